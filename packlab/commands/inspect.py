"""``packlab inspect PATH``: what a spool or a shard holds (counts, lengths, sizes)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from packlab.commands import emit


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="describe a spool or a shard",
        description="Describe a spool (counts, length stats, mask fraction, bytes) or a shard "
        "of any registered format (format, bins, tokens, pack size, bytes on disk).",
    )
    parser.add_argument("path", help="a spool directory or a shard")
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


def inspect_path(path: str | Path) -> dict[str, Any]:
    """The description ``packlab inspect`` prints; FormatError for anything unreadable."""
    from packlab.formats import open_shard
    from packlab.spool import SpoolReader
    from packlab.spool_stats import describe_spool

    p = Path(path)
    if is_spool(p):
        return describe_spool(SpoolReader(p))
    reader = open_shard(p)
    try:
        return dict(reader.info())
    finally:
        close = getattr(reader, "close", None)
        if close is not None:
            close()


def run(args: argparse.Namespace) -> int:
    info = inspect_path(args.path)
    emit(info, args.json, flat=True)
    return 0
