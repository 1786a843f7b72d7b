"""A timed read made honest: what it returned is delivered inside the timer; timings summarized.

Readers that return views of a memory map (``binidx``, ``arrow_ipc``, ``memmap_v1``...) take
their page faults only when the bytes are touched: a benchmark that stops the clock when the
read returns would stop it before the disk was read, and a cold read would look nearly free.
So every timed read copies what it returned into the reusable buffers of a :class:`Sink`, as
the consumer would, before the clock stops (:meth:`Sink.timed`).

Also here: :func:`percentiles` (nanoseconds in, microseconds out) and :class:`Budget` (stop a
timing loop after ``max_seconds``, never before :data:`MIN_SAMPLES`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

MIN_SAMPLES = 10


class Sink:
    """Reusable buffers a benchmark copies every bin it reads into.

    A dataset item (a mapping: ``input_ids``, ``loss_mask``, ``seq_boundaries``) goes into
    batch buffers as a collate puts it (int64 tokens as training consumes them, uint8 mask,
    int32 boundaries); a reader's bin (or any sequence of arrays) is copied byte for byte,
    back to back, into ``buffer``. Buffers grow as needed and are reused, so a timed read pays
    the copy, never an allocation.
    """

    def __init__(self, capacity: int = 4096) -> None:
        capacity = max(int(capacity), 1)
        self._resize(capacity, capacity + 1)
        self.buffer = np.empty(capacity, dtype=np.uint8)

    def _resize(self, tokens: int, bounds: int) -> None:
        self.ids = np.empty(tokens, dtype=np.int64)
        self.mask = np.empty(tokens, dtype=np.uint8)
        self.bounds = np.empty(bounds, dtype=np.int32)

    def take(self, got: Mapping[str, Any] | Iterable[Any]) -> int:
        """Copy one item or bin; returns the bytes it held in its own dtypes (what the memcpy
        and pread floors move)."""
        if isinstance(got, Mapping):
            return self._take_item(got)
        return self._take_arrays(got)

    def take_all(self, batch: Iterable[Any]) -> int:
        """Copy every item or bin of a batch (``read_bins`` / ``__getitems__``)."""
        return sum(self.take(got) for got in batch)

    def timed(self, read: Callable[..., Any], *args: Any, batch: bool = False
              ) -> tuple[int, int]:
        """``read(*args)`` and the delivery of what it returned, inside the timer:
        ``(nanoseconds, bytes)``. ``batch``: it returns a list of items or bins."""
        began = time.perf_counter_ns()
        got = read(*args)
        nbytes = self.take_all(got) if batch else self.take(got)
        return time.perf_counter_ns() - began, nbytes

    def _take_item(self, item: Mapping[str, Any]) -> int:
        ids, mask, bounds = item["input_ids"], item["loss_mask"], item["seq_boundaries"]
        n, s = ids.shape[0], bounds.shape[0]
        if n > self.ids.shape[0] or s > self.bounds.shape[0]:
            self._resize(max(n, self.ids.shape[0]), max(s, self.bounds.shape[0]))
        np.copyto(self.ids[:n], ids, casting="unsafe")
        np.copyto(self.mask[:n], mask, casting="unsafe")
        np.copyto(self.bounds[:s], bounds, casting="unsafe")
        return int(ids.nbytes + mask.nbytes + bounds.nbytes)

    def _take_arrays(self, arrays: Iterable[Any]) -> int:
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


def percentiles(ns: np.ndarray, prefix: str = "") -> dict[str, float]:
    """p50/p90/p99 (and mean) of nanosecond timings, in microseconds."""
    us = np.asarray(ns, dtype=np.float64) / 1e3
    p50, p90, p99 = np.percentile(us, [50, 90, 99])
    return {f"{prefix}p50_us": float(p50), f"{prefix}p90_us": float(p90),
            f"{prefix}p99_us": float(p99), f"{prefix}mean_us": float(us.mean())}


class Budget:
    """A timing loop's time budget: spent after ``max_seconds`` (None: never), and never
    before :data:`MIN_SAMPLES` samples (a percentile of three numbers says nothing)."""

    def __init__(self, max_seconds: float | None) -> None:
        self.max_seconds = max_seconds
        self.began = time.perf_counter()

    def spent(self, taken: int) -> bool:
        return (self.max_seconds is not None and taken >= MIN_SAMPLES
                and time.perf_counter() - self.began > self.max_seconds)
