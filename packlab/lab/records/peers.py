"""Notebook 11's record: every system on the same bins, and the findings' figures."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from packlab.lab.records.base import Record


@dataclass
class Peers(Record):
    NOTEBOOK: ClassVar[str] = "11_peers"

    best_packlab: str
    best_packlab_p50_us: float
    best_packlab_x_floor: float
    fastest_system: str
    fastest_x_floor: float
    smallest_within: str
    smallest_within_bytes_per_token: float
    within: float
    num_bins: int
    num_tokens: int
    samples: int
    rows: list[dict[str, Any]]
    fastest_full_peer: str | None = None
    fastest_full_peer_p50_us: float | None = None
    fastest_full_peer_x_floor: float | None = None
    fastest_library: str | None = None
    fastest_library_p50_us: float | None = None
    parquet_bytes_per_token: float | None = None
    parquet_x_floor: float | None = None
    best_packlab_vs_fastest_full_peer: float | None = None
    best_packlab_vs_fastest_library: float | None = None
    skipped: list[dict[str, str]] = field(default_factory=list)
    environments: dict[str, dict[str, Any]] = field(default_factory=dict)
