"""Tokenize a chat JSONL into a spool with a real tokenizer, offline.

Each line of CHAT_JSONL is one record, {"messages": [{"role": ..., "content": ...}, ...],
"tools": [...]}; each record becomes one sequence of the spool OUT, its loss mask on exactly
the assistant turns. --encoding: bpe-openai with packlab's ChatML template. --tokenizer: a
Hugging Face tokenizer.json or tokenizer folder, its chat template rendered as transformers
renders it; the mask from the template's {% generation %} markers, else from each assistant
message's located text plus its end-of-turn token (records that cannot be masked exactly are
skipped, counted and named). --workers N or --executor ray spread the work and write the same
bytes.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from packlab.commands import OUTPUT_HELP, add_executor_options, emit, positive_int

ENCODINGS = ("cl100k_base", "o200k_base")  # packlab.tokenize.ENCODINGS, without importing it


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tokenize",
        help="tokenize a chat JSONL into a spool (bpe-openai or any Hugging Face tokenizer)",
        description=__doc__,
    )
    parser.add_argument("jsonl", metavar="CHAT_JSONL", help="chat JSONL file (local or a URI)")
    parser.add_argument("out", metavar="OUT", help=f"spool directory to create: {OUTPUT_HELP}")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--encoding", default=None,
                       help=f"bpe-openai encoding: {' or '.join(ENCODINGS)} (the default, "
                            "cl100k_base, when there is no --tokenizer)")
    which.add_argument("--tokenizer", default=None, metavar="PATH",
                       help="a Hugging Face tokenizer.json, or a folder with tokenizer.json and "
                            "tokenizer_config.json (whose chat_template is used; default: none, "
                            "--encoding is used)")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="Jinja chat template file for --tokenizer, or the name of one "
                             "packlab ships (chatml, chatml_generation, llama3, llama3_system; "
                             "default: the tokenizer folder's own)")
    add_executor_options(parser, workers=1, jobs="jobs over byte ranges of the JSONL")
    parser.add_argument("--unlocated", choices=("skip", "error"), default="skip",
                        help="a record whose assistant text cannot be masked exactly: skip and "
                             "count it, or stop with an error naming its line")
    parser.add_argument("--limit", type=positive_int, default=None, metavar="N",
                        help="tokenize only the first N records (default: every record)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it is a spool (nothing else is replaced)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.sources.describe import what_is
    from packlab.sources.outputs import local_input, output
    from packlab.storage.files import require_file
    from packlab.tokenize import tokenize_chat_jsonl

    began = time.perf_counter()
    jsonl = require_file(local_input(args.jsonl, what="file"), "a chat JSONL file", what_is)
    with output(args.out, kind="spool", overwrite=args.overwrite) as local:  # OUT may be a URI
        reader = tokenize_chat_jsonl(jsonl, local,
                                     encoding=args.encoding, tokenizer=args.tokenizer,
                                     chat_template=args.chat_template, workers=args.workers,
                                     executor=args.executor, address=args.ray_address,
                                     overwrite=args.overwrite, limit=args.limit,
                                     unlocated=args.unlocated)
    seconds = time.perf_counter() - began
    source = reader.record.get("source", {})
    stats = source.get("stats", {})
    summary = {
        "path": args.out,
        "encoding": source.get("encoding"),
        "tokenizer": source.get("tokenizer"),
        "chat_template": source.get("chat_template_origin", source.get("template")),
        "mask": source.get("mask"),
        "vocab_size": reader.vocab_size,
        "special_tokens": source.get("special_tokens"),
        "num_records": stats.get("records"),
        "num_sequences": reader.num_sequences,
        "num_tokens": reader.num_tokens,
        "learn_tokens": stats.get("learn_tokens"),
        "records_without_response": stats.get("records_without_response"),
        "records_unlocated": stats.get("records_unlocated"),
        "first_unlocated": (stats.get("unlocated") or [None])[0],
        "workers": args.workers,
        "executor": args.executor,
        "seconds": round(seconds, 3),
        "tokens_per_second": reader.num_tokens / seconds if seconds > 0 else None,
    }
    emit(summary, args.json)
    return 0
