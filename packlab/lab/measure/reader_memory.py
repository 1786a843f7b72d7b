"""What a reader of a memory-mapped format costs as its shard grows (notebook 04).

Such a reader keeps its per-bin index in its files' pages (:mod:`packlab.formats.read.table`), so
the memory it owns, its anonymous RSS, should not grow with the number of bins: every rank and
DataLoader worker opens its own readers, and what one copies is paid by each. Measured from a
thousand to hundreds of thousands of bins of a small pack size (the index is per bin: a bin's
length does not change it), each shard written by packlab's writer and opened through
``open_dataset`` in a fresh process (:func:`packlab.lab.measure.sweep.memory_sweep`: *load*
is the dataset opened and its first bin read, *read* every bin once).

Beside it, :func:`bins_touched_at_open`: with the shard's pages evicted, a dataset is opened
and its tables built (every bin's structure checked over the index), then ``mincore`` says
which of a sample of bins has a token or mask page in memory. Opening reads the index only:
none should.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.formats import formats_where
from packlab.lab.measure.pagecache import PAGE, drop_until_cold, resident_map, shard_files
from packlab.lab.measure.sweep import memory_sweep, shard_path
from packlab.sources import open_dataset
from packlab.storage.files import remove


def reader_memory(directory: str | os.PathLike[str], sizes: Sequence[int], *,
                  pack_size: int = 256, formats: Sequence[str] | None = None,
                  samples: int = 200, seed: int = 0) -> dict[str, Any]:
    """``rows`` (one per format, bins and phase, as :func:`memory_sweep` gives them) and
    ``touched`` (per format: :func:`bins_touched_at_open` at the largest size), for every
    memory-mapped format (or ``formats``)."""
    names = list(formats or formats_where("RAW_RUNS"))
    rows = memory_sweep(directory, sizes, formats=names, pack_size=pack_size, via="dataset",
                        tracemalloc=False, seed=seed, keep_shards=True)
    largest = max(sizes)
    touched = {}
    for fmt in names:
        if shard_path(directory, fmt, largest).exists():
            touched[fmt] = bins_touched_at_open(shard_path(directory, fmt, largest),
                                                samples=samples, seed=seed)
        for bins in sizes:
            remove(shard_path(directory, fmt, bins))
    return {"rows": rows, "touched": touched}


def bins_touched_at_open(path: str | os.PathLike[str], *, samples: int = 200,
                         seed: int = 0) -> dict[str, int]:
    """Open the shard cold and build its table; how many of ``samples`` seeded bins then have
    a page of their tokens or mask in the page cache (``bins_touched``), and the pages of the
    shard's files in memory in all (``pages_resident``: the index's)."""
    files = shard_files(path)
    drop_until_cold(files)
    dataset = open_dataset(path)
    reader = dataset.readers()[0]
    reader.table()
    placement = reader.placement()
    n = placement.index.num_bins
    picked = np.random.default_rng(seed).choice(n, size=min(samples, n), replace=False)
    maps = {Path(f): resident_map(f) for f in files}
    touched = sum(_has_page(maps, placement, int(b)) for b in picked)
    pages = sum(int(m.sum()) for m in maps.values())
    dataset.close()
    return {"bins_sampled": int(picked.shape[0]), "bins_touched": int(touched),
            "pages_resident": pages}


def _has_page(maps: dict[Path, np.ndarray], placement: Any, b: int) -> bool:
    """Whether bin ``b``'s tokens or mask have a page in memory."""
    runs = placement.index.runs(b, b + 1)
    for column, first in ((placement.tokens, runs.token_start[0]),
                          (placement.mask, runs.mask_start[0])):
        width = np.dtype(column.dtype).itemsize
        start = column.offset + int(first) * width
        stop = start + int(runs.packed_len[0]) * width
        pages = maps[Path(column.path)][start // PAGE:(stop - 1) // PAGE + 1]
        if pages.any():
            return True
    return False

