"""Questions asked of a packed dataset, each in SQL (DuckDB views) and in polars (lazy frames).

The answers are compared as normalized rows: both engines must agree exactly before their time
and memory are put side by side (:mod:`packlab.lab.measure.queries`). The dataset card is the first
table a reader wants: per split, bins, tokens, sequences, packing efficiency and the fraction of
tokens that carry loss.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from packlab.storage.files import short_digest

CARD_SQL = """
SELECT split, count(DISTINCT shard) AS shards, count(*) AS bins,
       sum(packed_len) AS tokens, sum(num_seqs) AS sequences, sum(loss_tokens) AS loss_tokens,
       sum(packed_len) / sum(pack_size) AS efficiency,
       sum(loss_tokens) / sum(packed_len) AS loss_fraction,
       avg(num_seqs) AS mean_seqs_per_bin, max(packed_len) AS max_packed_len,
       max(pack_size) AS pack_size
FROM bins GROUP BY split
"""


def dataset_card(con: Any) -> list[dict[str, Any]]:
    """Per split (in the layout's order): shards, bins, tokens, sequences, loss tokens,
    efficiency (tokens / (bins * pack_size)), loss fraction, mean sequences per bin."""
    from packlab.query.run import query

    order = [r["split"] for r in query(con, "SELECT split, min(rowid) AS first FROM shards "
                                            "GROUP BY split ORDER BY first")]
    rows = query(con, CARD_SQL)
    return sorted(rows, key=lambda r: order.index(r["split"]))


def histogram(con: Any, column: str, view: str = "bins") -> tuple[list[int], list[int]]:
    """Values and counts of an integer column of a view, ascending (for bar charts)."""
    from packlab.query.run import query

    if column not in ("packed_len", "num_seqs", "loss_tokens", "length") or \
            view not in ("bins", "sequences"):
        raise ValueError(f"no histogram of {view}.{column}")
    rows = query(con, f"SELECT {column} AS v, count(*) AS n FROM {view} GROUP BY v ORDER BY v")
    return [int(r["v"]) for r in rows], [int(r["n"]) for r in rows]


def _polars_split_counts(f: dict[str, Any]) -> Any:
    import polars as pl

    return f["bins"].group_by("split").agg(
        pl.len().cast(pl.Int64).alias("bins"), pl.col("packed_len").sum().alias("tokens"),
        pl.col("num_seqs").sum().alias("sequences"),
        pl.col("loss_tokens").sum().alias("loss_tokens")).sort("split")


def _polars_packed_len(f: dict[str, Any]) -> Any:
    import polars as pl

    return f["bins"].group_by("packed_len").agg(pl.len().alias("bins")).sort("packed_len")


def _polars_seq_length(f: dict[str, Any]) -> Any:
    import polars as pl

    return f["sequences"].group_by("length").agg(pl.len().alias("sequences")).sort("length")


def _polars_token_top(f: dict[str, Any]) -> Any:
    import polars as pl

    return (f["raw"].select(pl.col("input_ids").explode().alias("token"))
            .group_by("token").agg(pl.len().alias("n"))
            .sort(["n", "token"], descending=[True, False]).head(20))


@dataclass(frozen=True)
class Question:
    name: str
    sql: str
    polars: Callable[[dict[str, Any]], Any]
    tokens: bool = False  # needs the opt-in tokens view


QUESTIONS: dict[str, Question] = {q.name: q for q in (
    Question("split_counts",
             "SELECT split, count(*) AS bins, sum(packed_len) AS tokens, sum(num_seqs) AS "
             "sequences, sum(loss_tokens) AS loss_tokens FROM bins GROUP BY split ORDER BY split",
             _polars_split_counts),
    Question("packed_len_hist",
             "SELECT packed_len, count(*) AS bins FROM bins GROUP BY packed_len "
             "ORDER BY packed_len", _polars_packed_len),
    Question("seq_length_hist",
             "SELECT length, count(*) AS sequences FROM sequences GROUP BY length "
             "ORDER BY length", _polars_seq_length),
    Question("token_top",
             "SELECT token, count(*) AS n FROM tokens GROUP BY token ORDER BY n DESC, token "
             "LIMIT 20", _polars_token_top, tokens=True),
)}


def normalize(rows: list[tuple[Any, ...]]) -> list[list[Any]]:
    """Rows as plain JSON values (ints stay ints, floats rounded), for comparing engines."""
    def plain(v: Any) -> Any:
        if isinstance(v, float):
            return round(v, 9)
        if hasattr(v, "item"):
            return v.item()
        return v
    return [[plain(v) for v in row] for row in rows]


def digest(rows: list[tuple[Any, ...]]) -> str:
    text = json.dumps(normalize(rows), separators=(",", ":"), default=str)
    return short_digest(text)


def answer(engine: str, question: str, data: Any, *, split: str | None = None
           ) -> list[tuple[Any, ...]]:
    """The rows of ``question`` computed by ``engine`` (``duckdb`` or ``polars``)."""
    q = QUESTIONS[question]
    if engine == "duckdb":
        from packlab.query.run import execute
        from packlab.query.views import connect

        con = connect(data, split=split, tokens=q.tokens)
        try:
            return execute(con, q.sql).fetchall()
        finally:
            con.close()
    if engine == "polars":
        from packlab.query.lazy import frames

        return q.polars(frames(data, split=split)).collect().rows()
    raise ValueError(f"engine must be 'duckdb' or 'polars', got {engine!r}")
