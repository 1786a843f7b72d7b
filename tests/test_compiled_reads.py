"""``dataset[i]`` compiled (``packlab/_views.c``): built by the install, and read for read the
same as the Python closures it replaces: the same items (values, dtypes, read-only views of the
maps), the same read advice counted and called, the same answer to every other index, no
reference leaked."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import shard_per_format

from packlab.formats import format_names
from packlab.formats.bintable import CompiledReader, MaskApartTable, VerifiedTable
from packlab.packing import pack
from packlab.sources import open_dataset
from packlab.spool import SpoolReader

VIEWS = {"memmap_v1", "binidx", "arrow_ipc", "pbin"}  # formats whose bins are views of files


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from conftest import write_random_spool

    root = tmp_path_factory.mktemp("compiled")
    spool = write_random_spool(root / "spool", num_sequences=600, seed=7)
    assignment, _ = pack(SpoolReader(root / "spool").lengths, 1024, seed=0)
    return shard_per_format(spool, assignment, root, format_names())


class Spy:
    """A read advice that records what it is asked (``due`` counts down as the table's)."""

    __slots__ = ("due", "calls")

    def __init__(self, due: int) -> None:
        self.due = due
        self.calls: list[tuple[Any, ...]] = []

    def advise_bin(self, t0: int, m0: int, n: int) -> bool:
        self.calls.append(("bin", t0, m0, n, self.due))
        self.due = 2
        return False


def tables_of(shards: dict[str, Path]) -> dict[str, Any]:
    """The bin table of every format whose bins are views of its files."""
    out = {}
    for name, shard in shards.items():
        dataset = open_dataset(shard)
        dataset[0]
        table = dataset._tables[0]
        if table is not None:
            out[name] = table
    return out


def refuse(b: Any) -> str:
    return f"other {b!r}"


def same_item(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert list(a) == list(b) == ["input_ids", "loss_mask", "seq_boundaries"]
    for key in a:
        x, y = a[key], b[key]
        assert type(x) is np.ndarray and x.dtype == y.dtype and x.shape == y.shape, key
        assert np.array_equal(x, y), key
        assert x.flags.writeable == y.flags.writeable and x.flags.c_contiguous, key
        assert np.shares_memory(x, y), key  # views of the same mapped bytes, not copies


def test_the_install_built_the_compiled_read(shards: dict[str, Path]) -> None:
    # setup.py builds it wherever a C compiler is (here, and in CI): what notebooks 05 and 11
    # measure; without it packlab reads through the Python closures
    assert CompiledReader is not None
    dataset = open_dataset(shards["memmap_v1"])
    dataset[0]
    assert type(dataset._get) is CompiledReader and dataset._items is not None


@pytest.fixture(scope="module")
def tables(shards: dict[str, Path]) -> dict[str, Any]:
    found = tables_of(shards)
    assert set(found) == VIEWS
    return found


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_every_bin_reads_as_the_python_closure_reads_it(name: str, tables: dict[str, Any]) -> None:
    table = tables[name]
    fast, slow = table.reader(refuse), table.reader(refuse, compiled=False)
    assert type(fast) is CompiledReader and type(slow) is not CompiledReader
    n = fast.num_bins
    for b in range(n):
        same_item(fast(b), slow(b))
    for other in (-1, n, 10**30, -(10**30), np.int64(1), True, 1.0, "1", None):
        assert fast(other) == slow(other) == f"other {other!r}"
    batch = [n - 1, 0, 3, 3]
    for a, b in zip(fast.items(batch), table.items(batch), strict=True):
        same_item(a, b)
    assert fast.items([]) == []
    for refused in ([0, -1], [0, n], [np.int64(0)], (0, 1), [True]):
        assert fast.items(refused) is None  # the caller's Python path takes these


def test_a_mask_indexed_apart_is_read_from_its_own_positions(tables: dict[str, Any]) -> None:
    apart = [name for name, t in tables.items() if type(t) is MaskApartTable]
    assert apart  # arrow_ipc
    for name in apart:
        table = tables[name]
        fast = table.reader(refuse)
        assert any(table.mask_start[b] != table.start[b] for b in range(len(table.start)))
        for b in range(len(table.start)):
            assert np.array_equal(fast(b)["loss_mask"], table.bin(b).loss_mask)


@pytest.mark.parametrize("name", ["memmap_v1", "arrow_ipc"])
def test_the_read_advice_is_counted_and_called_as_in_python(name: str,
                                                             tables: dict[str, Any]) -> None:
    table = tables[name]
    order = [5, 1, 1, 7, 0, 3, 2, 6, 4, 4]
    seen = []
    for compiled in (True, False):
        spy = Spy(due=1)
        read = table._replace(advice=spy).reader(refuse, compiled=compiled)
        for b in order:
            read(b)
        seen.append((spy.calls, spy.due))
    assert seen[0] == seen[1] and len(seen[0][0]) == 3  # due at reads 2, 5 and 8


def test_a_due_batch_asks_the_table_to_advise_it(tables: dict[str, Any]) -> None:
    table = tables["binidx"]
    asked: list[list[int]] = []
    spy = Spy(due=3)
    read = CompiledReader(table.input_ids, table.loss_mask, table.bounds, table.start,
                          table.stop, table.mask_start, table.bound_at, spy, refuse,
                          asked.append)
    assert len(read.items([0, 1, 2])) == 3 and spy.due == 0 and asked == []
    assert len(read.items([4, 2])) == 2 and spy.due == -2 and asked == [[4, 2]]


def test_a_batch_is_the_bins_asked_even_if_the_advice_changes_the_list(
        tables: dict[str, Any]) -> None:
    table = tables["memmap_v1"]
    read = CompiledReader(table.input_ids, table.loss_mask, table.bounds, table.start,
                          table.stop, table.mask_start, table.bound_at, Spy(due=0), refuse,
                          list.clear)  # the advice's call empties the list it is given
    batch = [3, 1, 2]
    got = read.items(batch)
    assert batch == [] and len(got) == 3
    for b, item in zip([3, 1, 2], got, strict=True):
        same_item(item, table.reader(refuse, compiled=False)(b))


def test_reads_leak_no_reference(tables: dict[str, Any]) -> None:
    table = tables["pbin"]
    read = table.reader(refuse)
    columns = (table.input_ids, table.loss_mask, table.bounds)
    kept = read(0)  # a view holds its column (valid after the reader is dropped)
    gc.collect()
    before = [sys.getrefcount(c) for c in columns]
    for _ in range(20):
        for b in range(read.num_bins):
            read(b)
        read.items(list(range(read.num_bins)))
        read(-1)
    gc.collect()
    assert [sys.getrefcount(c) for c in columns] == before
    del read
    gc.collect()
    assert np.array_equal(kept["input_ids"], table.bin(0).input_ids)


def test_a_verified_table_reads_in_python(shards: dict[str, Path]) -> None:
    dataset = open_dataset(shards["memmap_v1"], verify=True)
    dataset[0]
    assert type(dataset._tables[0]) is VerifiedTable
    assert type(dataset._get) is not CompiledReader and dataset._items is None


def test_wrong_positions_are_refused_with_their_name(tables: dict[str, Any]) -> None:
    table = tables["memmap_v1"]
    args = [table.input_ids, table.loss_mask, table.bounds, table.start, table.stop,
            table.mask_start, table.bound_at, Spy(0), refuse, refuse]
    floats = memoryview(np.zeros(len(table.start), dtype=np.float64))
    with pytest.raises(TypeError, match="stop: uint32 or int64 positions expected"):
        CompiledReader(*args[:4], floats, *args[5:])
    short = memoryview(np.zeros(len(table.start), dtype=np.uint32))
    with pytest.raises(ValueError, match=f"bound_at: {len(table.start)} positions, "
                                         f"{len(table.start) + 1} expected"):
        CompiledReader(*args[:6], short, *args[7:])
    with pytest.raises(TypeError, match="ids: a 1-D C-contiguous ndarray expected"):
        CompiledReader(table.input_ids[::2], *args[1:])
