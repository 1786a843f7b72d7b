"""packlab's first fit against Megatron-Bridge's own (``megatron/bridge/data/packing/
algorithms.py``, megatron-bridge 0.6.2 on its declared stack): the same bins from the same
order, and from the order Bridge's ``create_packing_strategy`` draws with its global NumPy seed."""

from __future__ import annotations

import numpy as np
import pytest
from bridge_code import import_bridge

from packlab.packing import algorithms as packers
from packlab.spool.synth import synth_lengths


@pytest.fixture(scope="module")
def bridge_algorithms():
    return import_bridge().algorithms


def bins_as_lengths(bin_of: np.ndarray, order: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    """Each bin's lengths in placement order: Bridge's ``first_fit`` output."""
    placed = bin_of[order]
    by_bin = np.argsort(placed, kind="stable")
    edges = np.cumsum(np.bincount(placed))[:-1]
    return [part.tolist() for part in np.split(lengths[order][by_bin], edges)]


@pytest.mark.parametrize("seed", [0, 1234])
def test_the_same_first_fit_as_bridge_on_the_same_order(bridge_algorithms, seed: int) -> None:
    lengths = np.minimum(synth_lengths(5000, "chat", seed), 4096)
    order = np.random.default_rng(seed).permutation(lengths.shape[0])
    theirs = bridge_algorithms.first_fit(lengths[order].tolist(), 4096)
    ours = packers.first_fit_shuffle(lengths, 4096, np.random.default_rng(seed))
    assert bins_as_lengths(ours, order, lengths) == theirs


def test_bridge_orders_with_its_global_numpy_seed_then_the_same_first_fit(
    bridge_algorithms,
) -> None:
    """Bridge's ``create_packing_strategy``: lengths ascending (from its histogram), shuffled by
    ``np.random.shuffle`` under ``np.random.seed(seed)``; first fit of that order is packlab's."""
    lengths = np.minimum(synth_lengths(3000, "chat", 9), 4096)
    histogram = np.bincount(lengths, minlength=4097).tolist()
    state = np.random.get_state()
    try:
        np.random.seed(9)
        theirs, _ = bridge_algorithms.create_packing_strategy(histogram, 4096,
                                                              "first_fit_shuffle")
        np.random.seed(9)
        shuffled = sorted(lengths.tolist())
        np.random.shuffle(shuffled)
    finally:
        np.random.set_state(state)
    in_order = np.array(shuffled, dtype=np.int64)
    identity = np.arange(in_order.shape[0])
    ours = packers.first_fit_in_order(in_order, identity, 4096)
    assert bins_as_lengths(ours, identity, in_order) == theirs
