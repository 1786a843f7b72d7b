"""Throughput: a sequential scan in tokens/s, and a torch DataLoader in bins/s by worker count.

The scan has its floor beside it, measured in the same run: a raw sequential read of every
byte of the shard, in the same cache state (warm: after a pass; cold: pages dropped first).
The DataLoader reads in shuffled order (seeded), as training does, with an identity collate
so the figure is the read path, not batching; time to the first batch (worker start-up) is
reported apart from the steady rate.
"""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.measure.jobs import open_items, resolve_via
from packlab.measure.latency import CACHES, _read_all
from packlab.measure.pagecache import drop_shard, shard_files


def scan(path: str | os.PathLike[str], *, cache: str = "warm", via: str = "reader") -> dict[str, Any]:
    """Read every bin in order once; tokens/s beside a raw sequential read of the same files."""
    if cache not in CACHES:
        raise PacklabError(f"cache must be 'warm' or 'cold', got {cache!r}")
    via = resolve_via(via)
    files = shard_files(path)
    on_disk = sum(f.stat().st_size for f in files)
    items = open_items(str(path), via)
    _scan(items, via)  # opens maps, parses headers; warms the cache
    if cache == "cold":
        drop_shard(files)
    began = time.perf_counter()
    bins, tokens = _scan(items, via)
    seconds = time.perf_counter() - began
    if cache == "cold":
        drop_shard(files)
    began = time.perf_counter()
    raw = sum(_read_all(f) for f in files)
    floor_seconds = time.perf_counter() - began
    return {
        "path": str(path), "cache": cache, "via": via, "num_bins": bins, "num_tokens": tokens,
        "seconds": seconds, "tokens_per_s": tokens / seconds, "bins_per_s": bins / seconds,
        "bytes_on_disk": on_disk, "bytes_per_s": on_disk / seconds,
        "floor_read_bytes_per_s": raw / floor_seconds,
        "ratio_to_floor": (on_disk / seconds) / (raw / floor_seconds),
    }


def _scan(items: Any, via: str) -> tuple[int, int]:
    tokens = 0
    if via == "dataset":
        for i in range(len(items)):
            tokens += len(items[i]["input_ids"])
        return len(items), tokens
    count = 0
    for packed in items.iter_bins():
        tokens += packed.packed_len
        count += 1
    return count, tokens


class ShardItems:
    """A map-style dataset of one shard's bins (picklable: workers reopen the reader)."""

    def __init__(self, path: str, via: str) -> None:
        self.path = path
        self.via = via
        self._items: Any = None
        self._len = len(open_items(path, via))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> Any:
        if self._items is None:
            self._items = open_items(self.path, self.via)
        if self.via == "dataset":
            return self._items[index]
        return tuple(self._items.read_bin(index))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_items": None}


def keep(batch: list[Any]) -> list[Any]:
    """Identity collate: the benchmark measures reading, not batching."""
    return batch


def dataloader(
    path: str | os.PathLike[str],
    *,
    workers: Sequence[int] = (0, 2, 4),
    batch_size: int = 8,
    seed: int = 0,
    via: str = "reader",
    max_bins: int | None = None,
) -> dict[str, Any]:
    """Bins/s through ``torch.utils.data.DataLoader`` with each worker count, shuffled."""
    try:
        import torch
        from torch.utils.data import DataLoader, Subset
    except ImportError:
        raise PacklabError("the DataLoader benchmark needs torch (pip install packlab[torch])") from None
    via = resolve_via(via)
    dataset: Any = ShardItems(str(path), via)
    if max_bins is not None and max_bins < len(dataset):
        dataset = Subset(dataset, np.arange(max_bins).tolist())
    out: dict[str, Any] = {"path": str(path), "via": via, "batch_size": batch_size,
                           "num_bins": len(dataset), "workers": {}}
    for n in workers:
        generator = torch.Generator().manual_seed(seed)
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=n,
                            collate_fn=keep, generator=generator)
        began = time.perf_counter()
        first = None
        bins = 0
        with warnings.catch_warnings():  # more workers than cores is the point of the sweep
            warnings.filterwarnings("ignore", message=".*suggested max number of worker.*")
            for batch in loader:
                if first is None:
                    first = time.perf_counter()
                bins += len(batch)
        end = time.perf_counter()
        steady = end - (first if first is not None else began)
        steady_bins = bins - min(batch_size, bins)
        out["workers"][str(n)] = {
            "bins": bins,
            "epoch_seconds": end - began,
            "first_batch_seconds": (first or end) - began,
            "bins_per_s": bins / (end - began),
            "steady_bins_per_s": steady_bins / steady if steady > 0 and steady_bins else None,
        }
    return out
