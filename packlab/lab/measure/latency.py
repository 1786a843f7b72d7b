"""Random-access latency of one bin (or a batch), warm or cold, with its floors from the same run.

Seeded random indices; every read timed alone with ``perf_counter_ns`` and *delivered* (what it
returned copied inside the timer: :mod:`packlab.lab.measure.delivery`), through a dataset
(``open_dataset(path)[i]``, the default) or a shard reader (``read_bin``), by the one timing
loop of :mod:`packlab.lab.measure.timing`. Warm: after a full pass over every data file and
every bin. Cold: before each read the source is reopened away from the bin
(:func:`packlab.lab.measure.reading.forget`: no decoded row group of it is kept) and every data
file is evicted until ``mincore`` finds no page (the pages left are reported, never assumed).

In the same loop, each step alternating which goes first, each on a bin a third of the index
list away from the others (the same seeded indices, never a bin another just pulled into the
CPU's caches): warm, the **raw CSR floor** (:class:`packlab.lab.measure.floors.RawCsr`: the same
bins gathered from the same files by plain numpy, all three columns into preallocated
buffers), and the **Python floor** (the same access path over the bins in RAM). Then, in a
second pass over the same indices and byte counts (after the format's, so its readahead does
not slow them): a memcpy (:class:`~packlab.lab.measure.floors.Memcpy`) and, warm, a raw pread
of the same bytes (:class:`~packlab.lab.measure.floors.Pread`). Cold, the raw pread of the same
bytes is timed right after each cold read, its file evicted again first: the device is
shared with other jobs, and its load changes faster than a pass. Readers keep whatever
readahead they get: on a machine with a large ``read_ahead_kb`` a cold memory-mapped read can
cost far more than the bytes it returns, and the ratio shows it. Report the median and the
tail, never one run.

``packlab bench latency`` and notebook 05 call the same :func:`random_access`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.delivery import Sink
from packlab.lab.measure.floors import FLOORS, Memcpy, Pread, checked_floor, raw_floor
from packlab.lab.measure.pagecache import drop_until_cold, read_all
from packlab.lab.measure.reading import (
    CACHES,
    data_files,
    forget,
    format_of,
    is_dataset,
    open_source,
    reads,
    source_blocks,
)
from packlab.lab.measure.timing import Lane, Timings, interleaved, seeded_indices, spread

PERCENTILES = ("p50_us", "p90_us", "p99_us", "mean_us")


def random_access(
    path: str | os.PathLike[str],
    *,
    cache: str = "warm",
    samples: int = 1000,
    seed: int = 0,
    via: str = "dataset",
    batch_size: int = 1,
    max_seconds: float | None = None,
    floor: Any | None = None,
    reader_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Latency per bin of random reads of the shards at ``path``, delivered, floors beside it.

    ``batch_size`` > 1 reads each sample as one batch (``__getitems__`` / ``read_bins``) and
    reports the batch's time divided by its size. ``floor``: a Python floor built beforehand
    (:func:`packlab.lab.measure.floors.python_floor`, same ``via``) to share between runs.
    ``max_seconds`` stops the format's reads early (after at least ``MIN_SAMPLES``), the
    floors of the same loop with them; ``samples`` then says how many were taken, and the
    floors' second pass takes as many.

    Keys: ``p50_us``, ``p90_us``, ``p99_us``, ``mean_us`` and the same prefixed by each floor
    of :data:`~packlab.lab.measure.floors.FLOORS` (``raw_csr_``, ``memcpy_``,
    ``python_floor_``, ``pread_``), with ``ratio_to_<floor>`` (p50 over p50); None where a
    floor was not measured (raw CSR: cold, or no placement). ``p50_by_part_us``: the p50 of
    each fifth of the reads (how much a rerun could move it). ``bytes_per_bin``; cold:
    ``cold_checked`` (reads whose eviction ``mincore`` checked), ``cold_max_resident_pages``,
    ``cold_verified`` (no page left, ever) and ``faster_than_cold_pread`` (the reader served
    from its own memory, not the disk: the figure is then not a cold read).
    """
    if cache not in CACHES:
        raise PacklabError(f"cache must be 'warm' or 'cold', got {cache!r}")
    if samples <= 0 or batch_size <= 0:
        raise PacklabError(f"samples and batch_size must be positive, got {samples}, {batch_size}")
    cold = cache == "cold"
    source = open_source(path, via, reader_options)
    n = len(source)
    if n == 0:
        raise PacklabError(f"{path}: no bins to read")
    floor = checked_floor(path, source, floor)
    files = data_files(source)
    big = max(files, key=lambda f: f.stat().st_size)
    batches = seeded_indices(n, samples, seed, batch_size)
    sink = Sink(source.pack_size)
    for f in files:  # warm: every file read once (then every bin, in the warm pass)
        read_all(f)
    pread = Pread(big, n)
    try:
        reading = _FormatLane(source, sink, files, cold=cold)
        lanes = _first_pass(reading, floor, None if cold else raw_floor(source), sink, pread,
                            samples, cold=cold)
        first = interleaved(lanes, batches, max_seconds=max_seconds, warm_bins=n)
    finally:
        source.close()
    taken = first.samples("format")
    sizes = np.asarray(reading.sizes[:taken], dtype=np.int64)
    try:
        second = _byte_floors(batches[:taken], sizes, sink, pread, cold=cold)
    finally:
        pread.close()
    out: dict[str, Any] = {"path": str(path), "format": format_of(source), "cache": cache,
                           "via": "dataset" if is_dataset(source) else "reader",
                           "samples": taken, "batch_size": batch_size, "seed": seed,
                           "num_bins": n, "pread_file": big.name,
                           "bytes_per_bin": float(sizes.mean() / batch_size)}
    out.update(first.percentiles("format", per=batch_size))
    out["p50_by_part_us"] = first.part_p50s("format", per=batch_size)
    for timings in (first, second):
        out.update(floor_keys(timings, per=batch_size, p50=out["p50_us"]))
    for name in FLOORS:  # the floors no lane measured here: None
        out.update({f"{name}_{k}": None for k in PERCENTILES if f"{name}_{k}" not in out})
        out.setdefault(f"ratio_to_{name}", None)
    if cold:
        worst = max(reading.worst, pread.worst)
        out["cold_checked"] = taken
        out["cold_max_resident_pages"] = worst
        out["cold_verified"] = worst == 0
        out["faster_than_cold_pread"] = out["p50_us"] < out["pread_p50_us"]
    return out


def floor_keys(timings: Timings, *, per: int, p50: float) -> dict[str, Any]:
    """Percentiles (``<floor>_p50_us`` ...) and ``ratio_to_<floor>`` of every floor timed."""
    out: dict[str, Any] = {}
    for name in FLOORS:
        if name in timings.ns and timings.samples(name):
            out.update(timings.percentiles(name, f"{name}_", per=per))
            base = out[f"{name}_p50_us"]
            out[f"ratio_to_{name}"] = p50 / base if base > 0 else None
    return out


class _FormatLane:
    """The format's read as a lane: cold, the source made to forget the bin and every data
    file evicted (untimed, the pages left kept in ``worst``); the bytes each read returned
    kept in ``sizes`` (what the floors of the second pass move)."""

    def __init__(self, source: Any, sink: Sink, files: list[Any], *, cold: bool) -> None:
        self.source, self.sink, self.files, self.cold = source, sink, files, cold
        self.one, self.many = reads(source)
        self.blocks = source_blocks(source, default_block_size=1)  # no row groups: any other bin
        self.sizes: list[int] = []
        self.worst = 0

    def read(self, batch: list[int]) -> int:
        if self.cold:
            forget(self.source, self.blocks, batch[0], self.sink)
            self.worst = max(self.worst, drop_until_cold(self.files))
        if len(batch) == 1:
            ns, nbytes = self.sink.timed(self.one, batch[0])
        else:
            ns, nbytes = self.sink.timed(self.many, batch, batch=True)
        self.sizes.append(nbytes)
        return ns

    def warm(self, i: int) -> None:
        self.sink.take(self.one(i))


def _first_pass(reading: _FormatLane, floor: Any, raw: Any, sink: Sink, pread: Pread,
                samples: int, *, cold: bool) -> list[Lane]:
    """The format (cold: the pread of its bytes right after each read), the raw CSR floor
    (warm, where there is a placement) and the Python floor, a third of the list apart."""
    shifts = spread(3, samples)
    then = None
    if cold:
        def cold_pread(batch: list[int]) -> int:
            time.sleep(0.002)  # the read's advised pages landed (evicted next)
            return pread.time(batch[0], reading.sizes[-1], cold=True)

        then = Lane("pread", cold_pread)
    lanes = [Lane("format", reading.read, warm=reading.warm, then=then)]
    if raw is not None:
        lanes.append(Lane("raw_csr", raw.timed, warm=raw.read, shift=shifts[1], floor=True))
    lanes.append(Lane("python_floor", _delivered(floor, sink), shift=shifts[2], floor=True))
    return lanes


def _delivered(source: Any, sink: Sink) -> Any:
    """A source's read of one item of the index list (a bin, or a batch), delivered."""
    one, many = reads(source)

    def read(batch: list[int]) -> int:
        if len(batch) == 1:
            return sink.timed(one, batch[0])[0]
        return sink.timed(many, batch, batch=True)[0]

    return read


def _byte_floors(batches: np.ndarray, sizes: np.ndarray, sink: Sink, pread: Pread, *,
                 cold: bool) -> Timings:
    """The second pass, over the batches the format read and the bytes it returned: memcpy of
    them and, warm, a raw pread of them (cold, pread was timed beside each read)."""
    memcpy = Memcpy(int(sizes.max()) + 1)
    lanes = [Lane("memcpy", lambda item: sink.timed_arrays(memcpy.read, item[1]), floor=True)]
    if not cold:
        lanes.append(Lane("pread", lambda item: pread.time(item[0], item[1], cold=False),
                          floor=True))
    return interleaved(lanes, np.column_stack([batches[:, 0], sizes]))


def latency(
    path: str | os.PathLike[str],
    *,
    samples: int = 1000,
    seed: int = 0,
    cache: str = "warm",
    via: str = "reader",
    batch_size: int = 1,
) -> dict[str, Any]:
    """``packlab bench latency``: :func:`random_access`, with the floor a cache state is
    judged against named (``floor``: memcpy when warm, pread when cold; ``floor_p50_us``,
    ``ratio_to_floor``)."""
    row = random_access(path, cache=cache, samples=samples, seed=seed, via=via,
                        batch_size=batch_size)
    floor = "memcpy" if cache == "warm" else "pread"
    return {**row, "floor": floor, "floor_p50_us": row[f"{floor}_p50_us"],
            "ratio_to_floor": row[f"ratio_to_{floor}"]}


def batched_access(
    path: str | os.PathLike[str],
    *,
    batch_size: int = 8,
    samples: int = 200,
    seed: int = 0,
    max_seconds: float | None = None,
    floor: Any | None = None,
    reader_options: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Per-bin cost of ``__getitems__(batch)`` against ``batch_size`` single ``[i]`` reads (warm,
    delivered), in the one loop, each lane on its own random batch (the index list read at
    evenly spread places), alternating which goes first; the Python floor of both beside
    them, and the raw CSR floor (memory-mapped formats): a single read of a batch's first bin,
    timed alone as in :func:`random_access` (``raw_single_``), and a loop over a batch timed
    together (``raw_batch_``, per bin: the same loop without a timer per bin). ``gain`` =
    single p50 / batched p50 (above 1: batching is cheaper); ``gain_vs_raw`` = raw single p50
    / batched p50."""
    if batch_size < 2 or samples <= 0:
        raise PacklabError(f"batch_size must be >= 2 and samples positive, got {batch_size}, "
                           f"{samples}")
    dataset = open_source(path, "dataset", reader_options)
    floor = checked_floor(path, dataset, floor)
    sink = Sink(dataset.pack_size)
    for f in data_files(dataset):
        read_all(f)
    raw = raw_floor(dataset)
    shifts = spread(6, samples)
    lanes = [Lane("batched", _delivered(dataset, sink), warm=lambda i: sink.take(dataset[i])),
             Lane("single", _singles(dataset, sink), shift=shifts[1]),
             Lane("floor_batched", _delivered(floor, sink), shift=shifts[2], floor=True),
             Lane("floor_single", _singles(floor, sink), shift=shifts[3], floor=True)]
    if raw is not None:
        lanes += [Lane("raw_batch", raw.timed, warm=raw.read, shift=shifts[4], floor=True),
                  Lane("raw_single", lambda batch: raw.timed(batch[:1]), shift=shifts[5],
                       floor=True)]
    try:
        timings = interleaved(lanes, seeded_indices(len(dataset), samples, seed, batch_size),
                              max_seconds=max_seconds, warm_bins=len(dataset))
    finally:
        dataset.close()
    out: dict[str, Any] = {"path": str(path), "batch_size": batch_size,
                           "samples": timings.samples("batched"), "seed": seed}
    for name in ("batched", "single", "floor_batched", "floor_single"):
        out.update(timings.percentiles(name, f"{name}_", per=batch_size))
    out["gain"] = out["single_p50_us"] / out["batched_p50_us"] if out["batched_p50_us"] else None
    if raw is not None:
        out.update(timings.percentiles("raw_single", "raw_single_"))
        out.update(timings.percentiles("raw_batch", "raw_batch_", per=batch_size))
        out["gain_vs_raw"] = out["raw_single_p50_us"] / out["batched_p50_us"]
    else:
        out.update({"raw_single_p50_us": None, "raw_batch_p50_us": None, "gain_vs_raw": None})
    return out


def _singles(source: Any, sink: Sink) -> Any:
    """A batch read as single ``[i]`` reads, delivered together."""
    one = reads(source)[0]

    def read(batch: list[int]) -> int:
        return sink.timed(lambda b: [one(j) for j in b], batch, batch=True)[0]

    return read
