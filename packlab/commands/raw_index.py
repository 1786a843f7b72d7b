"""Index a JSONL file's lines for Modalities, as its data create_raw_index does.

Write the line index Modalities reads: a pickled list of (byte offset, byte length) per
record, beside the file as NAME.idx, where Modalities looks for it. Every line is parsed once;
a bad one is named.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit
from packlab.errors import PacklabError


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "raw-index",
        help="index a JSONL file's lines for Modalities (its create_raw_index)",
        description=__doc__,
    )
    parser.add_argument("jsonl", metavar="JSONL", help="JSONL file (local or a URI)")
    parser.add_argument("--index-path", default=None,
                        help="where to write the index (default: JSONL with suffix .idx)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an index packlab wrote there (nothing else is replaced)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.interop.modalities import INDEX_SUFFIX, write_raw_index
    from packlab.sources.describe import what_is
    from packlab.sources.outputs import local_input, output
    from packlab.storage.files import require_file

    target = args.index_path or _beside(args.jsonl, INDEX_SUFFIX)
    if target == args.jsonl:
        raise PacklabError(f"{target}: the index would replace its own JSONL (--index-path)")
    jsonl = require_file(local_input(args.jsonl, what="file"), "a JSONL file", what_is)
    with output(target, kind="raw_index", overwrite=args.overwrite) as local:
        summary = write_raw_index(jsonl, local, overwrite=True)
    emit({**summary, "path": target, "source": args.jsonl}, args.json)
    return 0


def _beside(jsonl: str, suffix: str) -> str:
    """``data/x.jsonl`` -> ``data/x.idx`` (a URI stays a URI): where Modalities looks."""
    head, _, name = jsonl.rpartition("/")
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return f"{head}/{stem}{suffix}" if head else f"{stem}{suffix}"
