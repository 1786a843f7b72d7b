"""``packlab bench memory|latency|throughput|size PATH... [--json]``: honest measurements.

memory      open the dataset and read every bin once, in a fresh process: peak RSS, anon and
            file-backed RSS, Arrow pool, Python heap (a separate traced run)
latency     seeded random reads, each delivered inside its timer, p50/p90/p99 per bin; then,
            over the same bins, the Python floor (bins in RAM), memcpy and a raw pread
throughput  sequential scan tokens/s (Python floor and raw read beside it), DataLoader bins/s
            by workers (shuffled, THD collate)
size        bytes on disk, per token, padding waste, ratio to raw unpadded and token entropy

The same measurements notebook 05 makes (packlab.measure.latency, packlab.measure.throughput).

With one PATH, ``--json`` prints that PATH's object; with several, ``{"results": [...]}``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from packlab.commands import emit_json, emit_table, flatten
from packlab.errors import PacklabError

KINDS = ("memory", "latency", "throughput", "size")


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="measure memory, latency, throughput or size of shards",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kind", choices=KINDS)
    p.add_argument("paths", nargs="+", metavar="PATH", help="shards (files or shard directories)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--cache", choices=("warm", "cold"), default="warm",
                   help="latency/throughput: warm (after a full pass) or cold (pages dropped)")
    p.add_argument("--samples", type=int, default=1000, help="latency: random reads to time")
    p.add_argument("--seed", type=int, default=0, help="seed of the random indices")
    p.add_argument("--batch-size", type=int, default=1,
                   help="latency: bins per read (read_bins / __getitems__), timed per bin")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4],
                   help="throughput: DataLoader worker counts")
    p.add_argument("--via", choices=("auto", "reader", "dataset"), default="auto",
                   help="read through the shard reader or packlab.open_dataset (auto: dataset "
                        "when available)")
    p.add_argument("--no-tracemalloc", action="store_true",
                   help="memory: skip the separate tracemalloc run")
    p.set_defaults(run=run)


def measure_one(kind: str, path: str, args: argparse.Namespace) -> dict[str, Any]:
    from packlab import measure

    if kind == "memory":
        return measure.load_memory(path, via=args.via, tracemalloc=not args.no_tracemalloc)
    if kind == "latency":
        return measure.latency(path, samples=args.samples, seed=args.seed, cache=args.cache,
                               via=args.via, batch_size=args.batch_size)
    if kind == "throughput":
        scanned = measure.scan(path, cache=args.cache, via=args.via)
        loader = measure.dataloader(path, workers=args.workers, seed=args.seed, via=args.via)
        out = {"path": path, "cache": args.cache, "tokens_per_s": scanned["tokens_per_s"],
               "scan": scanned, "dataloader": loader}
        for n, row in loader["workers"].items():
            out[f"dataloader_bins_per_s_{n}_workers"] = row["bins_per_s"]
        return out
    return measure.size_report(path)


def run(args: argparse.Namespace) -> int:
    if args.samples <= 0:
        raise PacklabError(f"--samples must be positive, got {args.samples}")
    if args.batch_size <= 0:
        raise PacklabError(f"--batch-size must be positive, got {args.batch_size}")
    if any(n < 0 for n in args.workers):
        raise PacklabError(f"--workers must be >= 0, got {args.workers}")
    for path in args.paths:
        if not Path(path).exists():
            raise PacklabError(f"{path}: no such file or directory")
    results = [{"kind": args.kind, **measure_one(args.kind, path, args)} for path in args.paths]
    if args.json:
        emit_json(results[0] if len(results) == 1 else {"kind": args.kind, "results": results})
        return 0
    for i, result in enumerate(results):
        if i:
            print()
        emit_table(flatten(result))
    return 0
