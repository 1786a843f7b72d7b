"""``packlab convert SRC DST --format F``: a shard (or a directory of shards) into another format."""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("convert", help="convert shards to another format, bin by bin",
                       description="Stream every bin of SRC (a shard or a directory of shards) "
                                   "into DST in format F; prints sizes before and after.")
    p.add_argument("src", help="a shard, or a directory of shards")
    p.add_argument("dst", help="the output shard (or directory, when SRC is a directory)")
    p.add_argument("--format", required=True, help="target format")
    p.add_argument("--overwrite", action="store_true", help="replace existing output")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.convert import convert

    rows = convert(args.src, args.dst, format=args.format, overwrite=args.overwrite)
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
