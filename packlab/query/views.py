"""DuckDB views over Parquet shards: ``shards``, ``bins``, ``sequences``, ``violations`` and an
opt-in ``tokens``.

::

    shards      split, dataset, shard, path, pack_size, num_bins, num_tokens   (from footers)
    bins        split, dataset, shard, row, packed_len, num_seqs, loss_tokens, pack_size
    sequences   split, dataset, shard, row, seq, start, length, loss_tokens
    violations  split, dataset, shard, row, rule          (bins breaking "One packed bin")
    tokens      split, dataset, shard, row, pos, token, loss      (opt-in: one row per token)

``row`` is the bin's row in its shard (``file_row_number``): bin ``row`` of that shard's
reader. ``loss_tokens`` counts ``loss_mask`` ones (next-token aligned, as stored). Views are
lazy: DuckDB reads only the columns a query names, so ``SELECT split, count(*) FROM bins
GROUP BY split`` decodes no token. ``tokens`` is opt-in because a careless ``SELECT *`` over it
is one row per token of the dataset.

The rules of ``violations`` (DESIGN.md, "One packed bin"; ``packlab validate`` checks the same):

- ``packed_len``: ``packed_len`` not in ``(0, pack_size]``;
- ``lengths_differ``: ``loss_mask`` and ``input_ids`` of different lengths;
- ``loss_mask_not_binary``: a ``loss_mask`` value other than 0/1;
- ``negative_token``: a negative token id;
- ``no_starts`` / ``first_start_not_zero`` / ``starts_not_increasing`` / ``last_start_past_end``:
  ``seq_start_id`` must be ``[0, s1, ...]``, strictly increasing, last ``< packed_len``;
- ``loss_crosses_boundary``: ``loss_mask`` is 1 on the last token of a sub-sequence.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from packlab.query.sources import PathLike, Shard, resolve_sources

VIEWS = ("shards", "bins", "sequences", "violations", "tokens")

_RAW = """
CREATE VIEW _raw AS
SELECT s.split, s.dataset, s.shard, p.file_row_number AS row, s.pack_size,
       p.input_ids, p.loss_mask, p.seq_start_id
FROM read_parquet({files}, filename = true, file_row_number = true) AS p
JOIN shards AS s ON p.filename = s.path
"""

_BINS = """
CREATE VIEW bins AS
SELECT split, dataset, shard, row, len(input_ids) AS packed_len,
       len(seq_start_id) AS num_seqs, CAST(coalesce(list_sum(loss_mask), 0) AS BIGINT)
       AS loss_tokens, pack_size
FROM _raw
"""

# one row per sub-sequence: unnest the starts beside the ends (the next start, or packed_len);
# the loss of a sequence is summed from its slice of the bin's mask only when asked for
_SEQUENCES = """
CREATE VIEW sequences AS
WITH per_seq AS (
  SELECT split, dataset, shard, row, loss_mask,
         unnest(range(len(seq_start_id))) AS seq,
         unnest(seq_start_id) AS start,
         unnest(list_concat(seq_start_id[2:], [len(input_ids)])) AS stop
  FROM _raw
)
SELECT split, dataset, shard, row, seq, start, stop - start AS length,
       CAST(coalesce(list_sum(loss_mask[start + 1 : stop]), 0) AS BIGINT) AS loss_tokens
FROM per_seq
"""

_VIOLATIONS = """
CREATE VIEW violations AS
WITH checked AS (
  SELECT split, dataset, shard, row, [
    CASE WHEN len(input_ids) = 0 OR len(input_ids) > pack_size THEN 'packed_len' END,
    CASE WHEN len(loss_mask) <> len(input_ids) THEN 'lengths_differ' END,
    CASE WHEN coalesce(list_max(loss_mask), 0) > 1 THEN 'loss_mask_not_binary' END,
    CASE WHEN coalesce(list_min(input_ids), 0) < 0 THEN 'negative_token' END,
    CASE WHEN len(seq_start_id) = 0 THEN 'no_starts' END,
    CASE WHEN len(seq_start_id) > 0 AND seq_start_id[1] <> 0 THEN 'first_start_not_zero' END,
    CASE WHEN NOT coalesce(list_bool_and(list_transform(seq_start_id[2:],
                  lambda x, i: x > seq_start_id[i])), true)
         THEN 'starts_not_increasing' END,
    CASE WHEN len(seq_start_id) > 0 AND seq_start_id[-1] >= len(input_ids)
         THEN 'last_start_past_end' END,
    CASE WHEN coalesce(list_bool_or(list_transform(
                  list_concat(seq_start_id[2:], [len(input_ids)]),
                  lambda e: e >= 1 AND e <= len(loss_mask) AND loss_mask[e] <> 0)), false)
         THEN 'loss_crosses_boundary' END
  ] AS rules
  FROM _raw
)
SELECT split, dataset, shard, row, unnest(list_filter(rules, lambda r: r IS NOT NULL)) AS rule
FROM checked
"""

_TOKENS = """
CREATE VIEW tokens AS
SELECT split, dataset, shard, row, unnest(range(len(input_ids))) AS pos,
       unnest(input_ids) AS token, unnest(loss_mask) AS loss
FROM _raw
"""


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def create_views(con: Any, shards: Sequence[Shard], *, tokens: bool = False) -> None:
    """Create the ``shards`` table and the views on an open DuckDB connection."""
    con.execute("CREATE TABLE shards (split VARCHAR, dataset VARCHAR, shard VARCHAR, "
                "path VARCHAR, pack_size INTEGER, num_bins BIGINT, num_tokens BIGINT)")
    con.executemany("INSERT INTO shards VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(s.split, s.dataset, s.shard, s.path, s.pack_size, s.num_bins,
                      s.num_tokens) for s in shards])
    files = "[" + ", ".join(_literal(s.path) for s in shards) + "]"
    con.execute(_RAW.format(files=files))
    for sql in (_BINS, _SEQUENCES, _VIOLATIONS, *((_TOKENS,) if tokens else ())):
        con.execute(sql)


def connect(
    data: PathLike | Sequence[PathLike],
    *,
    split: str | None = None,
    tokens: bool = False,
    threads: int | None = None,
    memory_limit: str | None = None,
) -> Any:
    """A DuckDB connection (in memory) with the views over ``data``'s Parquet shards."""
    import duckdb

    shards = resolve_sources(data, split=split)
    con = duckdb.connect(":memory:")
    # DuckDB draws its own progress bar for long queries: on a terminal only. Under Jupyter
    # without ipywidgets the bar is already off and DuckDB refuses any change to the setting.
    try:
        con.execute(f"SET enable_progress_bar = {str(sys.stderr.isatty()).lower()}")
    except duckdb.Error:
        pass
    if threads is not None:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit is not None:
        con.execute(f"SET memory_limit = {_literal(str(memory_limit))}")
    create_views(con, shards, tokens=tokens)
    return con
