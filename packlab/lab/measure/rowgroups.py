"""Parquet row groups: what training's read order costs, and the RFC's row-group table measured.

- :func:`shuffled_epoch`: one epoch through the two Parquet policies (Megatron-Bridge's
  one-row-group cache with a uniform shuffle; packlab's LRU reader with the block-shuffle
  sampler), row-group decodes counted;
- :func:`row_group_miss`: a random bin whose row group is not decoded yet;
- :func:`row_group_sweep`: one shard per row-group size (the RFC's "Row Group Size"): write
  memory, a miss, a block-shuffled epoch and a scan; judged by
  :func:`packlab.lab.measure.access_report.row_group_findings`.

Every read is delivered inside its timer (:class:`packlab.lab.measure.delivery.Sink`), the file in
the page cache first (warm): the figures are decode costs, not the disk's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.delivery import Budget, Sink, percentiles
from packlab.lab.measure.pagecache import read_all
from packlab.lab.measure.throughput import SAMPLERS, scan_rate
from packlab.loading.samplers import BlockShuffleSampler, ShuffleSampler

POLICIES = ("one_row_group", "lru")
# The RFC's row-group table (its "Row Group Size").
RFC_ROW_GROUPS: dict[int, dict[str, Any]] = {
    100: {"write_memory": 2e6, "read_latency": "Lower", "best_for": "Random access heavy"},
    1000: {"write_memory": 20e6, "read_latency": "Medium", "best_for": "Balanced workloads"},
    10000: {"write_memory": 200e6, "read_latency": "Higher", "best_for": "Sequential scans"},
}
RFC_BYTES_PER_ROW = 20e3  # every row of the RFC's table: ~20 KB of write memory per bin


def _read_item(reader: Any, index: int) -> dict[str, np.ndarray]:
    return reader.read_bin(index).item()


def shuffled_epoch(
    path: str | os.PathLike[str],
    *,
    policy: str = "lru",
    sampler: str = "block",
    window: int = 4,
    max_accesses: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """One epoch over every bin of a Parquet shard in ``sampler`` order, delivered.

    ``policy``: ``one_row_group`` (Megatron-Bridge today: one cached row group, rows through
    ``as_py``; :class:`packlab.formats.parquet.OneRowGroupReader`) or ``lru`` (packlab's reader,
    a few decoded row groups). ``max_accesses`` times only the first accesses of the epoch's
    order and projects the epoch as their mean times the bins (``projected`` is then True): under
    a uniform shuffle every position of the order has the same chance of a cache hit, so the
    prefix is an unbiased sample of the epoch. The file is in the page cache first (warm).
    """
    from packlab.formats.parquet import OneRowGroupReader, Reader

    if policy not in POLICIES:
        raise PacklabError(f"policy must be one of {POLICIES}, got {policy!r}")
    reader = OneRowGroupReader(path) if policy == "one_row_group" else Reader(path)
    n = reader.num_bins
    if sampler == "shuffle":
        order = ShuffleSampler(n, seed=seed).indices()
    elif sampler == "block":
        order = BlockShuffleSampler(n, boundaries=reader.row_group_offsets, window=window,
                                    seed=seed).indices()
    else:
        raise PacklabError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
    taken = order if max_accesses is None else order[: max(1, int(max_accesses))]
    read_all(Path(path))
    sink = Sink(reader.pack_size)
    ns = np.empty(taken.shape[0], dtype=np.int64)
    try:
        for k, i in enumerate(taken.tolist()):
            ns[k] = sink.timed(_read_item, reader, i)[0]
        groups = np.asarray(reader.row_group_of(taken))
        switches = 1 + int(np.count_nonzero(np.diff(groups)))
        decodes = switches if policy == "one_row_group" else reader.cache_stats()["misses"]
    finally:
        reader.close()
    seconds = float(ns.sum()) / 1e9
    projected = taken.shape[0] < n
    return {"path": str(path), "policy": policy, "sampler": sampler, "window": window,
            "num_bins": n, "num_row_groups": reader.num_row_groups, "accesses": int(ns.shape[0]),
            "seconds": seconds, "projected": projected,
            "epoch_seconds": seconds * n / ns.shape[0] if projected else seconds,
            "row_group_decodes": decodes, **percentiles(ns, "per_bin_")}


def row_group_miss(
    path: str | os.PathLike[str],
    *,
    samples: int = 50,
    seed: int = 0,
    max_seconds: float | None = None,
) -> dict[str, Any]:
    """Latency of a random Parquet bin whose row group is not decoded yet (delivered; the file
    in the page cache): what a shuffled read pays each time it leaves the cached row groups.

    packlab's reader with a one-row-group cache; before each timed read, a bin of another row
    group is read (untimed) to evict the target's, or, with a single row group, the reader's
    handles are closed (its reopening, a footer parse, is then inside the timer).
    """
    from packlab.formats.parquet import Reader

    if samples <= 0:
        raise PacklabError(f"samples must be positive, got {samples}")
    reader = Reader(path, cache_row_groups=1)
    groups, n = reader.num_row_groups, reader.num_bins
    indices = np.random.default_rng(seed).integers(0, n, size=samples).tolist()
    read_all(Path(path))
    sink = Sink(reader.pack_size)
    ns = np.zeros(samples, dtype=np.int64)
    taken, budget = samples, Budget(max_seconds)
    try:
        for k, i in enumerate(indices):
            if groups > 1:
                other = (int(reader.row_group_of(i)) + 1) % groups
                reader.read_bin(int(reader.row_group_offsets[other]))
            else:
                reader.close()
            ns[k] = sink.timed(_read_item, reader, i)[0]
            if budget.spent(k + 1):
                taken = k + 1
                break
    finally:
        reader.close()
    return {"path": str(path), "num_bins": n, "num_row_groups": groups,
            "samples": taken, **percentiles(ns[:taken])}


def row_group_sweep(
    directory: str | os.PathLike[str],
    spool: str | os.PathLike[str],
    assignment: str | os.PathLike[str],
    sizes: Sequence[int],
    *,
    latency_samples: int = 50,
    max_seconds: float | None = 20.0,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One Parquet shard per row-group size, written in a fresh process (its write-phase peak
    RSS measured), then: bytes on disk, the latency of a random bin whose row group must be
    decoded (:func:`row_group_miss`), the per-bin cost of a block-shuffled epoch, and a warm
    sequential scan. One row per size."""
    from packlab.lab.measure.footprint import write_memory

    if not sizes or min(sizes) < 1:
        raise PacklabError(f"row-group sizes must be positive, got {list(sizes)}")
    rows = []
    for size in sorted(set(int(s) for s in sizes)):
        out = Path(directory) / f"row_group_{size}.parquet"
        wrote = write_memory("parquet", spool, assignment, out, tracemalloc=False,
                             options={"row_group_size": size})
        miss = row_group_miss(out, samples=latency_samples, seed=seed, max_seconds=max_seconds)
        epoch = shuffled_epoch(out, policy="lru", sampler="block", seed=seed)
        scan = scan_rate(out)
        rows.append({
            "row_group_size": size, "num_bins": epoch["num_bins"],
            "num_row_groups": epoch["num_row_groups"], "bytes_on_disk": out.stat().st_size,
            "write_peak_rss_growth_bytes": wrote["write_peak_rss_growth_bytes"],
            "write_peak_anon_growth_bytes": wrote["write_peak_anon_growth_bytes"],
            "write_arrow_pool_peak_bytes": wrote["write_arrow_pool_peak_bytes"],
            "miss_p50_us": miss["p50_us"], "miss_p90_us": miss["p90_us"],
            "miss_samples": miss["samples"],
            "block_epoch_per_bin_us": epoch["per_bin_mean_us"],
            "scan_tokens_per_s": scan["tokens_per_s"],
        })
    return rows
