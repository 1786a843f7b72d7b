"""``packlab pack SPOOL OUT --format F --pack-size P``: plan the bins, then write the shards."""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit_json, emit_table

SHOWN = 10  # shard lines printed (the first ones and the last)


def add_parser(sub: Any) -> None:
    from packlab.packing import DEFAULT_ALGORITHM

    p = sub.add_parser("pack", help="pack a spool into shards of one format",
                       description="Plan bins from the spool's lengths, then write them as "
                                   "shards (in parallel), each with a JSON receipt.")
    p.add_argument("spool", help="spool directory (spool_v1)")
    p.add_argument("out", help="output directory for the shards")
    p.add_argument("--format", required=True, help="shard format (see `packlab validate -h`)")
    p.add_argument("--pack-size", type=int, required=True, help="tokens per bin")
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM, help="packing algorithm")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="what to do with sequences longer than --pack-size")
    p.add_argument("--bins-per-shard", type=int, default=8192)
    p.add_argument("--workers", type=int, default=2, help="parallel shard writers")
    p.add_argument("--overwrite", action="store_true", help="replace shards already in OUT")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.errors import PacklabError
    from packlab.formats import get_format
    from packlab.packing import pack
    from packlab.pipeline import write_shards
    from packlab.spool import SpoolReader

    if args.workers < 1:
        raise PacklabError(f"--workers must be >= 1, got {args.workers}")
    get_format(args.format)  # an unknown format fails before any work
    spool = SpoolReader(args.spool)
    assignment, report = pack(spool.lengths, args.pack_size, algorithm=args.algorithm,
                              seed=args.seed, overlong=args.overlong)
    receipts = write_shards(spool, assignment, args.out, format=args.format,
                            bins_per_shard=args.bins_per_shard, workers=args.workers,
                            overwrite=args.overwrite)
    plan = report.to_dict()
    written = {
        "out": args.out,
        "format": args.format,
        "num_shards": len(receipts),
        "num_bins": sum(r["num_bins"] for r in receipts),
        "num_tokens": sum(r["num_tokens"] for r in receipts),
        "bytes": sum(r["bytes"] for r in receipts),
    }
    if args.json:
        emit_json({"plan": plan, "written": written, "shards": receipts})
        return 0
    emit_table(plan)
    print()
    emit_table(written)
    print()
    shown = receipts if len(receipts) <= SHOWN else receipts[: SHOWN - 1]
    for r in shown:
        print(f"{r['shard']}  bins {r['bins'][0]}..{r['bins'][1] - 1}  "
              f"{r['num_tokens']:,} tokens  {r['bytes']:,} B")
    if len(shown) < len(receipts):
        last = receipts[-1]
        print(f"... {len(receipts) - len(shown) - 1} more ...\n{last['shard']}  bins "
              f"{last['bins'][0]}..{last['bins'][1] - 1}  {last['num_tokens']:,} tokens  "
              f"{last['bytes']:,} B")
    return 0
