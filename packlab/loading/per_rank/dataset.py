"""The consumer side: a map-style, rank-aware dataset over chunk files, and the tracker that
writes completion markers.

:class:`RankShardedDataset` has ``len`` (so Megatron-style trainers take the map-style path,
not rank 0 reading everything and scattering it), opens only its rank's chunks, waits for
chunks not yet published (poll interval, finite timeout, an error naming the chunk), and keeps
at most ``cache_chunks`` decoded chunks per process, evicting the least recently used. Its
index is rank-local (:class:`~packlab.loading.per_rank.sampler.RankLocalIndex`): pair it with
:class:`~packlab.loading.per_rank.sampler.RankLocalSampler`.

Completion markers are written by :class:`ConsumptionTracker` in the training process, once
every sample of a chunk has been *delivered* there. The dataset cannot do it: with DataLoader
workers each worker sees only some of a chunk's samples. When the marker appears no worker
needs that chunk again this epoch, so the producer may delete it.

A marker (``chunk_00003.parquet.completed``)::

    {"chunk": 3, "rank": 1, "world_size": 2, "epoch": 0, "samples": 1000}
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import InvariantError, PacklabError
from packlab.loading.per_rank.chunks import LoadedChunk, load_chunk, preload, wait_for_chunk
from packlab.loading.per_rank.plan import ChunkPlan, chunk_path, marker_path, plan_path, read_plan
from packlab.loading.per_rank.sampler import RankLocalIndex
from packlab.storage.files import staged


def data_parallel_info() -> tuple[int, int]:
    """(rank, world size) of data parallelism: Megatron's ``mpu`` when it is initialized,
    else ``torch.distributed``, else ``(0, 1)``. Neither library is imported here."""
    mpu = sys.modules.get("megatron.core.parallel_state")
    if mpu is not None and mpu.model_parallel_is_initialized():
        return mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size()
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def wait_for_plan(directory: Path, *, poll_interval: float, timeout: float) -> ChunkPlan:
    """The plan, once the producer has published it (finite wait)."""
    deadline = time.monotonic() + timeout
    while not plan_path(directory).exists():
        if time.monotonic() >= deadline:
            raise PacklabError(f"{plan_path(directory)}: no chunk plan after {timeout:g} s; "
                               "is the producer running?")
        time.sleep(poll_interval)
    return read_plan(directory)


class RankShardedDataset:
    """Samples of this rank's chunks, numbered locally; picklable and lazy per process."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rank: int | None = None,
        world_size: int | None = None,
        poll_interval: float = 0.05,
        timeout: float = 60.0,
        cache_chunks: int = 2,
    ) -> None:
        if (rank is None) != (world_size is None):
            raise PacklabError("give both rank= and world_size=, or neither (then they come "
                               "from torch.distributed)")
        if rank is None or world_size is None:
            rank, world_size = data_parallel_info()
        if int(cache_chunks) < 1:
            raise PacklabError(f"cache_chunks must be >= 1, got {cache_chunks}")
        self.directory = Path(directory)
        self.poll_interval = float(poll_interval)
        self.timeout = float(timeout)
        self.cache_chunks = int(cache_chunks)
        self.plan = wait_for_plan(self.directory, poll_interval=self.poll_interval,
                                      timeout=self.timeout)
        self.index = RankLocalIndex(self.plan, rank, world_size)
        preload(self.plan.format)
        self._cache: OrderedDict[int, LoadedChunk] = OrderedDict()
        self._pid = os.getpid()
        self.loads = 0
        self.evictions = 0
        self.peak_cached = 0

    @property
    def rank(self) -> int:
        return self.index.rank

    @property
    def world_size(self) -> int:
        return self.index.world_size

    def __len__(self) -> int:
        return len(self.index)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cache"] = OrderedDict()
        return state

    # -- chunks -----------------------------------------------------------------------------
    def _chunk(self, chunk: int) -> LoadedChunk:
        if self._pid != os.getpid():  # a forked worker: never share the parent's handles
            self._cache, self._pid = OrderedDict(), os.getpid()
        loaded = self._cache.get(chunk)
        if loaded is not None:
            self._cache.move_to_end(chunk)
            return loaded
        path = wait_for_chunk(chunk_path(self.directory, self.plan, chunk), chunk=chunk,
                              rank=self.rank, poll_interval=self.poll_interval,
                              timeout=self.timeout)
        loaded = load_chunk(path, self.plan, chunk)
        self.loads += 1
        self._cache[chunk] = loaded
        while len(self._cache) > self.cache_chunks:
            self._evict_oldest()
        self.peak_cached = max(self.peak_cached, len(self._cache))
        return loaded

    def _evict_oldest(self) -> None:
        _, loaded = self._cache.popitem(last=False)
        loaded.close()
        self.evictions += 1

    def evict(self, chunk: int) -> bool:
        """Drop a chunk from this process's memory; True if it was held."""
        loaded = self._cache.pop(chunk, None)
        if loaded is None:
            return False
        loaded.close()
        self.evictions += 1
        return True

    def cached_chunks(self) -> list[int]:
        return list(self._cache)

    # -- map-style access -------------------------------------------------------------------
    def __getitem__(self, local: int) -> dict[str, Any]:
        chunk, offset = self.index.locate(local)
        packed = self._chunk(chunk).bin(offset)
        return {**packed.item(), "sample_id": chunk * self.plan.samples_per_chunk + offset,
                "chunk": chunk}

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [self[int(i)] for i in indices]

    def tracker(self, *, epoch: int = 0) -> ConsumptionTracker:
        """A tracker for this rank that also evicts each chunk here once it is consumed."""
        return ConsumptionTracker(self.directory, self.plan, self.index, epoch=epoch,
                                  on_complete=self.evict)

    def __repr__(self) -> str:
        return (f"RankShardedDataset({self.directory}, rank {self.rank}/{self.world_size}, "
                f"{len(self)} samples in {self.index.chunks.shape[0]} chunks)")


class ConsumptionTracker:
    """Counts delivered samples per chunk; marks a chunk completed when all have arrived.

    Delivering a sample of a chunk more often than it holds is an :class:`InvariantError`
    (a duplicate), so exactly-once is checked as training runs, not only in tests.
    """

    def __init__(self, directory: Path, plan: ChunkPlan, index: RankLocalIndex, *,
                 epoch: int = 0, on_complete: Callable[[int], Any] | None = None) -> None:
        self.directory = Path(directory)
        self.plan = plan
        self.index = index
        self.epoch = int(epoch)
        self.remaining = dict(zip(index.chunks.tolist(), index.sizes.tolist(), strict=True))
        self.completed: list[int] = []
        self.on_complete = on_complete

    def skip(self, local: np.ndarray) -> list[int]:
        """Count samples served before a restart (``RankLocalSampler.served_before()``)."""
        return self.update(self.index.chunk_of(local)) if len(local) else []

    def update(self, chunks: Iterable[int] | np.ndarray) -> list[int]:
        """Record delivered samples (their chunk ids); returns the chunks completed now."""
        done = []
        values, counts = np.unique(np.asarray(chunks, dtype=np.int64), return_counts=True)
        for chunk, count in zip(values.tolist(), counts.tolist(), strict=True):
            if chunk not in self.remaining:
                raise InvariantError(f"{self.directory}: rank {self.index.rank} was delivered a "
                                     f"sample of chunk {chunk}, which is not its own")
            left = self.remaining[chunk] - count
            if left < 0:
                raise InvariantError(f"{chunk_path(self.directory, self.plan, chunk)}: rank "
                                     f"{self.index.rank} was delivered {-left} sample(s) of "
                                     f"chunk {chunk} twice in epoch {self.epoch}")
            self.remaining[chunk] = left
            if left == 0:
                self._mark(chunk)
                if self.on_complete is not None:
                    self.on_complete(chunk)
                done.append(chunk)
        return done

    def _mark(self, chunk: int) -> None:
        final = marker_path(chunk_path(self.directory, self.plan, chunk))
        with staged(final, overwrite=True) as tmp:
            tmp.write_text(json.dumps({
                "chunk": chunk, "rank": self.index.rank, "world_size": self.index.world_size,
                "epoch": self.epoch, "samples": int(self.index.sizes[
                    int(np.flatnonzero(self.index.chunks == chunk)[0])]),
            }) + "\n")
        self.completed.append(chunk)

    def track(self, batches: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        """Yield each batch; once the caller is done with it, count its samples (a chunk is
        marked only after the step that used its last sample)."""
        for batch in batches:
            yield batch
            self.update(batch["chunk"])

    @property
    def finished(self) -> bool:
        return all(v == 0 for v in self.remaining.values())


def collate_ids(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A light collate for tests and measurements: sample ids, chunks and token counts."""
    return {
        "sample_id": np.array([it["sample_id"] for it in items], dtype=np.int64),
        "chunk": np.array([it["chunk"] for it in items], dtype=np.int64),
        "num_tokens": int(sum(it["input_ids"].shape[0] for it in items)),
        "token_sum": np.array([int(it["input_ids"].sum(dtype=np.int64)) for it in items],
                              dtype=np.int64),
    }
