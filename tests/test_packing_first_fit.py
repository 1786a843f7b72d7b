"""first_fit_shuffle compiled: the same assignment as the per-item Python walk it replaced, for
every seed, and the same first fit as Megatron-Bridge's packer on the same order."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab import compiled as compiled_module
from packlab.packing import algorithms as packers
from packlab.packing import assignment_from_bins, pack
from packlab.spool.synth import synth_lengths

FAST = settings(max_examples=150, deadline=None)


# -- the reference: packlab's first fit before it was compiled (commit b362468), verbatim ------


def reference_first_fit_in_order(lengths: np.ndarray, order: np.ndarray,
                                 pack_size: int) -> np.ndarray:
    size = 1
    while size < packers.max_bins(lengths, pack_size):
        size *= 2
    tree = [pack_size] * (2 * size)
    bin_of = np.empty(lengths.shape[0], dtype=np.int64)
    for lo in range(0, order.shape[0], 1 << 16):
        chunk = order[lo : lo + (1 << 16)]
        bin_of[chunk] = _reference_walk(tree, size, lengths[chunk].tolist())
    return bin_of


def _reference_walk(tree: list[int], size: int, sizes: list[int]) -> list[int]:
    placed = []
    for s in sizes:
        i = 1
        while i < size:  # down to the leftmost leaf with room >= s
            i <<= 1
            if tree[i] < s:
                i += 1
        placed.append(i - size)
        room = tree[i] - s
        tree[i] = room
        while i > 1:  # up while the subtree maximum changes
            sibling = tree[i ^ 1]
            if sibling > room:
                room = sibling
            i >>= 1
            if tree[i] == room:
                break
            tree[i] = room
    return placed


def reference_first_fit_shuffle(lengths: np.ndarray, pack_size: int, seed: int) -> np.ndarray:
    order = np.random.default_rng(seed).permutation(lengths.shape[0])
    return reference_first_fit_in_order(lengths, order, pack_size)


def assert_same_as_reference(lengths: np.ndarray, pack_size: int, seed: int) -> None:
    """The algorithm's bins and pack()'s whole assignment, against the reference's."""
    kept = np.minimum(lengths, pack_size)
    ours = packers.first_fit_shuffle(kept, pack_size, np.random.default_rng(seed))
    theirs = reference_first_fit_shuffle(kept, pack_size, seed)
    assert np.array_equal(ours, theirs)
    assignment, _ = pack(lengths, pack_size, algorithm="first_fit_shuffle", seed=seed)
    order = np.argsort(theirs, kind="stable")  # the CSR as pack() built it before
    offsets = np.concatenate(([0], np.cumsum(np.bincount(theirs))))
    assert np.array_equal(assignment.bin_offsets, offsets)
    assert np.array_equal(assignment.seq_indices, order)


# -- the same assignment for every seed --------------------------------------------------------


@FAST
@given(
    st.integers(1, 5000).flatmap(
        lambda p: st.tuples(st.just(p), st.lists(st.integers(1, p), min_size=1, max_size=400))
    ),
    st.integers(0, 2**63 - 1),
)
def test_first_fit_shuffle_equals_the_python_walk_for_any_seed(
    problem: tuple[int, list[int]], seed: int
) -> None:
    pack_size, sizes = problem
    assert_same_as_reference(np.array(sizes, dtype=np.int64), pack_size, seed)


@FAST
@given(
    st.integers(1, 64).flatmap(
        lambda p: st.tuples(st.just(p), st.lists(st.integers(1, min(p, 4)), min_size=1,
                                                 max_size=3000))
    ),
    st.integers(0, 2**32 - 1),
)
def test_many_small_items_per_bin(problem: tuple[int, list[int]], seed: int) -> None:
    """Small items: bins hold many, rooms tie often (the upward pass stops on a tie), and the
    tree is several levels deep."""
    pack_size, sizes = problem
    assert_same_as_reference(np.array(sizes, dtype=np.int64), pack_size, seed)


@FAST
@given(st.integers(1, 600).flatmap(
    lambda n: st.tuples(st.lists(st.integers(1, 50), min_size=n, max_size=n),
                        st.permutations(range(n)), st.integers(1, 50))
))
def test_first_fit_in_any_order_equals_the_python_walk(
    problem: tuple[list[int], list[int], int]
) -> None:
    sizes, order, pack_size = problem
    lengths = np.minimum(np.array(sizes, dtype=np.int64), pack_size)
    order_array = np.array(order, dtype=np.int64)
    assert np.array_equal(packers.first_fit_in_order(lengths, order_array, pack_size),
                          reference_first_fit_in_order(lengths, order_array, pack_size))


@pytest.mark.parametrize(
    ("name", "make", "pack_size", "seed"),
    [
        ("chat 400k", lambda: synth_lengths(400_000, "chat", 11), 4096, 0),
        ("chat 400k, another seed", lambda: synth_lengths(400_000, "chat", 11), 4096, 2**40 + 7),
        ("uniform, every length", lambda: np.random.default_rng(1).integers(1, 8193, 300_000),
         8192, 3),
        ("tiny items, ~1000 per bin", lambda: np.random.default_rng(2).integers(1, 9, 300_000),
         4096, 4),
        ("pack_size 1: one bin per item, all bins the bound allows",
         lambda: np.ones(50_000, dtype=np.int64), 1, 5),
        ("just over half: one item per bin", lambda: np.full(50_000, 2049), 4096, 6),
        ("pack_size past int32", lambda: np.random.default_rng(3).integers(1, 2**33, 100_000),
         2**33, 7),
    ],
)
def test_large_fixed_cases_equal_the_python_walk(name: str, make, pack_size: int,
                                                 seed: int) -> None:
    assert_same_as_reference(np.asarray(make(), dtype=np.int64), pack_size, seed)


def test_the_decreasing_order_fallback_equals_the_python_walk() -> None:
    """FFD's per-item path (diverse lengths) is the same compiled walk."""
    lengths = np.random.default_rng(5).integers(1, 200_000, size=20_000)
    order = packers.decreasing_order(lengths)
    ours = packers.first_fit_decreasing(lengths, 200_000, np.random.default_rng(0))
    assert np.array_equal(ours, reference_first_fit_in_order(lengths, order, 200_000))


@FAST
@given(st.lists(st.integers(0, 40), min_size=1, max_size=500))
def test_sequences_by_bin_is_the_stable_argsort(bins: list[int]) -> None:
    bin_of = np.array(bins, dtype=np.int64)
    assert np.array_equal(packers.sequences_by_bin(bin_of, np.bincount(bin_of)),
                          np.argsort(bin_of, kind="stable"))


def test_a_first_fit_that_runs_out_of_bins_is_an_error_not_a_crash() -> None:
    from packlab.errors import PacklabError

    with pytest.raises(PacklabError, match="ran out of bins .algorithm bug"):
        packers.first_fit_in_order(np.array([5, 9]), np.array([0, 1]), 8)  # 9 > pack_size
    assignment = assignment_from_bins(np.array([1, 0, 1]), None, 8, "truncate")
    assert assignment.seq_indices.tolist() == [1, 0, 2]


def test_without_numba_the_same_loops_run_in_python(monkeypatch: pytest.MonkeyPatch) -> None:
    """numba missing (a Python or numpy it does not support yet): the same assignment, slower,
    and a warning that says so."""
    import sys

    lengths = synth_lengths(3000, "chat", 4)
    expected, _ = pack(lengths, 4096, seed=3)
    monkeypatch.setitem(sys.modules, "numba", None)  # `import numba` now raises ImportError
    compiled_module.compiled.cache_clear()
    try:
        with pytest.warns(UserWarning, match="numba is not installed"):
            again, _ = pack(lengths, 4096, seed=3)
    finally:
        compiled_module.compiled.cache_clear()
    assert again.digest() == expected.digest()


def test_ctrl_c_while_compiling_is_raised_once_the_compile_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C that lands while numba compiles (or loads its cache) waits for the compile:
    raised inside it, it can hit one of the compiler's callbacks into Python, where it is
    printed as a traceback and lost (CI saw ``packlab pack`` do that)."""
    import os
    import signal

    from numba.core.dispatcher import Dispatcher

    original = Dispatcher.compile
    compiled: list[object] = []

    def interrupted(self: Dispatcher, signature: object) -> object:
        compiled.append(signature)
        os.kill(os.getpid(), signal.SIGINT)  # delivered at the compiler's next Python line
        return original(self, signature)

    # Ctrl-C as a fresh `packlab` process has it, whatever the tests before left in this
    # worker (a late pool's signal mask, a handler): the test is about numba, not about them
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    bin_of = np.array([0, 1, 0, 2], dtype=np.int64)
    lengths = np.array([5, 6, 7, 8], dtype=np.int64)
    compiled_module.compiled.cache_clear()
    monkeypatch.setattr(Dispatcher, "compile", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            packers.bin_totals(bin_of, lengths)
        assert compiled, "numba compiled nothing: the interruption was never tried"
        assert compiled_module.compiled(packers._add_per_bin).dispatcher.overloads  # it finished
        monkeypatch.setattr(Dispatcher, "compile", original)
        counts, loads = packers.bin_totals(bin_of, lengths)
    finally:
        compiled_module.compiled.cache_clear()
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    assert counts.tolist() == [2, 1, 1] and loads.tolist() == [12, 6, 8]


@FAST
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10**12)), min_size=1,
                max_size=500))
def test_bin_totals_are_the_bincounts(pairs: list[tuple[int, int]]) -> None:
    bin_of = np.array([b for b, _ in pairs], dtype=np.int64)
    lengths = np.array([n for _, n in pairs], dtype=np.int64)
    counts, loads = packers.bin_totals(bin_of, lengths)
    assert np.array_equal(counts, np.bincount(bin_of))
    assert loads.tolist() == [sum(n for b, n in pairs if b == k) for k in range(counts.shape[0])]
