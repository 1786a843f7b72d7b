"""Modified First-Fit Decreasing: the packer of Megatron-LM's ``SFTDataset``, in the registry.

Megatron-LM's pull request #5017 (``megatron/core/datasets/sft_dataset.py``, ``pack_samples``,
read at commit ``97b2c55e4c373a072c36e79104bcdac1d77c022f``) packs conversations with Johnson
and Garey's MFFD. Sequences are classed by their length ``s`` against the capacity ``C``::

    large   (C/2, C]     medium  (C/3, C/2]     small  (C/6, C/3]     tiny  (0, C/6]

1. one bin per large sequence, longest first;
2. forward over those bins: each takes the longest medium sequence that fits;
3. backward over the bins without a medium sequence: when the two shortest small sequences fit
   together, the shortest goes in with the longest small sequence that fits beside it;
4. forward over the same bins: each takes the longest remaining sequence that fits, again and
   again, until none does;
5. the leftovers, longest first, into new bins.

Step 5 is where the two registered variants differ. Johnson and Garey pack the leftovers by
first fit decreasing (``modified_first_fit_decreasing``). Megatron-LM's code puts each
leftover into the least-loaded new bin when it fits there and opens a bin otherwise (a worst
fit: ``megatron_lm_mffd``); its bins come out in its order too (the large ones, then the
others by load), so a packlab assignment holds the very conversations each of its samples
holds. Equal lengths go by sequence index, as Megatron-LM's stable sorts leave them: the
lowest index first, except the second small sequence of step 3, taken from the top.

Why it is fast without a per-sequence Python loop: sequences of equal length are interchangeable
up to their order, so every step works on length groups (at most a few thousand distinct
lengths). "The longest remaining sequence of length <= r" is a union-find over the groups in
decreasing length, an emptied group pointing past itself: each query and removal costs nearly
O(1) in the compiled walk (numba, as :mod:`packlab.packing.algorithms`' first fit). Step 5 is
packlab's grouped first fit (:func:`packlab.packing.algorithms.grouped_first_fit`) or, for
Megatron-LM's variant, a binary heap of the new bins keyed by load, then by when the bin last
changed (Megatron-LM's list keeps equal loads in insertion order).
"""

from __future__ import annotations

import numpy as np

from packlab.bins import cumulative_offsets
from packlab.compiled import compiled
from packlab.errors import PacklabError
from packlab.packing.algorithms import (
    _runs,
    decreasing_order,
    grouped_first_fit,
    max_bins,
    register,
)

LARGE, MEDIUM, SMALL, TINY = 0, 1, 2, 3


def size_classes(values: np.ndarray, pack_size: int) -> np.ndarray:
    """Each length's class (:data:`LARGE` ... :data:`TINY`), in integers: ``s > C/2`` is
    ``2s > C`` (exactly what Megatron-LM's float comparisons decide for integer lengths)."""
    v = np.asarray(values, dtype=np.int64)
    return np.select([2 * v > pack_size, 3 * v > pack_size, 6 * v > pack_size],
                     [LARGE, MEDIUM, SMALL], TINY).astype(np.int8)


@register("modified_first_fit_decreasing")
def modified_first_fit_decreasing(lengths: np.ndarray, pack_size: int,
                                  rng: np.random.Generator) -> np.ndarray:
    """Johnson and Garey's MFFD with Megatron-LM's classes: leftovers by first fit decreasing."""
    return _mffd(lengths, pack_size, megatron_leftovers=False)


@register("megatron_lm_mffd")
def megatron_lm_mffd(lengths: np.ndarray, pack_size: int,
                     rng: np.random.Generator) -> np.ndarray:
    """Megatron-LM's ``pack_samples``: leftovers into the least-loaded new bin (its bins)."""
    return _mffd(lengths, pack_size, megatron_leftovers=True)


def _mffd(lengths: np.ndarray, pack_size: int, *, megatron_leftovers: bool) -> np.ndarray:
    order = decreasing_order(lengths)
    values, counts = _runs(lengths[order])
    starts = cumulative_offsets(counts)
    classes = size_classes(values, pack_size)
    num_large = int(counts[classes == LARGE].sum())
    head, tail = starts[:-1].copy(), starts[1:].copy()  # each group's sequences left: order[h:t]
    bin_of = np.full(lengths.shape[0], -1, dtype=np.int64)
    compiled(_fill_large_bins)(order, values.astype(np.int64), classes, head, tail, bin_of,
                                np.int64(pack_size), np.int64(num_large))
    left = tail - head
    if not left.any():
        return bin_of
    placed = np.concatenate([order[h:t] for h, t in zip(head.tolist(), tail.tolist(),
                                                          strict=True) if t > h])
    kept = left > 0
    if megatron_leftovers:
        handles = np.empty(placed.shape[0], dtype=np.int64)
        count = compiled(_least_loaded)(np.repeat(values[kept], left[kept]).astype(np.int64),
                                         np.int64(pack_size), handles)
        if count < 0:
            raise PacklabError("MFFD ran out of bins (algorithm bug)")
        bin_of[placed] = num_large + handles
    else:
        bound = max_bins(lengths[placed], pack_size)
        bin_of[placed] = num_large + grouped_first_fit(values[kept], left[kept], pack_size,
                                                       bound)
    return bin_of


def _fill_large_bins(order: np.ndarray, values: np.ndarray, classes: np.ndarray,
                     head: np.ndarray, tail: np.ndarray, bin_of: np.ndarray, pack_size: int,
                     num_large: int) -> None:
    """Steps 1-4 over length groups; what is left for step 5 stays in ``order[head:tail]``."""
    count = values.shape[0]

    def find(parent: np.ndarray, g: int) -> int:
        """The first group at or after ``g`` still in the set (a deleted group points past
        itself; the sentinel ``count`` is always in), compressing the path walked."""
        root = g
        while parent[root] != root:
            root = parent[root]
        while parent[g] != root:
            following = parent[g]
            parent[g] = root
            g = following
        return root

    def longest_fitting(parent: np.ndarray, room: int) -> int:
        """The group of the longest sequence left in the set with a length <= ``room``."""
        lo, hi = 0, count
        while lo < hi:  # the first group (lengths decreasing) of length <= room
            mid = (lo + hi) // 2
            if values[mid] > room:
                lo = mid + 1
            else:
                hi = mid
        return find(parent, lo)

    def take(parent: np.ndarray, g: int, b: int, room: np.ndarray) -> None:
        """Group ``g``'s next sequence (lowest index first) into bin ``b``; an emptied group
        leaves the set ``parent``."""
        bin_of[order[head[g]]] = b
        head[g] += 1
        room[b] -= values[g]
        if head[g] == tail[g]:
            parent[g] = g + 1

    def members(wanted: int) -> np.ndarray:
        """A union-find over the groups of class ``wanted`` with sequences left (-1: every class
        but large), the others deleted."""
        parent = np.empty(count + 1, dtype=np.int64)
        for g in range(count + 1):
            keep = g == count or (head[g] < tail[g] and (
                classes[g] == wanted or (wanted < 0 and classes[g] != 0)))
            parent[g] = g if keep else g + 1
        return parent

    room = np.empty(num_large, dtype=np.int64)
    has_medium = np.zeros(num_large, dtype=np.bool_)
    b = 0
    for g in range(count):  # 1: one bin per large sequence, longest first (groups are in order)
        if classes[g] != 0:
            continue
        for k in range(head[g], tail[g]):
            bin_of[order[k]] = b
            room[b] = pack_size - values[g]
            b += 1
        head[g] = tail[g]
    medium = members(1)
    for b in range(num_large):  # 2: the longest medium sequence that fits, lowest index first
        g = longest_fitting(medium, room[b])
        if g == count:
            continue
        take(medium, g, b, room)
        has_medium[b] = True
    small = members(2)
    shortest = count - 1  # the group of the shortest small sequence left (moves up only)
    up = count - 1  # the next longer group with small sequences left (moves up only)
    left = 0
    for g in range(count):
        if classes[g] == 2:
            left += tail[g] - head[g]
    for b in range(num_large - 1, -1, -1):  # 3: backward, the bins without a medium sequence
        if has_medium[b] or left < 2:
            continue
        while shortest >= 0 and (classes[shortest] != 2 or head[shortest] == tail[shortest]):
            shortest -= 1
        first = values[shortest]
        second = first
        if tail[shortest] - head[shortest] < 2:  # the next shortest: a longer group
            while up >= shortest or classes[up] != 2 or head[up] == tail[up]:
                up -= 1
            second = values[up]
        if first + second > room[b]:
            continue
        bin_of[order[head[shortest]]] = b  # the shortest, lowest index first
        head[shortest] += 1
        if head[shortest] == tail[shortest]:
            small[shortest] = shortest + 1
        room[b] -= first
        g = longest_fitting(small, room[b])
        tail[g] -= 1  # the longest that fits beside it, highest index first
        bin_of[order[tail[g]]] = b
        if head[g] == tail[g]:
            small[g] = g + 1
        room[b] -= values[g]
        left -= 2
    rest = members(-1)
    for b in range(num_large):  # 4: forward, the longest sequence left that fits, until none
        while True:
            g = longest_fitting(rest, room[b])
            if g == count:
                break
            take(rest, g, b, room)


def _least_loaded(sizes: np.ndarray, pack_size: int, handles: np.ndarray) -> int:
    """Megatron-LM's step 5: each size (longest first) into the least-loaded bin if it fits,
    else into a new one; equal loads in the order the bins last changed. ``handles`` gets each
    sequence's bin numbered as Megatron-LM lists its bins at the end (by load, then that order);
    returns the number of bins, or -1 on a bug."""
    n = sizes.shape[0]

    def push(heap: np.ndarray, size: int, key: int) -> None:
        i = size
        while i > 0:
            parent = (i - 1) // 2
            if heap[parent] <= key:
                break
            heap[i] = heap[parent]
            i = parent
        heap[i] = key

    def replace_top(heap: np.ndarray, size: int, key: int) -> None:
        i = 0
        while True:
            child = 2 * i + 1
            if child >= size:
                break
            if child + 1 < size and heap[child + 1] < heap[child]:
                child += 1
            if heap[child] >= key:
                break
            heap[i] = heap[child]
            i = child
        heap[i] = key

    base = n + 2  # a key is load * base + the stamp of the bin's last change
    heap = np.empty(n + 1, dtype=np.int64)
    owner = np.empty(n + 2, dtype=np.int64)  # stamp -> bin
    heap[0] = 0  # Megatron-LM starts from one empty bin
    owner[0] = 0
    size_of_heap, stamp, bins = 1, 1, 1
    for i in range(n):
        s = sizes[i]
        top = heap[0]
        load = top // base
        if s <= pack_size - load:
            target = owner[top % base]
            key = (load + s) * base + stamp
            replace_top(heap, size_of_heap, key)
        else:
            target = bins
            bins += 1
            key = s * base + stamp
            push(heap, size_of_heap, key)
            size_of_heap += 1
        owner[stamp] = target
        stamp += 1
        handles[i] = target
    if size_of_heap != bins:
        return -1
    rank = np.empty(bins, dtype=np.int64)  # final order: ascending key
    keys = np.sort(heap[:size_of_heap])
    for r in range(bins):
        rank[owner[keys[r] % base]] = r
    for i in range(n):
        handles[i] = rank[handles[i]]
    return bins
