"""Running SQL for people and scripts: DuckDB's errors as one line, results as rows.

A query that names a missing view or column, or does not parse, raises a
:class:`~packlab.errors.PacklabError` carrying DuckDB's own message on one line (the CLI prints
it and exits 2), never a traceback.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from packlab.errors import PacklabError, one_line

MAX_MESSAGE = 500
READ_STATEMENTS = ("SELECT", "EXPLAIN")


def short_line(exc: BaseException) -> str:
    """A DuckDB error on one line, at most :data:`MAX_MESSAGE` characters (an ellipsis when
    cut)."""
    text = one_line(exc)
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 3] + "..."


@dataclass
class Result:
    """Column names and a cursor to fetch from (in batches, so a CSV export streams)."""

    columns: list[str]
    cursor: Any

    def batches(self, size: int = 10_000) -> Iterator[list[tuple[Any, ...]]]:
        import duckdb

        while True:
            try:
                rows = self.cursor.fetchmany(size)
            except duckdb.Error as exc:
                raise PacklabError(short_line(exc)) from None
            if not rows:
                return
            yield rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return [row for batch in self.batches() for row in batch]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.fetchall()]


def check_read_only(sql: str) -> None:
    """Refuse statements that may write (COPY, EXPORT, ATTACH, CREATE, INSERT, SET, PRAGMA,
    INSTALL/LOAD...): a read-only query runs SELECT and EXPLAIN only."""
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as exc:
        raise PacklabError(short_line(exc)) from None
    for statement in statements:
        kind = str(statement.type).rsplit(".", 1)[-1]
        if kind not in READ_STATEMENTS:
            article = "an" if kind[:1] in "AEIOU" else "a"
            raise PacklabError(f"{article} {kind} statement: queries are read-only (SELECT, "
                               "EXPLAIN); pass --allow-writes to run others")


def execute(con: Any, sql: str, params: Any = None) -> Result:
    """Run ``sql`` on ``con``; DuckDB's error (missing view, column, syntax, I/O) as one line.
    On a read-only connection (:func:`packlab.query.views.lock_down`) only SELECT and EXPLAIN
    run."""
    import duckdb

    from packlab.query.views import read_only

    if read_only(con):
        check_read_only(sql)
    try:
        cursor = con.execute(sql, params) if params is not None else con.execute(sql)
    except duckdb.Error as exc:
        raise PacklabError(short_line(exc)) from None
    if cursor is None:  # "", ";", "-- a comment": DuckDB runs nothing and returns nothing
        raise PacklabError(f"no SQL statement to run in {sql!r:.80} (empty, or only a comment)")
    description = cursor.description or []
    return Result([d[0] for d in description], cursor)


def query(con: Any, sql: str, params: Any = None) -> list[dict[str, Any]]:
    """All rows of ``sql`` as dicts (for small answers: cards, histograms, checks)."""
    return execute(con, sql, params).records()
