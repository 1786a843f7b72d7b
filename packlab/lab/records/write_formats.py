"""Notebook 03's record: one packing written in every format, bin for bin the same."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from packlab.lab.records.base import Record


@dataclass
class WriteFormats(Record):
    NOTEBOOK: ClassVar[str] = "03_write_formats"

    bytes_per_token: dict[str, float]
    num_formats: int | None = None
    num_bins: int | None = None
    num_tokens: int | None = None
    bins_differing: int | None = None
    by_reference: list[str] = field(default_factory=list)
    raw_bytes_per_token: float | None = None
    #: the spool's bytes per token (what a format that reads its tokens from it keeps)
    spool_bytes_per_token: float | None = None
    roundtrip_chain: list[str] = field(default_factory=list)
    roundtrip_identical: bool | None = None
    repack_index_bytes: int | None = None
    repack_parquet_bytes: int | None = None
    repack_identical: bool | None = None
    repack_index_seconds: float | None = None
    repack_parquet_seconds: float | None = None
    #: the planned prefix path: the spool exported once as a Megatron prefix, then repacked
    #: over it by ``packed_index`` (bytes written and seconds of each step)
    prefix_export_bytes: int | None = None
    prefix_export_seconds: float | None = None
    prefix_repack_bytes: int | None = None
    prefix_repack_seconds: float | None = None
    prefix_repack_identical: bool | None = None
