"""Random-access latency of one bin, with its floors measured side by side in the same run.

Seeded random indices; every access timed alone with ``perf_counter_ns``, and *delivered*:
the arrays it returned are copied inside the timer (a view of a memory map costs nothing until
its bytes are touched, so an undelivered cold read would stop the clock before the disk was
read). Warm: after a full
pass over the shard. Cold: before each access every file of the shard is evicted from the page
cache (:func:`packlab.measure.pagecache.drop_shard`), and ``mincore`` confirms it for a sample
of the accesses. Beside them, in a second pass over the same indices, two floors over the same
numbers of bytes (after the reader's pass, so its readahead does not slow them): a plain memcpy
(``np.copyto`` into a preallocated array) and a raw ``os.pread`` from the shard's largest file
(readahead off, ``POSIX_FADV_RANDOM``; cold: that file's pages dropped first). Readers keep
whatever readahead they get: on a machine with a large ``read_ahead_kb`` a cold memory-mapped
read can cost far more than the bytes it returns, and the ratio shows it. Report the median and the tail, never one run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.measure.jobs import open_items, resolve_via
from packlab.measure.pagecache import drop_cache, drop_shard, shard_files, shard_resident_pages

CACHES = ("warm", "cold")


def percentiles(ns: np.ndarray, prefix: str = "") -> dict[str, float]:
    """p50/p90/p99 (and mean) of nanosecond timings, in microseconds."""
    us = np.asarray(ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {f"{prefix}p50_us": float(p50), f"{prefix}p90_us": float(p90),
            f"{prefix}p99_us": float(p99), f"{prefix}mean_us": float(us.mean())}


class _Delivery:
    """A reusable byte buffer every timed read copies its arrays into, inside the timer.

    Readers that return views of a memory map (``binidx``, ``arrow_ipc``, ``memmap_v1``...)
    take their page faults only when the bytes are touched: without the copy a cold read
    would stop the clock before the disk was read, and look nearly free.
    """

    def __init__(self, capacity: int = 1 << 16) -> None:
        self.buffer = np.empty(capacity, dtype=np.uint8)

    def take(self, arrays: Any) -> int:
        """Copy every array's bytes; returns how many."""
        total = 0
        for array in arrays:
            raw = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            end = total + raw.shape[0]
            if end > self.buffer.shape[0]:
                grown = np.empty(max(end, 2 * self.buffer.shape[0]), dtype=np.uint8)
                grown[:total] = self.buffer[:total]
                self.buffer = grown
            self.buffer[total:end] = raw
            total = end
        return total


def _item_arrays(item: Any) -> list[Any]:
    return [v for v in item.values() if hasattr(v, "__len__")]


def _access(items: Any, via: str, index: int, sink: _Delivery) -> int:
    """Read one bin and deliver it (copy its bytes); returns the bytes (what the floors copy)."""
    if via == "dataset":
        return sink.take(_item_arrays(items[index]))
    return sink.take(items.read_bin(index))


def _access_batch(items: Any, via: str, indices: np.ndarray, sink: _Delivery) -> int:
    if via == "dataset":
        getter = getattr(items, "__getitems__", None)
        batch = getter(indices.tolist()) if getter else [items[int(i)] for i in indices]
        return sum(sink.take(_item_arrays(item)) for item in batch)
    return sum(sink.take(b) for b in items.read_bins(indices))


def latency(
    path: str | os.PathLike[str],
    *,
    samples: int = 1000,
    seed: int = 0,
    cache: str = "warm",
    via: str = "reader",
    batch_size: int = 1,
    verify_every: int = 10,
) -> dict[str, Any]:
    """Per-bin latency of random reads of the shard at ``path``, floors beside it.

    Keys: ``p50_us``, ``p90_us``, ``p99_us`` (per bin: a batch's time divided by its size),
    ``floor_p50_us`` (memcpy when warm, raw pread when cold), the memcpy and pread
    percentiles, ``ratio_to_floor``, and for cold runs how many accesses ``mincore`` checked
    and the most pages it found still resident (``cold_verified`` is False if any).
    """
    if cache not in CACHES:
        raise PacklabError(f"cache must be 'warm' or 'cold', got {cache!r}")
    if samples <= 0 or batch_size <= 0:
        raise PacklabError(f"samples and batch_size must be positive, got {samples}, {batch_size}")
    via = resolve_via(via)
    files = shard_files(path)
    items = open_items(str(path), via)
    count = len(items)
    if count == 0:
        raise PacklabError(f"{path}: no bins to read")
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, count, size=(samples, batch_size))
    big = max(files, key=lambda f: f.stat().st_size)
    sink = _Delivery()
    if cache == "warm":
        for i in range(count):
            _access(items, via, i, sink)
        _read_all(big)
    else:
        _access(items, via, 0, sink)  # maps opened, headers parsed: what stays is the data path
    timings = np.empty(samples, dtype=np.int64)
    memcpy_ns = np.empty(samples, dtype=np.int64)
    pread_ns = np.empty(samples, dtype=np.int64)
    sizes = np.empty(samples, dtype=np.int64)
    checked, worst = 0, 0
    try:
        for k in range(samples):  # pass 1: the reader
            batch = indices[k]
            if cache == "cold":
                left = drop_shard(files)
                if k % verify_every == 0:
                    checked += 1
                    worst = max(worst, left, shard_resident_pages(files))
            began = time.perf_counter_ns()
            if batch_size == 1:
                sizes[k] = _access(items, via, int(batch[0]), sink)
            else:
                sizes[k] = _access_batch(items, via, batch, sink)
            timings[k] = (time.perf_counter_ns() - began) // batch_size
    finally:
        close = getattr(items, "close", None)
        if callable(close):
            close()
    if cache == "cold":
        time.sleep(0.2)  # let the reader's asynchronous readahead drain before the floors
    worst = max(worst, _floors(big, indices[:, 0], sizes, count, cache, batch_size,
                               memcpy_ns, pread_ns, verify_every))
    out: dict[str, Any] = {"path": str(path), "cache": cache, "via": via, "samples": samples,
                           "batch_size": batch_size, "seed": seed, "num_bins": count}
    out.update(percentiles(timings))
    out.update(percentiles(memcpy_ns, "memcpy_"))
    out.update(percentiles(pread_ns, "pread_"))
    out["floor"] = "memcpy" if cache == "warm" else "pread"
    out["floor_p50_us"] = out[f"{out['floor']}_p50_us"]
    out["ratio_to_floor"] = out["p50_us"] / out["floor_p50_us"] if out["floor_p50_us"] else None
    out["ratio_to_memcpy"] = out["p50_us"] / out["memcpy_p50_us"] if out["memcpy_p50_us"] else None
    out["ratio_to_pread"] = out["p50_us"] / out["pread_p50_us"] if out["pread_p50_us"] else None
    out["pread_file"] = big.name
    if cache == "cold":
        out["cold_checked"] = checked
        out["cold_resident_pages_max"] = worst
        out["cold_verified"] = worst == 0 and checked > 0
        # faster than a cold pread of the same bytes: the reader served from its own memory
        # (a decoded row-group cache, say), not from the disk; the figure is not a cold read
        out["faster_than_cold_pread"] = out["p50_us"] < out["pread_p50_us"]
    return out


def _floors(big: Path, first: np.ndarray, sizes: np.ndarray, count: int, cache: str,
            batch_size: int, memcpy_ns: np.ndarray, pread_ns: np.ndarray,
            verify_every: int) -> int:
    """Pass 2, same indices and byte counts: memcpy, and a raw pread at the bin's relative
    position in the shard's largest file. Returns the most pages found resident when cold."""
    src = np.ones(int(sizes.max()) + 1, dtype=np.uint8)
    dst = np.ones_like(src)
    big_size = big.stat().st_size
    worst = 0
    fd = os.open(big, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # raw: no readahead on the floor's reads
    try:
        for k, nbytes in enumerate(sizes.tolist()):
            began = time.perf_counter_ns()
            np.copyto(dst[:nbytes], src[:nbytes])
            memcpy_ns[k] = (time.perf_counter_ns() - began) // batch_size
            offset = int(first[k]) * max(big_size - nbytes, 0) // max(count - 1, 1)
            if cache == "cold":
                left = drop_cache(big)
                worst = max(worst, left) if k % verify_every == 0 else worst
            began = time.perf_counter_ns()
            os.pread(fd, nbytes, offset)
            pread_ns[k] = (time.perf_counter_ns() - began) // batch_size
    finally:
        os.close(fd)
    return worst


def _read_all(path: Path, chunk: int = 8 << 20) -> int:
    """Read a file once, sequentially (warms the page cache); returns the bytes read."""
    total = 0
    buf = bytearray(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return total
