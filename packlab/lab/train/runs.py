"""Training from every format, each in a fresh process, and what the runs say side by side.

:func:`train_every_format` starts one new interpreter (:mod:`packlab.lab.measure.harness`), which
imports torch and takes a warm-up step once, then forks a process per format from that state
(``isolation="fork"``): each format's memory is its own, every format starts from the same
allocator and library state, and torch's import is paid once. In each fork
:func:`training_job` opens the dataset (a format that loads everything pays it here) and
trains the same model with the same sampler once per DataLoader worker count. Then:

- :func:`compare_curves`: are the loss curves identical bit for bit across formats and worker
  counts, and if not, the first step that differs and whether its batch differed too;
- :func:`step_rows`: per format and worker count, the startup (open + first batch), the
  steady step time, data wait, compute, the data-wait share of the step, and memory;
- :func:`step_time_spread`: per worker count, the slowest format's steady step over the
  fastest's, the most data wait a format adds over the least (as a share of the step: what a
  format can change), and the spread of compute (identical work in every run: the noise).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from packlab.errors import PacklabError
from packlab.lab.measure.harness import run_job
from packlab.lab.measure.jobs import format_imports
from packlab.lab.train.batch import make_collator, thd_view
from packlab.lab.train.loop import train
from packlab.lab.train.model import ModelConfig, build_model, deterministic, masked_loss
from packlab.loading.samplers import BlockShuffleSampler, ShuffleSampler
from packlab.sources import local_shards, open_dataset


def make_sampler(num_items: int, *, seed: int = 0, block_size: int | None = None
                 ) -> ShuffleSampler | BlockShuffleSampler:
    """The sampler every format trains with: a uniform shuffle, or (``block_size``) a block
    shuffle over equal blocks. Never one derived from a format (Parquet's row groups): the
    order would then differ by format, and so would the curves."""
    if block_size is None:
        return ShuffleSampler(num_items, seed=seed)
    return BlockShuffleSampler(num_items, block_size=block_size, seed=seed)


def warm_up(config: ModelConfig, *, batch_size: int, threads: int = 1) -> None:
    """One optimizer step on a synthetic batch: torch's one-time allocations (thread pools,
    kernels, autograd) land before the first format, not in its figures."""
    length = config.max_positions
    item = {"input_ids": np.arange(length, dtype=np.int32) % config.vocab_size,
            "loss_mask": np.ones(length, dtype=np.uint8),
            "seq_boundaries": np.array([0, length // 2, length], dtype=np.int32)}
    view = thd_view(make_collator()([item] * batch_size))
    model = build_model(config)
    with deterministic(threads):
        masked_loss(model(view), view)[0].backward()
        torch.optim.AdamW(model.parameters()).step()


def training_job(
    path: str,
    *,
    model: dict[str, Any],
    steps: int,
    batch_size: int,
    workers: Sequence[int] = (0,),
    sampler_seed: int = 0,
    block_size: int | None = None,
    collate_style: str = "thd",
    collate_options: dict[str, Any] | None = None,
    lr: float = 1e-3,
    threads: int = 1,
) -> Generator[str, None, dict[str, Any]]:
    """One format: open its dataset (phase ``open``; a format that loads everything pays it
    here), then train from scratch once per worker count (phase ``train_<n>_workers``).
    Returns the per-step records of every run."""
    config = ModelConfig(**model)
    began = time.perf_counter()
    dataset = open_dataset(path)
    opened = time.perf_counter() - began
    yield "open"
    runs = []
    for n in workers:
        run = train(dataset, config, steps=steps, batch_size=batch_size,
                    sampler=make_sampler(len(dataset), seed=sampler_seed, block_size=block_size),
                    collate_fn=make_collator(collate_style, **(collate_options or {})),
                    num_workers=int(n), lr=lr,
                    threads=threads)
        runs.append({"workers": int(n), "records": run.records})
        yield f"train_{n}_workers"
    return {"open_seconds": opened, "num_bins": len(dataset), "runs": runs}


def formats_job(sources: dict[str, str], **job: Any) -> dict[str, Any]:
    """In a fresh process: one warm-up step, then :func:`training_job` for each format in a
    fork of this warmed-up process (every format starts from the same state, its memory is
    its own, and its DataLoader workers may start)."""
    warm_up(ModelConfig(**job["model"]), batch_size=job["batch_size"],
            threads=job.get("threads", 1))
    out = {}
    for name, path in sources.items():
        payload = run_job(training_job, path, isolation="fork", interval=0.005, **job)
        out[name] = {**payload["result"], "memory": format_memory(payload["phases"])}
    return out


def train_every_format(
    sources: Mapping[str, str | os.PathLike[str]],
    *,
    timeout: float = 3600.0,
    **job: Any,
) -> dict[str, dict[str, Any]]:
    """:func:`formats_job` over ``{format: path}`` in a new interpreter (it imports torch and
    warms it up once; each format then trains in a fork of it). Per format: the per-step
    records of every worker count, ``open_seconds``, and ``memory`` (:func:`format_memory`).
    ``job``: the keyword arguments of :func:`training_job`."""
    imports = ["torch", "torch.utils.data", "packlab.lab.train"]
    for path in sources.values():
        for fmt in {fmt for _, fmt in local_shards(path)}:
            imports += format_imports(fmt, "dataset")
    payload = run_job(formats_job, {n: str(p) for n, p in sources.items()},
                      imports=sorted(set(imports)), isolation="subprocess", interval=0.5,
                      timeout=timeout, **job)
    return payload["result"]


def format_memory(phases: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """A format's memory, as growth over its process's baseline: once the dataset is open
    (``open_*``: what the process holds before the first step) and at the peak of the whole
    job (``peak_*``: open and every training run). RSS and anonymous RSS. (The kernel counts
    RSS in per-CPU batches, so a few hundred KB either way is counting noise; a negative
    growth is reported as 0.)"""
    opened = phases["open"]
    figures = {
        "open_rss_bytes": opened["peak_rss_growth_bytes"],
        "open_anon_bytes": opened["peak_anon_growth_bytes"],
        "peak_rss_bytes": max(p["peak_rss_growth_bytes"] for p in phases.values()),
        "peak_anon_bytes": max(p["peak_anon_growth_bytes"] for p in phases.values()),
    }
    return {key: max(0, int(value)) for key, value in figures.items()}


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


def step_rows(results: Mapping[str, Mapping[str, Any]], *, warmup: int = 1
              ) -> list[dict[str, Any]]:
    """Per format and worker count: ``startup_seconds`` (open + the first batch's wait, which
    holds worker start-up), then over the steps after ``warmup``: median ``step_seconds``,
    mean ``wait_seconds`` and ``compute_seconds``, ``wait_share`` (wait over wait + compute),
    the format's memory (:func:`format_memory`: one figure for all its worker counts), and
    the largest resident total of the run's workers (``workers_rss_bytes``)."""
    rows = []
    for name, result in results.items():
        for run in result["runs"]:
            records = run["records"]
            steady = records[warmup:] or records
            wait = sum(r["wait_seconds"] for r in steady)
            compute = sum(r["compute_seconds"] for r in steady)
            rows.append({
                "format": name, "workers": run["workers"],
                "open_seconds": result["open_seconds"],
                "startup_seconds": result["open_seconds"] + records[0]["wait_seconds"],
                "step_seconds": statistics.median(r["wait_seconds"] + r["compute_seconds"]
                                                  for r in steady),
                "wait_seconds": wait / len(steady), "compute_seconds": compute / len(steady),
                "wait_share": wait / (wait + compute),
                **result["memory"],
                "workers_rss_bytes": max(r["workers_rss_bytes"] for r in records),
            })
    return rows


def step_time_spread(rows: Sequence[Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per worker count: the fastest and slowest format by median step and their ``ratio``;
    ``wait_added``: the largest data wait a format adds over the format that waits least, as a
    share of the fastest step (``wait_added_by``: which format); ``compute_ratio``: the
    largest mean compute over the smallest (the same computation in every run, so this is the
    machine's noise, the floor under ``ratio``)."""
    out: dict[int, dict[str, Any]] = {}
    for workers in sorted({r["workers"] for r in rows}):
        group = [r for r in rows if r["workers"] == workers]
        fast = min(group, key=lambda r: r["step_seconds"])
        slow = max(group, key=lambda r: r["step_seconds"])
        least = min(r["wait_seconds"] for r in group)
        most = max(group, key=lambda r: r["wait_seconds"])
        compute = [r["compute_seconds"] for r in group]
        out[workers] = {"fastest": fast["format"], "slowest": slow["format"],
                        "fastest_seconds": fast["step_seconds"],
                        "slowest_seconds": slow["step_seconds"],
                        "ratio": slow["step_seconds"] / fast["step_seconds"],
                        "wait_added": (most["wait_seconds"] - least) / fast["step_seconds"],
                        "wait_added_by": most["format"],
                        "compute_ratio": max(compute) / min(compute)}
    return out
