"""The proposed ``LazyShardedDataset`` as written, kept only to measure what it does. Do not use.

Its ``__getitem__(idx)`` takes a *global* index: chunk ``idx // samples_per_chunk``, offset
``idx % samples_per_chunk``. When that chunk is not this rank's (``chunk % world_size !=
rank``), or not available (timed out; consumed and deleted), it silently serves the same
offset of "the nearest chunk that IS ours", ``(chunk // world_size) * world_size + rank``,
and wraps the offset with ``% len(samples)`` when a chunk is short. It marks a chunk completed
as soon as it has *loaded* it, and its ``len`` is a configured ``max_total_samples``.

Under Megatron's samplers every rank is handed indices from every region (see
:mod:`packlab.lab.per_rank.megatron_sampler`), so most requests are substituted: samples are served
several times and others never, without a word. :func:`served_ids` computes what it serves
without I/O; :class:`SeedLazyShardedDataset` does it for real on chunk files (the two agree,
tests check it).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin
from packlab.loading.per_rank.chunks import load_chunk
from packlab.loading.per_rank.plan import ChunkPlan, check_world, chunk_path, marker_path

NOT_SERVED = -1  # the request raised IndexError


def served_ids(indices: np.ndarray, plan: ChunkPlan, rank: int, world_size: int, *,
               available: np.ndarray | None = None) -> np.ndarray:
    """Global sample id the seed's dataset serves for each requested global index on ``rank``
    (``NOT_SERVED`` where it raises). ``available[c]`` says whether chunk ``c`` can be loaded
    (default: all published, none deleted)."""
    rank, world_size = check_world(rank, world_size)
    idx = np.asarray(indices, dtype=np.int64)
    spc, num_chunks = plan.samples_per_chunk, plan.num_chunks
    ok = np.ones(num_chunks, dtype=bool) if available is None else np.asarray(available, bool)
    sizes = plan.chunk_sizes()
    chunk, offset = np.divmod(idx, spc)
    in_range = chunk < num_chunks
    safe = np.where(in_range, chunk, 0)
    mine = in_range & (chunk % world_size == rank) & ok[safe]
    substitute = (chunk // world_size) * world_size + rank
    sub_in = substitute < num_chunks
    sub_safe = np.where(sub_in, substitute, 0)
    sub_ok = sub_in & ok[sub_safe] & (substitute != chunk)
    served_chunk = np.where(mine, chunk, np.where(sub_ok, substitute, NOT_SERVED))
    out = np.full(idx.shape, NOT_SERVED, dtype=np.int64)
    hit = served_chunk >= 0
    out[hit] = served_chunk[hit] * spc + offset[hit] % sizes[served_chunk[hit]]
    return out


class SeedLazyShardedDataset:
    """The proposed dataset, on real chunk files (see the module docstring).

    The only change: ``max_wait_time`` must be positive (the seed's default 0 waits forever
    for a chunk that never comes, a hang). Its items carry ``sample_id`` (what was served) and
    ``asked`` (the global index requested), so the damage can be counted. With
    ``record_errors`` (measurement only) a request that raises ``IndexError`` (which would end
    the epoch in a DataLoader) returns an empty item with ``sample_id = NOT_SERVED`` instead.
    """

    def __init__(self, directory: str | os.PathLike[str], plan: ChunkPlan, *, rank: int,
                 world_size: int, max_total_samples: int | None = None,
                 wait_poll_interval: float = 0.01, max_wait_time: float = 0.2,
                 mark_completed: bool = True, record_errors: bool = False) -> None:
        if not max_wait_time > 0:
            raise ValueError("max_wait_time must be positive here (0 waits forever: a hang)")
        self.directory = Path(directory)
        self.plan = plan
        self.dp_rank, self.dp_world_size = check_world(rank, world_size)
        self.max_total_samples = plan.num_samples if max_total_samples is None else int(
            max_total_samples)
        self.wait_poll_interval = wait_poll_interval
        self.max_wait_time = max_wait_time
        self.mark_completed = mark_completed
        self.record_errors = record_errors
        self._chunk_cache: dict[int, list[PackedBin]] = {}

    def __len__(self) -> int:
        return self.max_total_samples

    def _is_my_chunk(self, chunk_idx: int) -> bool:
        return chunk_idx % self.dp_world_size == self.dp_rank

    def _wait_for_chunk(self, chunk_idx: int) -> Path | None:
        if chunk_idx >= self.plan.num_chunks:
            path = self.directory / f"chunk_{chunk_idx:05d}.missing"
        else:
            path = chunk_path(self.directory, self.plan, chunk_idx)
        start = time.monotonic()
        while True:
            if path.exists():
                return path
            if marker_path(path).exists():
                return None  # consumed and deleted: silently skipped
            if time.monotonic() - start > self.max_wait_time:
                return None  # timeout: silently skipped
            time.sleep(self.wait_poll_interval)

    def _load_chunk(self, chunk_idx: int) -> list[PackedBin]:
        if chunk_idx in self._chunk_cache:
            return self._chunk_cache[chunk_idx]
        if not self._is_my_chunk(chunk_idx):
            return []
        path = self._wait_for_chunk(chunk_idx)
        if path is None:
            return []
        loaded = load_chunk(path, self.plan, chunk_idx)
        samples = [loaded.bin(j) for j in range(loaded.num_samples)]
        loaded.close()
        if self.mark_completed and samples:
            marker_path(path).touch()  # marked on load, not on consumption
        self._chunk_cache[chunk_idx] = samples
        return samples

    def __getitem__(self, idx: int) -> dict[str, Any]:
        chunk_idx, offset = divmod(int(idx), self.plan.samples_per_chunk)
        samples = self._load_chunk(chunk_idx)
        served_chunk = chunk_idx
        if not samples:
            served_chunk = (chunk_idx // self.dp_world_size) * self.dp_world_size + self.dp_rank
            if served_chunk != chunk_idx:
                samples = self._load_chunk(served_chunk)
        if not samples:
            if self.record_errors:
                empty = np.zeros(0, dtype=np.int32)
                return {"input_ids": empty, "loss_mask": empty.astype(np.uint8),
                        "seq_boundaries": empty, "sample_id": NOT_SERVED, "chunk": NOT_SERVED,
                        "asked": int(idx)}
            raise IndexError(f"No samples available for idx {idx} (chunk {chunk_idx})")
        actual = offset % len(samples)
        packed = samples[actual]
        return {**packed.item(),
                "sample_id": served_chunk * self.plan.samples_per_chunk + actual,
                "chunk": served_chunk, "asked": int(idx)}
