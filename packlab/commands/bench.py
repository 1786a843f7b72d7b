"""Measure a dataset honestly: memory, latency, throughput or size.

KIND is one of:

  memory      open the dataset and read every bin once, in a fresh process: peak RSS,
              anonymous and file-backed RSS, Arrow pool, Python heap (a separate traced run)
  latency     seeded random reads, each delivered inside its timer, p50/p90/p99 per bin;
              then, over the same bins, the Python floor (bins in RAM), memcpy and a raw pread
  throughput  a sequential scan in tokens/s (Python floor and raw read beside it), then a
              torch DataLoader in bins/s for each --workers count, over the first --max-bins
              bins in --sampler order, through packlab's THD collate
  size        bytes on disk, per token, padding waste, ratio to raw unpadded and token entropy

The same measurements notebook 05 makes. The defaults finish in seconds on a small output.

PATH is any dataset path (a shard, a directory of shards, an output layout with --split,
ROOT/splits/NAME, a glob, a run folder; local or s3://). Memory, latency and throughput read
it through the dataset (--via dataset, what packlab.open_dataset returns) or, for one shard,
its reader, from local files (page-cache states and pread floors are local things): a dataset
on object storage is measured on its verified copy in the download cache, and the result says
so ("measured"); size counts the objects where they are. With one PATH, --json prints that
PATH's object; with several, {"kind": KIND, "results": [...]}. A progress bar counts the steps
(never the timed reads: a bar drawn inside a timing loop would be measured too).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from packlab.commands import (
    DATASET_HELP,
    emit_json,
    emit_table,
    flatten,
    nonnegative_int,
    positive_int,
)
from packlab.errors import PacklabError

KINDS = ("memory", "latency", "throughput", "size")
LOADER_BINS = 2000  # packlab.lab.measure.throughput.LOADER_BINS, without importing the lab


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("bench", help="measure memory, latency, throughput or size of shards",
                              description=__doc__)
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=f"one of {', '.join(KINDS)}")
    p.add_argument("paths", nargs="+", metavar="PATH", help=DATASET_HELP)
    p.add_argument("--split", help="this split of an output layout (each PATH a layout root; "
                                   "default: PATH is one dataset)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.add_argument("--cache", choices=("warm", "cold"), default="warm",
                   help="latency/throughput: warm (after a full pass) or cold (pages dropped)")
    p.add_argument("--samples", type=positive_int, default=1000,
                   help="latency: random reads to time")
    p.add_argument("--seed", type=nonnegative_int, default=0, help="seed of the random indices")
    p.add_argument("--batch-size", type=positive_int, default=1,
                   help="latency: bins per read (read_bins / __getitems__), timed per bin")
    p.add_argument("--workers", type=nonnegative_int, nargs="+", default=[0, 2], metavar="N",
                   help="throughput: DataLoader worker counts")
    p.add_argument("--max-bins", type=nonnegative_int, default=LOADER_BINS, metavar="N",
                   help="throughput: bins the DataLoader reads per worker count (0: every bin)")
    p.add_argument("--sampler", choices=("auto", "shuffle", "block"), default="auto",
                   help="throughput: the DataLoader's order: a uniform shuffle, a block shuffle "
                        "(whole row groups in turn), or auto: block where the shards read in "
                        "row groups (Parquet), uniform elsewhere")
    p.add_argument("--via", choices=("auto", "reader", "dataset"), default="auto",
                   help="read through the shard reader or the dataset (auto: the dataset)")
    p.add_argument("--no-tracemalloc", action="store_true",
                   help="memory: skip the separate tracemalloc run")
    p.set_defaults(run=run)


def steps(kind: str, args: argparse.Namespace) -> int:
    """The steps of one PATH's measurement the progress bar counts: a throughput measurement
    is a scan, then one DataLoader epoch per worker count; the others are one step."""
    return 1 + len(args.workers) if kind == "throughput" else 1


def measure_one(kind: str, path: str, args: argparse.Namespace, step: Any) -> dict[str, Any]:
    """One PATH's measurement; ``step()`` after each of its :func:`steps`."""
    from packlab.lab import measure

    if kind == "memory":
        out = measure.load_memory(path, via=args.via, tracemalloc=not args.no_tracemalloc)
    elif kind == "latency":
        out = measure.latency(path, samples=args.samples, seed=args.seed, cache=args.cache,
                              via=args.via, batch_size=args.batch_size)
    elif kind == "size":
        out = measure.size_report(path, split=args.split)
    else:
        return throughput(path, args, step)
    step()
    return out


def throughput(path: str, args: argparse.Namespace, step: Any) -> dict[str, Any]:
    from packlab.lab import measure

    scanned = measure.scan(path, cache=args.cache, via=args.via)
    step()
    loader: dict[str, Any] = {}
    for n in args.workers:  # one epoch per worker count, a step each
        one = measure.dataloader(path, workers=[n], seed=args.seed, via=args.via,
                                 max_bins=args.max_bins or None, sampler=args.sampler)
        loader = {**one, "workers": {**loader.get("workers", {}), **one["workers"]}}
        step()
    out = {"path": path, "cache": args.cache, "tokens_per_s": scanned["tokens_per_s"],
           "scan": scanned, "dataloader": loader}
    for n, row in loader.get("workers", {}).items():
        out[f"dataloader_bins_per_s_{n}_workers"] = row["bins_per_s"]
    return out


def dataset_path(path: str, split: str | None, kind: str) -> str:
    """One string naming the dataset to measure (the measurements run in fresh processes, by
    path): a layout's split is ``ROOT/splits/NAME``, which resolves locally (its links) and on
    object storage (through ``blend.json``) alike. Resolved once here, so a bad PATH fails
    before any measurement starts."""
    from packlab.sources.resolve import resolve_source

    source = resolve_source(path, split=split)
    if kind == "size":  # measured here, not in a fresh process: the split goes as it is
        return path
    if split is not None and source.kind == "run":
        raise PacklabError(f"{path}: --split of a run folder cannot be measured as one path: "
                           "name the layout root, or one output under the run folder")
    if split is not None:
        path = f"{source.layout}/splits/{split}"
    source.only_split("measure")  # reads are of one dataset: never several splits at once
    return path


def run(args: argparse.Namespace) -> int:
    import tempfile

    from packlab.progress import progress_bar
    from packlab.sources.outputs import local_copy
    from packlab.sources.resolve import resolve_source
    from packlab.storage.files import remove
    from packlab.storage.location import is_remote

    paths = [dataset_path(p, args.split, args.kind) for p in args.paths]
    results = []
    with progress_bar(total=len(paths) * steps(args.kind, args), desc=f"bench {args.kind}",
                      unit="step") as bar:
        def step() -> None:
            bar.update(1)

        for path in paths:
            if args.kind == "size" or not is_remote(path):
                results.append({"kind": args.kind, **measure_one(args.kind, path, args, step)})
                continue
            # reads are measured on local files (page cache, pread floors): the dataset's
            # verified copy in the download cache, said so in the result
            folder = Path(tempfile.mkdtemp(prefix="packlab-bench-"))
            try:
                copy = local_copy(resolve_source(path), folder / "dataset")
                row = measure_one(args.kind, str(copy), args, step)
            finally:
                remove(folder)
            results.append({"kind": args.kind, **row, "path": path,
                            "measured": "the verified local copy (download cache)"})
    if args.json:
        emit_json(results[0] if len(results) == 1 else {"kind": args.kind, "results": results})
        return 0
    for i, result in enumerate(results):
        if i:
            print()
        emit_table(flatten(result))
    return 0
