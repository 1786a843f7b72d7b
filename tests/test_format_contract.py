"""The format contract, held once and run over every registered format.

Whatever a format is on disk, its writer and reader keep the promises of
:mod:`packlab.formats.shared.base`: bins read back exactly as written; a writer killed mid-shard leaves
nothing under the final name; writer memory does not grow with the shard (unless the format's
facts say it holds everything); bins out of order or too few are refused; a forked DataLoader
worker, a pickled reader and arrays kept after ``close`` all see the same bins; a truncated file
is a :class:`~packlab.errors.FormatError` naming it, never a numpy or pyarrow traceback or a
crash. Each case decides by the format's facts (``get_format(name).Reader.X``), never its name,
so a new format is tested by adding its module and its registry line.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import (
    Child,
    digests,
    open_format_writer,
    shard_files_of,
    shard_path,
    write_format_shard,
    write_random_spool,
)

from packlab.bins import PackedBin, bins_equal
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.formats import detect_format, format_names, get_format
from packlab.lab.measure.harness import run_job
from packlab.lab.measure.jobs import format_imports
from packlab.lab.measure.workload import Workload, make_workload
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_shard
from packlab.spool import SpoolReader
from packlab.storage.files import is_temporary

FORMATS = format_names()
MiB = 1 << 20
PACK_SIZE = 1024


def assert_same_bins(reader: object, bins: list) -> None:
    """``reader`` returns exactly ``bins`` (tokens in whatever integer dtype the format stores;
    masks uint8, starts int32)."""
    assert len(reader) == len(bins)  # type: ignore[arg-type]
    for i, expected in enumerate(bins):
        got = reader.read_bin(i)  # type: ignore[attr-defined]
        assert bins_equal(got, expected), i
        assert got.input_ids.dtype.kind in "iu" and got.loss_mask.dtype == np.uint8, got
        assert got.seq_start_id.dtype == np.int32, got
        assert all(type(a) is np.ndarray for a in got), got  # not np.memmap, not Arrow


def facts(name: str) -> type:
    """The format's facts (its Reader class: the Writer shares them)."""
    return get_format(name).Reader


class Case:
    """A real spool, its packing, and the bins every shard of it must hold."""

    def __init__(self, root: Path, *, num_sequences: int = 200, seed: int = 0) -> None:
        self.root = root
        self.spool = write_random_spool(root / "spool", num_sequences=num_sequences, seed=seed)
        self.assignment, _ = pack(self.spool.lengths, PACK_SIZE, algorithm="next_fit", seed=seed)
        self.bins = list(iter_bins(self.spool, self.assignment, copy=True))
        self.out = root / "out"

    def path(self, name: str, stem: str = "shard") -> Path:
        return shard_path(self.out, name, stem)

    def write(self, name: str, stem: str = "shard", *, announce: bool = True) -> Path:
        return write_format_shard(name, self.path(name, stem), self.spool, self.assignment,
                                  announce=announce)

    def writer(self, name: str, stem: str = "shard", **options: object) -> object:
        return open_format_writer(name, self.path(name, stem), self.spool, self.assignment,
                                  **options)


@pytest.fixture
def case(tmp_path: Path) -> Case:
    return Case(tmp_path)


# -- a workload larger than any cache: 2048-token bins, up to 40,000 of them (320 MiB raw) ------
# Its size is the writer-memory contract's: a writer holds less than half of what it writes
# (below), and Parquet's writer, which buffers a row group of bins, holds about 110 MiB
# whatever it writes: more than half of 20,000 bins (160 MiB), less than half of 40,000. A
# writer of one bin at a time is measured on its first 20,000.
@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Workload]:
    root = tmp_path_factory.mktemp("workload")
    yield make_workload(root, 40_000, pack_size=2048)
    shutil.rmtree(root)  # half a gigabyte of spool


def workload_shard(name: str, work: Workload, num_bins: int, root: Path) -> tuple[Any, list[str]]:
    """A shard of the first ``num_bins`` bins of the workload, its reader and its bins' digests."""
    spool = SpoolReader(work.spool)
    assignment = BinAssignment.load(work.prefix(num_bins))
    path = write_format_shard(name, shard_path(root, name), spool, assignment)
    return open_shard(path), digests(iter_bins(spool, assignment))


# -- round trip -------------------------------------------------------------------------------
@pytest.mark.parametrize("announce", [True, False], ids=["announced", "unannounced"])
@pytest.mark.parametrize("name", FORMATS)
def test_round_trip_bin_for_bin(name: str, announce: bool, case: Case) -> None:
    path = case.write(name, announce=announce)
    bins = case.bins
    assert detect_format(path) == name
    reader = open_shard(path)
    assert isinstance(reader, get_format(name).Reader)
    assert len(reader) == reader.num_bins == len(bins)
    assert reader.num_tokens == sum(b.packed_len for b in bins)
    # a format that does not store pack_size infers the longest bin
    assert max(b.packed_len for b in bins) <= reader.pack_size <= PACK_SIZE
    assert_same_bins(reader, bins)
    order = np.random.default_rng(0).integers(-len(bins), len(bins), size=3 * len(bins))
    got = reader.read_bins(order)
    assert all(bins_equal(g, bins[i]) for g, i in zip(got, order, strict=True))
    assert all(bins_equal(g, b) for g, b in zip(reader.iter_bins(), bins, strict=True))
    assert reader.packed_lengths().tolist() == [b.packed_len for b in bins]
    summary = reader.validate()
    assert (summary["num_bins"], summary["num_tokens"]) == (len(bins), reader.num_tokens)
    for i in (-1, -len(bins)):
        assert bins_equal(reader.read_bin(i), bins[i])
    for wrong in (len(bins), -len(bins) - 1):
        with pytest.raises(IndexError, match=path.name):
            reader.read_bin(wrong)
    with pytest.raises(IndexError, match=path.name):
        reader.read_bins([0, len(bins)])
    # nothing else left: the shard only (a one-file shard's companions beside it)
    assert sorted(case.out.iterdir()) == sorted(
        [path] if facts(name).is_directory() else shard_files_of(name, path))


# -- a writer killed mid-shard ----------------------------------------------------------------
def _write_and_hang(name: str, path: Path, spool: SpoolReader, assignment: BinAssignment,
                    phase: str, ready: object) -> None:
    """Write bins, then wait to be killed: halfway through (``writing``), or with every byte
    written under the temporary name, at the rename that would publish it (``publishing``)."""
    def hang() -> None:
        ready.send(phase)  # type: ignore[attr-defined]
        while True:
            time.sleep(1)

    writer = open_format_writer(name, path, spool, assignment)
    writer._publish = hang  # the one step finalize takes after the temporary is complete
    for b, packed in enumerate(iter_bins(spool, assignment)):
        if phase == "writing" and b == assignment.num_bins // 2:
            hang()
        writer.write(packed)
    writer.finalize()


@pytest.mark.parametrize("phase", ["writing", "publishing"])
@pytest.mark.parametrize("name", FORMATS)
def test_a_writer_killed_mid_shard_leaves_nothing_and_a_rerun_completes(
        name: str, phase: str, case: Case) -> None:
    final = case.path(name)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_write_and_hang,
                            args=(name, final, case.spool, case.assignment, phase, send))
    child.start()
    try:
        assert receive.poll(120) and receive.recv() == phase
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join(timeout=60)
    assert child.exitcode == -signal.SIGKILL
    assert not final.exists() and not final.is_symlink()
    leftovers = list(case.out.iterdir())
    assert all(is_temporary(p) for p in leftovers), leftovers
    if phase == "publishing":  # killed with the whole shard written, under a temporary name
        (leftover,) = leftovers
        assert facts(name)(leftover).validate()["num_bins"] == len(case.bins)
    else:
        # a writer works on disk under a temporary name, unless it holds everything until the end
        assert bool(leftovers) != facts(name).IN_RAM, leftovers
        for leftover in leftovers:  # and nothing unfinished opens as a shard
            with pytest.raises(FormatError, match=leftover.name):
                facts(name)(leftover).validate()
    case.write(name)
    reader = open_shard(final)
    assert digests(reader.iter_bins()) == digests(case.bins)
    assert reader.validate()["num_bins"] == len(case.bins)


# -- writer memory, measured in a fresh process ----------------------------------------------
def write_growth(name: str, work: Workload, num_bins: int, out: Path) -> dict:
    """The write phase's own peak RSS growth and Arrow pool peak, and the raw bytes written
    (int32 tokens and uint8 masks); the shard is removed afterwards."""
    report = run_job("packlab.lab.measure.jobs:write_shard", name, work.spool, work.prefix(num_bins),
                     out, {}, imports=format_imports(name))
    phase = report["phases"]["write"]
    reader = open_shard(out)
    assert reader.num_bins == num_bins
    raw = 5 * reader.num_tokens
    del reader
    for file in shard_files_of(name, out):
        file.unlink()
    return {"rss": phase["peak_rss_phase_growth_bytes"], "raw": raw,
            "pool": phase.get("arrow_pool_peak_bytes", 0)}


@pytest.mark.parametrize("name", FORMATS)
def test_writer_memory_is_flat_as_the_shard_grows_unless_the_format_holds_everything(
        name: str, workload: Workload, tmp_path: Path) -> None:
    holds_everything = facts(name).IN_RAM
    small_bins, large_bins = (400, 4_000) if holds_everything else (
        (4_000, 40_000) if facts(name).BUFFERED_BINS > 1 else (2_000, 20_000))
    small = write_growth(name, workload, small_bins, shard_path(tmp_path, name, "small"))
    large = write_growth(name, workload, large_bins, shard_path(tmp_path, name, "large"))
    print(f"{name} writer peak RSS growth: {small['rss'] / MiB:.1f} MiB for "
          f"{small['raw'] / MiB:.0f} MiB of bins, {large['rss'] / MiB:.1f} MiB for "
          f"{large['raw'] / MiB:.0f} MiB; Arrow pool {small['pool'] / MiB:.1f} / "
          f"{large['pool'] / MiB:.1f} MiB")
    assert large["raw"] > 9 * small["raw"]
    added = large["rss"] - small["rss"]
    if holds_everything:
        assert large["rss"] > large["raw"]  # every bin is in memory before the file is written
        assert added > 0.9 * (large["raw"] - small["raw"])
        assert 5 < large["rss"] / small["rss"] < 15  # ten times the bins: about ten times
    else:
        # ten times the data, the same memory: allocator noise and at most 1/20 of the added
        # bytes (a writer that kept only its loss masks, 1/5, fails)
        assert added < 16 * MiB + (large["raw"] - small["raw"]) / 20, (small, large)
        # and less than half of what it wrote: flat growth alone passes a writer whose constant
        # is as large as the data. The formats that buffer bins hold the largest constants
        # (Parquet: a row group being encoded and the Arrow pool, about 110 MiB here; Arrow
        # IPC: a record batch, about 37 MiB), so they are the binding case, and their workload
        # is sized for them (40,000 bins, 320 MiB). A writer of one bin at a time is measured
        # at 20,000 (160 MiB): ten times the bins still, and a writer that kept its loss masks
        # (29 MiB added) is still over the first bound (23 MiB) and one that kept its bins over
        # this one
        assert large["rss"] < large["raw"] / 2, (large, small)
        assert large["pool"] < small["pool"] + 8 * MiB
        # and bounded by the bins it holds (one row group, one record batch, one bin: its
        # facts say how many) times what its encoder needs, plus a constant
        block = facts(name).BUFFERED_BINS * workload.pack_size * 5
        assert large["rss"] < 48 * MiB + 10 * block, (large, block)


# -- bins refused -----------------------------------------------------------------------------
@pytest.mark.parametrize("name", FORMATS)
def test_bins_out_of_order_too_few_or_invalid_are_refused_and_publish_nothing(
        name: str, case: Case) -> None:
    bins = case.bins
    with pytest.raises(PacklabError, match="bin 2 written out of order"), \
            case.writer(name, "a") as w:
        w.write_bin(0, *bins[0])
        w.write_bin(2, *bins[2])
    with pytest.raises(PacklabError, match="bin 1 written out of order"), \
            case.writer(name, "b") as w:
        w.write_bin(1, *bins[1])
    with pytest.raises(PacklabError, match="only 3 of 5"), case.writer(name, "c", num_bins=5) as w:
        for packed in bins[:3]:
            w.write(packed)
    with pytest.raises(PacklabError, match="beyond the announced 2"), \
            case.writer(name, "d", num_bins=2) as w:
        for packed in bins[:3]:
            w.write(packed)
    leaking = bins[0].copy()
    leaking.loss_mask[-1] = 1  # loss across the end of the last sub-sequence
    with pytest.raises(InvariantError, match="bin 0: loss_mask is 1"), case.writer(name, "e") as w:
        w.write(leaking)
    first, second = bins[0], bins[1]
    overlong = PackedBin(np.concatenate([first.input_ids, second.input_ids]),
                         np.concatenate([first.loss_mask, second.loss_mask]),
                         np.concatenate([first.seq_start_id, second.seq_start_id
                                         + first.packed_len]).astype(np.int32))
    assert overlong.packed_len > PACK_SIZE
    with pytest.raises(InvariantError, match="bin 0: packed_len"), case.writer(name, "f") as w:
        w.write(overlong)
    with pytest.raises(RuntimeError, match="crash"), case.writer(name, "g") as w:
        w.write(bins[0])
        raise RuntimeError("crash")
    with pytest.raises(PacklabError, match="no bins written"), \
            case.writer(name, "h", num_bins=None) as w:
        pass
    assert list(case.out.iterdir()) == []  # no shard, no temporary left behind


# -- readers in other processes, pickled, closed ----------------------------------------------
def _read_as_a_worker(reader: object) -> tuple[list[str], list[str], bool | None]:
    """Every bin, one by one and as a reversed batch, through the parent's reader; and, for a
    reader that remembers which process opened its handles, whether this one reopened them."""
    one_by_one = digests(reader.read_bin(i) for i in range(len(reader)))  # type: ignore[arg-type]
    batch = digests(reader.read_bins(np.arange(len(reader))[::-1]))  # type: ignore[arg-type]
    opener = getattr(reader, "_pid", None)
    return one_by_one, batch[::-1], None if opener is None else opener == os.getpid()


@pytest.mark.parametrize("name", FORMATS)
def test_a_forked_worker_reads_the_same_bins(name: str, workload: Workload, tmp_path: Path) -> None:
    """DataLoader workers fork after the parent has read (handles open, a cache filled): two
    workers and the parent read at the same time, and all see the shard's bins. The shard is
    larger than what the parent decoded, so the workers read the file, not only its cache."""
    reader, expected = workload_shard(name, workload, 3_000, tmp_path)
    assert digests([reader.read_bin(0)]) == expected[:1]
    workers = [Child(_read_as_a_worker, reader) for _ in range(2)]
    assert digests(reader.read_bins(np.arange(len(reader))[::-1]))[::-1] == expected
    for worker in workers:
        one_by_one, batch, reopened = worker.result()
        assert one_by_one == batch == expected
        assert reopened in (True, None)
    assert digests(reader.iter_bins()) == expected


@pytest.mark.parametrize("name", FORMATS)
def test_a_pickled_reader_is_small_and_reads_the_same_bins(name: str, tmp_path: Path) -> None:
    """A reader is pickled to every DataLoader worker: paths and metadata only, never its maps,
    handles, caches or decoded bins, however much it has read and however large the shard."""
    blobs = []
    for scale, num_sequences in (("small", 20), ("large", 400)):
        case = Case(tmp_path / scale, num_sequences=num_sequences)
        reader = open_shard(case.write(name))
        reader.read_bins(range(len(reader)))  # every map opened, every cache filled
        reader.packed_lengths()
        blob = pickle.dumps(reader)
        clone = pickle.loads(blob)
        assert all(getattr(clone, handle) is None for handle in clone._handles())
        assert_same_bins(clone, case.bins)
        blobs.append(len(blob))
        assert len(blob) < 4096, len(blob)
    # 20 times the sequences: the same pickle (paths, counts and checksums differ in digits)
    assert blobs[1] < blobs[0] + 256, blobs


def _kept_after_close(name: str, path: Path) -> dict:
    reader = get_format(name).Reader(path)
    single = [reader.read_bin(i) for i in range(len(reader))]
    batch = reader.read_bins(range(len(reader)))
    reader.close()
    del reader
    gc.collect()
    noise = np.ones(64 * MiB, dtype=np.uint8)  # reuse what a released buffer held
    del noise
    return {"single": digests(single), "batch": digests(batch),
            "sums": [int(b.input_ids.astype(np.int64).sum()) for b in single],
            "writeable": sorted({b.input_ids.flags.writeable for b in single + batch})}


@pytest.mark.parametrize("name", FORMATS)
def test_arrays_stay_valid_after_the_reader_is_closed_and_collected(name: str,
                                                                    case: Case) -> None:
    """In a child: an unmapped buffer would crash the process, not just fail an assert."""
    kept = Child(_kept_after_close, name, case.write(name)).result()
    assert kept["single"] == kept["batch"] == digests(case.bins)
    assert kept["sums"] == [int(b.input_ids.astype(np.int64).sum()) for b in case.bins]
    # arrays of their own, never views of a map (a bin's read maps no page of the file)
    assert kept["writeable"] == [True]


@pytest.mark.parametrize("name", FORMATS)
def test_a_kept_bin_costs_its_bytes_and_reading_holds_no_page_of_the_file(
        name: str, workload: Workload, tmp_path: Path) -> None:
    """Keeping every bin costs about the bins' bytes in anonymous memory (arrays of their own,
    read by ``pread`` or decoded) and the reads leave no page of the shard's files in the
    process's resident set: on a kernel that maps a whole large folio (up to 2 MB) per page
    fault, reads through a map held ~90 KB of file-backed memory per 20 KB bin."""
    reader, _ = workload_shard(name, workload, 4_000, tmp_path)
    report = run_job("conftest:read_every_bin_and_keep", reader.path, imports=format_imports(name))
    read = report["phases"]["read"]
    raw = 5 * report["result"]["num_tokens"]
    print(f"{name}: keeping every bin ({raw / MiB:.0f} MiB of tokens and masks) grew anonymous "
          f"memory by {read['peak_anon_phase_growth_bytes'] / MiB:.1f} MiB, file-backed by "
          f"{read['peak_file_growth_bytes'] / MiB:.1f} MiB")
    assert 0.8 * raw < read["peak_anon_phase_growth_bytes"]
    assert read["peak_file_growth_bytes"] < raw / 8


# -- truncation -------------------------------------------------------------------------------
def _read_then_validate(name: str, path: Path) -> list[tuple]:
    """Open and read every bin, then open and validate, each with a fresh reader: what each
    raised (one child for both: a bad offset into a map would crash it, a failure either way)."""
    outcomes: list[tuple] = []
    for validate in (False, True):
        try:
            reader = get_format(name).Reader(path)
            if validate:
                reader.validate()
            else:
                reader.read_bins(range(len(reader)))
                for i in range(len(reader)):
                    reader.read_bin(i)
            outcomes.append(("returned", validate))
        except Exception as exc:  # noqa: BLE001 - the test judges what was raised
            outcomes.append(("raised", type(exc).__name__, str(exc), isinstance(exc, FormatError)))
    return outcomes


@pytest.mark.parametrize("keep", [0, 3, 7, 100, 0.5, -8, -2])
@pytest.mark.parametrize("name", FORMATS)
def test_a_truncated_file_is_a_format_error_naming_it(name: str, keep: float,
                                                      case: Case) -> None:
    """Every file of the shard, cut: opening and reading every bin, and ``validate``, each
    raise a FormatError naming the file (in a child: a bad offset into a map could crash)."""
    path = case.write(name)
    for file in shard_files_of(name, path):
        original = file.read_bytes()
        cut = int(len(original) * keep) if isinstance(keep, float) else keep % len(original)
        file.write_bytes(original[:cut])
        for validate, outcome in zip((False, True), Child(_read_then_validate, name, path
                                                          ).result(), strict=True):
            assert outcome[0] == "raised" and outcome[3], (file.name, cut, validate, outcome)
            assert str(file) in outcome[2], (file.name, outcome)
        file.write_bytes(original)
    assert open_shard(path).validate()["num_bins"] == len(case.bins)


def test_every_format_is_under_contract() -> None:
    """The seven formats are registered (and so run through every case above), each a Writer
    and a Reader sharing its facts."""
    assert {"memmap_v1", "binidx", "packed_index", "parquet", "arrow_ipc", "pbin",
            "legacy_npy_pickle"} <= set(FORMATS)
    for name in FORMATS:
        module = get_format(name)
        assert module.Writer.FORMAT == module.Reader.FORMAT == name
        for fact in ("SUFFIX", "RECORD", "FILES", "NEEDS_SPOOL", "IN_RAM", "RAW_RUNS",
                     "STREAMS", "READS_IN_PLACE", "SQL_READABLE", "BUFFERED_BINS"):
            assert getattr(module.Writer, fact) == getattr(module.Reader, fact), (name, fact)

