"""Report how a spool would pack, writing nothing.

Assign the spool's sequences to bins of at most --pack-size tokens and report: bins, the lower
bound ceil(tokens / pack size), efficiency, sequences per bin, over-long sequences truncated
or dropped, and the time it took. Packing reads only the spool's lengths, so trying pack sizes
and algorithms costs seconds even for a 13M-sequence spool: plan first, then packlab pack with
the choice. When over-long sequences lose 1% or more of the spool's tokens, a warning line on
stderr says how many (--json also lists it under "warnings"). SPOOL may be a URI (s3://...).
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit, nonnegative_int, pack_size_int, warn


def add_parser(sub: Any) -> None:
    from packlab.packing import ALGORITHMS, DEFAULT_ALGORITHM
    from packlab.packing import algorithms as packers  # noqa: F401  (registers the algorithms)

    p = sub.add_parser(
        "plan",
        help="pack a spool's lengths and report bins and efficiency (writes nothing)",
        description=__doc__)
    p.add_argument("spool", metavar="SPOOL", help="spool directory (spool_v1), local or a URI")
    p.add_argument("--pack-size", type=pack_size_int, required=True, help="tokens per bin")
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM,
                   help=f"packing algorithm: {', '.join(sorted(ALGORITHMS))}")
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="seed of the shuffling algorithms")
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="sequences longer than --pack-size: truncate to it, or drop them")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.commands.pack import loss_warning
    from packlab.errors import PacklabError
    from packlab.packing import check_algorithm, pack
    from packlab.sources.outputs import local_input
    from packlab.spool import SpoolReader

    check_algorithm(args.algorithm)  # bad arguments fail before the spool is opened
    spool = SpoolReader(local_input(args.spool))
    try:
        _, report = pack(spool.lengths, args.pack_size, algorithm=args.algorithm,
                         seed=args.seed, overlong=args.overlong)
    except PacklabError as exc:
        raise PacklabError(f"{spool.path / 'lengths.bin'}: {exc}") from None
    plan = {"spool": args.spool, **report.to_dict()}
    lost = plan["truncated_tokens"] + plan["dropped_tokens"]
    plan["lost_token_fraction"] = lost / plan["spool_tokens"] if plan["spool_tokens"] else 0.0
    message = loss_warning(plan)
    plan["warnings"] = [message] if message else []
    emit(plan if args.json else {k: v for k, v in plan.items() if k != "warnings"}, args.json)
    if message:
        warn("plan", message)
    return 0
