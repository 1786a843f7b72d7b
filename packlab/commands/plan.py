"""``packlab plan SPOOL --pack-size P``: the packing report of a spool, nothing written.

Packing reads only ``lengths.bin``, so trying pack sizes and algorithms costs seconds even for
a 13M-sequence spool: plan first, then ``packlab pack`` with the choice.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit


def add_parser(sub: Any) -> None:
    from packlab import packers  # noqa: F401  (registers the algorithms)
    from packlab.packing import ALGORITHMS, DEFAULT_ALGORITHM

    p = sub.add_parser(
        "plan",
        help="pack a spool's lengths and report bins and efficiency (writes nothing)",
        description="Assign the spool's sequences to bins of at most --pack-size tokens and "
        "report: bins, the lower bound ceil(tokens / pack size), efficiency, sequences per "
        "bin, over-long sequences truncated or dropped, and the time it took.",
    )
    p.add_argument("spool", help="spool directory (spool_v1)")
    p.add_argument("--pack-size", type=int, required=True, help="tokens per bin")
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM,
                   help=f"one of {', '.join(sorted(ALGORITHMS))} (default {DEFAULT_ALGORITHM})")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffling algorithms")
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="sequences longer than --pack-size: truncate to it, or drop them")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.errors import PacklabError
    from packlab.packing import check_algorithm, check_pack_size, pack
    from packlab.spool import SpoolReader

    check_pack_size(args.pack_size)  # bad arguments fail before the spool is opened
    check_algorithm(args.algorithm)
    spool = SpoolReader(args.spool)
    try:
        _, report = pack(spool.lengths, args.pack_size, algorithm=args.algorithm,
                         seed=args.seed, overlong=args.overlong)
    except PacklabError as exc:
        raise PacklabError(f"{spool.path / 'lengths.bin'}: {exc}") from None
    plan = {"spool": str(spool.path), **report.to_dict()}
    emit(plan, args.json)
    return 0
