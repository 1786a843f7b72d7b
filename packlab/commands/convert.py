"""Convert a dataset into another format, bin by bin.

SRC is any dataset path (a shard, a directory of shards, an output layout with --split,
ROOT/splits/NAME, a run folder, a glob; local or s3://). One shard converts into the shard
DST; anything else into the folder DST: one shard per source shard, a receipt beside each,
and DST/dataset.json written first (as "writing") and finished last, so an interrupted run is
refused by every reader until it is rerun. DST is a local path or a URI (written locally,
then uploaded). Prints the sizes before and after.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import DATASET_HELP, OUTPUT_HELP, emit_json, format_choices


def add_parser(sub: Any) -> None:
    p = sub.add_parser("convert", help="convert shards to another format, bin by bin",
                       description=__doc__)
    p.add_argument("src", metavar="SRC", help=DATASET_HELP)
    p.add_argument("dst", metavar="DST", help="the output shard (SRC is one shard) or folder: "
                                              f"{OUTPUT_HELP}")
    p.add_argument("--format", required=True, help=f"target format: {format_choices()}")
    p.add_argument("--split", help="the split of an output layout (or run folder) to convert "
                                   "(default: SRC must hold one)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace DST when it is a packlab output of the same kind (a shard of "
                        "the format, or a converted/packed folder); anything else is refused")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.sources.convert import convert

    rows = convert(args.src, args.dst, format=args.format, split=args.split,
                   overwrite=args.overwrite)
    before = sum(r["bytes_before"] for r in rows)
    after = sum(r["bytes_after"] for r in rows)
    tokens = sum(r["num_tokens"] for r in rows)
    if args.json:
        emit_json({"shards": rows, "bytes_before": before, "bytes_after": after,
                   "num_bins": sum(r["num_bins"] for r in rows), "num_tokens": tokens})
        return 0
    for r in rows:
        print(f"{r['source']} ({r['source_format']}, {r['bytes_before']:,} B) -> "
              f"{r['destination']} ({r['format']}, {r['bytes_after']:,} B)")
    ratio = after / before if before else float("nan")
    print(f"total: {len(rows)} shard(s), {tokens:,} tokens, {before:,} B -> {after:,} B "
          f"({ratio:.3f}x, {after / max(tokens, 1):.3f} B/token)")
    return 0

