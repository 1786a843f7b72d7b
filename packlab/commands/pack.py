"""Pack spools into shards of one format.

Without --split (one spool): plan the bins and write the shards straight into OUT, with
OUT/dataset.json written first (as "writing": every reader refuses OUT meanwhile) and finished
last. With --split (or several spools): write an output layout (splits/ of relative links,
runs/RUN_HASH/datasets/NAME/HASH/ holding the shards, and blend.json, itself written as
"writing" first).

Interrupted (Ctrl-C, a kill, a lost machine), the same command finishes the job: every shard
whose receipt still vouches for it is kept, the rest written. OUT may be a URI (s3://...): the
output is written in a local staging folder and uploaded when whole (dataset.json or
blend.json last); a packed_index output takes its spool along (OUT/spool/NAME/). SPOOL may be
a URI too (fetched once into the verified cache).
"""

from __future__ import annotations

import argparse
from typing import Any

from packlab.commands import (
    OUTPUT_HELP,
    add_executor_options,
    emit_json,
    emit_table,
    format_choices,
    nonnegative_int,
    pack_size_int,
    positive_int,
    warn,
)

SHOWN = 10  # shard lines printed (the first ones and the last)
BINS_PER_SHARD = 8192
LOSS_WARNING = 0.01  # warn when over-long sequences lose this share of the spool's tokens


def add_parser(sub: Any) -> None:
    from packlab.packing import ALGORITHMS, DEFAULT_ALGORITHM

    p = sub.add_parser(
        "pack", help="pack spools into shards (or into a split/blend output layout)",
        description=__doc__)
    p.add_argument("spool", nargs="+", metavar="SPOOL",
                   help="spool directory (spool_v1), local or a URI; several to blend")
    p.add_argument("out", metavar="OUT", help=f"output directory: {OUTPUT_HELP}")
    p.add_argument("--format", required=True, help=f"shard format: {format_choices()}")
    p.add_argument("--pack-size", type=pack_size_int, required=True, help="tokens per bin")
    p.add_argument("--algorithm", default=DEFAULT_ALGORITHM,
                   help=f"packing algorithm: {', '.join(sorted(ALGORITHMS))}")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="packing and split seed")
    p.add_argument("--overlong", choices=("truncate", "drop"), default="truncate",
                   help="what to do with sequences longer than --pack-size")
    p.add_argument("--bins-per-shard", type=positive_int, default=BINS_PER_SHARD,
                   help="bins in each shard file; the last shard holds the rest")
    add_executor_options(p, workers=2, jobs="shard writers")
    p.add_argument("--split", help="write the layout with these splits, e.g. "
                                   "train=0.98,valid=0.01,test=0.01 (fractions of sequences, "
                                   "each in [0, 1], summing to 1; default: no splits, one "
                                   "output)")
    p.add_argument("--weights", help="blend weights, one per spool, e.g. 0.7,0.3 (relative; "
                                     "default: each spool's share of the bins)")
    p.add_argument("--names", help="dataset names, one per spool (default: folder names)")
    p.add_argument("--verify", choices=("receipt", "full"), default="receipt",
                   help="reruns: trust a receipt's size+checksum, or also validate every bin "
                        "before keeping a shard")
    p.add_argument("--overwrite", action="store_true",
                   help="replace OUT when it is a packlab output of the same kind (rewrite "
                        "every shard); anything else at OUT is refused")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(run=run, resumable=True)


def run(args: argparse.Namespace) -> int:
    from packlab.formats import get_format
    from packlab.packing import check_algorithm
    from packlab.pipeline.layout.splits import parse_fractions, parse_weights
    from packlab.sources.outputs import local_input, output, stage_spools
    from packlab.storage.location import is_remote

    get_format(args.format)  # an unknown format fails before any work
    check_algorithm(args.algorithm)
    layout = args.split is not None or len(args.spool) > 1 or bool(args.weights or args.names)
    if layout:  # bad --split/--weights fail before any work
        parse_fractions(args.split)
        parse_weights(args.weights, len(args.spool))
    spools = [local_input(s) for s in args.spool]
    planned = plan_within_limits(args, spools)  # the format's bounds, before any work
    needs_spool = get_format(args.format).Writer.NEEDS_SPOOL
    with output(args.out, kind="layout" if layout else "dataset", overwrite=args.overwrite,
                resume=True) as local:
        if needs_spool and is_remote(args.out):  # the spool travels along
            spools = stage_spools(spools, local)
        result = run_layout(args, spools, local) if layout else \
            run_flat(args, spools, local, planned[0])
    plans = [p["plan"] for p in result["parts"] if p["plan"]] if layout else [result[0]]
    wheres = [f"{p['name']}/{p['split']}: " for p in result["parts"] if p["plan"]] \
        if layout else [""]
    warnings = [message for plan, where in zip(plans, wheres, strict=True)
                if (message := loss_warning(plan, where))]
    code = show_layout(args, result, warnings) if layout else show_flat(args, *result, warnings)
    for message in warnings:  # after the output: a failure stays one line
        warn("pack", message)
    return code


def plan_within_limits(args: argparse.Namespace, spools: list[Any]) -> list[tuple[Any, Any]]:
    """Each spool packed (from its lengths: cheap) and the plan checked against the format's
    bounds (:meth:`~packlab.formats.shared.base.FormatFacts.plan_limits`) before anything is written:
    a plan it cannot write is refused, one it should say something about is said now."""
    from packlab.formats import get_format
    from packlab.packing import pack
    from packlab.spool import SpoolReader

    planned = []
    for spool in spools:
        reader = SpoolReader(spool)
        planned.append(pack(reader.lengths, args.pack_size, algorithm=args.algorithm,
                            seed=args.seed, overlong=args.overlong))
    notes = get_format(args.format).Writer.plan_limits(
        pack_size=args.pack_size, num_bins=sum(a.num_bins for a, _ in planned),
        num_tokens=sum(int(r.num_tokens) for _, r in planned), where=args.out)
    for note in notes:
        warn("pack", note)
    return planned


def loss_warning(report: dict[str, Any], where: str = "") -> str | None:
    """What to say when over-long sequences lose a large share of the spool's tokens (said
    once the command has succeeded: a failure stays one line)."""
    lost = int(report.get("truncated_tokens", 0)) + int(report.get("dropped_tokens", 0))
    total = int(report.get("spool_tokens") or 0)
    if not total or lost / total < LOSS_WARNING:
        return None
    verb = "truncates" if report.get("truncated") else "drops"
    count = report.get("truncated") or report.get("dropped")
    return (f"{where}--pack-size {report['pack_size']} {verb} {count:,} over-long "
            f"sequence(s): {lost:,} tokens, {lost / total:.1%} of the spool's (a larger "
            "--pack-size keeps them)")


def run_flat(args: argparse.Namespace, spools: list[Any], out: Any, planned: tuple[Any, Any]
             ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    from packlab.pipeline.shards import write_shards
    from packlab.spool import SpoolReader

    spool = SpoolReader(spools[0])
    assignment, report = planned
    receipts = write_shards(spool, assignment, out, format=args.format,
                            bins_per_shard=args.bins_per_shard, workers=args.workers,
                            existing="overwrite" if args.overwrite else "refuse",
                            executor=args.executor, address=args.ray_address)
    return report.to_dict(), receipts


def show_flat(args: argparse.Namespace, plan: dict[str, Any],
              receipts: list[dict[str, Any]], warnings: list[str]) -> int:
    written = {
        "out": args.out,
        "format": args.format,
        "num_shards": len(receipts),
        "num_bins": sum(r["num_bins"] for r in receipts),
        "num_tokens": sum(r["num_tokens"] for r in receipts),
        "bytes": sum(r["bytes"] for r in receipts),
        "reused": sum(bool(r.get("reused")) for r in receipts),  # kept from an interrupted run
        "written": sum(not r.get("reused") for r in receipts),
    }
    if args.json:
        emit_json({"plan": plan, "written": written, "shards": receipts, "warnings": warnings})
        return 0
    emit_table(plan)
    print()
    emit_table(written)
    print()
    shown = receipts if len(receipts) <= SHOWN else receipts[: SHOWN - 1]
    for r in shown:
        print(shard_line(r))
    if len(shown) < len(receipts):
        print(f"... {len(receipts) - len(shown) - 1} more ...\n{shard_line(receipts[-1])}")
    return 0


def shard_line(receipt: dict[str, Any]) -> str:
    """One shard as ``pack`` lists it; ``(kept)``: an interrupted run had written it whole."""
    kept = "  (kept)" if receipt.get("reused") else ""
    return (f"{receipt['shard']}  bins {receipt['bins'][0]}..{receipt['bins'][1] - 1}  "
            f"{receipt['num_tokens']:,} tokens  {receipt['bytes']:,} B{kept}")


def run_layout(args: argparse.Namespace, spools: list[Any], out: Any) -> dict[str, Any]:
    from packlab.pipeline.layout import build_layout

    names = args.names
    if names is None:  # the given spools' folder names, not their cached or staged copies'
        from packlab.pipeline.layout import dataset_names

        names = dataset_names([s.rstrip("/").rsplit("/", 1)[-1] for s in args.spool])
    result = build_layout(
        spools, out, format=args.format, pack_size=args.pack_size,
        splits=args.split, weights=args.weights, names=names, algorithm=args.algorithm,
        seed=args.seed, overlong=args.overlong, bins_per_shard=args.bins_per_shard,
        workers=args.workers, reuse=not args.overwrite, verify=args.verify,
        executor=args.executor, address=args.ray_address)
    return {**result, "out": args.out}


def show_layout(args: argparse.Namespace, result: dict[str, Any], warnings: list[str]) -> int:
    if args.json:
        emit_json({**result, "warnings": warnings})
        return 0
    emit_table({k: result[k] for k in ("out", "run_hash", "format", "num_shards", "reused",
                                       "written")})
    print()
    for split, row in result["splits"].items():
        dropped = f"  ({row['dropped_sequences']:,} dropped)" if row["dropped_sequences"] else ""
        print(f"splits/{split}/  {row['num_shards']} shards  {row['num_bins']:,} bins  "
              f"{row['num_tokens']:,} tokens  {row['num_sequences']:,} sequences{dropped}")
    for part in result["parts"]:
        plan = part["plan"] or {}
        eff = f"  efficiency {plan['efficiency']:.4f}" if plan else "  (empty)"
        print(f"  {part['name']}/{part['split']}  {part['config_hash']}  "
              f"reused {part['reused']}  written {part['written']}{eff}")
    if result["other_runs"]:
        print(f"runs/ also holds {len(result['other_runs'])} other run(s), not in blend.json: "
              f"{', '.join(result['other_runs'])}")
    return 0
