"""The chunk plan that producer and consumers agree on before any chunk exists.

A per-rank dataset must answer ``len()`` before the producer has written its chunks, and
every rank must know which chunks are its own without listing a directory that is still
filling. So the producer publishes the plan first, in ``chunks.json``::

    {"version": "packlab_chunks_v1", "format": "parquet", "num_samples": 10000,
     "samples_per_chunk": 1000, "pack_size": 4096}

Chunk ``c`` holds samples ``[c * samples_per_chunk, min((c + 1) * samples_per_chunk,
num_samples))`` (a sample is one packed bin), in the file ``chunk_{c:05d}.jsonl`` or
``chunk_{c:05d}.parquet``. Rank ``r`` of ``world_size`` owns the chunks with
``c % world_size == r``.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import FormatError, PacklabError
from packlab.storage.files import read_versioned_json, staged

PLAN_FILE = "chunks.json"
PLAN_VERSION = "packlab_chunks_v1"
CHUNK_FORMATS = {"jsonl": ".jsonl", "parquet": ".parquet"}
MARKER_SUFFIX = ".completed"


@dataclass(frozen=True)
class ChunkPlan:
    """How ``num_samples`` samples are cut into chunks, and which rank owns which chunk."""

    num_samples: int
    samples_per_chunk: int
    format: str = "parquet"
    pack_size: int = 0

    def __post_init__(self) -> None:
        if self.format not in CHUNK_FORMATS:
            raise PacklabError(f"unknown chunk format {self.format!r}; choose from "
                               f"{sorted(CHUNK_FORMATS)}")
        if self.num_samples <= 0 or self.samples_per_chunk <= 0:
            raise PacklabError(f"a chunk plan needs num_samples > 0 and samples_per_chunk > 0, "
                               f"got {self.num_samples} and {self.samples_per_chunk}")

    @property
    def num_chunks(self) -> int:
        return -(-self.num_samples // self.samples_per_chunk)

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """Global sample ids ``[start, stop)`` of ``chunk``."""
        self.check_chunk(chunk)
        start = chunk * self.samples_per_chunk
        return start, min(start + self.samples_per_chunk, self.num_samples)

    def chunk_sizes(self) -> np.ndarray:
        """Samples in every chunk (int64[num_chunks]); only the last may be short."""
        sizes = np.full(self.num_chunks, self.samples_per_chunk, dtype=np.int64)
        sizes[-1] = self.num_samples - (self.num_chunks - 1) * self.samples_per_chunk
        return sizes

    def check_chunk(self, chunk: int) -> int:
        if not 0 <= chunk < self.num_chunks:
            raise PacklabError(f"chunk {chunk} out of range [0, {self.num_chunks})")
        return chunk

    def chunk_name(self, chunk: int) -> str:
        return f"chunk_{chunk:05d}{CHUNK_FORMATS[self.format]}"

    def owner(self, chunk: int, world_size: int) -> int:
        return chunk % check_world(0, world_size)[1]

    def rank_chunks(self, rank: int, world_size: int) -> np.ndarray:
        """The chunks rank ``rank`` owns, in production order (``c % world_size == rank``)."""
        rank, world_size = check_world(rank, world_size)
        return np.arange(rank, self.num_chunks, world_size, dtype=np.int64)

    def rank_sizes(self, world_size: int) -> np.ndarray:
        """Samples each rank owns (int64[world_size])."""
        _, world_size = check_world(0, world_size)
        sizes = self.chunk_sizes()
        return np.bincount(np.arange(self.num_chunks) % world_size, weights=sizes,
                           minlength=world_size).astype(np.int64)

    def to_dict(self) -> dict[str, Any]:
        return {"version": PLAN_VERSION, **asdict(self)}


def check_world(rank: int, world_size: int) -> tuple[int, int]:
    if isinstance(world_size, bool) or int(world_size) < 1:
        raise PacklabError(f"world_size must be >= 1, got {world_size}")
    if not 0 <= int(rank) < int(world_size):
        raise PacklabError(f"rank {rank} out of range for world_size {world_size}")
    return int(rank), int(world_size)


def plan_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / PLAN_FILE


def chunk_path(directory: str | os.PathLike[str], plan: ChunkPlan, chunk: int) -> Path:
    return Path(directory) / plan.chunk_name(plan.check_chunk(chunk))


def marker_path(chunk_file: Path) -> Path:
    """``chunk_00003.parquet.completed``: the consumer's word that the chunk may be deleted."""
    return chunk_file.with_name(chunk_file.name + MARKER_SUFFIX)


def write_plan(directory: str | os.PathLike[str], plan: ChunkPlan, *,
                 overwrite: bool = False) -> Path:
    """Publish ``chunks.json`` atomically (consumers may be polling for it)."""
    final = plan_path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=overwrite) as tmp:
        tmp.write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    return final


def read_plan(directory: str | os.PathLike[str]) -> ChunkPlan:
    """The plan in ``directory/chunks.json``; a clear error if missing or malformed."""
    path = plan_path(directory)
    info = read_versioned_json(path, version=PLAN_VERSION, kind="chunk plan",
                               unreadable="unreadable chunk plan")
    if info is None:
        raise FormatError(f"{path}: no chunk plan (the producer writes it first)")
    try:
        return ChunkPlan(num_samples=int(info["num_samples"]),
                           samples_per_chunk=int(info["samples_per_chunk"]),
                           format=str(info["format"]), pack_size=int(info.get("pack_size", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: bad chunk plan field: {exc}") from None
