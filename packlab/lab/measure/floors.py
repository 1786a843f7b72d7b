"""The floors a read is judged against, measured in the same run as the read.

- the **raw CSR floor** (:class:`RawCsr`): the same bins gathered from the shard's own files
  (where its format's :class:`~packlab.formats.read.table.Placement` says they are) with plain numpy
  memory maps and the index in RAM, all three columns copied into preallocated buffers as a
  read is delivered (int64 tokens, uint8 mask, int32 boundaries), by a loop with nothing else
  in it: what the bytes cost through numpy, whatever the API;
- the **Python floor**: the same access path (``PackedDataset.__getitem__`` / ``__getitems__``,
  or a reader's ``read_bin``) over the same bins already in RAM as numpy CSR arrays
  (:class:`RamShard`, :class:`RamDataset`): what any format costs at the least through that
  path, so a format's own cost is its ratio to it;
- **memcpy** of the bytes a read returned (:class:`Memcpy`: delivered as any read is), and a
  **raw pread** of as many bytes at the bin's relative position in the largest data file
  (:class:`Pread`: readahead off; cold: the file evicted first);
- the cold floors of a **memory map** (:func:`mmap_floors`): one cold read four ways, and the
  pages each really read.

Every floor is timed in the same run as what it judges, by the one loop of
:mod:`packlab.lab.measure.timing`; :data:`FLOORS` names them (the keys and rows they report).
"""

from __future__ import annotations

import os
import time
from bisect import bisect_right
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin, cumulative_offsets
from packlab.errors import PacklabError
from packlab.formats.read.table import BinTable, CsrIndex, Placement, lookup
from packlab.lab.measure.delivery import percentiles
from packlab.lab.measure.pagecache import drop_until_cold, resident_pages
from packlab.lab.measure.reading import is_dataset, open_source, readers_of
from packlab.loading.dataset import PackedDataset

MMAP_MODES = ("pread", "mmap", "mmap_random", "mmap_random_willneed")
#: every floor, in the order tables and rows list them
FLOORS = ("raw_csr", "memcpy", "python_floor", "pread")
FLOOR_LABELS = {"raw_csr": "raw CSR numpy (same files)", "memcpy": "memcpy of the same bytes",
                "python_floor": "in-RAM Python floor", "pread": "raw pread of the same bytes"}


# -- the Python floor --------------------------------------------------------------------------
class RamShard:
    """One shard's bins held in RAM as CSR arrays (in the dtypes its reader returns);
    ``read_bin`` returns views: the cheapest reader the dataset's access path can call."""

    def __init__(self, reader: Any) -> None:
        self.path = Path(reader.path)
        self.pack_size = int(reader.pack_size)
        lengths = np.asarray(reader.packed_lengths(), dtype=np.int64)
        self.num_bins = int(lengths.shape[0])
        if self.num_bins == 0:
            raise PacklabError(f"{self.path}: no bins to hold in RAM")
        self.token_offsets = cumulative_offsets(lengths)
        self.num_tokens = int(self.token_offsets[-1])
        starts: list[np.ndarray] = []
        for b, packed in enumerate(reader.iter_bins()):
            if b == 0:
                self.input_ids = np.empty(self.num_tokens, dtype=packed.input_ids.dtype)
                self.loss_mask = np.empty(self.num_tokens, dtype=packed.loss_mask.dtype)
            lo, hi = self.token_offsets[b], self.token_offsets[b + 1]
            if hi - lo != packed.packed_len:
                raise PacklabError(f"{self.path}: bin {b} has {packed.packed_len} tokens, "
                                   f"its reader's packed_lengths say {hi - lo}")
            self.input_ids[lo:hi] = packed.input_ids
            self.loss_mask[lo:hi] = packed.loss_mask
            starts.append(np.asarray(packed.seq_start_id))
        self.seq_offsets = cumulative_offsets([s.shape[0] for s in starts])
        self.seq_start_id = np.concatenate(starts)
        self._table: BinTable | None = None

    def __len__(self) -> int:
        return self.num_bins

    def check_index(self, index: int) -> int:
        if not -self.num_bins <= index < self.num_bins:
            raise IndexError(f"{self.path} (in RAM): bin {index} out of range [0, {self.num_bins})")
        return index % self.num_bins

    def read_bin(self, index: int) -> PackedBin:
        return self.table().bin(self.check_index(index))

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        return [self.read_bin(int(i)) for i in np.asarray(indices).reshape(-1)]

    def iter_bins(self) -> Any:
        return (self.read_bin(i) for i in range(self.num_bins))

    def packed_lengths(self) -> np.ndarray:
        return np.diff(self.token_offsets)

    def table(self) -> BinTable:
        """The bins as a table in RAM: the dataset reads them as it reads a mapped shard's."""
        if self._table is None:
            self._table = BinTable(self.input_ids, self.loss_mask,
                                   self.seq_start_id.astype(np.int32),
                                   CsrIndex(self.token_offsets, self.seq_offsets),
                                   pack_size=self.pack_size, source=f"{self.path} (in RAM)")
        return self._table

    def item_read(self) -> Any:
        return self.table().item

    def close(self) -> None:
        pass


class RamDataset(PackedDataset):
    """A :class:`PackedDataset` whose readers are :class:`RamShard` copies of another's: the
    same ``locate`` / ``__getitem__`` / ``__getitems__`` code, with the bins already in RAM."""

    def __init__(self, dataset: PackedDataset) -> None:
        self._ram = [RamShard(reader) for reader in dataset.readers()]
        super().__init__(list(zip(dataset.shards, dataset.formats, strict=True)),
                         reader_options=dataset.reader_options)

    def open_reader(self, shard: int) -> RamShard:
        return self._ram[shard]


def floor_of(source: Any) -> RamDataset | RamShard:
    """The Python floor of an open source: a dataset's bins in a :class:`RamDataset`, a
    reader's in a :class:`RamShard`."""
    return RamDataset(source) if is_dataset(source) else RamShard(source)


def python_floor(path: str | os.PathLike[str], *, via: str = "dataset",
                 **reader_options: Any) -> RamDataset | RamShard:
    """The Python floor of the shards at ``path``: their bins, read once, held in RAM (to
    pass as ``floor=`` to several measurements of the same shards)."""
    source = open_source(path, via, reader_options)
    try:
        return floor_of(source)
    finally:
        source.close()


def checked_floor(path: object, source: Any, floor: Any | None) -> Any:
    """``floor`` if it holds the source's bins through the same path, else a new one."""
    if floor is None:
        return floor_of(source)
    kind = "dataset" if is_dataset(source) else "reader"
    if is_dataset(floor) != is_dataset(source):
        raise PacklabError(f"{path}: the Python floor must be read as a {kind}, as the source is")
    if len(floor) != len(source):
        raise PacklabError(f"{path}: the Python floor holds {len(floor)} bins, the {kind} "
                           f"{len(source)}")
    return floor


# -- the raw CSR floor --------------------------------------------------------------------------
class RawCsr:
    """Bins gathered straight from a shard's files: plain numpy memory maps (``np.memmap``
    viewed as ``ndarray``, default advice), positions in RAM as memoryviews, each read copying
    tokens (into int64), mask and boundaries (starts, then the packed length, as
    :class:`~packlab.lab.measure.delivery.Sink` delivers an item or a bin) into preallocated
    buffers. ``read(i)`` is
    the raw single read, ``read_batch(indices)`` a loop of them. For sources whose readers
    describe their :class:`~packlab.formats.read.table.Placement` (the memory-mapped formats);
    :func:`raw_floor` gives None for the others.
    """

    def __init__(self, placements: list[Placement]) -> None:
        self.placements = placements
        self.runs = [placement.index.runs(0, placement.index.num_bins) for placement in placements]
        longest = max(int(np.max(runs.packed_len)) for runs in self.runs)
        most = max(int(np.max(runs.num_seqs)) for runs in self.runs)
        self.ids = np.empty(longest, dtype=np.int64)
        self.mask = np.empty(longest, dtype=np.uint8)
        self.bounds = np.empty(most + 1, dtype=np.int32)
        self._shard_reads = [self._reader_of(placement, runs)
                             for placement, runs in zip(placements, self.runs, strict=True)]
        counts = [int(runs.packed_len.shape[0]) for runs in self.runs]
        self._firsts = np.concatenate(([0], np.cumsum(counts)[:-1])).tolist()
        self.read = self._shard_reads[0] if len(placements) == 1 else self._read_any

    def _read_any(self, i: int) -> None:
        shard = bisect_right(self._firsts, i) - 1
        self._shard_reads[shard](i - self._firsts[shard])

    def read_batch(self, indices: Sequence[int]) -> None:
        read = self.read
        for i in indices:
            read(i)

    def timed(self, indices: Sequence[int]) -> int:
        """Nanoseconds of reading ``indices`` (one bin: a single read, nothing else in the
        timer; several: the loop over them, one timer)."""
        if len(indices) == 1:
            i, read = indices[0], self.read
            began = time.perf_counter_ns()
            read(i)
            return time.perf_counter_ns() - began
        began = time.perf_counter_ns()
        self.read_batch(indices)
        return time.perf_counter_ns() - began

    def _reader_of(self, placement: Placement, runs: Any) -> Any:
        """The read of one shard: a closure over its maps, positions and the buffers."""
        def column(c: Any) -> np.ndarray:
            mapped = np.memmap(c.path, dtype=c.dtype, mode="r", offset=c.offset, shape=(c.count,))
            return mapped.view(np.ndarray)

        ids, mask = column(placement.tokens), column(placement.mask)
        starts = column(placement.starts)
        first = runs.token_start
        t0s, t1s = lookup(first), lookup(first + runs.packed_len)
        s0s = lookup(runs.seq_start)
        s1s = lookup(runs.seq_start + runs.num_seqs)
        out_ids, out_mask, out_bounds = self.ids, self.mask, self.bounds
        if not np.array_equal(runs.mask_start, first):  # the mask indexed apart (arrow_ipc)
            m0s = lookup(runs.mask_start)

            def read_apart(i: int) -> None:
                t0 = t0s[i]
                n = t1s[i] - t0
                s0 = s0s[i]
                k = s1s[i] - s0
                m0 = m0s[i]
                out_ids[:n] = ids[t0:t0 + n]
                out_mask[:n] = mask[m0:m0 + n]
                out_bounds[:k] = starts[s0:s0 + k]
                out_bounds[k] = n

            return read_apart

        def read(i: int) -> None:
            t0 = t0s[i]
            t1 = t1s[i]
            s0 = s0s[i]
            s1 = s1s[i]
            k = s1 - s0
            out_ids[:t1 - t0] = ids[t0:t1]
            out_mask[:t1 - t0] = mask[t0:t1]
            out_bounds[:k] = starts[s0:s1]
            out_bounds[k] = t1 - t0

        return read


def raw_floor(source: Any) -> RawCsr | None:
    """The raw CSR floor of an open source, or None when a shard's bins are not slices of its
    files (decoded, gathered from a spool or loaded whole: no placement to compare with)."""
    placements = []
    for reader in readers_of(source):
        describe = getattr(reader, "placement", None)
        placement = describe() if describe is not None else None
        if placement is None:
            return None
        placements.append(placement)
    return RawCsr(placements)


# -- memcpy and pread of the same bytes ----------------------------------------------------------
class Pread:
    """The raw ``pread`` floor: ``nbytes`` read with one system call at a bin's relative
    position in ``big`` (the shard's largest data file; ``POSIX_FADV_RANDOM``: no readahead;
    cold: ``big`` evicted until ``mincore`` finds no page first). ``worst``: the most pages found
    resident before a cold pread."""

    def __init__(self, big: Path, num_bins: int) -> None:
        self.span = big.stat().st_size
        self.big = big
        self.num_bins = num_bins
        self.worst = 0
        self.fd = os.open(big, os.O_RDONLY)
        os.posix_fadvise(self.fd, 0, 0, os.POSIX_FADV_RANDOM)  # raw: no readahead

    def time(self, index: int, nbytes: int, *, cold: bool) -> int:
        offset = index * max(self.span - nbytes, 0) // max(self.num_bins - 1, 1)
        if cold:
            self.worst = max(self.worst, drop_until_cold([self.big]))
        began = time.perf_counter_ns()
        os.pread(self.fd, nbytes, offset)
        return time.perf_counter_ns() - began

    def close(self) -> None:
        os.close(self.fd)


class Memcpy:
    """The memcpy floor: a 'read' that returns ``nbytes`` of one preallocated array, so
    delivering it (the same delivery as any read:
    :meth:`~packlab.lab.measure.delivery.Sink.timed_arrays`) is one copy of as many bytes as
    the bin holds."""

    def __init__(self, max_bytes: int) -> None:
        self.source = np.ones(max(int(max_bytes), 1), dtype=np.uint8)

    def read(self, nbytes: int) -> tuple[np.ndarray]:
        return (self.source[:nbytes],)


# -- the cold floors of a memory map ----------------------------------------------------------
def read_ahead_kb(path: str | os.PathLike[str]) -> int | None:
    """The read-ahead window (KB) of the block device holding ``path``, if sysfs tells."""
    dev = os.stat(path).st_dev
    base = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    for queue in (base / "queue", base.parent / "queue", base / ".." / "queue"):
        try:
            return int((queue / "read_ahead_kb").read_text())
        except (OSError, ValueError):
            continue
    return None


def mmap_floors(
    path: str | os.PathLike[str],
    *,
    nbytes: int,
    samples: int = 30,
    seed: int = 0,
) -> dict[str, Any]:
    """Cold reads of ``nbytes`` at random page-aligned offsets of one file, four ways.

    ``pread``: one system call. ``mmap``: a copy out of a read-only map with the default
    advice (a fault reads the device's read-around window, however few bytes are wanted).
    ``mmap_random``: the map advised ``MADV_RANDOM`` (one page per fault). ``mmap_random_willneed``:
    also ``MADV_WILLNEED`` over the wanted range first (one read for the range), inside the
    timer. The file is evicted until ``mincore`` finds no page before every read; the pages a
    read left resident are counted (``<mode>_pages``: what it really read).
    """
    import mmap as mmap_module

    size = os.path.getsize(path)
    page = mmap_module.PAGESIZE
    if nbytes <= 0 or size < nbytes + page:
        raise PacklabError(f"{path}: {size} bytes, too small for reads of {nbytes}")
    rng = np.random.default_rng(seed)
    offsets = (rng.integers(0, size - nbytes, size=samples) // page * page).tolist()
    span = -(-nbytes // page) * page
    ns = {mode: np.zeros(samples, dtype=np.int64) for mode in MMAP_MODES}
    pages = {mode: np.zeros(samples, dtype=np.int64) for mode in MMAP_MODES}
    dst = np.empty(nbytes, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    mapped = mmap_module.mmap(fd, 0, prot=mmap_module.PROT_READ)
    view = np.frombuffer(mapped, dtype=np.uint8)
    try:
        for k, off in enumerate(offsets):
            for mode in MMAP_MODES:
                advice = mmap_module.MADV_NORMAL if mode == "mmap" else mmap_module.MADV_RANDOM
                mapped.madvise(advice)
                drop_until_cold([Path(path)])
                began = time.perf_counter_ns()
                if mode == "pread":
                    os.pread(fd, nbytes, off)
                else:
                    if mode == "mmap_random_willneed":
                        mapped.madvise(mmap_module.MADV_WILLNEED, off, min(span, size - off))
                    np.copyto(dst, view[off:off + nbytes])
                ns[mode][k] = time.perf_counter_ns() - began
                pages[mode][k] = resident_pages(path)[0]
    finally:
        del view
        mapped.close()
        os.close(fd)
    out: dict[str, Any] = {"path": str(path), "nbytes": nbytes, "samples": samples,
                           "read_ahead_kb": read_ahead_kb(path)}
    for mode in MMAP_MODES:
        out.update(percentiles(ns[mode], f"{mode}_"))
        out[f"{mode}_pages"] = float(np.median(pages[mode]))
    return out
