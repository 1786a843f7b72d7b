"""Write a Modalities packed data file (.pbin), as Modalities' data pack_encoded_data does.

From a JSONL of documents: each record's text field tokenized with an offline BPE encoding and
closed with the end-of-document token, one document per record. From a spool directory: one
document per sequence. Modalities' PackedMemMapDatasetBase reads the file.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit, nonnegative_int

ENCODINGS = ("cl100k_base", "o200k_base")  # packlab.tokenize.ENCODINGS, without importing it


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "pbin",
        help="write a Modalities packed data file from a JSONL or a spool (its "
             "pack_encoded_data)",
        description=__doc__,
    )
    parser.add_argument("src", metavar="SRC", help="a JSONL file of documents, or a spool "
                                                   "directory (local or a URI)")
    parser.add_argument("out", metavar="OUT", help="the .pbin file to write (a local path or "
                                                   "a URI)")
    parser.add_argument("--field", default="text",
                        help="JSONL: the record's text field, dotted for nested keys "
                             "(Modalities' jq_pattern .text)")
    parser.add_argument("--encoding", default="cl100k_base",
                        help=f"JSONL: BPE encoding, {' or '.join(ENCODINGS)}")
    parser.add_argument("--eod-id", type=nonnegative_int, default=None,
                        help="JSONL: end-of-document token id (default: the encoding's "
                             "<|endoftext|>)")
    parser.add_argument("--token-width", default="auto",
                        help="bytes per token: 1, 2, 4 or auto (from the vocabulary)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if packlab wrote it with `packlab pbin` (nothing else is "
                             "replaced)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.sources.describe import what_is
    from packlab.sources.outputs import local_input, output, spool_at
    from packlab.storage.files import require_file

    width = args.token_width if args.token_width == "auto" else _width(args.token_width)
    spool = spool_at(args.src)
    jsonl = None if spool is not None else require_file(
        local_input(args.src, what="file"), "a JSONL file of documents or a spool", what_is)
    with output(args.out, kind="packed_data", overwrite=args.overwrite) as local:
        if spool is not None:
            from packlab.formats.pbin.codec import write_pbin

            summary = write_pbin(spool.path, local, token_width=width, overwrite=True)
        else:
            from packlab.interop.modalities import encode_jsonl_pbin

            summary = encode_jsonl_pbin(jsonl, local,
                                        encoding=args.encoding, field=args.field,
                                        eod_id=args.eod_id, token_width=width, overwrite=True)
    emit({**summary, "path": args.out}, args.json)
    return 0


def _width(text: str) -> int | str:
    try:
        return int(text)
    except ValueError:
        return text  # check_width names it
