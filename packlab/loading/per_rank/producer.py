"""The producer side of the chunk protocol.

1. Publish the plan (``chunks.json``) first: consumers size themselves from it.
2. Publish chunks in order, each atomically (temporary name, then rename).
3. Optionally :meth:`ChunkProducer.collect`: delete the chunks whose completion marker a
   consumer wrote (a streaming, single-pass run; keep them for more epochs).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from packlab.bins import PackedBin
from packlab.errors import PacklabError
from packlab.loading.per_rank.chunks import write_chunk
from packlab.loading.per_rank.plan import (
    ChunkPlan,
    chunk_path,
    marker_path,
    plan_path,
    read_plan,
    write_plan,
)
from packlab.packing import BinAssignment
from packlab.packing.materialize import iter_bins
from packlab.spool import SpoolReader
from packlab.storage.files import remove

BinSource = Callable[[int, int], Iterable[PackedBin]]


def spool_source(spool: SpoolReader | str | os.PathLike[str], assignment: BinAssignment
                 ) -> BinSource:
    """Bins ``[start, stop)`` of ``assignment`` materialized from ``spool``, one at a time."""
    reader = spool if isinstance(spool, SpoolReader) else SpoolReader(spool)
    return lambda start, stop: iter_bins(reader, assignment, start=start, stop=stop)


class ChunkProducer:
    """Writes the plan, then chunk files, into ``directory``.

    A directory that already holds a different plan is refused unless ``overwrite``; then
    every chunk and marker of the old run is removed first, so no stale chunk is ever served.
    """

    def __init__(self, directory: str | os.PathLike[str], plan: ChunkPlan, *,
                 overwrite: bool = False) -> None:
        self.directory = Path(directory)
        self.plan = plan
        if plan_path(self.directory).exists():
            old = read_plan(self.directory)
            if not overwrite:
                raise PacklabError(f"{plan_path(self.directory)}: a chunk plan is already "
                                   "here (pass overwrite=True to start a new run)")
            _clear(self.directory, old)
        write_plan(self.directory, plan, overwrite=True)
        self.deleted: list[int] = []

    def write_chunk(self, chunk: int, bins: Iterable[PackedBin]) -> Path:
        return write_chunk(self.directory, self.plan, chunk, bins)

    def produce(self, source: BinSource, *, chunks: Sequence[int] | None = None,
                delay: float = 0.0, collect: bool = False) -> list[Path]:
        """Write ``chunks`` (all, in order, by default), sleeping ``delay`` s before each one
        (a producer slower than training), collecting consumed chunks as it goes if asked."""
        written = []
        for chunk in range(self.plan.num_chunks) if chunks is None else chunks:
            if delay > 0:
                time.sleep(delay)
            if collect:
                self.collect()
            written.append(self.write_chunk(chunk, source(*self.plan.chunk_range(chunk))))
        return written

    def published(self) -> list[int]:
        return [c for c in range(self.plan.num_chunks)
                if chunk_path(self.directory, self.plan, c).exists()]

    def collect(self) -> list[int]:
        """Delete every published chunk that a consumer has marked completed; returns them."""
        gone = []
        for chunk in self.published():
            path = chunk_path(self.directory, self.plan, chunk)
            if marker_path(path).exists():
                remove(path)
                gone.append(chunk)
        self.deleted.extend(gone)
        return gone


def _clear(directory: Path, plan: ChunkPlan) -> None:
    for chunk in range(plan.num_chunks):
        path = chunk_path(directory, plan, chunk)
        remove(path)
        remove(marker_path(path))
