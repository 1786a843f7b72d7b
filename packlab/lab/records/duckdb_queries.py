"""Notebook 07's record: a dataset card, invariants and statistics from SQL."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from packlab.lab.records.base import Record


@dataclass
class DuckdbQueries(Record):
    NOTEBOOK: ClassVar[str] = "07_duckdb_queries"

    train_bins: int
    train_tokens: int
    train_efficiency: float
    train_loss_fraction: float
    splits: dict[str, dict[str, float]]
    shards_written: int
    rerun_reused: int
    rerun_written: int
    sql_violations: int
    broken_shard: str
    broken_bin: int
    broken_bin_agree: bool
    engines_agree: bool
    distinct_tokens: int
    top10_token_share: float
    engines: list[dict[str, Any]]
