"""``packlab tokenize CHAT.jsonl OUT``: chat JSONL to a spool with a real, offline tokenizer.

See :mod:`packlab.tokenize` for the chat template, the special-token ids and the mask.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from packlab.commands import emit

ENCODINGS = ("cl100k_base", "o200k_base")  # packlab.tokenize.ENCODINGS, without importing it


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "tokenize",
        help="tokenize a chat JSONL into a spool (bpe-openai, ChatML template, offline)",
        description="Tokenize chat JSONL ({\"messages\": [{\"role\", \"content\"}, ...]} per "
                    "line) into a spool_v1 directory with a ChatML-style template and a "
                    "response-only mask (assistant content and its <|im_end|>).",
    )
    parser.add_argument("jsonl", help="chat JSONL file")
    parser.add_argument("out", help="spool directory to create")
    parser.add_argument("--encoding", default="cl100k_base",
                        help=f"BPE encoding: {' or '.join(ENCODINGS)} (default cl100k_base)")
    parser.add_argument("--limit", type=int, default=None,
                        help="tokenize only the first N records")
    parser.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.sources.outputs import local_input, output
    from packlab.tokenize import tokenize_chat_jsonl

    began = time.perf_counter()
    with output(args.out, kind="spool", overwrite=args.overwrite) as local:  # OUT may be a URI
        reader = tokenize_chat_jsonl(local_input(args.jsonl, what="file"), local,
                                     encoding=args.encoding, overwrite=args.overwrite,
                                     limit=args.limit)
    seconds = time.perf_counter() - began
    source = reader.manifest.get("source", {})
    stats = source.get("stats", {})
    summary = {
        "path": args.out,
        "encoding": source.get("encoding"),
        "vocab_size": reader.vocab_size,
        "special_tokens": source.get("special_tokens"),
        "num_records": stats.get("records"),
        "num_sequences": reader.num_sequences,
        "num_tokens": reader.num_tokens,
        "learn_tokens": stats.get("learn_tokens"),
        "records_without_response": stats.get("records_without_response"),
        "seconds": round(seconds, 3),
        "tokens_per_second": reader.num_tokens / seconds if seconds > 0 else None,
    }
    emit(summary, args.json)
    return 0
