"""``packlab corpus OUT.jsonl --records N``: a real-text chat corpus from installed docstrings.

Offline and deterministic for a seed on a given environment (see :mod:`packlab.corpus`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from packlab.commands import emit


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "corpus",
        help="build a chat JSONL from installed packages' docstrings (offline)",
        description="Build a chat JSONL corpus: questions about public functions and classes "
                    "of the installed Python packages, answered with their docstrings "
                    "(sources parsed with ast, never imported).",
    )
    parser.add_argument("out", help="JSONL file to write")
    parser.add_argument("--records", "-n", type=int, required=True,
                        help="number of chat records (positive)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default 0)")
    parser.add_argument("--index", action="store_true",
                        help="also write the line index OUT.idx for random access")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.corpus import build_docstring_corpus
    from packlab.jsonl_index import build_jsonl_index

    began = time.perf_counter()
    out = build_docstring_corpus(Path(args.out), args.records, args.seed,
                                 overwrite=args.overwrite)
    index = build_jsonl_index(out) if args.index else None
    summary = {
        "path": str(out),
        "records": args.records,
        "seed": args.seed,
        "bytes": out.stat().st_size,
        "index": str(index) if index else None,
        "seconds": round(time.perf_counter() - began, 3),
    }
    emit(summary, args.json)
    return 0
