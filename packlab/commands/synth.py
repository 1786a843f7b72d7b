"""Write a synthetic spool, seeded and streamed.

OUT is a local folder or a URI (written locally, then uploaded: record last). --overwrite
replaces a spool only (never another kind of file or folder), and never one that packed_index
shards still read.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from packlab.commands import OUTPUT_HELP, emit, nonnegative_int, positive_int
from packlab.spool.stats import spool_bytes
from packlab.spool.synth import PROFILES


def add_parser(subparsers: Any) -> None:
    profiles = "; ".join(f"{p.name}: {p.description}" for p in PROFILES.values())
    parser = subparsers.add_parser(
        "synth",
        help="write a synthetic spool (seeded, streamed)",
        description=f"{__doc__}\nProfiles: {profiles}.",
    )
    parser.add_argument("out", metavar="OUT", help=f"spool directory to create: {OUTPUT_HELP}")
    parser.add_argument("--num-sequences", "-n", type=positive_int, required=True,
                        help="number of sequences (positive)")
    parser.add_argument("--profile", default="chat", choices=sorted(PROFILES),
                        help="length / structure / token profile")
    parser.add_argument("--vocab-size", type=positive_int, default=None,
                        help="vocabulary size (default: the profile's, 131072 for chat)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="seed")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace OUT if it is a spool (nothing else is replaced)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.sources.outputs import output
    from packlab.spool.synth import synthesize

    began = time.perf_counter()
    with output(args.out, kind="spool", overwrite=args.overwrite) as local:
        reader = synthesize(
            local,
            num_sequences=args.num_sequences,
            profile=args.profile,
            vocab_size=args.vocab_size,
            seed=args.seed,
            overwrite=args.overwrite,
            show_progress=True,
        )
        sizes = spool_bytes(reader)
    seconds = time.perf_counter() - began
    summary = {
        "path": args.out,
        "profile": args.profile,
        "seed": args.seed,
        "vocab_size": reader.vocab_size,
        "num_sequences": reader.num_sequences,
        "num_tokens": reader.num_tokens,
        "bytes_on_disk": sum(sizes.values()),
        "seconds": round(seconds, 3),
        "tokens_per_second": reader.num_tokens / seconds if seconds > 0 else None,
    }
    emit(summary, args.json)
    return 0
