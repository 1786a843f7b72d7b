"""Random-access latency of one bin (or a batch), warm or cold, with its floors from the same run.

Seeded random indices; every read timed alone with ``perf_counter_ns`` and *delivered* (what it
returned copied inside the timer: :mod:`packlab.lab.measure.delivery`), through a dataset
(``open_dataset(path)[i]``, the default) or a shard reader (``read_bin``). Warm: after a full
pass over every data file. Cold: before each read the source is reopened away from the bin
(:func:`packlab.lab.measure.reading.forget`: no decoded row group of it is kept) and every data
file is evicted until ``mincore`` finds no page (the pages left are reported, never assumed).

In the same loop, each step alternating which goes first, each on a bin a third of the index
list away from the others (the same seeded indices, never a bin another just pulled into the
CPU's caches): warm, the **raw CSR floor** (:class:`packlab.lab.measure.floors.RawCsr`: the same
bins gathered from the same files by plain numpy, all three columns into preallocated
buffers), and the **Python floor** (the same access path over the bins in RAM). Then, in a
second pass over the same indices and byte counts (after the format's, so its readahead does
not slow them: :func:`packlab.lab.measure.floors.byte_floors`): a memcpy and, warm, a raw pread of
the same bytes. Cold, the raw pread of the same bytes is timed right after each cold read,
its file evicted again first: the device is shared with other jobs, and its load changes
faster than a pass. Readers keep whatever readahead they get: on a machine with a large ``read_ahead_kb`` a
cold memory-mapped read can cost far more than the bytes it returns, and the ratio shows it.
Report the median and the tail, never one run.

``packlab bench latency`` and notebook 05 call the same :func:`random_access`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.delivery import Budget, Sink, percentiles
from packlab.lab.measure.floors import Pread, byte_floors, checked_floor, raw_floor
from packlab.lab.measure.pagecache import drop_until_cold
from packlab.lab.measure.reading import (
    CACHES,
    data_files,
    forget,
    format_of,
    is_dataset,
    open_source,
    reads,
    source_blocks,
    warm,
)

FLOORS = ("python_floor", "memcpy", "pread")


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
    ``max_seconds`` stops the format's pass early (after at least ``MIN_SAMPLES``);
    ``samples`` then says how many were taken, and the floors' pass takes as many.

    Keys: ``p50_us``, ``p90_us``, ``p99_us``, ``mean_us`` and the same ``python_floor_``,
    ``memcpy_``, ``pread_`` prefixed; ``ratio_to_python_floor``, ``ratio_to_memcpy``,
    ``ratio_to_pread`` (p50 over p50); ``bytes_per_bin``; warm, for the memory-mapped formats:
    ``raw_csr_`` prefixed and ``ratio_to_raw_csr`` (None where there is no raw layout, and
    cold); cold: ``cold_checked`` (reads whose
    eviction ``mincore`` checked), ``cold_max_resident_pages``, ``cold_verified`` (no page
    left, ever) and ``faster_than_cold_pread`` (the reader served from its own memory, not
    the disk: the figure is then not a cold read).
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
    batches = np.random.default_rng(seed).integers(0, n, size=(samples, batch_size))
    blocks = source_blocks(source, default_block_size=1)  # no row groups: any other bin
    sink = Sink(source.pack_size)
    warm(source, files, sink)
    one, many = reads(source)
    raw = None if cold else raw_floor(source)
    if raw is not None:  # its maps' pages mapped in, as the format's were by warm()
        raw.read_batch(range(n))
    ns = np.zeros(samples, dtype=np.int64)
    raw_ns = np.zeros(samples, dtype=np.int64)
    floor_ns = np.zeros(samples, dtype=np.int64)
    pread_ns = np.zeros(samples, dtype=np.int64)
    pread = Pread(big, n) if cold else None
    floor_one, floor_many = reads(floor)
    sizes = np.zeros(samples, dtype=np.int64)
    worst, taken, budget = 0, samples, Budget(max_seconds)

    def floors_of(k: int) -> None:
        """The raw CSR floor (warm) and the Python floor, each on a bin a third of the index
        list away from the other two."""
        if raw is not None:
            raw_ns[k] = _timed_raw(raw, batches[(k + samples // 3) % samples])
        other = batches[(k + 2 * samples // 3) % samples]
        floor_ns[k] = (sink.timed(floor_one, int(other[0]))[0] if batch_size == 1
                       else sink.timed(floor_many, other.tolist(), batch=True)[0])

    try:
        for k in range(samples):  # pass 1: the format, the raw CSR and Python floors
            batch = batches[k]
            if k % 2:
                floors_of(k)
            if cold:
                forget(source, blocks, int(batch[0]), sink)
                worst = max(worst, drop_until_cold(files))
            if batch_size == 1:
                ns[k], sizes[k] = sink.timed(one, int(batch[0]))
            else:
                ns[k], sizes[k] = sink.timed(many, batch.tolist(), batch=True)
            if pread is not None:  # the same bytes, cold, right after: the same device load
                time.sleep(0.002)  # the read's advised pages landed (evicted next)
                pread_ns[k] = pread.time(int(batch[0]), int(sizes[k]), cold=True)
            if not k % 2:
                floors_of(k)
            if budget.spent(k + 1):
                taken = k + 1
                break
    finally:
        source.close()
        if pread is not None:
            pread.close()
    floors, left = byte_floors(floor, big, batches[:taken], sizes[:taken], num_bins=n,
                               cold=cold, sink=sink, python_ns=floor_ns[:taken],
                               pread_ns=pread_ns[:taken] if cold else None)  # pass 2
    if pread is not None:
        left = pread.worst
    out: dict[str, Any] = {"path": str(path), "format": format_of(source), "cache": cache,
                           "via": "dataset" if is_dataset(source) else "reader",
                           "samples": taken, "batch_size": batch_size, "seed": seed,
                           "num_bins": n, "pread_file": big.name,
                           "bytes_per_bin": float(sizes[:taken].mean() / batch_size)}
    out.update(percentiles(ns[:taken] // batch_size))
    for row, name in enumerate(FLOORS):
        out.update(percentiles(floors[row], f"{name}_"))
    for name in FLOORS:
        base = out[f"{name}_p50_us"]
        out[f"ratio_to_{name}"] = out["p50_us"] / base if base > 0 else None
    if raw is not None:
        out.update(percentiles(raw_ns[:taken] // batch_size, "raw_csr_"))
        out["ratio_to_raw_csr"] = out["p50_us"] / out["raw_csr_p50_us"]
    else:
        out.update({f"raw_csr_{k}": None for k in ("p50_us", "p90_us", "p99_us", "mean_us")})
        out["ratio_to_raw_csr"] = None
    if cold:
        worst = max(worst, left)
        out["cold_checked"] = taken
        out["cold_max_resident_pages"] = worst
        out["cold_verified"] = worst == 0
        out["faster_than_cold_pread"] = out["p50_us"] < out["pread_p50_us"]
    return out


def _timed_raw(raw: Any, batch: np.ndarray) -> int:
    """Nanoseconds of the raw CSR floor reading ``batch`` (one bin: a single read)."""
    if batch.shape[0] == 1:
        i = int(batch[0])
        began = time.perf_counter_ns()
        raw.read(i)
        return time.perf_counter_ns() - began
    indices = batch.tolist()
    began = time.perf_counter_ns()
    raw.read_batch(indices)
    return time.perf_counter_ns() - began


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
    delivered), each on its own random batch, alternating which goes first; the Python floor
    of both beside them, and the raw CSR floor (memory-mapped formats): its single reads, each
    timed alone as in :func:`random_access` (``raw_single_``), and as loops over a batch timed
    together (``raw_batch_``, per bin: the same loop without a timer per bin). ``gain`` =
    single p50 / batched p50 (above 1: batching is cheaper); ``gain_vs_raw`` = raw single p50
    / batched p50."""
    if batch_size < 2 or samples <= 0:
        raise PacklabError(f"batch_size must be >= 2 and samples positive, got {batch_size}, "
                           f"{samples}")
    dataset = open_source(path, "dataset", reader_options)
    floor = checked_floor(path, dataset, floor)
    files = data_files(dataset)
    batches = np.random.default_rng(seed).integers(0, len(dataset),
                                                   size=(3, samples, batch_size))
    sink = Sink(dataset.pack_size)
    warm(dataset, files, sink)
    raw = raw_floor(dataset)
    if raw is not None:
        raw.read_batch(range(len(dataset)))
    ns = np.zeros((5, samples), dtype=np.int64)
    raw_single = np.zeros((samples, batch_size), dtype=np.int64)
    modes = [(dataset, True), (dataset, False), (floor, True), (floor, False)]
    taken, budget = samples, Budget(max_seconds)
    try:
        for k in range(samples):
            for m in range(5) if k % 2 == 0 else (1, 0, 4, 3, 2):
                if m == 4:
                    if raw is not None:
                        ns[m, k] = _timed_raw(raw, batches[2, k]) // batch_size
                        for j, i in enumerate(batches[2, (k + samples // 2) % samples]):
                            raw_single[k, j] = _timed_raw(raw, i[None])
                    continue
                source, batched = modes[m]
                one, many = reads(source)
                batch = batches[0 if batched else 1, k].tolist()
                read = many if batched else (lambda b, one=one: [one(j) for j in b])
                ns[m, k] = sink.timed(read, batch, batch=True)[0] // batch_size
            if budget.spent(k + 1):
                taken = k + 1
                break
    finally:
        dataset.close()
    out: dict[str, Any] = {"path": str(path), "batch_size": batch_size, "samples": taken,
                           "seed": seed}
    for row, prefix in enumerate(("batched_", "single_", "floor_batched_", "floor_single_")):
        out.update(percentiles(ns[row, :taken], prefix))
    out["gain"] = out["single_p50_us"] / out["batched_p50_us"] if out["batched_p50_us"] else None
    if raw is not None:
        out.update(percentiles(raw_single[:taken].reshape(-1), "raw_single_"))
        out.update(percentiles(ns[4, :taken], "raw_batch_"))
        out["gain_vs_raw"] = out["raw_single_p50_us"] / out["batched_p50_us"]
    else:
        out.update({"raw_single_p50_us": None, "raw_batch_p50_us": None, "gain_vs_raw": None})
    return out
