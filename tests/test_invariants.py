"""Every rule of "One packed bin", broken on purpose, is caught by check_bin (one bin) AND by
check_csr (many bins in flat CSR form), each naming the source and the bin."""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.bins import check_bin, check_csr
from packlab.errors import InvariantError, PacklabError
from packlab.packing.materialize import align_loss_mask

PACK = 6
SOURCE = "shards/part-00003.x"
FIRST = 10  # the shard's first bin number: messages name global bin numbers

Bin = tuple[np.ndarray, np.ndarray, np.ndarray]


def valid_bins() -> list[Bin]:
    return [
        (np.array([5, 6, 7, 8, 9], np.int32), np.array([1, 1, 0, 1, 0], np.uint8),
         np.array([0, 3], np.int32)),
        (np.array([1, 2, 3, 4], np.int32), np.array([1, 0, 0, 0], np.uint8),
         np.array([0, 2, 3], np.int32)),
        (np.array([4, 4, 4], np.int32), np.array([1, 1, 0], np.uint8), np.array([0], np.int32)),
    ]


def to_csr(bins: list[Bin]) -> dict[str, np.ndarray]:
    """Flat arrays plus offsets, as a columnar shard stores them."""
    return {
        "token_offsets": np.concatenate(([0], np.cumsum([len(b[0]) for b in bins]))),
        "seq_offsets": np.concatenate(([0], np.cumsum([len(b[2]) for b in bins]))),
        "seq_starts": np.concatenate([b[2] for b in bins]),
        "loss_mask": np.concatenate([b[1] for b in bins]),
        "input_ids": np.concatenate([b[0] for b in bins]),
    }


def run_csr(csr: dict[str, np.ndarray]) -> None:
    check_csr(csr["token_offsets"], csr["seq_offsets"], csr["seq_starts"], csr["loss_mask"],
              pack_size=PACK, source=SOURCE, first_bin=FIRST, input_ids=csr["input_ids"])


def named(bin_number: int) -> str:
    return re.escape(f"{SOURCE}: bin {bin_number}: ")


def test_valid_bins_pass_both() -> None:
    bins = valid_bins()
    for k, b in enumerate(bins):
        check_bin(*b, pack_size=PACK, source=SOURCE, bin_id=FIRST + k)
    run_csr(to_csr(bins))
    csr = to_csr(bins)  # the optional columns may be left out
    check_csr(csr["token_offsets"], csr["seq_offsets"], csr["seq_starts"], None,
              pack_size=PACK, source=SOURCE)
    check_bin(bins[0][0], bins[0][1].astype(bool), bins[0][2], pack_size=PACK)


# (rule, which bin to break, the break, what the message says)
Break = Callable[[Bin], Bin]
CASES: list[tuple[str, int, Break, str]] = [
    ("empty bin", 1, lambda b: (b[0][:0], b[1][:0], b[2][:1]), r"packed_len 0 not in \(0, 6\]"),
    ("longer than pack_size", 1,
     lambda b: (np.arange(7, dtype=np.int32), np.zeros(7, np.uint8), b[2][:1]),
     r"packed_len 7 not in \(0, 6\]"),
    ("loss_mask shorter than input_ids", 2, lambda b: (b[0], b[1][:-1], b[2]), r"loss_mask"),
    ("loss_mask value 2", 1, lambda b: (b[0], np.array([0, 2, 0, 0], np.uint8), b[2]),
     r"loss_mask values must be 0 or 1"),
    ("loss_mask value -1", 1, lambda b: (b[0], np.array([0, -1, 0, 0], np.int8), b[2]),
     r"loss_mask"),
    ("negative token id", 1, lambda b: (np.array([1, -2, 3, 4], np.int32), b[1], b[2]),
     r"negative (token id|input_ids value) -2"),
    ("seq_start_id empty", 1, lambda b: (b[0], b[1], b[2][:0]), r"seq_start_id is empty"),
    ("seq_start_id not from 0", 1, lambda b: (b[0], b[1], np.array([1, 3], np.int32)),
     r"seq_start_id\[0\] is 1, must be 0"),
    ("seq_start_id repeated", 1, lambda b: (b[0], b[1], np.array([0, 2, 2], np.int32)),
     r"not strictly increasing"),
    ("seq_start_id decreasing", 1, lambda b: (b[0], b[1], np.array([0, 3, 2], np.int32)),
     r"not strictly increasing"),
    ("start at packed_len", 1, lambda b: (b[0], b[1], np.array([0, 2, 4], np.int32)),
     r"last seq_start_id 4 >= packed_len 4"),
    ("loss crosses an inner boundary", 0,
     lambda b: (b[0], np.array([1, 1, 1, 1, 0], np.uint8), b[2]),
     r"loss_mask is 1 at position 2.*cross a sequence boundary"),
    ("loss on the bin's last token", 2, lambda b: (b[0], np.array([1, 1, 1], np.uint8), b[2]),
     r"loss_mask is 1 at position 2.*cross a sequence boundary"),
]


@pytest.mark.parametrize(("rule", "which", "breaks", "says"), CASES, ids=[c[0] for c in CASES])
def test_each_rule_is_caught_by_check_bin_and_check_csr(
    rule: str, which: int, breaks: Break, says: str
) -> None:
    bins = valid_bins()
    bins[which] = breaks(bins[which])
    with pytest.raises(InvariantError, match=named(FIRST + which) + ".*" + says):
        check_bin(*bins[which], pack_size=PACK, source=SOURCE, bin_id=FIRST + which)
    with pytest.raises(InvariantError, match=named(FIRST + which) + ".*" + says):
        run_csr(to_csr(bins))


@pytest.mark.parametrize("column", ["input_ids", "loss_mask"])
def test_float_columns_are_refused_by_both(column: str) -> None:
    bins = valid_bins()
    position = 0 if column == "input_ids" else 1
    broken = list(bins[0])
    broken[position] = broken[position].astype(np.float64)
    with pytest.raises(InvariantError, match=named(FIRST) + f"{column} dtype float64"):
        check_bin(*broken, pack_size=PACK, source=SOURCE, bin_id=FIRST)
    csr = to_csr(bins)
    csr[column] = csr[column].astype(np.float64)
    with pytest.raises(InvariantError, match=named(FIRST) + f"{column} dtype float64"):
        run_csr(csr)


def test_shapes_are_refused_by_both() -> None:
    ids, mask, starts = valid_bins()[0]
    with pytest.raises(InvariantError, match=named(4) + ".*must be 1-D"):
        check_bin(ids.reshape(1, -1), mask, starts, pack_size=PACK, source=SOURCE, bin_id=4)
    csr = to_csr(valid_bins())
    csr["loss_mask"] = csr["loss_mask"].reshape(2, -1)
    with pytest.raises(InvariantError, match=re.escape(SOURCE) + ".*must be 1-D"):
        run_csr(csr)
    csr = to_csr(valid_bins())
    with pytest.raises(InvariantError, match=re.escape(SOURCE) + ".*sequence offsets for 3 bins"):
        check_csr(csr["token_offsets"], csr["seq_offsets"][:-1], csr["seq_starts"], None,
                  pack_size=PACK, source=SOURCE)


def test_an_invariant_error_is_a_packlab_error() -> None:
    assert issubclass(InvariantError, PacklabError)  # the CLI prints it as one line, exit 2


# -- random bins: valid ones pass, one random break is found in the right bin -------------------


@st.composite
def random_bins(draw: st.DrawFn) -> tuple[int, list[Bin]]:
    pack_size = draw(st.integers(2, 40))
    bins = []
    for _ in range(draw(st.integers(1, 8))):
        lengths = draw(st.lists(st.integers(1, pack_size), min_size=1, max_size=6))
        while sum(lengths) > pack_size:
            lengths.pop()
        if not lengths:
            lengths = [pack_size]
        n = sum(lengths)
        raw = np.array(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.uint8)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int32)
        loss = np.empty_like(raw)
        align_loss_mask(raw, starts, loss)
        ids = np.array(draw(st.lists(st.integers(0, 2**31 - 1), min_size=n, max_size=n)),
                       np.int32)
        bins.append((ids, loss, starts))
    return pack_size, bins


@settings(max_examples=60, deadline=None)
@given(random_bins(), st.data())
def test_random_valid_bins_pass_and_one_break_is_located(
    problem: tuple[int, list[Bin]], data: st.DataObject
) -> None:
    pack_size, bins = problem
    csr = to_csr(bins)
    check_csr(csr["token_offsets"], csr["seq_offsets"], csr["seq_starts"], csr["loss_mask"],
              pack_size=pack_size, source=SOURCE, input_ids=csr["input_ids"])
    for k, b in enumerate(bins):
        check_bin(*b, pack_size=pack_size, source=SOURCE, bin_id=k)
    k = data.draw(st.integers(0, len(bins) - 1))
    ids, loss, starts = (a.copy() for a in bins[k])
    ends = np.append(starts[1:], ids.shape[0]) - 1
    rule = data.draw(st.sampled_from(["leak", "negative", "two", "start"]))
    if rule == "leak":
        loss[ends[data.draw(st.integers(0, ends.shape[0] - 1))]] = 1
    elif rule == "negative":
        ids[data.draw(st.integers(0, ids.shape[0] - 1))] = -7
    elif rule == "two":
        loss[data.draw(st.integers(0, loss.shape[0] - 1))] = 2
    else:
        starts[0] = 1 if starts.shape[0] == 1 or starts[1] > 1 else 0
        if starts[0] == 0:
            starts[1] = 0  # a repeated start
    bins[k] = (ids, loss, starts)
    with pytest.raises(InvariantError, match=re.escape(f"{SOURCE}: bin {k}: ")):
        check_bin(*bins[k], pack_size=pack_size, source=SOURCE, bin_id=k)
    csr = to_csr(bins)
    with pytest.raises(InvariantError, match=re.escape(f"{SOURCE}: bin {k}: ")):
        check_csr(csr["token_offsets"], csr["seq_offsets"], csr["seq_starts"], csr["loss_mask"],
                  pack_size=pack_size, source=SOURCE, input_ids=csr["input_ids"])
