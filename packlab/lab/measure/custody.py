"""What the chain of custody costs a pack run, measured. The same plan is written by
:func:`packlab.pipeline.shards.write_shards` with the spool's verification (``lengths.bin``
and ``offsets.bin`` whole, the range checksums of every sequence the plan reads:
:meth:`SpoolReader.verify_index`, :meth:`SpoolReader.verify_sequences`) and without it (both
made no-ops for the run; forked workers inherit that), alternately and in turns first, each
into a fresh folder, page cache warm (the spool
read once first); the median of ``repeats`` runs each. Also the verification alone, timed
once per run (its per-process memo cleared, as in a fresh ``packlab pack``).
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packlab.packing import pack
from packlab.pipeline.shards import write_shards
from packlab.spool import SpoolReader
from packlab.spool import custody as spool_custody
from packlab.storage.files import remove


@contextmanager
def _unverified() -> Iterator[None]:
    """The spool's checks made no-ops (what pack did before the chain of custody)."""
    saved = SpoolReader.verify_index, SpoolReader.verify_sequences
    SpoolReader.verify_index = lambda self: None  # type: ignore[method-assign]
    SpoolReader.verify_sequences = lambda self, indices: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        SpoolReader.verify_index, SpoolReader.verify_sequences = saved


def _verification_alone(spool: SpoolReader, indices: Any) -> float:
    spool_custody._VERIFIED.clear()
    began = time.perf_counter()
    spool.verify_index()
    spool.verify_sequences(indices)
    return time.perf_counter() - began


def custody_cost(spool_path: str | os.PathLike[str], work: str | os.PathLike[str], *,
                 format: str = "parquet", pack_size: int = 4096, bins_per_shard: int = 2048,
                 workers: int = 1, repeats: int = 5) -> dict[str, Any]:
    """Pack throughput (tokens per second) with and without the spool's verification, and
    what the verification alone takes; ``work`` is a scratch folder, removed after."""
    spool = SpoolReader(spool_path)
    assignment, _ = pack(spool.lengths, pack_size, seed=0)
    for name in ("tokens", "masks"):  # the page cache warm for both variants
        _ = int(getattr(spool, name).view("u1").sum(dtype="u8"))
    work = Path(work)
    times: dict[str, list[float]] = {"verified": [], "unverified": []}
    alone = []
    for i in range(repeats):
        order = ("verified", "unverified")
        for variant in order if i % 2 == 0 else order[::-1]:  # neither always first
            out = work / f"{variant}{i}"
            spool_custody._VERIFIED.clear()  # a fresh process's memo
            began = time.perf_counter()
            if variant == "verified":
                write_shards(spool_path, assignment, out, format=format,
                             bins_per_shard=bins_per_shard, workers=workers)
            else:
                with _unverified():
                    write_shards(spool_path, assignment, out, format=format,
                                 bins_per_shard=bins_per_shard, workers=workers)
            times[variant].append(time.perf_counter() - began)
            remove(out)
        alone.append(_verification_alone(spool, assignment.seq_indices))
    shutil.rmtree(work, ignore_errors=True)
    tokens = int(spool.num_tokens)
    seconds = {k: statistics.median(v) for k, v in times.items()}
    rate = {k: tokens / s for k, s in seconds.items()}
    return {"format": format, "num_tokens": tokens, "spool_bytes": spool.tokens.nbytes
            + spool.masks.nbytes, "pack_size": pack_size, "workers": workers,
            "repeats": repeats, "seconds": seconds, "tokens_per_second": rate,
            "verification_seconds": statistics.median(alone),
            "slowdown": seconds["verified"] / seconds["unverified"] - 1}
