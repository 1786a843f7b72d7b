"""``packlab pack SPOOL [SPOOL ...] OUT --format F --pack-size P [--split ...]``.

Without ``--split`` (one spool): plan the bins and write the shards straight into OUT, as
before. With ``--split`` (or several spools): write the output layout of seed 001 (``splits/``
of relative links, ``runs/{run_hash}/datasets/{name}/{hash}/``, ``blend.json``); a rerun keeps
every shard whose receipt still vouches for it and writes only what is missing or damaged.
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import emit_json, emit_table

SHOWN = 10  # shard lines printed (the first ones and the last)


def add_parser(sub: Any) -> None:
    from packlab.packing import DEFAULT_ALGORITHM

    p = sub.add_parser(
        "pack", help="pack spools into shards (or into a split/blend output layout)",
        description="Plan bins from the spool's lengths, then write them as shards (in "
                    "parallel), each with a JSON receipt. With --split (or several spools), "
                    "write the output layout: splits/{train,valid,test}/ of relative links, "
                    "runs/{run_hash}/datasets/{name}/{hash}/ shards and blend.json; sequences "
                    "are split by a seeded hash of their content before packing; a rerun "
                    "reuses every shard whose receipt validates.")
    p.add_argument("spool", nargs="+", help="spool directory (spool_v1); several to blend")
    p.add_argument("out", help="output directory")
    p.add_argument("--format", required=True, help="shard format (see `packlab validate -h`)")
    p.add_argument("--pack-size", type=int, required=True, help="tokens per bin")
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM, help="packing algorithm")
    p.add_argument("--seed", type=int, default=0, help="packing and split seed")
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="what to do with sequences longer than --pack-size")
    p.add_argument("--bins-per-shard", type=int, default=8192)
    p.add_argument("--workers", type=int, default=2, help="parallel shard writers")
    p.add_argument("--executor", choices=("process", "ray"), default="process",
                   help="run shard writes in a local process pool or as Ray tasks")
    p.add_argument("--ray-address", default=None,
                   help="with --executor ray: join this cluster (default: start a local one)")
    p.add_argument("--split", help="write the layout with these splits, e.g. "
                                   "train=0.98,valid=0.01,test=0.01 (fractions of sequences)")
    p.add_argument("--weights", help="blend weights, one per spool, e.g. 0.7,0.3 (default: "
                                     "each spool's share of the bins)")
    p.add_argument("--names", help="dataset names, one per spool (default: folder names)")
    p.add_argument("--verify", choices=("receipt", "full"), default="receipt",
                   help="layout reruns: trust a receipt's size+checksum, or also validate "
                        "every bin before reusing a shard")
    p.add_argument("--overwrite", action="store_true",
                   help="replace shards already in OUT (layout: rewrite every shard)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from packlab.errors import PacklabError
    from packlab.formats import get_format

    if args.workers < 1:
        raise PacklabError(f"--workers must be >= 1, got {args.workers}")
    get_format(args.format)  # an unknown format fails before any work
    if args.split is not None or len(args.spool) > 1 or args.weights or args.names:
        return run_layout(args)
    return run_flat(args)


def run_flat(args: argparse.Namespace) -> int:
    from packlab.packing import pack
    from packlab.pipeline.shards import write_shards
    from packlab.spool import SpoolReader

    spool = SpoolReader(args.spool[0])
    assignment, report = pack(spool.lengths, args.pack_size, algorithm=args.algorithm,
                              seed=args.seed, overlong=args.overlong)
    receipts = write_shards(spool, assignment, args.out, format=args.format,
                            bins_per_shard=args.bins_per_shard, workers=args.workers,
                            existing="overwrite" if args.overwrite else "refuse",
                            executor=args.executor,
                            address=args.ray_address)
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


def run_layout(args: argparse.Namespace) -> int:
    from packlab.layout import build_layout

    result = build_layout(
        args.spool, args.out, format=args.format, pack_size=args.pack_size,
        splits=args.split, weights=args.weights, names=args.names, algorithm=args.algorithm,
        seed=args.seed, overlong=args.overlong, bins_per_shard=args.bins_per_shard,
        workers=args.workers, reuse=not args.overwrite, verify=args.verify,
        executor=args.executor, address=args.ray_address)
    if args.json:
        emit_json(result)
        return 0
    emit_table({k: result[k] for k in ("out", "run_hash", "format", "num_shards", "reused",
                                       "written")})
    print()
    for split, row in result["splits"].items():
        print(f"splits/{split}/  {row['num_shards']} shards  {row['num_bins']:,} bins  "
              f"{row['num_tokens']:,} tokens  {row['num_sequences']:,} sequences")
    for part in result["parts"]:
        plan = part["plan"] or {}
        eff = f"  efficiency {plan['efficiency']:.4f}" if plan else "  (empty)"
        print(f"  {part['name']}/{part['split']}  {part['config_hash']}  "
              f"reused {part['reused']}  written {part['written']}{eff}")
    if result["other_runs"]:
        print(f"runs/ also holds {len(result['other_runs'])} other run(s), not in blend.json: "
              f"{', '.join(result['other_runs'])}")
    return 0
