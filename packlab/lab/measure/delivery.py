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

from packlab.bins import PackedBin

MIN_SAMPLES = 10


class Sink:
    """Reusable buffers a benchmark copies every bin it reads into.

    A dataset item (a dict: ``input_ids``, ``loss_mask``, ``seq_boundaries``) goes into
    batch buffers as a collate puts it (int64 tokens as training consumes them, uint8 mask,
    int32 boundaries); a reader's bin (a :class:`~packlab.bins.PackedBin`) the same way, its
    starts and then its length as the boundaries; any other sequence of arrays is copied byte for byte,
    back to back, into ``buffer``. Buffers grow as needed and are reused, so a timed read pays
    the copy, never an allocation; copies are slice assignments (a third cheaper than
    ``np.copyto`` for one bin, and per array than ``np.concatenate`` of a batch), the same
    the raw floor uses (:class:`packlab.lab.measure.floors.RawCsr`).
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
        self.copy(got)
        return nbytes(got)

    def take_all(self, batch: Iterable[Any]) -> int:
        """Copy every item or bin of a batch (``read_bins`` / ``__getitems__``)."""
        batch = list(batch)
        self.copy_batch(batch)
        return sum(nbytes(one) for one in batch)

    def timed(self, read: Callable[..., Any], *args: Any, batch: bool = False
              ) -> tuple[int, int]:
        """``read(*args)`` and the delivery of what it returned, inside the timer:
        ``(nanoseconds, bytes)`` (the bytes counted after the clock stops). ``batch``: it
        returns a list of items or bins. Items' copies are inline here (:meth:`copy_batch`'s
        loop): a timed read pays them, not a method call around them."""
        arg = args[0] if len(args) == 1 else args
        call = read if len(args) == 1 else (lambda packed: read(*packed))
        ids, mask, bounds = self.ids, self.mask, self.bounds
        began = time.perf_counter_ns()
        got = call(arg)
        try:  # the common cases inline: items of a dataset, bins of a reader
            if type(got) is dict:
                a = got["input_ids"]
                n = len(a)
                ids[:n] = a
                mask[:n] = got["loss_mask"]
                b = got["seq_boundaries"]
                bounds[:len(b)] = b
            elif type(got) is PackedBin:
                a, m, b = got
                n, k = len(a), len(b)
                ids[:n] = a
                mask[:n] = m
                bounds[:k] = b
                bounds[k] = n
            elif batch and got and type(got[0]) is dict:
                for one in got:
                    a = one["input_ids"]
                    n = len(a)
                    ids[:n] = a
                    mask[:n] = one["loss_mask"]
                    b = one["seq_boundaries"]
                    bounds[:len(b)] = b
            elif batch and got and type(got[0]) is PackedBin:
                for a, m, b in got:
                    n, k = len(a), len(b)
                    ids[:n] = a
                    mask[:n] = m
                    bounds[:k] = b
                    bounds[k] = n
            else:
                self.copy_batch(got if batch else [got])
        except (ValueError, IndexError):  # larger than the buffers: grow them, copy again
            self.copy_batch(got if batch else [got])
        elapsed = time.perf_counter_ns() - began
        return elapsed, (sum(nbytes(one) for one in got) if batch else nbytes(got))

    def timed_arrays(self, read: Callable[[Any], Any], arg: Any) -> int:
        """``read(arg)`` and every array it returned (a dict's values, or the sequence) copied
        byte for byte into ``buffer``, inside the timer; nanoseconds. Notebook 11's delivery:
        one copy for every system, whatever container and dtypes it returns."""
        began = time.perf_counter_ns()
        self._take_arrays(returned_arrays(read(arg)))
        return time.perf_counter_ns() - began

    def copy_batch(self, batch: list[Any]) -> None:
        """Copy a batch's items (or bins) one after the other into the buffers (slice
        assignments: cheaper per array than ``np.concatenate``, measured)."""
        for one in batch:
            self.copy(one)

    def copy(self, got: Any) -> None:
        """Copy one item or bin into the buffers (nothing counted: the timed path)."""
        if type(got) is dict:
            ids, mask, bounds = got["input_ids"], got["loss_mask"], got["seq_boundaries"]
        elif type(got) is PackedBin:
            ids, mask, starts = got
            n, s = ids.shape[0], starts.shape[0]
            if n > self.ids.shape[0] or s >= self.bounds.shape[0]:
                self._resize(max(n, self.ids.shape[0]), max(s + 1, self.bounds.shape[0]))
            self.ids[:n] = ids
            self.mask[:n] = mask
            self.bounds[:s] = starts
            self.bounds[s] = n
            return
        elif isinstance(got, Mapping):
            ids, mask, bounds = got["input_ids"], got["loss_mask"], got["seq_boundaries"]
        else:
            self._take_arrays(got)
            return
        n, s = ids.shape[0], bounds.shape[0]
        if n > self.ids.shape[0] or s > self.bounds.shape[0]:
            self._resize(max(n, self.ids.shape[0]), max(s, self.bounds.shape[0]))
        self.ids[:n] = ids
        self.mask[:n] = mask
        self.bounds[:s] = bounds

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


def returned_arrays(got: Any) -> Any:
    """The arrays one read returned: a dict's values (packlab's items, in column order), or
    the sequence itself."""
    return got.values() if isinstance(got, dict) else got


def nbytes(got: Any) -> int:
    """Bytes one item or bin holds, in its own dtypes."""
    if isinstance(got, Mapping):
        return int(got["input_ids"].nbytes + got["loss_mask"].nbytes
                   + got["seq_boundaries"].nbytes)
    return int(sum(np.asarray(a).nbytes for a in got))


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
