"""``packlab export SPOOL OUT``: a spool as a Megatron-core ``.bin/.idx`` prefix, one document
per conversation. It is what Megatron-LM's ``SFTDataset`` (pull request #5017, open) reads;
the masks in packlab's sidecar beside it, from the spool or derived from the chat role markers
(``--chat-markers``). The work: :func:`packlab.sources.export.export`."""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit
from packlab.errors import PacklabError

DESCRIPTION = ("Write a spool (or a Megatron prefix) as the prefix OUT: OUT.bin, OUT.idx "
               "(megatron-core's IndexedDataset, one document per sequence), packlab's mask "
               "sidecar OUT.masks.bin and record OUT.spool.json. The prefix reads back as a "
               "spool wherever a spool is read.")

# what to train on, as Megatron-LM's SFTDatasetConfig flags (and packlab's end of turn)
TRAIN_FLAGS = {
    "--no-thinking-traces": "do not train on reasoning (train_on_thinking_traces off)",
    "--no-tool-calls": "do not train on tool calls (train_on_tool_calls off)",
    "--all-tokens": "train on every token (train_on_assistant_responses_only off)",
    "--end-of-turn": "also train the end marker closing each assistant turn, as packlab's "
                     "ChatML masks do",
}


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser("export", description=DESCRIPTION, help="write a spool as a "
                                   "Megatron .bin/.idx prefix (the input of Megatron-LM's "
                                   "proposed SFTDataset, an open pull request)")
    parser.add_argument("src", help="a spool folder (local or a URI) or a local Megatron prefix")
    parser.add_argument("out", help="the prefix to write, without suffix (a local path or a URI)")
    parser.add_argument("--chat-markers", metavar="TOKENIZER", default=None,
                        help="derive the masks from the chat role markers, tokenized with this "
                             "encoding (cl100k_base, o200k_base) or Hugging Face tokenizer, as "
                             "Megatron-LM's SFTDataset derives them (Nemotron-3's markers; "
                             "default: the masks of the spool or of the prefix's sidecar)")
    parser.add_argument("--marker", action="append", default=[], metavar="NAME=TEXT",
                        help="replace one marker string of packlab.spool.masks.ChatMarkers "
                             "(Nemotron-3's), e.g. end='<|im_end|>\\n' (default: none replaced)")
    for flag, text in TRAIN_FLAGS.items():
        parser.add_argument(flag, action="store_true", help=text)
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if packlab exported it (nothing else is replaced)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.sources.export import export

    record = export(args.src, args.out, markers=_markers(args), overwrite=args.overwrite)
    shown = {key: record[key] for key in ("path", "num_sequences", "num_tokens", "tokens_dtype",
                                          "vocab_size")}
    emit({**shown, "masks": record["exported_from"]["masks"],
          "files": sorted(record["files"])}, args.json)
    return 0


def _markers(args: argparse.Namespace) -> Any:
    flags = args.marker or args.no_thinking_traces or args.no_tool_calls or args.all_tokens \
        or args.end_of_turn
    if args.chat_markers is None:
        if flags:
            raise PacklabError("--marker, --no-thinking-traces, --no-tool-calls, --all-tokens "
                               "and --end-of-turn need --chat-markers TOKENIZER")
        return None
    from packlab.spool.masks import MARKERS, ChatMarkers
    from packlab.tokenize import encoder_spec, marker_encoder

    strings = {}
    for item in args.marker:
        name, sep, text = item.partition("=")
        if not sep or name not in MARKERS:
            raise PacklabError(f"--marker {item}: NAME=TEXT with NAME one of "
                               f"{', '.join(MARKERS)}")
        strings[name] = text.encode().decode("unicode_escape")  # "\n" as a newline
    from packlab.commands.tokenize import ENCODINGS

    known = args.chat_markers in ENCODINGS
    spec = encoder_spec(encoding=args.chat_markers) if known else \
        encoder_spec(tokenizer=args.chat_markers)
    markers = ChatMarkers(**strings, train_on_assistant_responses_only=not args.all_tokens,
                          train_on_thinking_traces=not (args.no_thinking_traces
                                                        or args.all_tokens),
                          train_on_tool_calls=not (args.no_tool_calls or args.all_tokens),
                          train_on_end_of_turn=args.end_of_turn)
    return markers.tokenized(marker_encoder(spec))
