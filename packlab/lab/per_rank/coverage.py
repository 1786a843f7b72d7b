"""Counting what an epoch served: how many samples twice (or more), how many never.

:func:`coverage` takes the sample ids each rank served; :func:`seed_epoch` and
:func:`fixed_epoch` build those ids for the proposed design under a Megatron sampler and for
packlab's rank-local fix, without I/O (the real-process tests check the same numbers on files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from packlab.lab.per_rank.megatron_sampler import rank_indices
from packlab.lab.per_rank.seed_design import NOT_SERVED, served_ids
from packlab.loading.per_rank.plan import ChunkPlan
from packlab.loading.per_rank.sampler import RankLocalSampler


@dataclass
class Coverage:
    """One epoch's service, over all ranks."""

    num_samples: int
    served: int  # items delivered (requests that did not raise)
    unique: int  # distinct samples delivered
    duplicated: int  # samples delivered more than once
    extra: int  # deliveries beyond the first of a sample (served - unique)
    lost: int  # samples never delivered
    errors: int  # requests that raised
    per_rank: dict[str, list[int]] = field(default_factory=dict)

    @property
    def exactly_once(self) -> bool:
        return self.extra == 0 and self.lost == 0 and self.errors == 0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exactly_once": self.exactly_once}


def coverage(served: Sequence[np.ndarray], num_samples: int, *,
             asked: Sequence[np.ndarray] | None = None) -> Coverage:
    """Count an epoch from each rank's served sample ids (``NOT_SERVED`` = raised).

    ``per_rank`` holds, per rank: ``served``, ``substituted`` (served another sample than
    asked, when ``asked`` is given), ``duplicates`` (its deliveries of a sample some rank
    already delivered, counting in rank order); :func:`lost_by_owner` adds who owned the
    samples never delivered.
    """
    ids = [np.asarray(s, dtype=np.int64) for s in served]
    flat = np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)
    ok = flat[flat != NOT_SERVED]
    if ok.size and (ok.min() < 0 or ok.max() >= num_samples):
        raise ValueError(f"served ids outside [0, {num_samples})")
    counts = np.bincount(ok, minlength=num_samples)
    per_rank: dict[str, list[int]] = {"served": [], "substituted": [], "duplicates": []}
    seen = np.zeros(num_samples, dtype=np.int64)
    for r, s in enumerate(ids):
        good = s[s != NOT_SERVED]
        per_rank["served"].append(int(good.shape[0]))
        if asked is not None:
            per_rank["substituted"].append(int(np.count_nonzero(
                (s != np.asarray(asked[r], dtype=np.int64)) & (s != NOT_SERVED))))
        mine = np.bincount(good, minlength=num_samples)
        first_here = np.count_nonzero((seen == 0) & (mine > 0))
        per_rank["duplicates"].append(int(good.shape[0] - first_here))
        seen += mine
    lost = counts == 0
    return Coverage(
        num_samples=num_samples,
        served=int(ok.shape[0]),
        unique=int(np.count_nonzero(counts)),
        duplicated=int(np.count_nonzero(counts > 1)),
        extra=int(ok.shape[0] - np.count_nonzero(counts)),
        lost=int(np.count_nonzero(lost)),
        errors=int(flat.shape[0] - ok.shape[0]),
        per_rank=per_rank,
    )


def lost_by_owner(served: Sequence[np.ndarray], plan: ChunkPlan, world_size: int
                  ) -> list[int]:
    """Samples never served, by the rank that owns their chunk."""
    flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in served])
    counts = np.bincount(flat[flat != NOT_SERVED], minlength=plan.num_samples)
    never = np.flatnonzero(counts == 0)
    owner = (never // plan.samples_per_chunk) % world_size
    return np.bincount(owner, minlength=world_size).astype(int).tolist()


def seed_epoch(plan: ChunkPlan, world_size: int, micro_batch_size: int, *,
               sampler: str = "single", epoch: int = 0,
               available: np.ndarray | None = None) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(asked, served) global ids per rank: the proposed dataset under a Megatron sampler over
    ``len = num_samples`` (the kindest ``max_total_samples``)."""
    asked, served = [], []
    for rank in range(world_size):
        idx = rank_indices(sampler, plan.num_samples, micro_batch_size, rank, world_size,
                           epoch=epoch)
        asked.append(idx)
        served.append(served_ids(idx, plan, rank, world_size, available=available))
    return asked, served


def fixed_epoch(plan: ChunkPlan, world_size: int, micro_batch_size: int, *,
                seed: int = 0, epoch: int = 0, window: int = 1) -> list[np.ndarray]:
    """Global ids per rank served by the rank-local fix in one epoch."""
    served = []
    for rank in range(world_size):
        sampler = RankLocalSampler(plan, rank=rank, world_size=world_size,
                                   micro_batch_size=micro_batch_size, seed=seed, epoch=epoch,
                                   window=window)
        served.append(sampler.index.global_ids(sampler.order()))
    return served


def epoch_table(plan: ChunkPlan, world_size: int, micro_batch_size: int, *,
                sampler: str = "single", epoch: int = 0) -> dict[str, Any]:
    """Seed design vs fix for one epoch: totals and per-rank counts (for the notebook)."""
    asked, seed_served = seed_epoch(plan, world_size, micro_batch_size, sampler=sampler,
                                    epoch=epoch)
    seed_cov = coverage(seed_served, plan.num_samples, asked=asked)
    seed_cov.per_rank["lost_owned"] = lost_by_owner(seed_served, plan, world_size)
    fixed = fixed_epoch(plan, world_size, micro_batch_size, epoch=epoch)
    fixed_cov = coverage(fixed, plan.num_samples)
    fixed_cov.per_rank["lost_owned"] = lost_by_owner(fixed, plan, world_size)
    plain = coverage(asked, plan.num_samples)  # the sampler over an unsharded global dataset
    return {"sampler": sampler, "world_size": world_size,
            "sampler_dropped": plan.num_samples - sum(int(a.shape[0]) for a in asked),
            "global_dataset": plain.to_dict(), "seed_design": seed_cov.to_dict(),
            "rank_local": fixed_cov.to_dict()}
