"""Notebook 08's record: the proposed rank-sharded design under Megatron's sampler, the fix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from packlab.lab.records.base import Record


@dataclass
class ShardedLoading(Record):
    NOTEBOOK: ClassVar[str] = "08_sharded_loading"

    num_samples: int
    num_chunks: int
    world_size_shown: int
    foreign_request_share_w4: float
    seed_duplicated_w4: int
    seed_lost_w4: int
    seed_lost_fraction_w4: float
    seed_worst_lost_fraction: float
    cyclic_duplicated: int
    cyclic_lost: int
    seed_real_lost: int
    seed_real_errors: int
    seed_real_matches_model: bool
    fix_exactly_once_simulated: bool
    fix_exactly_once_real: bool
    worker_speedup_steady: float
    worker_speedup_epoch: float
    chunks_deleted: int
    chunks_left: int
