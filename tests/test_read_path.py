"""The one read path (``packlab/formats/read/table.py`` and ``packlab/loading/dataset.py``): every format
whose bins are slices of its files reads through one table; ``dataset[i]``, a batch and a
reader's ``read_bin`` agree bin for bin with the bytes the format's own index points at; bins
are arrays of their own, valid after close; the read advice is counted and asked for; every
kind of index is answered or refused the same way."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import shard_per_format

from packlab.formats import format_names, get_format
from packlab.formats.read.item_table import ItemTable
from packlab.formats.read.table import BinTable, gather
from packlab.packing import pack
from packlab.sources import open_dataset
from packlab.spool import SpoolReader

VIEWS = {"memmap_v1", "binidx", "arrow_ipc", "pbin"}  # formats whose bins are runs of values
ITEMS = {"megatron_sft"}  # formats whose bin is one item of a file, decoded


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from conftest import write_random_spool

    root = tmp_path_factory.mktemp("read_path")
    spool = write_random_spool(root / "spool", num_sequences=600, seed=7)
    assignment, _ = pack(SpoolReader(root / "spool").lengths, 1024, seed=0)
    return shard_per_format(spool, assignment, root, format_names())


def test_the_formats_whose_bins_are_runs_of_values_are_the_raw_runs_ones(shards) -> None:
    tables = {name: _table(shard) for name, shard in shards.items()}
    tabled = {name for name, table in tables.items() if isinstance(table, BinTable)}
    assert tabled == VIEWS == {n for n in format_names() if get_format(n).Reader.RAW_RUNS}
    # a bin that is one item it decodes is read through the items' table
    assert {name for name, table in tables.items() if isinstance(table, ItemTable)} == ITEMS


def _table(shard: Path) -> BinTable | None:
    reader = open_dataset(shard).readers()[0]
    return reader.table() if hasattr(reader, "table") else None


def same_item(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b) == ["input_ids", "loss_mask", "seq_boundaries"]
    for key in a:
        assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), key


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_every_read_agrees_with_the_index_runs(name: str, shards: dict[str, Path]) -> None:
    """``locate`` (one bin, the hot path) against ``runs`` (vectorized, what the checks read),
    and every way of reading a bin against the bytes those runs point at."""
    dataset = open_dataset(shards[name])
    reader = dataset.readers()[0]
    table = reader.table()
    runs = table.index.runs(0, table.num_bins)
    for b in range(table.num_bins):
        t0, t1, m0, s0, s1 = table.locate(b)
        assert (t0, t1 - t0, m0, s0, s1 - s0) == (
            runs.token_start[b], runs.packed_len[b], runs.mask_start[b], runs.seq_start[b],
            runs.num_seqs[b])
        ids = table.tokens[t0:t1]
        starts = table.starts[s0:s1]
        expected = {"input_ids": ids, "loss_mask": table.mask[m0:m0 + t1 - t0],
                    "seq_boundaries": np.append(starts, t1 - t0).astype(np.int32)}
        same_item(dataset[b], expected)
        same_item(reader.read_bin(b).item(), expected)
        same_item(reader.item(b), expected)
    batch = [table.num_bins - 1, 0, 3, 3]
    for item, b in zip(dataset.__getitems__(batch), batch, strict=True):
        same_item(item, dataset[b])
    flat = gather(table.tokens, runs.token_start, runs.packed_len)
    assert np.array_equal(flat, np.concatenate([dataset[b]["input_ids"]
                                                for b in range(len(dataset))]))


def test_a_mask_indexed_apart_is_read_from_its_own_positions(shards: dict[str, Path]) -> None:
    table = _table(shards["arrow_ipc"])
    runs = table.index.runs(0, table.num_bins)
    assert (runs.mask_start != runs.token_start).any()  # the Arrow mask has buffers of its own
    for b in range(table.num_bins):
        m0 = runs.mask_start[b]
        assert np.array_equal(table.item(b)["loss_mask"],
                              table.mask[m0:m0 + runs.packed_len[b]])


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_bins_are_arrays_of_their_own_that_outlive_the_reader(name: str, shards) -> None:
    dataset = open_dataset(shards[name])
    item, again = dataset[1], dataset[1]
    copy = {k: v.copy() for k, v in item.items()}
    for key in item:
        assert item[key].flags.writeable and not np.shares_memory(item[key], again[key])
    item["input_ids"][0] += 1  # a write reaches no file and no other read
    assert np.array_equal(dataset[1]["input_ids"], copy["input_ids"])
    item["input_ids"][0] -= 1
    dataset.close()
    del dataset
    gc.collect()
    same_item(item, copy)


class Spy:
    """A read advice that records what it is asked (``due`` counts down as the table's)."""

    __slots__ = ("due", "calls")

    def __init__(self, due: int) -> None:
        self.due = due
        self.calls: list[tuple[Any, ...]] = []

    def advise_bin(self, t0: int, m0: int, n: int, s0: int, s1: int) -> None:
        self.calls.append((t0, m0, n, s0, s1))
        self.due = 2


@pytest.mark.parametrize("name", ["memmap_v1", "arrow_ipc"])
def test_the_read_advice_is_counted_and_asked_for_the_bins_runs(name: str, shards) -> None:
    table = _table(shards[name])
    table.advice = Spy(due=1)
    order = [5, 1, 1, 7, 0, 3, 2, 6, 4, 4]
    for b in order:
        table.item(b)
    due = [order[1], order[4], order[7]]  # reads 2, 5 and 8
    assert table.advice.calls == [(table.locate(b)[0], table.locate(b)[2],
                                   table.locate(b)[1] - table.locate(b)[0],
                                   *table.locate(b)[3:]) for b in due]


def test_reads_leak_no_reference(shards: dict[str, Path]) -> None:
    table = _table(shards["pbin"])
    columns = (table.tokens, table.mask, table.starts)
    kept = table.item(0)  # a view holds its column (valid after the table is dropped)
    gc.collect()
    before = [sys.getrefcount(c) for c in columns]
    for _ in range(20):
        for b in range(table.num_bins):
            table.item(b)
            table.bin(b)
    gc.collect()
    assert [sys.getrefcount(c) for c in columns] == before
    assert np.array_equal(kept["input_ids"], table.bin(0).input_ids)


@pytest.mark.parametrize("name", sorted(format_names()))
def test_every_index_kind_is_answered_or_refused_alike(name: str, shards) -> None:
    dataset = open_dataset(shards[name])
    n = len(dataset)
    same_item(dataset[-1], dataset[n - 1])
    same_item(dataset[np.int64(2)], dataset[2])
    same_item(dataset[np.uint8(2)], dataset[2])
    for bad in (n, -n - 1, 10**30, -(10**30)):
        with pytest.raises(IndexError, match=f"bin {bad} out of range"):
            dataset[bad]
    for bad in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match="bin index must be an integer"):
            dataset[bad]
    for batch in ([0, -1], np.array([2, 0]), (1, 1), range(3)):
        got = dataset.__getitems__(batch)
        for item, b in zip(got, list(np.asarray(batch)), strict=True):
            same_item(item, dataset[int(b)])
    assert dataset.__getitems__([]) == []


def test_a_verified_table_checks_every_read_and_the_plain_one_none(shards) -> None:
    verified = open_dataset(shards["memmap_v1"], verify=True).readers()[0].table()
    plain = open_dataset(shards["memmap_v1"]).readers()[0].table()
    assert verified.checksum is not None and plain.checksum is None
    for b in range(plain.num_bins):
        same_item(verified.item(b), plain.item(b))
