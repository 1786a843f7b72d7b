"""The fix: a rank-local index space that the sampler and the dataset agree on.

A design that lets Megatron's sampler hand every rank *global* sample indices and then serves
whatever its own chunks hold at that offset: samples are duplicated and lost (see
:mod:`packlab.lab.per_rank.seed_design`). Here each rank numbers only the samples of its own chunks,
``0 .. n_rank - 1``, in production order (:class:`RankLocalIndex`); the dataset's ``len`` is
``n_rank`` and its ``[i]`` means "local sample ``i``"; the sampler (:class:`RankLocalSampler`)
permutes exactly those indices. So every sample of every chunk is served once per epoch by its
owning rank, whatever the world size, and nothing else is.

Shuffling is seeded per ``(seed, epoch)`` and stays within windows of ``window`` consecutive
chunks (in production order, or in a per-epoch chunk order with ``shuffle_chunks``), so a rank
holds about ``window`` chunks at a time and can evict each one once it is consumed.

Resuming takes Megatron's ``consumed_samples`` (global: steps x micro batch x world size,
counted within the epoch) and skips exactly the micro-batches this rank already served.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from packlab.bins import cumulative_offsets
from packlab.errors import PacklabError
from packlab.loading.per_rank.plan import ChunkPlan, check_world


class RankLocalIndex:
    """Rank ``rank``'s samples numbered ``0 .. len - 1`` over its chunks in production order."""

    def __init__(self, plan: ChunkPlan, rank: int, world_size: int) -> None:
        self.plan = plan
        self.rank, self.world_size = check_world(rank, world_size)
        self.chunks = plan.rank_chunks(self.rank, self.world_size)
        self.sizes = plan.chunk_sizes()[self.chunks]
        self.offsets = cumulative_offsets(self.sizes)

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, local: int) -> tuple[int, int]:
        """(chunk, offset within the chunk) of local sample ``local``; no wrapping."""
        if isinstance(local, bool) or not isinstance(local, int | np.integer):
            raise TypeError(f"sample index must be an integer, got {type(local).__name__}")
        if not 0 <= local < len(self):
            raise IndexError(f"rank {self.rank}: local sample {local} out of range "
                             f"[0, {len(self)})")
        k = int(np.searchsorted(self.offsets, local, side="right")) - 1
        return int(self.chunks[k]), int(local - self.offsets[k])

    def chunk_of(self, local: np.ndarray) -> np.ndarray:
        """Chunk of each local index (vectorized)."""
        k = np.searchsorted(self.offsets, np.asarray(local, dtype=np.int64), side="right") - 1
        return self.chunks[k]

    def global_ids(self, local: np.ndarray) -> np.ndarray:
        """Global sample id of each local index (vectorized)."""
        local = np.asarray(local, dtype=np.int64)
        if local.size and (local.min() < 0 or local.max() >= len(self)):
            raise IndexError(f"rank {self.rank}: local index out of range [0, {len(self)})")
        k = np.searchsorted(self.offsets, local, side="right") - 1
        return self.chunks[k] * self.plan.samples_per_chunk + (local - self.offsets[k])


class RankLocalSampler:
    """Micro-batches of local indices for one rank: a ``batch_sampler`` for a DataLoader.

    Every local index exactly once per epoch (the last micro-batch may be short unless
    ``drop_last``, which then drops up to ``micro_batch_size - 1`` samples, counted in
    :meth:`dropped`). ``consumed_samples`` is Megatron's global count within the epoch.
    """

    def __init__(
        self,
        plan: ChunkPlan,
        *,
        rank: int,
        world_size: int,
        micro_batch_size: int,
        seed: int = 0,
        epoch: int = 0,
        consumed_samples: int = 0,
        shuffle: bool = True,
        window: int = 1,
        shuffle_chunks: bool = False,
        drop_last: bool = False,
    ) -> None:
        if isinstance(micro_batch_size, bool) or int(micro_batch_size) < 1:
            raise PacklabError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
        if int(window) < 1:
            raise PacklabError(f"window must be >= 1 chunk, got {window}")
        self.index = RankLocalIndex(plan, rank, world_size)
        self.micro_batch_size = int(micro_batch_size)
        self.seed = int(seed)
        self.shuffle = shuffle
        self.window = int(window)
        self.shuffle_chunks = shuffle_chunks
        self.drop_last = drop_last
        self.epoch = int(epoch)
        self.consumed_samples = 0
        self.skip = 0
        self.resume(consumed_samples)

    @property
    def rank(self) -> int:
        return self.index.rank

    @property
    def world_size(self) -> int:
        return self.index.world_size

    def set_epoch(self, epoch: int) -> None:
        """A new epoch starts from its first sample (a new shuffle)."""
        self.epoch = int(epoch)
        self.resume(0)

    def resume(self, consumed_samples: int) -> None:
        """Skip what the first ``consumed_samples // (mbs * world_size)`` steps served."""
        step = self.micro_batch_size * self.world_size
        if consumed_samples < 0 or consumed_samples % step:
            raise PacklabError(f"consumed_samples {consumed_samples} is not a whole number of "
                               f"global micro-batches of {step} samples "
                               f"({self.micro_batch_size} x world size {self.world_size})")
        self.consumed_samples = int(consumed_samples)
        self.skip = min((consumed_samples // step) * self.micro_batch_size, len(self.index))

    def chunk_order(self) -> np.ndarray:
        """The order this rank reads its chunks in this epoch."""
        if not (self.shuffle and self.shuffle_chunks):
            return self.index.chunks
        rng = np.random.default_rng([self.seed, self.epoch, self.rank, self.world_size])
        return rng.permutation(self.index.chunks)

    def order(self) -> np.ndarray:
        """Every local index of this epoch, in the order served (int64[len(index)])."""
        position = {int(c): k for k, c in enumerate(self.index.chunks.tolist())}
        parts = []
        chunks = self.chunk_order().tolist()
        for w in range(0, len(chunks), self.window):
            group = chunks[w : w + self.window]
            local = np.concatenate([np.arange(self.index.offsets[position[c]],
                                              self.index.offsets[position[c] + 1],
                                              dtype=np.int64) for c in group])
            if self.shuffle:
                local = np.random.default_rng([self.seed, self.epoch, group[0]]).permutation(local)
            parts.append(local)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def served_before(self) -> np.ndarray:
        """Local indices already served when resuming (the skipped prefix of :meth:`order`)."""
        return self.order()[: self.skip]

    def remaining(self) -> np.ndarray:
        rest = self.order()[self.skip :]
        if self.drop_last:
            rest = rest[: (rest.shape[0] // self.micro_batch_size) * self.micro_batch_size]
        return rest

    def dropped(self) -> int:
        """Samples ``drop_last`` leaves out of this epoch (0 without it)."""
        rest = len(self.index) - self.skip
        return rest % self.micro_batch_size if self.drop_last else 0

    def __iter__(self) -> Iterator[list[int]]:
        rest = self.remaining()
        for start in range(0, rest.shape[0], self.micro_batch_size):
            yield rest[start : start + self.micro_batch_size].tolist()

    def __len__(self) -> int:
        """Micro-batches left in this epoch."""
        return -(-self.remaining().shape[0] // self.micro_batch_size)

    def state_dict(self, steps_done: int = 0) -> dict[str, Any]:
        """What a checkpoint keeps, after ``steps_done`` more training steps from here."""
        consumed = self.consumed_samples + steps_done * self.micro_batch_size * self.world_size
        return {"epoch": self.epoch, "consumed_samples": consumed, "seed": self.seed,
                "world_size": self.world_size, "micro_batch_size": self.micro_batch_size,
                "window": self.window, "shuffle": self.shuffle,
                "shuffle_chunks": self.shuffle_chunks}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`; the shuffle must match, and a mid-epoch world size
        change is refused (the rank-local index spaces differ; change it between epochs)."""
        for key in ("seed", "micro_batch_size", "window", "shuffle", "shuffle_chunks"):
            if key in state and state[key] != getattr(self, key):
                raise PacklabError(f"cannot resume: checkpoint has {key}={state[key]!r}, this "
                                   f"sampler {getattr(self, key)!r}")
        self.epoch = int(state["epoch"])
        consumed = int(state["consumed_samples"])
        if consumed and int(state.get("world_size", self.world_size)) != self.world_size:
            raise PacklabError(f"cannot resume mid-epoch with world size {self.world_size}: the "
                               f"checkpoint was taken at world size {state['world_size']} after "
                               f"{consumed} samples; finish the epoch or keep the world size")
        self.resume(consumed)


def steps_per_epoch(plan: ChunkPlan, world_size: int, micro_batch_size: int) -> np.ndarray:
    """Micro-batches each rank serves in one epoch (int64[world_size]); unequal counts mean a
    data-parallel step loop must stop at the shortest rank (choose chunks per rank equal)."""
    return -(-plan.rank_sizes(world_size) // int(micro_batch_size))
