"""``packlab query "SQL" --data OUT``: DuckDB over the Parquet shards of a layout (or a glob).

Views: ``shards``, ``bins`` (split, dataset, shard, row, packed_len, num_seqs, loss_tokens),
``sequences``, ``violations`` and, with ``--tokens``, ``tokens``. A missing view or column is
DuckDB's message on one line, exit 2; ``--split`` of a split that does not exist lists those
that do.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from packlab.commands import _jsonable


def add_parser(sub: Any) -> None:
    p = sub.add_parser("query", help="SQL (DuckDB) over Parquet shards",
                       description="Run SQL over the Parquet shards of an output layout, a "
                                   "directory, a shard or a glob. Views: shards, bins, "
                                   "sequences, violations, and tokens (with --tokens).")
    p.add_argument("sql", help='e.g. "SELECT split, count(*) AS bins FROM bins GROUP BY split"')
    p.add_argument("--data", required=True, help="output layout, shard directory, shard or glob")
    p.add_argument("--split", help="only this split of a layout")
    p.add_argument("--tokens", action="store_true",
                   help="also create the tokens view (one row per token)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   dest="output", help="output: an aligned table, CSV, or one JSON object")
    p.add_argument("--max-rows", type=int, default=100,
                   help="table output: rows shown (the rest are counted); csv/json: all rows")
    p.add_argument("--threads", type=int, help="DuckDB threads (default: all cores)")
    p.add_argument("--memory-limit", help="DuckDB memory limit, e.g. 1GB")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.errors import PacklabError
    from packlab.query import connect, execute

    con = connect(args.data, split=args.split, tokens=args.tokens, threads=args.threads,
                  memory_limit=args.memory_limit)
    try:
        try:
            result = execute(con, args.sql)
        except PacklabError as exc:
            if not args.tokens and "Table with name tokens does not exist" in str(exc):
                raise PacklabError(f"{exc} (the tokens view is opt-in: pass --tokens)") from None
            raise
        if args.output == "csv":
            writer = csv.writer(sys.stdout, lineterminator="\n")
            writer.writerow(result.columns)
            for batch in result.batches():
                writer.writerows(batch)
        elif args.output == "json":
            rows = result.records()
            json.dump({"columns": result.columns, "rows": rows}, sys.stdout, default=_jsonable)
            sys.stdout.write("\n")
        else:
            print_table(result, args.max_rows)
    finally:
        con.close()
    return 0


def print_table(result: Any, max_rows: int) -> None:
    """An aligned text table of the first ``max_rows`` rows; the rest are counted."""
    shown: list[tuple[Any, ...]] = []
    more = 0
    for batch in result.batches():
        room = max(max_rows - len(shown), 0)
        shown.extend(batch[:room])
        more += len(batch) - min(room, len(batch))
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(result.columns)]
    numeric = [all(isinstance(row[i], int | float) or row[i] is None for row in shown)
               for i in range(len(result.columns))]

    def line(values: list[str]) -> str:
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric, strict=True)).rstrip()

    print(line(list(result.columns)))
    print(line(["-" * w for w in widths]))
    for row in cells:
        print(line(row))
    print(f"({len(shown) + more} row{'s' if len(shown) + more != 1 else ''}"
          f"{f', {more} not shown' if more else ''})")


def _cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
