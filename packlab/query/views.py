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

The rules of ``violations`` (docs/design.md, "One packed bin"; ``packlab validate`` checks the same):

- ``packed_len``: ``packed_len`` not in ``(0, pack_size]``;
- ``lengths_differ``: ``loss_mask`` and ``input_ids`` of different lengths;
- ``loss_mask_not_binary``: a ``loss_mask`` value other than 0/1;
- ``negative_token``: a negative token id;
- ``no_starts`` / ``first_start_not_zero`` / ``starts_not_increasing`` / ``last_start_past_end``:
  ``seq_start_id`` must be ``[0, s1, ...]``, strictly increasing, last ``< packed_len``;
- ``loss_crosses_boundary``: ``loss_mask`` is 1 on the last token of a sub-sequence.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packlab.cloud import sql as remote_sql
from packlab.errors import PacklabError, one_line
from packlab.progress import progress_enabled
from packlab.query.sources import PathLike, Shard, resolve_sources, sql_readable
from packlab.storage.location import is_remote

VIEWS = ("shards", "bins", "sequences", "violations", "tokens")

_RAW = """
CREATE VIEW _raw AS
SELECT s.split, s.dataset, s.shard, p.file_row_number AS row, s.pack_size,
       p.input_ids, p.loss_mask, p.seq_start_id
FROM read_parquet({files}, filename = true, file_row_number = true) AS p
JOIN _shard_files AS f ON p.filename = f.file
JOIN shards AS s ON f.path = s.path
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
    con.execute("CREATE TABLE _shard_files (path VARCHAR, file VARCHAR)")
    con.executemany("INSERT INTO _shard_files VALUES (?, ?)",
                    [(s.path, s.file or s.path) for s in shards])
    files = "[" + ", ".join(_literal(s.file or s.path) for s in shards) + "]"
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
    allow_writes: bool = False,
    note: Callable[[str], None] | None = None,
) -> Any:
    """A DuckDB connection (in memory) with the views over ``data``'s shards (local or on
    object storage). Parquet is read where it is; a shard of another format is transcoded
    first, once per process (:func:`packlab.query.sources.sql_readable`, which tells ``note``
    when it does), so every format can be queried.

    Read-only unless ``allow_writes`` (:func:`lock_down`): only SELECT and EXPLAIN run, only
    the shards can be opened, DuckDB may spill only into a temporary folder of its own
    (``connection_temp_dir``), and the configuration is locked.
    """
    import duckdb

    spill = Path(tempfile.gettempdir()) / f"{SPILL_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:8]}"
    shards = sql_readable(resolve_sources(data, split=split), note=note)
    con = duckdb.connect(":memory:")
    con.execute(f"SET temp_directory = {_literal(str(spill))}")
    # DuckDB draws its own progress bar for long queries: when a person watches (a terminal,
    # not CI). Under Jupyter without ipywidgets the bar is off and DuckDB refuses any change.
    try:
        con.execute(f"SET enable_progress_bar = {str(progress_enabled()).lower()}")
    except duckdb.Error:
        pass
    _setting(con, "threads", threads, "a positive integer")
    _setting(con, "memory_limit", memory_limit, "a size such as 2GB, 512MB or 50%")
    if any(is_remote(s.path) for s in shards):
        remote_sql.connect(con=con)  # s3:// through packlab's own pyarrow filesystem
    try:
        create_views(con, shards, tokens=tokens)
    except duckdb.OutOfMemoryException as exc:
        con.close()  # no query runs any more, not even close()'s
        shutil.rmtree(spill, ignore_errors=True)
        said = one_line(exc).split(" Possible solutions")[0]
        limit = f"memory_limit={memory_limit}" if memory_limit else "its default memory limit"
        raise PacklabError(f"{_given(data)}: DuckDB ran out of memory making the views under "
                           f"{limit} (give it more; DuckDB: {said})") from None
    if not allow_writes:
        lock_down(con, [s.file or s.path for s in shards])
    return con


def _given(data: PathLike | Sequence[PathLike]) -> str:
    """The data as the caller named it, for messages."""
    items = data if isinstance(data, list | tuple) else [data]
    return ", ".join(os.fspath(d) for d in items)


def _setting(con: Any, name: str, value: Any, expected: str) -> None:
    import duckdb

    if value is None:
        return
    try:
        con.execute(f"SET {name} = {_literal(str(value))}")
    except duckdb.Error as exc:
        raise PacklabError(f"{name} must be {expected}, got {value!r} (DuckDB: "
                           f"{one_line(exc, 200)})") from None


SPILL_PREFIX = "packlab-query-"


def read_only(con: Any) -> bool:
    """Whether ``con`` was locked down by :func:`lock_down`."""
    value = con.execute("SELECT current_setting('enable_external_access')").fetchone()[0]
    return str(value).lower() == "false"


def lock_down(con: Any, paths: Sequence[str]) -> None:
    """Make ``con`` read-only over ``paths``: files other than those cannot be opened, writes
    go nowhere but its temporary folder (``temp_directory``), settings cannot be changed back. (Statements
    other than SELECT and EXPLAIN are refused by :func:`packlab.query.run.execute`; DuckDB
    itself would still let a COPY through the connection overwrite one of ``paths``.)"""
    spill = Path(con.execute("SELECT current_setting('temp_directory')").fetchone()[0])
    con.execute(f"SET allowed_directories = [{_literal(str(spill) + '/')}]")
    if paths:  # object storage URIs too: DuckDB checks them the same way
        con.execute(f"SET allowed_paths = [{', '.join(_literal(p) for p in paths)}]")
    con.execute("SET enable_external_access = false")
    con.execute("SET lock_configuration = true")


def close(con: Any) -> None:
    """Close a connection from :func:`connect`, and remove the spill folder of a read-only
    one."""
    spill = Path(con.execute("SELECT current_setting('temp_directory')").fetchone()[0])
    con.close()
    if spill.name.startswith(SPILL_PREFIX) and spill.parent == Path(tempfile.gettempdir()):
        shutil.rmtree(spill, ignore_errors=True)
