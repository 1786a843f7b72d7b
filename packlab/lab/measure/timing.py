"""The one timing loop of random access: lanes read one seeded index list, interleaved.

Notebook 05 (:mod:`packlab.lab.measure.latency`), notebook 11
(:mod:`packlab.lab.measure.peers.run`) and ``packlab bench latency`` all time reads here, by one
set of rules:

- **one seeded index list** (:func:`seeded_indices`): uniform over the bins, the same for
  every lane; a lane may read it shifted (``Lane.shift``: a floor a third of the list away
  from the format, so it never reads a bin the other just pulled into the CPU's caches);
- **each read timed alone** with ``perf_counter_ns`` and *delivered* inside the timer (what
  it returned copied, :mod:`packlab.lab.measure.delivery`): a lane's ``read`` returns the
  nanoseconds of one such read; whatever it does before the timer (a cold read's eviction)
  is its own and untimed;
- **floors in the same loop**: every lane, a system's read or a floor
  (:mod:`packlab.lab.measure.floors`), is read in the same rounds, so the machine's slow
  moments fall on all alike; a floor (``Lane.floor``) stops with the last system;
- **interleaved**: the list is read in ``rounds`` slices; in each round every lane reads the
  round's slice, one lane after another, in an order that alternates (``"alternate"``: the
  lanes' order, then reversed, so no lane always goes first) or is drawn anew each round
  (``"shuffle"``: a heavy lane's leftovers never fall on the same neighbour every round);
  ``settle`` untimed reads (the bins before the slice) put a lane back in stride first;
  ``Lane.then`` is a lane timed right after another, on the same item, in every step (a cold
  ``pread`` after each cold read: the device's load, shared with other jobs, changes faster
  than a pass);
- **a warm pass** first (every bin in order through each lane's ``warm``), and **budgets**:
  ``warm_seconds`` bounds each lane's warm pass, ``max_seconds`` its timed reads (never before
  :data:`~packlab.lab.measure.delivery.MIN_SAMPLES`); a lane past its budget reads no more, so
  what it read is a prefix of the list;
- the report is p50/p90/p99 and the mean, per lane (:meth:`Timings.percentiles`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from packlab.errors import PacklabError
from packlab.lab.measure.delivery import MIN_SAMPLES, Budget, percentiles

ORDERS = ("alternate", "shuffle")
#: the slices of a lane's reads whose p50s stand in for reruns (:meth:`Timings.part_p50s`)
PARTS = 5


def seeded_indices(num_bins: int, samples: int, seed: int, batch_size: int | None = None
                   ) -> np.ndarray:
    """The one index list every lane reads (uniform over the bins, seeded); with
    ``batch_size``, ``samples`` rows of that many bins (one batch a step)."""
    if num_bins <= 0 or samples <= 0:
        raise PacklabError(f"need bins and samples, got {num_bins} bins, {samples} samples")
    shape = samples if batch_size is None else (samples, batch_size)
    return np.random.default_rng(seed).integers(0, num_bins, size=shape)


@dataclass
class Lane:
    """One thing the loop times: a system's read or a floor.

    ``read(item)``: nanoseconds of one read of an item of the index list (an index, or a row
    of them), delivered. ``warm(i)``: bin ``i`` read untimed in the warm pass (None: no warm
    pass). ``shift``: the lane reads the list this many places on. ``floor``: it stops with the
    systems. ``then``: a lane timed right after this one on the same item, every step."""

    name: str
    read: Callable[[Any], int]
    warm: Callable[[int], object] | None = None
    shift: int = 0
    floor: bool = False
    then: Lane | None = None


@dataclass
class Timings:
    """Nanoseconds per read of every lane, in index-list order (a prefix where a budget
    stopped it), and how many bins each lane's warm pass read."""

    ns: dict[str, np.ndarray]
    warmed: dict[str, int] = field(default_factory=dict)

    def samples(self, name: str) -> int:
        return int(self.ns[name].shape[0])

    def percentiles(self, name: str, prefix: str = "", per: int = 1) -> dict[str, float]:
        """p50/p90/p99 and mean (µs) of one lane, each read divided by ``per`` (bins a read)."""
        return percentiles(self.ns[name] // per, prefix)

    def part_p50s(self, name: str, parts: int = PARTS, per: int = 1) -> list[float]:
        """The p50 (µs) of each of ``parts`` consecutive slices of one lane's reads: reruns in
        miniature, for how often a decision taken on the p50 would come out otherwise."""
        return [float(np.percentile(part // per, 50)) / 1e3
                for part in np.array_split(self.ns[name], parts) if len(part)]


def spread(count: int, samples: int) -> list[int]:
    """Shifts that put ``count`` lanes evenly apart on a list of ``samples``."""
    return [j * samples // count for j in range(count)]


def interleaved(
    lanes: Sequence[Lane],
    items: np.ndarray,
    *,
    rounds: int | None = None,
    order: str = "alternate",
    settle: int = 0,
    max_seconds: float | None = None,
    warm_bins: int = 0,
    warm_seconds: float | None = None,
    seed: int = 0,
) -> Timings:
    """Every lane warmed (``warm_bins`` bins in order), then timed over ``items`` (the index
    list: one item a step) by the rules of this module. ``rounds``: slices of the list (None:
    one item a round)."""
    if order not in ORDERS:
        raise PacklabError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    names = [lane.name for lane in lanes] + [lane.then.name for lane in lanes if lane.then]
    if len(set(names)) != len(names):
        raise PacklabError(f"lanes need distinct names, got {names}")
    warmed = {lane.name: _warm(lane, warm_bins, warm_seconds) for lane in lanes if lane.warm}
    listed = items.tolist()
    n = len(listed)
    ns = {name: np.zeros(n, dtype=np.int64) for name in names}
    taken = dict.fromkeys(names, 0)
    spent = dict.fromkeys(names, 0)
    stopped: set[str] = set()
    systems = [lane.name for lane in lanes if not lane.floor]
    limit = None if max_seconds is None else int(max_seconds * 1e9)
    bounds = np.linspace(0, n, max(1, min(rounds or n, n)) + 1).astype(int).tolist()
    shuffle = np.random.default_rng(seed)
    for r, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        if systems and stopped.issuperset(systems):
            break
        if order == "shuffle":
            ordered = [lanes[j] for j in shuffle.permutation(len(lanes))]
        else:
            ordered = list(lanes) if r % 2 == 0 else list(lanes)[::-1]
        for lane in ordered:
            if lane.name in stopped:
                continue
            for k in range(lo - settle, lo):  # back in stride: the bins before the slice
                lane.read(listed[(k + lane.shift) % n])
            for k in range(lo, hi):
                if limit is not None and taken[lane.name] >= MIN_SAMPLES \
                        and spent[lane.name] > limit:
                    stopped.add(lane.name)  # never resumes: what it read is a prefix
                    break
                item = listed[(k + lane.shift) % n]
                began = time.perf_counter_ns()
                ns[lane.name][k] = lane.read(item)
                if lane.then is not None:
                    ns[lane.then.name][k] = lane.then.read(item)
                    taken[lane.then.name] = k + 1
                spent[lane.name] += time.perf_counter_ns() - began
                taken[lane.name] = k + 1
    if systems:  # a floor reads no further than the last system did
        last = max(taken[name] for name in systems)
        for lane in lanes:
            if lane.floor:
                taken[lane.name] = min(taken[lane.name], last)
    return Timings({name: ns[name][:taken[name]] for name in names}, warmed)


def _warm(lane: Lane, bins: int, seconds: float | None) -> int:
    """The lane's warm pass: bins in order until ``bins`` or its budget; returns how many."""
    budget = Budget(seconds)
    for i in range(bins):
        if budget.spent(i):
            return i
        lane.warm(i)  # type: ignore[misc]
    return bins
