"""How Megatron-LM's pretraining samplers spread sample indices over data-parallel ranks.

Reimplemented (vectorized) from the behaviour of ``MegatronPretrainingSampler`` and
``MegatronPretrainingRandomSampler`` in Megatron-LM's ``megatron/training/datasets/
data_samplers.py``, so packlab can answer
the proposal's open question without importing Megatron's training stack. Megatron-Bridge 0.6.2
ships the same two samplers (``megatron/bridge/data/samplers.py``);
``tests/bridge/test_megatron_samplers.py`` runs them beside these over every rank, several
world sizes and consumed-sample counts, micro-batch for micro-batch:

``MegatronPretrainingSampler`` (``--dataloader-type single``, the default)
    Walks global indices ``consumed_samples .. total_samples - 1`` in order, in global batches
    of ``micro_batch_size * data_parallel_size``; rank ``r`` takes the *contiguous* slice
    ``[r * mbs, (r + 1) * mbs)`` of each. So rank ``r`` reads indices
    ``k * mbs * dp + r * mbs + j``: every rank touches every region of the index space, in
    lock step. With ``samples_per_chunk`` a multiple of ``mbs * dp`` *every* rank needs
    *every* chunk; the modulo chunk assignment does not survive it.
    A final partial global batch is dropped (``drop_last``), or, when kept, sliced the same
    way (ranks past its end get an empty batch).

``MegatronPretrainingRandomSampler`` (``--dataloader-type cyclic``)
    The epoch is ``consumed_samples // active_total_samples`` (the total rounded down to whole
    global batches) and seeds ``torch.randperm``. With ``data_sharding`` (the default) rank
    ``r`` owns the contiguous bucket ``[r * B, (r + 1) * B)``, ``B = (total // (mbs * dp)) *
    mbs``, shuffled; without it one permutation of ``(total // mbs) * mbs`` indices is dealt
    round-robin (``perm[r::dp]``). Incomplete micro-batches are dropped.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from packlab.errors import PacklabError


def _check(total_samples: int, micro_batch_size: int, rank: int, world_size: int) -> None:
    if total_samples <= 0:
        raise PacklabError(f"no sample to consume: total_samples={total_samples}")
    if micro_batch_size <= 0 or world_size <= 0:
        raise PacklabError(f"micro_batch_size and data_parallel_size must be positive, got "
                           f"{micro_batch_size} and {world_size}")
    if not 0 <= rank < world_size:
        raise PacklabError(f"data_parallel_rank {rank} out of range for size {world_size}")


def pretraining_batches(total_samples: int, consumed_samples: int, micro_batch_size: int,
                        data_parallel_rank: int, data_parallel_size: int, *,
                        drop_last: bool = True) -> list[np.ndarray]:
    """The micro-batches ``MegatronPretrainingSampler`` yields on one rank, in order."""
    _check(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
    if not 0 <= consumed_samples < total_samples:
        raise PacklabError(f"no samples left to consume: {consumed_samples}, {total_samples}")
    step = micro_batch_size * data_parallel_size
    lo = data_parallel_rank * micro_batch_size
    indices = np.arange(consumed_samples, total_samples, dtype=np.int64)
    full = (indices.shape[0] // step) * step
    body = indices[:full].reshape(-1, step)[:, lo : lo + micro_batch_size]
    batches = list(body)
    if full < indices.shape[0] and not drop_last:
        batches.append(indices[full:][lo : lo + micro_batch_size])
    return batches


def random_batches(total_samples: int, consumed_samples: int, micro_batch_size: int,
                   data_parallel_rank: int, data_parallel_size: int, *,
                   data_sharding: bool = True) -> list[np.ndarray]:
    """The micro-batches ``MegatronPretrainingRandomSampler`` yields on one rank for the epoch
    that ``consumed_samples`` falls in (from that point on)."""
    import torch

    _check(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
    step = micro_batch_size * data_parallel_size
    active = total_samples - total_samples % step
    if active <= 0:
        raise PacklabError(f"total_samples {total_samples} is less than one global batch {step}")
    epoch = consumed_samples // active
    in_epoch = consumed_samples % active
    if in_epoch % step:
        raise PacklabError(f"consumed_samples {consumed_samples} is not a whole number of global "
                           f"batches of {step}")
    generator = torch.Generator()
    generator.manual_seed(epoch)
    if data_sharding:
        bucket = (total_samples // step) * micro_batch_size
        perm = torch.randperm(bucket, generator=generator).numpy().astype(np.int64)
        indices = data_parallel_rank * bucket + perm[in_epoch // data_parallel_size :]
    else:
        full = (total_samples // micro_batch_size) * micro_batch_size
        perm = torch.randperm(full, generator=generator).numpy().astype(np.int64)
        indices = perm[in_epoch:][data_parallel_rank::data_parallel_size]
    whole = (indices.shape[0] // micro_batch_size) * micro_batch_size
    return list(indices[:whole].reshape(-1, micro_batch_size))


class MegatronPretrainingSampler:
    """A DataLoader ``batch_sampler`` with Megatron's sequential index distribution."""

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, drop_last: bool = True
                 ) -> None:
        self.args = (total_samples, consumed_samples, micro_batch_size, data_parallel_rank,
                     data_parallel_size)
        self.drop_last = drop_last
        self.total_samples = total_samples
        pretraining_batches(*self.args, drop_last=drop_last)  # validate now, as Megatron does

    def __iter__(self) -> Iterator[list[int]]:
        for batch in pretraining_batches(*self.args, drop_last=self.drop_last):
            yield batch.tolist()

    def __len__(self) -> int:
        return self.total_samples  # as Megatron's: samples, not batches


class MegatronPretrainingRandomSampler:
    """A DataLoader ``batch_sampler`` with Megatron's random (cyclic) index distribution.

    Like Megatron's, it advances ``consumed_samples`` as it yields, so iterating it again
    continues into the next epoch.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int, data_sharding: bool = True
                 ) -> None:
        _check(total_samples, micro_batch_size, data_parallel_rank, data_parallel_size)
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.rank = data_parallel_rank
        self.world_size = data_parallel_size
        self.data_sharding = data_sharding

    def __iter__(self) -> Iterator[list[int]]:
        batches = random_batches(self.total_samples, self.consumed_samples, self.micro_batch_size,
                                 self.rank, self.world_size, data_sharding=self.data_sharding)
        for batch in batches:
            self.consumed_samples += self.micro_batch_size * self.world_size
            yield batch.tolist()

    def __len__(self) -> int:
        return self.total_samples


def rank_indices(sampler: str, total_samples: int, micro_batch_size: int, rank: int,
                 world_size: int, *, epoch: int = 0, consumed_samples: int = 0) -> np.ndarray:
    """Every index one rank reads in one epoch, flat: ``sampler`` is ``"single"`` (the
    sequential sampler), ``"cyclic"`` (random, data sharding) or ``"cyclic_unsharded"``."""
    if sampler == "single":
        batches = pretraining_batches(total_samples, consumed_samples, micro_batch_size, rank,
                                      world_size)
    elif sampler in ("cyclic", "cyclic_unsharded"):
        step = micro_batch_size * world_size
        start = epoch * (total_samples - total_samples % step) + consumed_samples
        batches = random_batches(total_samples, start, micro_batch_size, rank, world_size,
                                 data_sharding=sampler == "cyclic")
    else:
        raise PacklabError(f"unknown sampler {sampler!r}; choose single, cyclic, "
                           "cyclic_unsharded")
    return np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
