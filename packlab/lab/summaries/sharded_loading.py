"""Notebook 08's summary: the proposed rank-sharded design under Megatron's sampler, the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.sharded_loading import ShardedLoading


def bullets(n: ShardedLoading, p: Mapping[str, Any]) -> list[str]:
    w, total = n.world_size_shown, n.num_samples
    workers, ranks = p["num_workers"], p["real_world_size"]
    return [
        "**The open question.** Megatron's sequential sampler gives each rank contiguous "
        "micro-batches *within each global batch*, so ranks interleave every "
        f"{p['micro_batch_size']} samples: at world size 4 each rank's epoch touches every one "
        f"of the {n.num_chunks} chunks and {n.foreign_request_share_w4:.0%} of its "
        "requests fall in chunks it does not own. The modulo assignment does not survive it, nor "
        f"the random sampler (`cyclic`): at world size {w}, {n.cyclic_duplicated:,} served "
        f"twice or more, {n.cyclic_lost:,} never.",
        f"**Seed 003's dataset** serves the wrong samples without a word: at world size {w}, "
        f"{n.seed_duplicated_w4:,} of {total:,} samples are served twice or more and "
        f"{n.seed_lost_w4:,} ({n.seed_lost_fraction_w4:.0%}) never; across chunk sizes up "
        f"to {n.seed_worst_lost_fraction:.0%} are never served. On real ranks it served "
        f"exactly what the model predicts ("
        f"{'identical ids' if n.seed_real_matches_model else 'ids differ'}): "
        f"{n.seed_real_lost:,} never served, {n.seed_real_errors:,} requests raised "
        "`IndexError` (the last, short chunk).",
        "**The fix** (a rank-local index space, one sampler and dataset that agree) served every "
        "sample exactly once in every simulated world size "
        f"({', '.join(map(str, p['world_sizes']))}): {n.fix_exactly_once_simulated}; and on "
        f"{ranks} real ranks in every phase: {n.fix_exactly_once_real}, with a producer "
        "slower than the ranks; shuffled per epoch, resumable from `consumed_samples`.",
        f"**Throughput**: with {workers} DataLoader workers per rank, a rank delivered "
        f"{n.worker_speedup_steady:.2f}x the samples/s of none once running, "
        f"{n.worker_speedup_epoch:.2f}x over the whole epoch including worker start-up "
        f"(median over ranks; {p['pack_size']:,}-token bins on a shared 2-core machine, where "
        f"{ranks} ranks x {workers} workers compete for the cores).",
        "**The protocol guarantees**: a chunk appears only whole (temporary name, then rename); a "
        "rank waits for its chunks (poll, finite timeout, an error naming the chunk); a "
        "completion marker is written only after every sample of the chunk reached the training "
        f"loop, so the producer's deletion is safe: here it deleted {n.chunks_deleted} of "
        f"{n.num_chunks} chunks, {n.chunks_left} left.",
    ]
