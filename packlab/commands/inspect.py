"""Describe what a spool or a dataset holds: counts, lengths, sizes.

A spool: counts, length statistics, mask fraction, bytes per file (and the keys its writer
added). One shard: format, bins, tokens, pack size, bytes on disk. Any other dataset path (a
directory of shards, a layout, a split, a run folder, a glob; local or s3://): the same
totals, per split, and one line per shard. Nothing is validated (packlab validate does).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from packlab.commands import DATASET_HELP, emit


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("inspect", help="describe a spool, a shard or a dataset",
                                   description=__doc__)
    parser.add_argument("path", metavar="PATH", help=f"a spool directory, or {DATASET_HELP}")
    parser.add_argument("--split", help="only this split of an output layout or run folder "
                                        "(default: every split)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def inspect_path(path: str | Path, split: str | None = None) -> dict[str, Any]:
    """The description ``packlab inspect`` prints; FormatError for anything unreadable."""
    from packlab.sources.describe import describe_source
    from packlab.sources.file_records import describe_file, file_output
    from packlab.sources.outputs import spool_at
    from packlab.sources.resolve import resolve_source
    from packlab.spool.stats import describe_spool

    if split is None and file_output(path, check=False) is not None:
        return describe_file(path)  # a one-file output packlab wrote
    spool = spool_at(str(path)) if split is None else None
    if spool is not None:
        return describe_spool(spool)
    return describe_source(resolve_source(str(path), split=split))


def run(args: argparse.Namespace) -> int:
    info = inspect_path(args.path, args.split)
    if args.json:
        emit(info, True)
        return 0
    shards = info.pop("shards", None)
    emit(info, False, flat=True)
    if shards:
        print()
        for row in shards:
            where = f"  [{row['split']}]" if row.get("split") else ""
            print(f"{row['name']}{where}  {row['format']}  {row['num_bins']:,} bins  "
                  f"{row['num_tokens']:,} tokens  {row['bytes_on_disk']:,} B")
    return 0
