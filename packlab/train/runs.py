"""Training from every format, each in a fresh process, and what the runs say side by side.

:func:`training_job` is the job a fresh process runs (through :mod:`packlab.measure.harness`,
so its peak RSS is its own): open the dataset (a format that loads everything pays it here),
then train the same model with the same sampler for each DataLoader worker count.
:func:`train_every_format` runs it once per format. Then:

- :func:`compare_curves`: are the loss curves identical bit for bit across formats and worker
  counts, and if not, the first step that differs and whether its batch differed too;
- :func:`step_rows`: per format and worker count, the startup (open + first batch), the
  steady step time, data wait, compute, the data-wait share of the step, and peak memory;
- :func:`step_time_spread`: the slowest format's steady step time over the fastest's, per
  worker count (the RFC: "storage format does not change step time").
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from packlab.errors import PacklabError
from packlab.measure.harness import run_job
from packlab.samplers import BlockShuffleSampler, ShuffleSampler
from packlab.sources import open_dataset
from packlab.train.batch import make_collator
from packlab.train.loop import train
from packlab.train.model import ModelConfig


def make_sampler(num_items: int, *, seed: int = 0, block_size: int | None = None
                 ) -> ShuffleSampler | BlockShuffleSampler:
    """The sampler every format trains with: a uniform shuffle, or (``block_size``) a block
    shuffle over equal blocks. Never one derived from a format (Parquet's row groups): the
    order would then differ by format, and so would the curves."""
    if block_size is None:
        return ShuffleSampler(num_items, seed=seed)
    return BlockShuffleSampler(num_items, block_size=block_size, seed=seed)


def training_job(
    path: str,
    *,
    model: dict[str, Any],
    steps: int,
    batch_size: int,
    workers: Sequence[int] = (0,),
    sampler_seed: int = 0,
    block_size: int | None = None,
    collate_style: str = "packlab",
    lr: float = 1e-3,
    threads: int = 1,
) -> Generator[str, None, dict[str, Any]]:
    """Open ``path`` (phase ``open``), then train from scratch once per worker count (phase
    ``train_<n>_workers``); the per-step records come back."""
    began = time.perf_counter()
    dataset = open_dataset(path)
    opened = time.perf_counter() - began
    yield "open"
    runs = []
    for n in workers:
        run = train(dataset, ModelConfig(**model), steps=steps, batch_size=batch_size,
                    sampler=make_sampler(len(dataset), seed=sampler_seed, block_size=block_size),
                    collate_fn=make_collator(collate_style), num_workers=int(n), lr=lr,
                    threads=threads)
        runs.append({"workers": int(n), "records": run.records})
        yield f"train_{n}_workers"
    return {"open_seconds": opened, "num_bins": len(dataset), "runs": runs}


def train_every_format(
    sources: Mapping[str, str | os.PathLike[str]],
    *,
    timeout: float = 3600.0,
    **job: Any,
) -> dict[str, dict[str, Any]]:
    """:func:`training_job` over each ``{format: path}``, each in a new interpreter (DataLoader
    workers need a process that may have children); per format the job's result plus
    ``phases`` (peak RSS growth per phase over the post-import baseline)."""
    out = {}
    for name, path in sources.items():
        payload = run_job(training_job, str(path), imports=("torch", "packlab.train"),
                          isolation="subprocess", interval=0.01, timeout=timeout, **job)
        out[name] = {**payload["result"], "phases": payload["phases"]}
    return out


def _runs(results: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, int, list[dict]]]:
    return [(name, run["workers"], run["records"])
            for name, result in results.items() for run in result["runs"]]


def compare_curves(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Whether every run's losses equal the first run's bit for bit (Python floats from the
    float32 loss compare exactly), and its batches (digests); the first difference, if any."""
    runs = _runs(results)
    if not runs:
        raise PacklabError("no training runs to compare")
    ref_name, ref_workers, reference = runs[0]
    differences = []
    for name, workers, records in runs[1:]:
        if len(records) != len(reference):
            raise PacklabError(f"{name} with {workers} workers ran {len(records)} steps, "
                               f"{ref_name} {len(reference)}")
        for a, b in zip(reference, records, strict=True):
            if a["loss"] != b["loss"] or a["batch_digest"] != b["batch_digest"]:
                differences.append({
                    "format": name, "workers": workers, "step": b["step"],
                    "loss": b["loss"], "reference_loss": a["loss"],
                    "batch_equal": a["batch_digest"] == b["batch_digest"]})
                break
    return {"reference": f"{ref_name}, {ref_workers} workers", "runs": len(runs),
            "steps": len(reference), "identical": not differences,
            "batches_identical": all(d["batch_equal"] for d in differences),
            "differences": differences}


def _peak(phases: Mapping[str, Mapping[str, Any]], name: str) -> int:
    return int(phases.get(name, {}).get("peak_rss_growth_bytes", 0))


def step_rows(results: Mapping[str, Mapping[str, Any]], *, warmup: int = 1
              ) -> list[dict[str, Any]]:
    """Per format and worker count: ``startup_seconds`` (open + the first batch's wait, which
    holds worker start-up), then over the steps after ``warmup``: median ``step_seconds``,
    mean ``wait_seconds`` and ``compute_seconds``, ``wait_share`` (wait over wait + compute),
    and the peak RSS growth of the training process (``peak_rss_bytes``: open and this run)
    and the largest resident total of its workers (``workers_rss_bytes``)."""
    rows = []
    for name, result in results.items():
        for run in result["runs"]:
            records = run["records"]
            steady = records[warmup:] or records
            wait = sum(r["wait_seconds"] for r in steady)
            compute = sum(r["compute_seconds"] for r in steady)
            phase = f"train_{run['workers']}_workers"
            rows.append({
                "format": name, "workers": run["workers"],
                "open_seconds": result["open_seconds"],
                "startup_seconds": result["open_seconds"] + records[0]["wait_seconds"],
                "step_seconds": statistics.median(r["wait_seconds"] + r["compute_seconds"]
                                                  for r in steady),
                "wait_seconds": wait / len(steady), "compute_seconds": compute / len(steady),
                "wait_share": wait / (wait + compute),
                "peak_rss_bytes": max(_peak(result["phases"], "open"),
                                      _peak(result["phases"], phase)),
                "open_rss_bytes": _peak(result["phases"], "open"),
                "workers_rss_bytes": max(r["workers_rss_bytes"] for r in records),
            })
    return rows


def step_time_spread(rows: Sequence[Mapping[str, Any]], key: str = "step_seconds"
                     ) -> dict[int, dict[str, Any]]:
    """Per worker count: the fastest and slowest format by ``key`` and their ratio."""
    out: dict[int, dict[str, Any]] = {}
    for workers in sorted({r["workers"] for r in rows}):
        group = [r for r in rows if r["workers"] == workers]
        fast = min(group, key=lambda r: r[key])
        slow = max(group, key=lambda r: r[key])
        out[workers] = {"fastest": fast["format"], "slowest": slow["format"],
                        "fastest_seconds": fast[key], "slowest_seconds": slow[key],
                        "ratio": slow[key] / fast[key]}
    return out
