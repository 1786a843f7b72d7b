"""A spool exported as a Megatron prefix and read back: tokens per second of each step
(``packlab export``, the report's export/read-back figures).

Timed once each, in this process, on files just written (page cache warm): the export
(:func:`packlab.spool.export.export_spool`), a read of every sequence's tokens and masks back
from the prefix (the sidecar) and from the spool itself through the same reader (every value
summed), the masks derived from the chat role markers (numba's compilation done before the
timer), and the full check of the prefix (checksums, structure).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from packlab.spool import SpoolReader
from packlab.spool.export import export_spool, sequence_chunks
from packlab.spool.masks import MarkerTokens


def read_all(reader: SpoolReader) -> int:
    """Every sequence's tokens and masks, a chunk of sequences at a time; a checksum of them
    (so the reads cannot be skipped)."""
    total = 0
    for lo, hi in sequence_chunks(reader):
        total += int(np.asarray(reader.tokens_of(lo, hi)).sum(dtype=np.int64))
        total += int(np.asarray(reader.masks_of(lo, hi)).sum())
    return total


def _timed(step: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = step()
    return time.perf_counter() - start, result


def export_and_read_back(spool: str | os.PathLike[str], workdir: str | os.PathLike[str],
                         markers: MarkerTokens) -> dict[str, Any]:
    """Seconds and tokens per second of each step over ``spool``, the prefix in ``workdir``."""
    source = SpoolReader(spool)
    prefix = Path(workdir) / "exported"
    seconds = {"export": _timed(lambda: export_spool(source, prefix, overwrite=True))[0]}
    seconds["read_spool"], from_spool = _timed(lambda: read_all(SpoolReader(spool)))
    seconds["read_prefix"], from_prefix = _timed(lambda: read_all(SpoolReader(prefix)))
    derived = SpoolReader(prefix, markers=markers)
    derived.masks_of(0, 1)  # the compiled walk compiled first: not part of the figure
    seconds["derive_masks"], _ = _timed(lambda: derived.masks)
    seconds["verify_prefix"], _ = _timed(SpoolReader(prefix).verify)
    n = source.num_tokens
    return {"num_sequences": source.num_sequences, "num_tokens": n,
            "same_reads": from_spool == from_prefix,
            "masks_equal": bool(np.array_equal(derived.masks, source.masks)),
            "seconds": seconds,
            "tokens_per_second": {step: n / s for step, s in seconds.items()}}
