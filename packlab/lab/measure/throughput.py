"""Throughput: a sequential scan in tokens/s, and a torch DataLoader in bins/s by worker count.

The scan (:func:`scan_rate`) reads every bin in order through the source's streaming path
(``iter(dataset)``, or a reader's ``iter_bins``), every bin delivered (its arrays copied into
reusable buffers inside the timer, so a memory-mapped format pays for every byte it claims to
read), in the same cache state as its floors measured in the same run: the Python floor's pass
over the same bins in RAM, and a raw sequential read of every data file into one buffer
allocated and faulted in once (:class:`RawRead`; warm: after a pass; cold: pages dropped
first). ``ratio_to_floor`` is the raw read's time over the scan's: a scan cannot beat the
disk, so it stays at or below 1 beyond noise (``tests/test_scan_floor.py``).

The DataLoader (:func:`loader_rates`) reads in a seeded sampler's order (a uniform shuffle, or
the block shuffle a Parquet shard wants) in ``__getitems__`` batches through packlab's THD
collate, as training does; time to the first batch (worker start-up) is reported apart from
the steady rate.

``packlab bench throughput`` (:func:`scan`, :func:`dataloader`) and notebook 05 call the
same two measurements. The command's defaults finish in seconds on any output: the
DataLoader reads at most ``LOADER_BINS`` bins per worker count, in the order training would
use on the source (:func:`natural_sampler`: a uniform shuffle over Parquet decodes a row group
per bin, minutes for a 35 MB output, and is what nobody trains with).
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.delivery import Sink
from packlab.lab.measure.floors import checked_floor
from packlab.lab.measure.jobs import resolve_via
from packlab.lab.measure.pagecache import drop_until_cold
from packlab.lab.measure.reading import (
    CACHES,
    data_files,
    is_dataset,
    open_source,
    source_blocks,
    stream,
    warm,
)
from packlab.loading.samplers import BlockShuffleSampler, ShuffleSampler, has_own_blocks

SAMPLERS = ("shuffle", "block")
LOADER_BINS = 2000  # bins the command's DataLoader reads per worker count, by default


# -- sequential scan ----------------------------------------------------------------------------
class RawRead:
    """The raw read floor of a scan: every byte of ``files`` read sequentially into one reused
    buffer, allocated and faulted in once (a fresh buffer per pass times the allocator and
    the page faults of the buffer, not the read: it made scans look faster than the disk)."""

    def __init__(self, files: Sequence[os.PathLike[str] | str], chunk: int = 8 << 20) -> None:
        self.files = list(files)
        self.buffer = np.ones(chunk, dtype=np.uint8)
        self.view = memoryview(self.buffer)

    def __call__(self) -> int:
        """Read every file once; returns the bytes read."""
        total = 0
        for path in self.files:
            with open(path, "rb", buffering=0) as f:
                while n := f.readinto(self.view):
                    total += n
        return total


def _interleaved_medians(runs: Sequence[Callable[[], float]], repeats: int, budget: float
                         ) -> list[float]:
    """Median seconds of each of ``runs``, called in turn, round after round (up to
    ``repeats`` rounds, stopping once ``budget`` seconds have gone, at least one round): a
    burst of load on a shared machine hits every run alike, so their ratios hold."""
    seconds: list[list[float]] = [[] for _ in runs]
    began = time.perf_counter()
    while len(seconds[0]) < max(repeats, 1) and (
            not seconds[0] or time.perf_counter() - began < budget):
        for timings, run in zip(seconds, runs, strict=True):
            timings.append(run())
    return [float(np.median(t)) for t in seconds]


def scan_rate(
    path: str | os.PathLike[str],
    *,
    cache: str = "warm",
    via: str = "dataset",
    repeats: int = 5,
    budget: float = 1.0,
    floor: Any | None = None,
    reader_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Tokens/s of one in-order pass, every bin delivered; beside it the Python floor's pass
    and a raw sequential read of every data file in the same cache state
    (``floor_tokens_per_s``: the tokens those bytes hold, per s; ``floor_read_bytes_per_s``).
    ``file_bytes``: the data files' size (what the raw read reads); ``bytes_delivered``: what
    the scan copied out of its bins (a padded format's padding is not read). Each figure is
    the median of up to ``repeats`` passes, the three interleaved, within ``3 * budget``
    seconds."""
    if cache not in CACHES:
        raise PacklabError(f"cache must be 'warm' or 'cold', got {cache!r}")
    source = open_source(path, via, reader_options)
    floor = checked_floor(path, source, floor)
    files = data_files(source)
    sink = Sink(source.pack_size)
    tokens = int(source.num_tokens)
    warm(source, files, sink)
    raw_read = RawRead(files)
    delivered = [0]

    def run(reading: Any) -> float:
        if cache == "cold" and reading is source:
            drop_until_cold(files)
        began = time.perf_counter()
        nbytes = 0
        for got in stream(reading):
            nbytes += sink.take(got)
        seconds = time.perf_counter() - began
        if reading is source:
            delivered[0] = nbytes
        return seconds

    def read() -> float:
        if cache == "cold":
            drop_until_cold(files)
        began = time.perf_counter()
        raw_read()
        return time.perf_counter() - began

    try:
        seconds, floor_seconds, read_seconds = _interleaved_medians(
            [lambda: run(source), lambda: run(floor), read], repeats, budget * 3)
        bytes_delivered = delivered[0]
    finally:
        source.close()
    raw = sum(f.stat().st_size for f in files)
    return {"path": str(path), "cache": cache, "via": "dataset" if is_dataset(source) else "reader",
            "num_bins": len(source), "num_tokens": tokens, "seconds": seconds,
            "tokens_per_s": tokens / seconds, "bins_per_s": len(source) / seconds,
            "python_floor_tokens_per_s": tokens / floor_seconds,
            "file_bytes": raw, "bytes_delivered": bytes_delivered,
            "delivered_bytes_per_s": bytes_delivered / seconds,
            "floor_read_bytes_per_s": raw / read_seconds,
            "floor_tokens_per_s": tokens / read_seconds, "ratio_to_floor": read_seconds / seconds}


def scan(path: str | os.PathLike[str], *, cache: str = "warm", via: str = "reader"
         ) -> dict[str, Any]:
    """``packlab bench throughput``'s scan: :func:`scan_rate` through ``via``."""
    return scan_rate(path, cache=cache, via=via)


# -- DataLoader ---------------------------------------------------------------------------------
def natural_sampler(source: Any) -> str:
    """The shuffle training uses on ``source``: ``block`` when its reads come in blocks of its
    own (Parquet row groups, decoded whole: a uniform shuffle would decode one for almost every
    bin), ``shuffle`` (uniform) otherwise."""
    return "block" if has_own_blocks(source) else "shuffle"


def epoch_sampler(source: Any, sampler: str, *, num_bins: int | None = None,
                  window: int = 4, seed: int = 0) -> ShuffleSampler | BlockShuffleSampler:
    """A uniform shuffle or a block shuffle (blocks: the shards' row groups, or 1024 bins) of
    the first ``num_bins`` bins of a dataset or a reader; ``auto``: :func:`natural_sampler`."""
    n = len(source) if num_bins is None else min(int(num_bins), len(source))
    if sampler == "auto":
        sampler = natural_sampler(source)
    if sampler == "shuffle":
        return ShuffleSampler(n, seed=seed)
    if sampler != "block":
        raise PacklabError(f"sampler must be auto, {' or '.join(SAMPLERS)}, got {sampler!r}")
    bounds = source_blocks(source)
    bounds = np.append(bounds[bounds < n], np.int64(n))
    return BlockShuffleSampler(n, boundaries=bounds, window=window, seed=seed)


class ReaderItems:
    """One shard's reader as a map-style dataset of Megatron-Bridge items, without the dataset
    layer (what ``via="reader"`` hands the DataLoader); picklable as its reader is."""

    def __init__(self, reader: Any) -> None:
        self.reader = reader

    def __len__(self) -> int:
        return len(self.reader)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return self.reader.read_bin(index).item()

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        return [b.item() for b in self.reader.read_bins(indices)]


def loader_rates(
    path: str | os.PathLike[str],
    *,
    workers: Sequence[int] = (0, 2, 4),
    batch_size: int = 8,
    sampler: str = "shuffle",
    max_bins: int | None = None,
    seed: int = 0,
    via: str = "dataset",
    reader_options: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Bins/s through ``torch.utils.data.DataLoader`` (``__getitems__`` batches, packlab's THD
    collate) for each worker count, over the first ``max_bins`` bins in ``sampler`` order.

    Each worker count gets a freshly opened source (a format that loads everything at open
    pays it in every worker, as in training). Rows: ``workers``, ``sampler``, ``bins``,
    ``epoch_seconds``, ``first_batch_seconds`` (start-up), ``bins_per_s``,
    ``steady_bins_per_s`` (after the first batch).
    """
    try:
        from torch.utils.data import DataLoader
    except ImportError:
        raise PacklabError("the DataLoader benchmark needs torch (pip install packlab[torch])"
                           ) from None
    from packlab.loading.collate import collate

    rows = []
    for n in workers:
        source = open_source(path, via, reader_options)
        chosen = natural_sampler(source) if sampler == "auto" else sampler
        order = epoch_sampler(source, chosen, num_bins=max_bins, seed=seed)
        source.close()
        items = source if is_dataset(source) else ReaderItems(source)
        began = time.perf_counter()
        first, bins = None, 0
        with warnings.catch_warnings():  # more workers than cores is what is being measured
            warnings.filterwarnings("ignore", message=".*worker processes in total.*")
            warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
            loader = DataLoader(items, batch_size=batch_size, sampler=order,
                                num_workers=int(n), collate_fn=collate)
            for batch in loader:
                first = time.perf_counter() if first is None else first
                bins += int(batch["tokens"].shape[0])
        end = time.perf_counter()
        steady_bins = bins - min(batch_size, bins)
        steady = end - (first or end)
        rows.append({"workers": int(n), "sampler": chosen, "bins": bins,
                     "epoch_seconds": end - began, "first_batch_seconds": (first or end) - began,
                     "bins_per_s": bins / (end - began),
                     "steady_bins_per_s": steady_bins / steady if steady > 0 else None})
    return rows


def dataloader(
    path: str | os.PathLike[str],
    *,
    workers: Sequence[int] = (0, 2),
    batch_size: int = 8,
    seed: int = 0,
    via: str = "reader",
    max_bins: int | None = LOADER_BINS,
    sampler: str = "auto",
) -> dict[str, Any]:
    """``packlab bench throughput``'s DataLoader: :func:`loader_rates` over the first
    ``max_bins`` bins (None: all) in ``sampler`` order (``auto``: :func:`natural_sampler`)
    through ``via``, rows keyed by worker count."""
    via = resolve_via(via)
    rows = loader_rates(path, workers=workers, batch_size=batch_size, max_bins=max_bins,
                        seed=seed, via=via, sampler=sampler)
    return {"path": str(path), "via": via, "batch_size": batch_size,
            "num_bins": rows[0]["bins"] if rows else 0,
            "workers": {str(r["workers"]): r for r in rows}}


def steady_rate(row: Mapping[str, Any]) -> float:
    """A DataLoader row's bins/s after the first batch (the whole epoch's when too short)."""
    return float(row["steady_bins_per_s"] or row["bins_per_s"])
