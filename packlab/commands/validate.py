"""Prove a dataset (or a spool) whole and valid.

PATH is any dataset path: a shard, a directory of shards, a glob, an output layout (every
split, or --split), a run folder, a Nemotron output directory; local or s3://. Exit 0 only
when every shard passes: sizes, checksums (its record, its receipt, and what dataset.json
records of it), counts against blend.json, and every invariant of every bin. An output still
being written (or interrupted) is refused. A spool is checked against its record.
Otherwise one line naming the file (and bin), exit 2; with --json, also one JSON object on
stdout saying what failed.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import DATASET_HELP, emit_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser("validate", help="check shards: sizes, checksums, every invariant",
                       description=__doc__)
    p.add_argument("path", metavar="PATH", help=f"{DATASET_HELP}; or a spool")
    p.add_argument("--split", help="only this split of an output layout or run folder "
                                   "(default: every split)")
    p.add_argument("--json", action="store_true",
                   help="one JSON object on stdout, whole or not (\"valid\": true or false)")
    p.set_defaults(run=run, failure=failure)


def failure(args: argparse.Namespace) -> dict[str, Any]:
    """What ``--json`` prints beside the error when PATH is not whole and valid."""
    return {"valid": False, "path": args.path, "split": args.split}


def run(args: argparse.Namespace) -> int:
    from packlab.sources.validate import validate_path

    result = validate_path(args.path, split=args.split)
    if args.json:
        emit_json({"valid": True, **result})
        return 0
    if result["kind"] == "file":
        print(f"valid: {result['what']} written by {result['written_by']}, "
              f"{result['bytes_on_disk']:,} bytes (the bytes its record lists)")
        return 0
    if result["kind"] == "spool":
        print(f"valid: spool, {result['num_sequences']:,} sequences, "
              f"{result['num_tokens']:,} tokens (files match its record's sizes and checksums)")
        return 0
    for row in result["shards"]:
        checked = "record+receipt" if row["receipt"] else "record"
        print(f"ok  {row['path']}  {row['format']}  {int(row['num_bins']):,} bins  "
              f"{int(row['num_tokens']):,} tokens  ({checked})")
    for split, counts in result.get("splits", {}).items():
        print(f"split {split}: {counts['num_shards']} shard(s), {counts['num_bins']:,} bins, "
              f"{counts['num_tokens']:,} tokens")
    print(f"valid: {result['num_shards']} shard(s), {result['num_bins']:,} bins, "
          f"{result['num_tokens']:,} tokens, {result['bytes']:,} bytes")
    return 0
