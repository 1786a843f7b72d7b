"""The packing algorithms, registered into :mod:`packlab.packing`.

Each takes lengths already clipped to ``[1, pack_size]`` and returns the bin of each sequence,
bins numbered in creation order. All are exact (they give what the textbook per-sequence loop
gives, which the tests check against naive versions) and deterministic for a seed.

Why they are fast without a compiled extension:

- Lengths are integers ``<= pack_size``, so a real corpus has at most a few thousand distinct
  lengths. The decreasing algorithms (FFD, BFD) see equal lengths one after another, and a
  run of ``k`` sequences of length ``s`` behaves simply: under first fit every bin with room
  ``r >= s``, taken in bin order, absorbs ``r // s`` of them before the next bin gets any;
  under best fit the same holds with bins taken by increasing room. So each *length group*
  is placed by a handful of numpy operations over whole groups of bins.
- First fit in arbitrary order (the shuffled variant) has no such runs, and no vectorized
  form (each placement depends on every earlier one). It walks an 8-ary max tree over bins,
  compiled by numba: ~0.1 us per sequence where the same walk in Python took 1-4 us.
  FFD falls back to the same walk when lengths are so diverse that groups do not pay.
- Next fit is a cumulative sum, one vectorized ``searchsorted`` and a walk over bin starts.

Bin count bound used for allocation: in any of these algorithms a new bin opens only when
no open bin fits, so any two bins (consecutive ones, for next fit) together hold more than
``pack_size`` tokens; hence ``num_bins <= 2 * ceil(total / pack_size) + 1``.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Callable

import numpy as np

from packlab.bins import cumulative_offsets
from packlab.compiled import compiled
from packlab.errors import PacklabError

ALGORITHMS: dict[str, Callable[..., np.ndarray]] = {}


def register(name: str) -> Callable[[Callable[..., np.ndarray]], Callable[..., np.ndarray]]:
    """Register a packing algorithm.

    An algorithm takes ``(lengths int64[n], pack_size, rng)`` with every length in
    ``[1, pack_size]`` and returns ``bin_of[n]`` (:data:`BIN`: int32, 4 bytes a sequence; a
    plan of 13M sequences holds several such arrays at once), the bin of each sequence, bins
    numbered from 0 in the order they should be written. Within a bin, sequences keep ascending
    index order unless the algorithm says otherwise through the order it returns from :func:`pack`.
    """

    def decorate(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        ALGORITHMS[name] = fn
        return fn

    return decorate

BIN = np.int32  # a bin number (fewer than 2**31 bins: a 13M-sequence corpus packs into ~1M)
_BLOCK = 512  # bins per block in grouped first fit (block maxima prune the search)
_FANOUT = 8  # children per node of the first-fit max tree (measured fastest of 4..64 at 13M)


def max_bins(lengths: np.ndarray, pack_size: int) -> int:
    """An upper bound on the bins any fit algorithm opens (see the module docstring)."""
    lower = -(-int(lengths.sum()) // pack_size)
    return int(min(lengths.shape[0], 2 * lower + 1))


def decreasing_order(lengths: np.ndarray) -> np.ndarray:
    """Indices by decreasing length; equal lengths keep ascending index order (stable)."""
    key = lengths.max() - lengths  # small non-negative keys: numpy's stable sort is a radix sort
    return np.argsort(key.astype(np.min_scalar_type(key.max())), kind="stable")


# -- next fit ---------------------------------------------------------------------------------
@register("next_fit")
def next_fit(lengths: np.ndarray, pack_size: int, rng: np.random.Generator) -> np.ndarray:
    """Concatenative packing in spool order: open a new bin when the next sequence won't fit.

    A bin starting at sequence ``i`` ends before the first ``j`` whose cumulative length
    passes ``cum[i - 1] + pack_size``: one vectorized search gives every ``next[i]``, and the
    walk ``0 -> next[0] -> ...`` visits only the bin starts.
    """
    n = lengths.shape[0]
    cum = np.cumsum(lengths)
    following = np.searchsorted(cum, cum - lengths + pack_size, side="right")
    del cum
    starts = array("q")  # compact: one machine int per bin, not a Python object
    append, step = starts.append, following.item
    i = 0
    while i < n:
        append(i)
        i = step(i)
    first = np.frombuffer(starts, dtype=np.int64)
    sizes = np.diff(first, append=n)
    return np.repeat(np.arange(first.shape[0], dtype=BIN), sizes)


# -- first fit ---------------------------------------------------------------------------------
@register("first_fit_shuffle")
def first_fit_shuffle(lengths: np.ndarray, pack_size: int, rng: np.random.Generator) -> np.ndarray:
    """NeMo / Megatron-Bridge / Nemotron's default: shuffle with the seed, then first fit."""
    order = np.arange(lengths.shape[0], dtype=np.int32 if lengths.shape[0] < 2**31 else np.int64)
    rng.shuffle(order)  # rng.permutation(n)'s order, in half its bytes
    return first_fit_in_order(lengths, order, pack_size)


@register("first_fit_decreasing")
def first_fit_decreasing(
    lengths: np.ndarray, pack_size: int, rng: np.random.Generator
) -> np.ndarray:
    """Longest first, each into the lowest-numbered bin with room."""
    order = decreasing_order(lengths)
    values, counts = _runs(lengths[order])
    if not _groups_pay(values.shape[0], lengths.shape[0]):
        return first_fit_in_order(lengths, order, pack_size)
    bin_of = np.empty(lengths.shape[0], dtype=BIN)
    bin_of[order] = grouped_first_fit(values, counts, pack_size, max_bins(lengths, pack_size))
    return bin_of


def first_fit_in_order(lengths: np.ndarray, order: np.ndarray, pack_size: int) -> np.ndarray:
    """First fit of ``lengths[order]`` in that order: exact, one tree walk per sequence.

    The leaves of the tree are bins (not yet opened ones hold ``pack_size``, so the first of
    those is where a sequence that fits nowhere opens a bin); a node holds the largest room
    below it. A sequence goes down to the leftmost leaf with room, and the new room goes up
    only while it changes a node's maximum.
    """
    dtype = np.int32 if pack_size < 2**31 else np.int64
    levels, starts = _max_tree(max_bins(lengths, pack_size), pack_size, dtype)
    sizes = lengths.astype(dtype, copy=False)[order]  # narrow first: the gather reads less
    placed = np.empty(order.shape[0], dtype=BIN)
    if compiled(_first_fit_walk)(sizes, levels, starts, placed) < 0:
        raise PacklabError("first fit ran out of bins (algorithm bug)")
    del sizes, levels
    bin_of = np.empty(lengths.shape[0], dtype=BIN)
    bin_of[order] = placed
    return bin_of


def _max_tree(num_leaves: int, pack_size: int, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """A ``_FANOUT``-ary max tree, all levels in one array (level 0: the leaves).

    Level ``k`` is ``levels[starts[k]:starts[k + 1]]``; node ``j`` of level ``k`` has children
    ``j * _FANOUT ...`` on level ``k - 1``; the top level (at most ``_FANOUT`` nodes) is
    scanned directly. Real nodes start at ``pack_size``; the padding that rounds each level
    up to whole nodes holds 0, so no sequence ever goes there.
    """
    counts = [num_leaves]
    while counts[-1] > _FANOUT:
        counts.append(-(-counts[-1] // _FANOUT))
    widths = [-(-c // _FANOUT) * _FANOUT for c in counts]
    starts = cumulative_offsets(widths)
    levels = np.zeros(int(starts[-1]), dtype=dtype)
    for k, c in enumerate(counts):
        levels[starts[k] : starts[k] + c] = pack_size
    return levels, starts


def _first_fit_walk(
    sizes: np.ndarray, levels: np.ndarray, starts: np.ndarray, placed: np.ndarray
) -> int:
    """Place ``sizes`` in order (see :func:`_max_tree`); 0, or -1 if no leaf had room."""
    fan = _FANOUT
    top = starts.shape[0] - 2
    for j in range(sizes.shape[0]):
        s = sizes[j]
        c = 0  # the top level: the leftmost node with room
        while c < fan and levels[starts[top] + c] < s:
            c += 1
        if c == fan:
            return -1
        node = c
        for k in range(top - 1, -1, -1):  # down: the leftmost child with room
            base = starts[k] + node * fan
            c = 0
            while levels[base + c] < s:
                c += 1
            node = node * fan + c
        placed[j] = node
        old = levels[node]
        levels[node] = old - s
        for k in range(1, top + 1):  # up: only while the leaf was its ancestor's maximum
            node //= fan
            if levels[starts[k] + node] != old:
                break
            base = starts[k - 1] + node * fan
            m = levels[base]
            for c in range(1, fan):
                m = max(m, levels[base + c])
            if m == old:
                break
            levels[starts[k] + node] = m
    return 0


def bin_totals(bin_of: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sequences and tokens per bin, in one pass (two ``np.bincount`` passes cost twice, and
    the weighted one a float64 copy of the lengths). ``bin_of`` must be non-negative."""
    num_bins = int(bin_of.max()) + 1 if bin_of.size else 0
    counts = np.zeros(num_bins, dtype=np.int64)
    loads = np.zeros(num_bins, dtype=np.int64)
    compiled(_add_per_bin)(bin_of, lengths, counts, loads)
    return counts, loads


def _add_per_bin(bin_of: np.ndarray, lengths: np.ndarray, counts: np.ndarray,
                 loads: np.ndarray) -> None:
    for i in range(bin_of.shape[0]):
        counts[bin_of[i]] += 1
        loads[bin_of[i]] += lengths[i]


def sequences_by_bin(bin_of: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Positions of ``bin_of`` grouped by bin, ascending within a bin: what
    ``np.argsort(bin_of, kind="stable")`` gives, by counting (1.5 s less at 13M sequences).
    ``counts`` must be ``np.bincount(bin_of)`` (so every bin number is in range)."""
    following = np.zeros(counts.shape[0], dtype=np.int64)
    np.cumsum(counts[:-1], out=following[1:])
    out = np.empty(bin_of.shape[0], dtype=np.int64)
    compiled(_counting_scatter)(bin_of, following, out)
    return out


def _counting_scatter(bin_of: np.ndarray, following: np.ndarray, out: np.ndarray) -> None:
    for i in range(bin_of.shape[0]):
        b = bin_of[i]
        out[following[b]] = i
        following[b] += 1


def grouped_first_fit(
    values: np.ndarray, counts: np.ndarray, pack_size: int, bin_bound: int
) -> np.ndarray:
    """First fit of ``counts[g]`` sequences of length ``values[g]``, group after group, in order.

    Returns the bin of each sequence in that order. Bins live in blocks of ``_BLOCK`` with a
    maximum room per block, so a group only looks at blocks that can take one of its sequences.
    """
    num_blocks = -(-bin_bound // _BLOCK) + 1
    room = np.zeros(num_blocks * _BLOCK, dtype=np.int64)
    room2d = room.reshape(num_blocks, _BLOCK)
    block_max = np.zeros(num_blocks, dtype=np.int64)
    out = np.empty(int(counts.sum()), dtype=np.int64)
    pos = 0
    num_bins = 0
    for s, k in zip(values.tolist(), counts.tolist(), strict=True):
        candidates = np.flatnonzero(block_max[: -(-num_bins // _BLOCK)] >= s)
        done, width = 0, 1
        while k and done < candidates.shape[0]:
            blocks = candidates[done : done + width]
            done += width
            width *= 4
            fits = (room2d[blocks] // s).ravel()
            before = np.cumsum(fits) - fits
            take = np.clip(k - before, 0, fits)
            hit = np.flatnonzero(take)
            bins = blocks[hit // _BLOCK] * _BLOCK + hit % _BLOCK
            take = take[hit]
            placed = int(take.sum())
            out[pos : pos + placed] = np.repeat(bins, take)
            pos += placed
            k -= placed
            room[bins] -= take * s
            block_max[blocks] = room2d[blocks].max(axis=1)
        if k:
            new, take = _open_bins(num_bins, k, s, pack_size)
            out[pos : pos + k] = np.repeat(new, take)
            pos += k
            room[new] = pack_size - take * s
            first, last = num_bins // _BLOCK, (num_bins + new.shape[0] - 1) // _BLOCK
            block_max[first : last + 1] = room2d[first : last + 1].max(axis=1)
            num_bins += new.shape[0]
    return out


# -- best fit ----------------------------------------------------------------------------------
@register("best_fit_decreasing")
def best_fit_decreasing(
    lengths: np.ndarray, pack_size: int, rng: np.random.Generator
) -> np.ndarray:
    """Longest first, each into the bin it fills most tightly (lowest number on a tie)."""
    order = decreasing_order(lengths)
    values, counts = _runs(lengths[order])
    bin_of = np.empty(lengths.shape[0], dtype=BIN)
    bin_of[order] = grouped_best_fit(values, counts, pack_size)
    return bin_of


class _RoomBuckets:
    """Open bins grouped by exact remaining room; each bucket's bin ids kept sorted on demand."""

    def __init__(self) -> None:
        self.keys: list[int] = []  # rooms with at least one bin, ascending
        self.parts: dict[int, list[np.ndarray]] = {}

    def add(self, room: int, bins: np.ndarray) -> None:
        if room <= 0 or bins.shape[0] == 0:
            return  # a full bin takes nothing more
        if room not in self.parts:
            bisect.insort(self.keys, room)
            self.parts[room] = []
        self.parts[room].append(bins)

    def take(self, room: int) -> np.ndarray:
        """Remove and return the bucket's bins, ascending."""
        parts = self.parts.pop(room)
        del self.keys[bisect.bisect_left(self.keys, room)]
        return parts[0] if len(parts) == 1 else np.sort(np.concatenate(parts), kind="stable")


def grouped_best_fit(values: np.ndarray, counts: np.ndarray, pack_size: int) -> np.ndarray:
    """Best fit of ``counts[g]`` sequences of length ``values[g]``, group after group, in order.

    Buckets of rooms ``>= s`` are visited by increasing room; each bin of bucket ``r`` absorbs
    ``r // s`` sequences in turn (after one sequence it is still the tightest fit), lowest id first.
    """
    buckets = _RoomBuckets()
    out = np.empty(int(counts.sum()), dtype=np.int64)
    pos = 0
    num_bins = 0
    for s, k in zip(values.tolist(), counts.tolist(), strict=True):
        moves: list[tuple[int, np.ndarray]] = []
        while k:
            i = bisect.bisect_left(buckets.keys, s)
            if i == len(buckets.keys):
                break
            r = buckets.keys[i]
            bins = buckets.take(r)
            per = r // s
            full = min(bins.shape[0], k // per)
            out[pos : pos + full * per] = np.repeat(bins[:full], per)
            pos += full * per
            k -= full * per
            moves.append((r - per * s, bins[:full]))
            if full < bins.shape[0]:  # the group ends inside this bucket
                if k:
                    out[pos : pos + k] = bins[full]
                    pos += k
                    moves.append((r - k * s, bins[full : full + 1]))
                    full += 1
                    k = 0
                moves.append((r, bins[full:]))
        if k:
            new, take = _open_bins(num_bins, k, s, pack_size)
            out[pos : pos + k] = np.repeat(new, take)
            pos += k
            num_bins += new.shape[0]
            moves.append((pack_size - int(take[0]) * s, new[:-1]))
            moves.append((pack_size - int(take[-1]) * s, new[-1:]))
        for room, moved in moves:
            buckets.add(room, moved)
    return out


# -- shared helpers ----------------------------------------------------------------------------
def _runs(sorted_lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values and run lengths of an already sorted array, in its order."""
    edges = np.flatnonzero(np.diff(sorted_lengths)) + 1
    starts = np.concatenate(([0], edges))
    counts = np.diff(np.concatenate((starts, [sorted_lengths.shape[0]])))
    return sorted_lengths[starts], counts


def _groups_pay(num_groups: int, num_items: int) -> bool:
    """Group-at-a-time costs ~40 us per group; the tree walk ~1 us per sequence (measured)."""
    return num_groups <= max(256, num_items // 32)


def _open_bins(first: int, k: int, s: int, pack_size: int) -> tuple[np.ndarray, np.ndarray]:
    """New bins for ``k`` sequences of length ``s``: each takes ``pack_size // s``, the last
    the rest."""
    per = pack_size // s
    count = -(-k // per)
    take = np.full(count, per, dtype=np.int64)
    take[-1] = k - per * (count - 1)
    return np.arange(first, first + count, dtype=np.int64), take
