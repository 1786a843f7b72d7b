"""Chunk files: written atomically by the producer, awaited and loaded by the consumers.

Two chunk formats, one sample (packed bin) per record:

- ``jsonl``: one JSON object per line, ``{"sample_id": 1000, "input_ids": [...],
  "loss_mask": [...], "seq_start_id": [...]}``. Read with
  ``pyarrow.json`` into list columns, so loading never builds a Python list per token.
- ``parquet``: a packed Parquet shard (packlab's ``parquet`` format), with the chunk number
  and its first sample id in the shard metadata. Bins are read lazily through its reader.

Either file appears under its final name only when whole (temporary name, then rename), so a
consumer that sees the name may read it at once: no settling delay.
Every load checks that the chunk holds exactly the samples the plan gives it (a short or
stale chunk is an error naming the file, never an offset wrapped with ``%``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packlab.bins import PackedBin, check_bin
from packlab.errors import FormatError, PacklabError, one_line
from packlab.loading.per_rank.plan import ChunkPlan, chunk_path, marker_path
from packlab.storage.files import staged

PLAN_TAG = "packlab_chunk"


class LoadedChunk(Protocol):
    """What a consumer holds in memory for one chunk."""

    chunk: int
    first_sample: int
    num_samples: int

    def bin(self, j: int) -> PackedBin: ...

    def close(self) -> None: ...


# -- writing ----------------------------------------------------------------------------------
def write_chunk(directory: str | os.PathLike[str], plan: ChunkPlan, chunk: int,
                bins: Iterable[PackedBin], *, overwrite: bool = False) -> Path:
    """Write chunk ``chunk`` from its bins (exactly as many as the plan gives it) and
    publish it atomically; returns its path. A wrong count aborts, leaving nothing behind."""
    final = chunk_path(directory, plan, chunk)
    start, stop = plan.chunk_range(chunk)
    if plan.format == "parquet":
        return _write_parquet(final, plan, chunk, start, stop, bins, overwrite)
    return _write_jsonl(final, plan, start, stop, bins, overwrite)


def _write_jsonl(final: Path, plan: ChunkPlan, start: int, stop: int,
                 bins: Iterable[PackedBin], overwrite: bool) -> Path:
    count = 0
    with staged(final, overwrite=overwrite) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            for count, packed in enumerate(bins, start=1):
                if start + count > stop:
                    raise PacklabError(f"{final}: more than the {stop - start} samples the "
                                       "plan gives this chunk")
                if plan.pack_size:
                    check_bin(*packed, pack_size=plan.pack_size, source=str(final),
                              bin_id=count - 1)
                f.write(json.dumps({
                    "sample_id": start + count - 1,
                    "input_ids": packed.input_ids.tolist(),
                    "loss_mask": packed.loss_mask.tolist(),
                    "seq_start_id": packed.seq_start_id.tolist(),
                }, separators=(",", ":")))
                f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        if count != stop - start:
            raise PacklabError(f"{final}: {count} samples given, the plan needs {stop - start}")
    return final


def _write_parquet(final: Path, plan: ChunkPlan, chunk: int, start: int, stop: int,
                   bins: Iterable[PackedBin], overwrite: bool) -> Path:
    from packlab.formats import get_format

    if not plan.pack_size:
        raise PacklabError(f"{final}: a parquet chunk plan needs pack_size")
    metadata = {PLAN_TAG: {"chunk": chunk, "first_sample": start, "num_samples": stop - start}}
    with get_format("parquet").Writer(final, pack_size=plan.pack_size, num_bins=stop - start,
                     overwrite=overwrite, metadata=metadata) as writer:
        for packed in bins:
            writer.write(packed)  # the writer refuses a bin beyond num_bins
    return final


# -- waiting ----------------------------------------------------------------------------------
def wait_for_chunk(path: Path, *, chunk: int, rank: int, poll_interval: float,
                   timeout: float) -> Path:
    """Return once ``path`` is published; a clear error, naming the chunk, on timeout.

    A chunk whose completion marker exists but whose file is gone was consumed and deleted by
    the producer: that is an error at once, never another chunk served in its place.
    """
    if not timeout > 0 or not poll_interval > 0:
        raise PacklabError(f"poll_interval and timeout must be positive (a finite wait, never a "
                           f"hang), got {poll_interval} and {timeout}")
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            return path
        if marker_path(path).exists():
            raise FormatError(f"{path}: chunk {chunk} (rank {rank}) was consumed and deleted by "
                              f"the producer (marker {marker_path(path).name}); it cannot be "
                              "served again")
        if time.monotonic() >= deadline:
            raise PacklabError(f"{path}: chunk {chunk} (rank {rank}) not published after "
                               f"{timeout:g} s; the producer is stalled or the chunk is missing")
        time.sleep(min(poll_interval, max(deadline - time.monotonic(), 0.0) + 1e-3))


# -- loading ----------------------------------------------------------------------------------
def preload(format: str) -> None:
    """Import a chunk format's reader now, so forked DataLoader workers inherit it instead of
    each importing it again."""
    if format == "parquet":
        import packlab.formats.parquet  # noqa: F401
    else:
        import pyarrow.json  # noqa: F401

        import packlab.formats.shared.arrow_lists  # noqa: F401


def load_chunk(path: Path, plan: ChunkPlan, chunk: int) -> LoadedChunk:
    """Open a published chunk and check it holds exactly its samples."""
    start, stop = plan.chunk_range(chunk)
    if plan.format == "parquet":
        return ParquetChunk(path, plan, chunk, start, stop)
    return JsonlChunk(path, plan, chunk, start, stop)


class JsonlChunk:
    """A JSONL chunk decoded into flat columns (CSR), held in memory until evicted."""

    def __init__(self, path: Path, plan: ChunkPlan, chunk: int, start: int, stop: int
                 ) -> None:
        import pyarrow as pa
        import pyarrow.json as pj

        from packlab.formats.shared.arrow_lists import decode

        self.chunk, self.first_sample, self.num_samples = chunk, start, stop - start
        try:
            table = pj.read_json(str(path))
        except (pa.ArrowException, OSError) as exc:
            raise FormatError(f"{path}: chunk {chunk}: unreadable JSONL: "
                              f"{one_line(exc, 200)}") from None
        for name in ("sample_id", "input_ids", "loss_mask", "seq_start_id"):
            if name not in table.column_names:
                raise FormatError(f"{path}: chunk {chunk}: no field {name!r} in its records")
        ids = table.column("sample_id").to_numpy()
        if ids.shape[0] != self.num_samples or not np.array_equal(
                ids, np.arange(start, stop, dtype=ids.dtype)):
            raise FormatError(f"{path}: chunk {chunk}: holds {ids.shape[0]} samples "
                              f"(ids {_span(ids)}), the plan says {stop - start} (ids "
                              f"{start}..{stop - 1}); a short or stale chunk")
        self.columns = decode(table, source=str(path), first_bin=0)
        if plan.pack_size:
            self.columns.check(pack_size=plan.pack_size, source=str(path), first_bin=0)

    def bin(self, j: int) -> PackedBin:
        return self.columns.bin(j, copy=True)

    def close(self) -> None:
        self.columns = None  # type: ignore[assignment]


class ParquetChunk:
    """A packed Parquet chunk, read lazily through packlab's Parquet reader."""

    def __init__(self, path: Path, plan: ChunkPlan, chunk: int, start: int, stop: int
                 ) -> None:
        from packlab.formats import get_format

        self.chunk, self.first_sample, self.num_samples = chunk, start, stop - start
        self.reader: Any = get_format("parquet").Reader(path)
        info = ((self.reader.packlab or {}).get("metadata") or {}).get(PLAN_TAG) or {}
        if (info.get("chunk"), info.get("first_sample"), self.reader.num_bins) != (
                chunk, start, stop - start):
            self.reader.close()
            raise FormatError(f"{path}: chunk {chunk}: holds {self.reader.num_bins} bins from "
                              f"sample {info.get('first_sample')} (chunk {info.get('chunk')}), "
                              f"the plan says {stop - start} from sample {start}; a short or "
                              "stale chunk")
        if plan.pack_size and self.reader.pack_size != plan.pack_size:
            self.reader.close()
            raise FormatError(f"{path}: chunk {chunk}: pack_size {self.reader.pack_size}, the "
                              f"plan says {plan.pack_size}")

    def bin(self, j: int) -> PackedBin:
        return self.reader.read_bin(j)

    def close(self) -> None:
        self.reader.close()


def _span(ids: np.ndarray) -> str:
    return f"{int(ids[0])}..{int(ids[-1])}" if ids.size else "none"
