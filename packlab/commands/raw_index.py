"""``packlab raw-index JSONL``: Modalities' ``data create_raw_index``, written by packlab.

The line index of a JSONL file in Modalities' own format (a pickled list of ``(offset,
length)``), where Modalities looks for it (``JSONL`` with ``.idx`` for its suffix):
:mod:`packlab.interop.modalities`.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "raw-index",
        help="index a JSONL file's lines for Modalities (its create_raw_index)",
        description="Write the line index Modalities reads (`modalities data create_raw_index`"
                    "): a pickled list of (byte offset, byte length) per record, beside the "
                    "file as NAME.idx. Every line is parsed once; a bad one is named.",
    )
    parser.add_argument("jsonl", help="JSONL file")
    parser.add_argument("--index-path", default=None,
                        help="where to write the index (default: JSONL with suffix .idx)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing index")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.interop.modalities import write_raw_index

    emit(write_raw_index(args.jsonl, args.index_path, overwrite=args.overwrite), args.json)
    return 0
