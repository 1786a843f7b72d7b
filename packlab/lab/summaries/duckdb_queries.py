"""Notebook 07's summary: a dataset card, the invariants and token statistics from SQL."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.duckdb_queries import DuckdbQueries


def bullets(n: DuckdbQueries, p: Mapping[str, Any]) -> list[str]:
    engines = n.engines
    duck = {r["question"]: r for r in engines if r["engine"] == "duckdb"}
    pol = {r["question"]: r for r in engines if r["engine"] == "polars"}
    faster = sum(duck[q]["query_seconds"] < pol[q]["query_seconds"] for q in duck if q in pol)
    return [
        f"The card came from SQL alone: train holds {n.train_bins:,} bins, "
        f"{n.train_tokens:,} tokens, efficiency {n.train_efficiency:.2%}, "
        f"{n.train_loss_fraction:.1%} of tokens carry loss.",
        f"SQL invariants and `validate` agree: {n.sql_violations} violations on the layout as "
        f"written; on the broken copy both name bin {n.broken_bin} of `{n.broken_shard}` "
        f"({n.broken_bin_agree}).",
        f"A rerun reused {n.rerun_reused} of {n.shards_written} shards and wrote "
        f"{n.rerun_written}.",
        f"{n.distinct_tokens:,} distinct token ids; the 10 most frequent carry "
        f"{n.top10_token_share:.1%} of all tokens.",
        f"DuckDB and polars returned identical rows on every question: {n.engines_agree}; "
        f"DuckDB was faster on {faster} of {len(duck)} questions here (timings are noisy on a "
        "shared 2-core machine: read them as ratios).",
    ]
