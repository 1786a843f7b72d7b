"""``packlab inspect PATH``: what a spool or a dataset holds (counts, lengths, sizes).

A spool: counts, length statistics, mask fraction, bytes per file (and the keys its writer
added). One shard: format, bins, tokens, pack size, bytes on disk. Any other dataset path (a
directory of shards, a layout, a split, a run folder, a glob; local or ``s3://``): the same
totals, per split, and one line per shard. Nothing is validated (``packlab validate`` does).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from packlab.commands import DATASET_HELP, emit


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("inspect", help="describe a spool, a shard or a dataset",
                                   description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", metavar="PATH", help=f"a spool directory, or {DATASET_HELP}")
    parser.add_argument("--split", help="only this split of an output layout or run folder")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def is_spool(path: Path) -> bool:
    """A directory whose manifest says ``spool_v1``, or that holds spool files (maybe broken)."""
    from packlab.spool import FILES, MANIFEST, SPOOL_VERSION

    if not path.is_dir():
        return False
    manifest = path / MANIFEST
    if manifest.is_file():
        try:
            data = json.loads(manifest.read_text())
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict) and ("version" in data or "format" in data):
            return data.get("version") == SPOOL_VERSION
    return any((path / name).exists() for name in FILES.values())


def spool_at(path: str) -> Any:
    """A reader of the spool at ``path`` (local, or on object storage: fetched into the
    verified cache), or None when ``path`` is no spool."""
    from packlab.sources.outputs import local_input
    from packlab.spool import MANIFEST, SpoolReader, is_spool_manifest
    from packlab.storage import is_remote, resolve

    if is_remote(path):
        manifest = resolve(path) / MANIFEST
        if not (manifest.is_file() and is_spool_manifest(manifest.read_bytes())):
            return None
        return SpoolReader(local_input(path))
    return SpoolReader(path) if is_spool(Path(path)) else None


def inspect_path(path: str | Path, split: str | None = None) -> dict[str, Any]:
    """The description ``packlab inspect`` prints; FormatError for anything unreadable."""
    from packlab.sources.describe import describe_source
    from packlab.sources.resolve import resolve_source
    from packlab.spool_stats import describe_spool

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
