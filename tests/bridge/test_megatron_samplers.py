"""packlab's reproduction of Megatron's pretraining samplers
(``packlab/lab/per_rank/megatron_sampler.py``: what notebook 08's model of seed 003's design and
its real ranks use) against Megatron-Bridge's own (``megatron/bridge/data/samplers.py``,
0.6.2): ``MegatronPretrainingSampler`` and ``MegatronPretrainingRandomSampler``, over the same
arguments (every rank of world sizes 1 to 8, micro-batch sizes, totals that do and do not fill
a global batch, consumed samples from the start, inside an epoch and in later epochs,
``drop_last`` and ``data_sharding`` both ways), micro-batch for micro-batch; and the arguments
both refuse.
"""

from __future__ import annotations

from itertools import product

import pytest
from bridge_code import import_bridge

from packlab.errors import PacklabError
from packlab.lab.per_rank.megatron_sampler import (
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    pretraining_batches,
    random_batches,
    rank_indices,
)

WORLDS = (1, 2, 3, 4, 8)
MICRO = (1, 2, 4)
TOTALS = (1, 7, 64, 103, 250)


@pytest.fixture(scope="module")
def samplers():
    return import_bridge(("samplers",)).samplers


def lists(batches) -> list[list[int]]:
    return [list(map(int, b)) for b in batches]


def test_the_sequential_sampler_is_bridges(samplers) -> None:
    compared = 0
    for total, mbs, world, drop_last in product(TOTALS, MICRO, WORLDS, (True, False)):
        step = mbs * world
        for consumed in sorted({0, 1, step, 3 * step, total // 2, total - 1} - {total}):
            if consumed >= total:
                continue
            for rank in range(world):
                args = (total, consumed, mbs, rank, world)
                theirs = list(samplers.MegatronPretrainingSampler(*args, drop_last=drop_last))
                assert lists(pretraining_batches(*args, drop_last=drop_last)) == theirs, args
                assert list(MegatronPretrainingSampler(*args, drop_last=drop_last)) == theirs
                compared += 1
    assert compared > 2_000


def test_the_random_sampler_is_bridges_epoch_after_epoch(samplers) -> None:
    """From each starting point, two passes: the rest of that epoch, then the whole next one
    (both samplers advance ``consumed_samples`` as they yield)."""
    compared = 0
    for total, mbs, world, sharding in product(TOTALS, MICRO, WORLDS, (True, False)):
        step = mbs * world
        active = total - total % step
        if active == 0:
            continue  # less than one global batch: refused, below
        for epoch, batches_in in product((0, 1, 2), sorted({0, 1, active // step - 1})):
            consumed = epoch * active + batches_in * step
            for rank in range(world):
                theirs = samplers.MegatronPretrainingRandomSampler(
                    list(range(total)), total, consumed, mbs, rank, world, sharding)
                ours = MegatronPretrainingRandomSampler(total, consumed, mbs, rank, world,
                                                        data_sharding=sharding)
                expected = lists(random_batches(total, consumed, mbs, rank, world,
                                                data_sharding=sharding))
                for _ in range(2):
                    batches = list(theirs)
                    assert list(ours) == batches, (total, consumed, mbs, rank, world, sharding)
                    assert ours.consumed_samples == theirs.consumed_samples
                assert expected == lists(
                    samplers.MegatronPretrainingRandomSampler(
                        list(range(total)), total, consumed, mbs, rank, world, sharding))
                if batches_in == 0:
                    name = "cyclic" if sharding else "cyclic_unsharded"
                    flat = rank_indices(name, total, mbs, rank, world, epoch=epoch).tolist()
                    assert flat == [i for b in expected for i in b]
                compared += 1
    assert compared > 2_000


def test_what_bridge_refuses_the_reproduction_refuses(samplers) -> None:
    sequential = [(5, 5, 1, 0, 1), (5, 9, 1, 0, 1), (5, 0, 1, 2, 2), (0, 0, 1, 0, 1),
                  (5, 0, 0, 0, 1)]
    for args in sequential:
        with pytest.raises(AssertionError):
            samplers.MegatronPretrainingSampler(*args)
        with pytest.raises(PacklabError):
            MegatronPretrainingSampler(*args)
    # inside an epoch at a point that is not a whole global batch; less than one global batch
    for total, consumed, mbs, world in [(64, 3, 2, 2), (3, 0, 2, 2)]:
        theirs = samplers.MegatronPretrainingRandomSampler(list(range(total)), total, consumed,
                                                          mbs, 0, world, True)
        with pytest.raises((AssertionError, ZeroDivisionError)):
            list(theirs)
        with pytest.raises(PacklabError):
            random_batches(total, consumed, mbs, 0, world)
