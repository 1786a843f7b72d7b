"""``packlab validate PATH``: prove a shard (or a directory of shards) whole and valid.

Exit 0 only when every shard passes: sizes, checksums (manifest and receipt), counts and every
invariant of every bin. Otherwise one line naming the file (and bin), exit 2.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="check shards: sizes, checksums, every invariant",
                       description="Exit 0 when every shard under PATH is whole and valid; "
                                   "otherwise print one line naming the file (and bin), exit 2.")
    p.add_argument("path", help="a shard, or a directory of shards")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.layout.validate import validate_path

    result = validate_path(args.path)
    if args.json:
        emit_json(result)
        return 0
    for row in result["shards"]:
        checked = "manifest+receipt" if row["receipt"] else "manifest"
        print(f"ok  {row['path']}  {row['format']}  {int(row['num_bins']):,} bins  "
              f"{int(row['num_tokens']):,} tokens  ({checked})")
    print(f"valid: {result['num_shards']} shard(s), {result['num_bins']:,} bins, "
          f"{result['num_tokens']:,} tokens, {result['bytes']:,} bytes")
    return 0
