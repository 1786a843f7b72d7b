"""Build a chat JSONL corpus from the installed packages' docstrings, offline.

Questions about the public functions and classes of the installed Python packages, answered
with their docstrings (sources parsed, never imported): real text, deterministic for a seed on
a given environment. OUT is a local file or a URI (written locally, then uploaded);
--overwrite replaces a corpus packlab wrote
there only (its record is beside it, hidden).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from packlab.commands import OUTPUT_HELP, emit, nonnegative_int, positive_int


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "corpus",
        help="build a chat JSONL from installed packages' docstrings (offline)",
        description=__doc__,
    )
    parser.add_argument("out", metavar="OUT", help=f"JSONL file to write: {OUTPUT_HELP}")
    parser.add_argument("--records", "-n", type=positive_int, required=True,
                        help="number of chat records (positive)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed")
    parser.add_argument("--index", action="store_true",
                        help="also write the line index OUT.idx for random access")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if packlab wrote it with `packlab corpus` (nothing else is "
                             "replaced)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.codecs.jsonl_index import SUFFIX, build_jsonl_index
    from packlab.sources.outputs import output
    from packlab.tokenize.corpus import build_docstring_corpus

    began = time.perf_counter()
    index_out = f"{args.out}{SUFFIX}" if args.index else None
    with output(args.out, kind="jsonl", overwrite=args.overwrite) as local:
        out = build_docstring_corpus(local, args.records, args.seed, overwrite=True,
                                     show_progress=True)
        size = out.stat().st_size
        if index_out is not None:
            with output(index_out, kind="jsonl_index", overwrite=args.overwrite) as local_index:
                build_jsonl_index(out, local_index)
    summary = {
        "path": args.out,
        "records": args.records,
        "seed": args.seed,
        "bytes": size,
        "index": index_out,
        "seconds": round(time.perf_counter() - began, 3),
    }
    emit(summary, args.json)
    return 0
