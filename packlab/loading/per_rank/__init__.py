"""Per-rank loading: each data-parallel rank reads the chunk files it owns, each sample once.

Each data-parallel rank reads only its own chunk files (``chunk % world_size == rank``) while
a producer is still writing them, and every sample is served exactly once per epoch:

- :mod:`~packlab.loading.per_rank.plan`: the chunk plan producer and consumers agree on first;
- :mod:`~packlab.loading.per_rank.chunks`: JSONL / packed Parquet chunk files, atomic, awaited, checked;
- :mod:`~packlab.loading.per_rank.producer`: publishes the plan, then chunks; deletes consumed ones;
- :mod:`~packlab.loading.per_rank.dataset`: the rank-aware map-style dataset and completion markers;
- :mod:`~packlab.loading.per_rank.sampler`: the rank-local index space and its sampler (the fix);

The lab measures it (``packlab.lab.per_rank``: a global-index design as written, Megatron's
samplers, duplicates and losses per epoch, real ``torch.distributed`` runs).
"""

from __future__ import annotations

from packlab.loading.per_rank.chunks import load_chunk, wait_for_chunk, write_chunk
from packlab.loading.per_rank.dataset import (
    ConsumptionTracker,
    RankShardedDataset,
    collate_ids,
    data_parallel_info,
)
from packlab.loading.per_rank.plan import ChunkPlan, read_plan, write_plan
from packlab.loading.per_rank.producer import ChunkProducer, spool_source
from packlab.loading.per_rank.sampler import RankLocalIndex, RankLocalSampler, steps_per_epoch

__all__ = [
    "ChunkPlan",
    "ChunkProducer",
    "ConsumptionTracker",
    "RankLocalIndex",
    "RankLocalSampler",
    "RankShardedDataset",
    "collate_ids",
    "data_parallel_info",
    "load_chunk",
    "read_plan",
    "spool_source",
    "steps_per_epoch",
    "wait_for_chunk",
    "write_chunk",
    "write_plan",
]
