"""Modified First-Fit Decreasing: both variants exactly as the naive per-item loops of its five
steps place items (Megatron-LM's ``pack_samples`` read as a specification, list for list), its
classes at Megatron-LM's boundaries, and fill at least FFD's on realistic lengths."""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.packing import BinAssignment, pack
from packlab.packing.mffd import LARGE, MEDIUM, SMALL, TINY, size_classes
from packlab.spool.synth import synth_lengths

FAST = settings(max_examples=200, deadline=None)
VARIANTS = {"modified_first_fit_decreasing": False, "megatron_lm_mffd": True}

Item = tuple[int, int]  # (sequence index, length)


# -- the reference: the five steps, one item at a time, over Python lists ---------------------


def naive_mffd(sizes: list[int], capacity: int, *, least_loaded: bool) -> list[list[int]]:
    """Bins as sorted lists of sequence indices, in the order the steps create them."""
    items = list(enumerate(sizes))
    large = sorted((x for x in items if 2 * x[1] > capacity), key=lambda x: -x[1])
    medium = sorted((x for x in items if 2 * x[1] <= capacity < 3 * x[1]), key=lambda x: -x[1])
    small = sorted((x for x in items if 3 * x[1] <= capacity < 6 * x[1]), key=lambda x: x[1])
    tiny = [x for x in items if 6 * x[1] <= capacity]
    bins: list[list[Item]] = [[x] for x in large]

    def room(b: list[Item]) -> int:
        return capacity - sum(s for _, s in b)

    for b in bins:  # 2
        fits = [k for k, (_, s) in enumerate(medium) if s <= room(b)]
        if fits:
            b.append(medium.pop(fits[0]))
    for b in reversed(bins):  # 3
        if len(b) > 1 or len(small) < 2 or small[0][1] + small[1][1] > room(b):
            continue
        first = small.pop(0)
        beside = [k for k, (_, s) in enumerate(small) if s <= room(b) - first[1]]
        b += [first, small.pop(beside[-1])]
    rest = sorted(medium + small + tiny, key=lambda x: -x[1])
    for b in bins:  # 4
        while True:
            fits = [k for k, (_, s) in enumerate(rest) if s <= room(b)]
            if not fits:
                break
            b.append(rest.pop(fits[0]))
    new: list[list[Item]] = []
    if least_loaded:  # 5, Megatron-LM: into the least-loaded bin, equal loads oldest first
        loads, new = [0], [[]]
        for x in rest:
            if x[1] <= capacity - loads[0]:
                target, load = new.pop(0), loads.pop(0)
            else:
                target, load = [], 0
            target.append(x)
            at = bisect_right(loads, load + x[1])
            loads.insert(at, load + x[1])
            new.insert(at, target)
    else:  # 5, Johnson and Garey: first fit decreasing
        for x in rest:
            target = next((b for b in new if room(b) >= x[1]), None)
            if target is None:
                new.append(target := [])
            target.append(x)
    return [sorted(i for i, _ in b) for b in bins + new if b]


def as_bins(assignment: BinAssignment) -> list[list[int]]:
    return [assignment.bin_indices(b).tolist() for b in range(assignment.num_bins)]


problems = st.integers(1, 90).flatmap(
    lambda c: st.tuples(st.just(c), st.lists(st.integers(1, c), min_size=1, max_size=150)))


@FAST
@given(problems)
@pytest.mark.parametrize("algorithm", sorted(VARIANTS))
def test_equals_the_naive_steps(algorithm: str, problem: tuple[int, list[int]]) -> None:
    capacity, sizes = problem
    assignment, _ = pack(np.array(sizes), capacity, algorithm=algorithm)
    assert as_bins(assignment) == naive_mffd(sizes, capacity,
                                             least_loaded=VARIANTS[algorithm])


@pytest.mark.parametrize("algorithm", sorted(VARIANTS))
@pytest.mark.parametrize("profile", ["chat", "short", "uniform"])
def test_equals_the_naive_steps_on_realistic_lengths(algorithm: str, profile: str) -> None:
    lengths = np.minimum(synth_lengths(3000, profile, 5), 2048)
    assignment, _ = pack(lengths, 2048, algorithm=algorithm)
    assert as_bins(assignment) == naive_mffd(lengths.tolist(), 2048,
                                             least_loaded=VARIANTS[algorithm])


def test_classes_at_megatron_lms_boundaries() -> None:
    """(C/2, C] large, (C/3, C/2] medium, (C/6, C/3] small, (0, C/6] tiny: C = 12 and 13."""
    got = size_classes(np.arange(1, 13), 12).tolist()
    assert got == [TINY, TINY, SMALL, SMALL, MEDIUM, MEDIUM] + [LARGE] * 6
    assert size_classes(np.array([2, 3, 4, 5, 6, 7]), 13).tolist() == [
        TINY, SMALL, SMALL, MEDIUM, MEDIUM, LARGE]


def test_a_known_case_step_by_step() -> None:
    """C = 24. Large 14 and 13 open bins (rooms 10, 11); medium 9 joins 14 (step 2); the bin
    of 13 has no medium item and the two shortest small items fit it (5 + 6 = 11), so 5 goes
    in with the longest small item that fits beside it, a 6: the one of highest index, as
    Megatron-LM takes it from the end of its list (step 3); nothing else fits (step 4); the
    leftovers 8, 6, 2 share a new bin (step 5)."""
    sizes = [13, 5, 6, 8, 6, 14, 9, 2]
    for algorithm in VARIANTS:
        assignment, report = pack(np.array(sizes), 24, algorithm=algorithm)
        assert as_bins(assignment) == [[5, 6], [0, 1, 4], [2, 3, 7]]
        assert report.num_bins == 3


def test_the_leftovers_differ_between_the_variants() -> None:
    """C = 12: 9, 8, 7 open bins and take 3, 4 and 5; the leftovers 6, 6, 3, 2, 2, 2, 1: first
    fit puts the two 6s together, then the rest; Megatron-LM's least-loaded bin too, but lists
    its bins by load (10 before 12)."""
    sizes = [7, 9, 3, 8, 5, 3, 4, 2, 2, 1, 6, 6, 2]
    ffd, _ = pack(np.array(sizes), 12, algorithm="modified_first_fit_decreasing")
    megatron, _ = pack(np.array(sizes), 12, algorithm="megatron_lm_mffd")
    assert as_bins(ffd) == [[1, 2], [3, 6], [0, 4], [10, 11], [5, 7, 8, 9, 12]]
    assert as_bins(megatron) == [[1, 2], [3, 6], [0, 4], [5, 7, 8, 9, 12], [10, 11]]
    # all small or tiny at C = 12, so step 5 packs everything: 5, 4, 4, 4, 3, 2, 2 fill two
    # bins by first fit; the least-loaded bin spreads them over three
    sizes = [2, 4, 4, 3, 5, 4, 2]
    _, first_fit = pack(np.array(sizes), 12, algorithm="modified_first_fit_decreasing")
    _, least_loaded = pack(np.array(sizes), 12, algorithm="megatron_lm_mffd")
    assert (first_fit.num_bins, least_loaded.num_bins) == (2, 3)


@pytest.mark.parametrize("algorithm", sorted(VARIANTS))
def test_as_close_to_the_lower_bound_as_ffd(algorithm: str) -> None:
    lengths = synth_lengths(200_000, "chat", 0)
    _, ffd = pack(lengths, 4096, algorithm="first_fit_decreasing")
    _, report = pack(lengths, 4096, algorithm=algorithm)
    assert report.bins_over_lower_bound < 0.005 and report.num_bins <= ffd.num_bins + 1
