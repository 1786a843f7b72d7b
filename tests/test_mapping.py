"""packlab.storage.reads and the memory-mapped readers built on it: a cold read fetches O(bin) pages,
all of a cold bin's ranges are asked for at once, warm reads stop asking, arrays outlive maps."""

from __future__ import annotations

import gc
import os
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool

from packlab import open_dataset
from packlab.bins import PackedBin, bins_equal
from packlab.errors import FormatError
from packlab.lab.measure.delivery import Sink
from packlab.lab.measure.pagecache import drop_until_cold, resident_once, resident_pages
from packlab.lab.measure.reading import data_files
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.shards import write_shards
from packlab.sources import open_shard
from packlab.spool import SpoolReader
from packlab.storage import reads as mapping
from packlab.storage.reads import MappedFile, ReadAdvice, load_array, scan

PAGE = os.sysconf("SC_PAGE_SIZE")
MAPPED_FORMATS = ["memmap_v1", "binidx", "pbin", "arrow_ipc", "packed_index"]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SpoolReader, BinAssignment, Path]:
    """About 1M tokens (4 MB of int32) packed into 2048-token bins, one shard per format."""
    root = tmp_path_factory.mktemp("mapping")
    spool = write_random_spool(root / "spool", num_sequences=3000, max_len=700, seed=5)
    assignment, _ = pack(spool.lengths, 2048, seed=5)
    for name in MAPPED_FORMATS:
        write_shards(spool, assignment, root / name, format=name,
                     bins_per_shard=assignment.num_bins, workers=1, **(
                         {"batch_size": 100} if name == "arrow_ipc" else {}))
    return spool, assignment, root


def shard_of(root: Path, name: str) -> Path:
    return next(p for p in (root / name).iterdir() if not p.name.endswith(".json"))


def resident(files: list[Path]) -> int:
    return sum(resident_pages(f)[0] for f in files)


def deliver(packed: PackedBin) -> int:
    return sum(np.array(a).nbytes for a in packed)


# -- the maps ---------------------------------------------------------------------------------
def test_mapped_file_views_outlive_the_file_object_and_errors_name_the_file(
        tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    values = np.arange(5000, dtype="<i4")
    path.write_bytes(b"HEAD" + values.tobytes())
    mapped = MappedFile(path)
    view = mapped.view("<i4", 4, 5000)
    assert not view.flags.writeable and np.array_equal(view, values)
    fd = mapped.fd
    mapped.close()
    del mapped
    gc.collect()
    with pytest.raises(OSError):
        os.fstat(fd)  # the descriptor went with the object; the map stays with its views
    assert int(view.sum()) == int(values.sum())
    with pytest.raises(FormatError, match="data.bin: .* too short for 5001 values"):
        MappedFile(path).view("<i4", 4, 5001)
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(FormatError, match="empty.bin: empty file"):
        MappedFile(tmp_path / "empty.bin")
    with pytest.raises(FormatError, match="missing.bin: cannot open"):
        MappedFile(tmp_path / "missing.bin")
    with pytest.raises(FormatError, match=r"data.bin: 20000 of the 40000 index bytes"):
        load_array(path, "<i8", 4, 5000)
    assert load_array(path, "<i4", 4, 3).tolist() == [0, 1, 2]


def test_a_scan_reads_ahead_while_it_lasts_then_maps_are_random_again(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(np.random.default_rng(2).integers(0, 255, 8 << 20, dtype=np.uint8))
    mapped = MappedFile(path)
    view = mapped.view("|u1", 0, 8 << 20)
    assert drop_until_cold([path]) == 0
    seen = []
    for i in scan(lambda i: int(view[i * PAGE]), 4, (mapped,)):
        seen.append(i)
    assert seen == view[: 4 * PAGE : PAGE].tolist()
    assert resident_once(path, 9) > 8  # sequential readahead, not one page per fault
    time.sleep(0.3)  # readahead still in flight would land after the eviction
    assert drop_until_cold([path]) == 0
    int(view[4 << 20])  # random again: one page
    assert resident_pages(path)[0] <= 2
    with pytest.raises(RuntimeError), mapping.sequential(mapped):
        raise RuntimeError("advice is restored on the way out")
    assert drop_until_cold([path]) == 0
    int(view[6 << 20])
    assert resident_pages(path)[0] <= 2


def test_a_file_read_by_pread_reads_ahead_in_a_scan_and_holds_nothing_after(
        tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    data = np.random.default_rng(3).integers(0, 255, 8 << 20, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    column = mapping.opened(path).column("|u1", 0, 8 << 20)
    assert mapping.opened(path) is column.file  # one per file per process
    assert drop_until_cold([path]) == 0
    with mapping.sequential(column.file):
        first = [column[i * PAGE:i * PAGE + 16] for i in range(4)]
    assert all(np.array_equal(f, data[i * PAGE:i * PAGE + 16]) for i, f in enumerate(first))
    assert resident_once(path, 9) > 8  # sequential readahead
    time.sleep(0.3)
    assert drop_until_cold([path]) == 0
    before = mapping.file_resident_bytes()
    assert int(column[6 << 20]) == int(data[6 << 20])  # random again: its page only
    assert resident_pages(path)[0] <= 2
    assert mapping.file_resident_bytes() - before < 64 << 10  # read, not mapped
    picked = column[np.array([5, 1, 4096 * 3])]
    assert picked.tolist() == data[[5, 1, 4096 * 3]].tolist()
    with pytest.raises(FormatError, match="big.bin: .* too short for"):
        column.file.column("|u1", 1, 8 << 20)


def test_read_advice_asks_for_cold_ranges_and_stops_asking_once_reads_stay_warm(
        tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    path.write_bytes(np.random.default_rng(1).integers(0, 255, 8 << 20, dtype=np.uint8))
    mapped = MappedFile(path)
    advice = ReadAdvice(mapped.fd)
    assert drop_until_cold([path]) == 0
    assert advice.first(3 * PAGE + 100, 5 * PAGE) is True  # just opened: advised, I/O started
    resident_once(path, 5)
    time.sleep(0.2)  # anything more asked for lands too
    assert 5 <= resident_pages(path)[0] <= 7  # the range, not a read-around window
    for _ in range(mapping.STAY - 1):  # cold lately: every read advised, no question asked
        assert advice.first(3 * PAGE + 100, 5 * PAGE) is True
    assert advice.credit == 0
    assert advice.first(3 * PAGE + 100, 5 * PAGE) is False  # asked: warm
    far = 1000 * PAGE
    # The probe's own one-page read can finish before the kernel answers it when the reading
    # thread is descheduled between the two (a loaded machine): the page is then warm, rightly.
    # A probe that never notices fails every try.
    for _try in range(5):
        assert drop_until_cold([path]) == 0
        for _ in range(mapping.SAMPLE - 1):  # warm for long: most reads are not checked at all
            assert advice.first(far, 4 * PAGE) is False
        assert resident_pages(path)[0] == 0
        if advice.first(far, 4 * PAGE):  # the sampled read notices
            break
    else:
        pytest.fail("the sampled read found a cold page warm in 5 tries")
    assert advice.credit == mapping.STAY
    resident_once(path, 4)
    time.sleep(0.2)
    assert 4 <= resident_pages(path)[0] <= 6  # the probe started one page, the advice the rest


# -- the readers ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MAPPED_FORMATS)
def test_a_cold_read_fetches_the_bins_pages_not_megabytes(name: str, packed) -> None:
    spool, assignment, root = packed
    expected = [b.copy() for b in iter_bins(spool, assignment)]
    dataset = open_dataset(shard_of(root, name))
    reader = dataset.readers()[0]
    files = data_files(dataset)
    total_pages = sum(-(-f.stat().st_size // PAGE) for f in files)
    reader.read_bin(0)  # maps open, index in RAM
    for b in (len(expected) // 2, len(expected) - 1, 7):
        assert drop_until_cold(files) == 0
        packed_bin = reader.read_bin(b)
        nbytes = deliver(packed_bin)
        assert bins_equal(packed_bin, expected[b])
        ranges = 3 if name != "packed_index" else 2 * expected[b].num_seqs
        bound = nbytes // PAGE + 2 * ranges + 2
        pages = resident(files)
        assert 0 < pages <= bound, (name, b, pages, bound)
        assert total_pages > 20 * bound  # a read-around window would be seen


@pytest.mark.parametrize("name", ["memmap_v1", "binidx"])
def test_a_cold_read_asks_for_every_range_before_any_is_touched(name: str, packed) -> None:
    """The loss mask and the starts live in other files: a cold read advises them too, at
    once, so their pages arrive although nothing touched them yet."""
    _, _, root = packed
    reader = open_shard(shard_of(root, name))
    reader.read_bin(0)
    files = sorted(Path(reader.path).iterdir())
    mask_file = next(f for f in files if f.name.startswith("loss_mask"))
    assert drop_until_cold(files) == 0
    packed_bin = reader.read_bin(reader.num_bins // 3)  # views: nothing touched
    assert resident_once(mask_file, 1) >= 1
    assert deliver(packed_bin) > 0


@pytest.mark.parametrize("name", MAPPED_FORMATS)
def test_batches_single_reads_and_scans_agree(name: str, packed) -> None:
    spool, assignment, root = packed
    expected = [b.copy() for b in iter_bins(spool, assignment)]
    reader = open_shard(shard_of(root, name))
    n = len(expected)
    asked = [3, -1, n - 2, 0, 3, np.int64(5), -n]
    batch = reader.read_bins(asked)
    assert all(bins_equal(got, expected[int(i)]) for got, i in zip(batch, asked, strict=True))
    assert all(bins_equal(got, expected[int(i)])
               for got, i in zip(reader.read_bins(np.array(asked)), asked, strict=True))
    assert reader.read_bins([]) == []
    with pytest.raises(IndexError, match=f"bin {n} out of range"):
        reader.read_bins([1, n])
    with pytest.raises(IndexError, match=f"bin {-n - 1} out of range"):
        reader.read_bin(-n - 1)
    assert drop_until_cold(data_files(open_dataset(shard_of(root, name)))) == 0
    assert all(bins_equal(a, b) for a, b in zip(reader.iter_bins(), expected, strict=True))


@pytest.mark.parametrize("name", MAPPED_FORMATS)
def test_arrays_stay_valid_after_close_and_a_forked_child_reopens(name: str, packed) -> None:
    import multiprocessing

    spool, assignment, root = packed
    expected = [b.copy() for b in iter_bins(spool, assignment)]
    dataset = open_dataset(shard_of(root, name))
    kept = dataset.read_bins(range(0, len(expected), 5))
    before = dataset.readers()
    context = multiprocessing.get_context("fork")
    queue = context.SimpleQueue()
    child = context.Process(target=_child_reads, args=(dataset, queue))
    child.start()
    reopened, digest_ok = queue.get()
    child.join(timeout=60)
    assert child.exitcode == 0 and reopened and digest_ok
    assert dataset.readers() is before  # the parent keeps its own
    dataset.close()
    del dataset, before
    gc.collect()
    assert all(bins_equal(a, expected[5 * k]) for k, a in enumerate(kept))


def _child_reads(dataset, queue) -> None:  # noqa: ANN001 - runs in a forked child
    parent = dataset._readers
    item = dataset[1]
    queue.put((dataset._readers is not parent, int(item["input_ids"].shape[0]) > 0))


def test_latency_delivers_the_bytes_it_times() -> None:
    sink = Sink(capacity=8)
    arrays = [np.arange(10, dtype=np.int32), np.ones(3, dtype=np.uint8)]
    assert sink.take(arrays) == 43
    assert sink.buffer[:40].view(np.int32).tolist() == list(range(10))
    assert sink.buffer[40:43].tolist() == [1, 1, 1]
