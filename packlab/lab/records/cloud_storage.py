"""Notebook 09's record: what a packed shard costs on object storage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from packlab.lab.records.base import Record


@dataclass
class CloudStorage(Record):
    NOTEBOOK: ClassVar[str] = "09_cloud_storage"

    access: list[dict[str, Any]]
    open: list[dict[str, Any]]
    write: list[dict[str, Any]]
    max_bytes_over_row_group: float
    max_requests_per_access: int
    parquet_cold_open_bytes: int
    memmap_cold_open_bytes: int
    parquet_direct_write_seconds: float
    parquet_staged_write_seconds: float
    duckdb_num_bins: int
    duckdb_requests: int
    duckdb_bytes: int
    #: one large shard per format read in place or downloaded first
    #: (:func:`packlab.lab.measure.in_place.in_place_comparison`); empty in runs before it
    in_place: list[dict[str, Any]] = field(default_factory=list)
