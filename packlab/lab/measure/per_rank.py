"""The measurements of notebook 08, as tested functions (the notebook only calls and plots).

- :func:`chunks_touched`: which chunks each rank's Megatron indices fall in, against the
  chunks it owns: the answer to the proposal's open question in one table;
- :func:`sweep_chunk_sizes`: the proposed losses and duplicates as samples-per-chunk varies
  against one global batch (``micro_batch_size * world_size``);
- :func:`protocol_run`: one real ``torch.distributed`` run with a producer slower than the
  ranks, then more phases (fix with 0 / N workers, the seed design) on complete chunks.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from packlab.lab.per_rank.coverage import coverage, seed_epoch
from packlab.lab.per_rank.megatron_sampler import rank_indices
from packlab.loading.per_rank.plan import ChunkPlan
from packlab.loading.per_rank.producer import BinSource, ChunkProducer


def chunks_touched(plan: ChunkPlan, world_size: int, micro_batch_size: int, *,
                   sampler: str = "single") -> list[dict[str, Any]]:
    """Per rank: chunks its sampler indices fall in, chunks it owns, and the share of its
    requests that land in a chunk it does not own."""
    rows = []
    for rank in range(world_size):
        idx = rank_indices(sampler, plan.num_samples, micro_batch_size, rank, world_size)
        chunks = idx // plan.samples_per_chunk
        rows.append({
            "rank": rank,
            "chunks_touched": int(np.unique(chunks).shape[0]),
            "chunks_owned": int(plan.rank_chunks(rank, world_size).shape[0]),
            "foreign_share": float(np.mean(chunks % world_size != rank)) if idx.size else 0.0,
        })
    return rows


def sweep_chunk_sizes(num_samples: int, world_size: int, micro_batch_size: int,
                      chunk_sizes: list[int], *, sampler: str = "single"
                      ) -> list[dict[str, Any]]:
    """The proposed design over one epoch for each samples-per-chunk value."""
    rows = []
    for spc in chunk_sizes:
        plan = ChunkPlan(num_samples=num_samples, samples_per_chunk=int(spc), format="jsonl")
        asked, served = seed_epoch(plan, world_size, micro_batch_size, sampler=sampler)
        cov = coverage(served, num_samples, asked=asked)
        rows.append({"samples_per_chunk": int(spc),
                     "per_global_batch": spc / (micro_batch_size * world_size),
                     "lost": cov.lost / num_samples, "extra": cov.extra / num_samples,
                     "errors": cov.errors / num_samples})
    return rows


def protocol_run(root: Path, source: BinSource, plan: ChunkPlan, *, world_size: int,
                 micro_batch_size: int, num_workers: int, delay: float,
                 seed_plan: ChunkPlan | None = None, timeout: float = 300.0
                 ) -> dict[str, Any]:
    """A real run: phase 0 reads chunks a slow producer publishes every ``delay`` s (deleting
    the ones marked completed); then the fix with 0 and ``num_workers`` workers on complete
    chunks; then the proposed design (on ``seed_plan`` chunks, if given)."""
    from packlab.lab.per_rank.launch import launch, run_phases

    slow, ready, complete = root / "slow", root / "ready", root / "complete"
    for old in ready.glob("rank*"):
        old.unlink()
    ChunkProducer(complete, plan, overwrite=True).produce(source)
    producer = ChunkProducer(slow, plan, overwrite=True)
    base = {"micro_batch_size": micro_batch_size, "poll_interval": 0.02, "timeout": 60.0}
    phases = [
        {**base, "directory": str(slow), "num_workers": num_workers, "ready_dir": str(ready)},
        {**base, "directory": str(complete), "num_workers": 0, "epoch": 1},
        {**base, "directory": str(complete), "num_workers": num_workers, "epoch": 1},
    ]
    if seed_plan is not None:
        ChunkProducer(root / "seed", seed_plan, overwrite=True).produce(source)
        phases.append({**base, "directory": str(root / "seed"), "num_workers": num_workers,
                       "design": "seed"})
    published: dict[int, float] = {}
    began: list[float] = []

    def produce(stop: threading.Event) -> None:
        while len(list(ready.glob("rank*"))) < world_size:
            if stop.wait(0.05):
                return  # the ranks are gone: nobody to produce for
        began.append(time.time())
        for chunk in range(plan.num_chunks):
            if stop.wait(delay):
                return
            producer.collect()
            producer.produce(source, chunks=[chunk])
            published[chunk] = time.time()

    results = launch(run_phases, world_size, {"phases": phases}, root / "run", timeout=timeout,
                     background=produce)
    deadline = time.monotonic() + 10
    while producer.published() and time.monotonic() < deadline:
        producer.collect()
        time.sleep(0.05)
    return {"results": results, "published": published, "t0": began[0] if began else 0.0,
            "deleted": sorted(producer.deleted), "left": producer.published()}
