"""Run SQL (DuckDB) over the bins of any dataset.

Views: shards, bins (split, dataset, shard, row, packed_len, num_seqs, loss_tokens),
sequences, violations and, with --tokens, tokens. PATH is an output layout (every split, or
--split), ROOT/splits/NAME, a run folder, a directory of shards, a shard or a glob; local or
s3:// (read through packlab's own S3 client, no DuckDB extension). DuckDB reads Parquet where
it is; shards of other formats are transcoded into Parquet first, in a temporary folder, once
per process (a note on stderr says so; packlab convert PATH OUT --format parquet keeps a
Parquet copy that needs none). Read-only unless --allow-writes: only SELECT and EXPLAIN run,
no file but the shards can be opened, DuckDB spills into a private temporary folder only. A
missing view or column is DuckDB's message on one line, exit 2; --split of a split that does
not exist lists those that do.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from typing import Any

from packlab.commands import DATASET_HELP, _jsonable, nonnegative_int, positive_int


def add_parser(sub: Any) -> None:
    p = sub.add_parser("query", help="SQL (DuckDB) over the bins of any dataset",
                       description=__doc__)
    p.add_argument("sql", metavar="SQL",
                   help='e.g. "SELECT split, count(*) AS bins FROM bins GROUP BY split"')
    p.add_argument("--data", required=True, metavar="PATH", help=DATASET_HELP)
    p.add_argument("--split", help="only this split of a layout (or run folder; default: every "
                                   "split)")
    p.add_argument("--tokens", action="store_true",
                   help="also create the tokens view (one row per token)")
    p.add_argument("--format", choices=("table", "csv", "json"), default="table",
                   dest="output", help="output: an aligned table, CSV, or one JSON object")
    p.add_argument("--max-rows", type=nonnegative_int, default=100,
                   help="table output: rows shown (the rest are counted); csv/json: all rows")
    p.add_argument("--threads", type=positive_int, help="DuckDB threads (default: all cores)")
    p.add_argument("--memory-limit", help="DuckDB memory limit, e.g. 1GB, 512MB or 50%% "
                                          "(default: DuckDB's own, 80%% of the RAM)")
    p.add_argument("--allow-writes", action="store_true",
                   help="let the SQL write (COPY ... TO, ATTACH, CREATE, ...) and open any file")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.errors import PacklabError
    from packlab.query import connect, execute
    from packlab.query.run import check_read_only
    from packlab.query.views import close

    if not args.allow_writes:
        check_read_only(args.sql)  # before the shards are even listed
    con = connect(args.data, split=args.split, tokens=args.tokens, threads=args.threads,
                  memory_limit=args.memory_limit, allow_writes=args.allow_writes,
                  note=lambda message: print(f"packlab query: {message}", file=sys.stderr))
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
        sys.stdout.flush()  # a closed pipe fails here, inside the command, not at exit
    finally:
        close(con)
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
