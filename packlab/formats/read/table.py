"""Bins as runs of values in a shard's files: the one read path of the formats whose bins are.

Those are ``memmap_v1``, ``binidx``, ``arrow_ipc`` and ``pbin``; ``megatron_sft``, whose bin is
one item it decodes, reads through :mod:`packlab.formats.read.item_table`.

Read as Megatron-core's ``IndexedDataset`` reads, a few lookups and three slices a bin, except
that a slice is a ``pread`` into an array of its own, never a view of a memory map (why:
:mod:`packlab.storage.reads`). A format says where its bins are with a :class:`Placement`:

- three :class:`Column` s, the whole run of token ids, loss-mask bytes and sequence starts in
  its files (a file, a dtype, a byte offset, a count);
- a :class:`BinIndex`: for a range of bins, where their tokens, masks and starts begin and how
  long they are, as values of those columns (``runs``: numpy arrays read from the format's own
  index files).

:class:`BinTable` does the rest for every format, once per process on its first read, through
the shard's reads (:class:`~packlab.formats.read.shard_reads.FileReads`, of the kind chosen
once for where the shard is):

- **where every bin is, in RAM** (:class:`Locator`: 16 bytes a bin where the shard's offsets
  fit 32 bits, as packlab's shards do; 24 with a mask indexed apart): a cold read then waits
  for its bin's pages only, never first for a page of the index (with the index read in place,
  a cold read waited for two to three index pages, one after the other, before it knew where
  its bin was: 2.0-2.5x a ``pread`` of the same bytes);
- **the structural invariants of every bin**, vectorized over the format's index ``CHUNK``
  bins at a time (so the temporaries stay small whatever the shard's size): ``packed_len`` in
  ``(0, pack_size]``, ``seq_start_id`` from 0, strictly increasing, below ``packed_len``,
  every run inside its column. A read then checks nothing and slices safely. The content
  invariants (mask values, 0 at the last token of every sub-sequence) are proven per bin read
  by its checksum with ``verify=True``: its writer checked them, and a changed byte changes
  the checksum;
- **reads**: :meth:`BinTable.bin` (a :class:`~packlab.bins.PackedBin` of three arrays of its
  own) and :meth:`BinTable.item` (what ``dataset[i]`` returns: the arrays and the boundaries,
  the starts followed by ``packed_len``). They stay valid after the reader is closed or
  collected;
- **cold reads**: the tokens and the mask of a bin are asked for together before they are
  read (:class:`~packlab.formats.read.shard_reads.TableAdvice`, :mod:`packlab.storage.reads`).

Memory: what a table holds in anonymous memory is its :class:`Locator` (16 bytes a bin) and a
constant; a local read holds the bin it returns and nothing of the files.

On object storage the same table reads in place: its data columns are read by ranged
requests, exactly a bin's runs per read (:mod:`packlab.formats.read.ranged`), its index from a
local cache.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from packlab.bins import (
    PackedBin,
    check_bin_checksum,
    check_csr,
    check_token_ids,
    cumulative_offsets,
    seq_boundaries,
)
from packlab.errors import FormatError, InvariantError
from packlab.formats.read.shard_reads import Column, FileReads, LocalReads, reads_for
from packlab.formats.shared.base import index_list
from packlab.storage.reads import NoAdvice, compact, forget_after_fork, lookup

LOCATOR_BYTES = 24  # the most a Locator keeps a bin (16 where a shard's offsets fit 32 bits)
CHUNK = 1 << 11  # bins checked per vectorized step (its temporaries, ~100 KB, are the peak)
CONTENT_CHUNK = 256  # bins per step of validate's pass over the data (~1M tokens at 4096)
_new = tuple.__new__  # a PackedBin without NamedTuple.__new__'s Python frame (a read's path)


class Runs(NamedTuple):
    """Where bins ``lo..hi-1`` are, as values of their columns (int64 arrays): bin ``b``'s
    tokens are ``tokens[token_start[b] : token_start[b] + packed_len[b]]``, its mask as many
    from ``mask_start[b]``, its starts ``num_seqs[b]`` from ``seq_start[b]``."""

    token_start: np.ndarray
    packed_len: np.ndarray
    mask_start: np.ndarray
    seq_start: np.ndarray
    num_seqs: np.ndarray


class BinIndex(ABC):
    """A format's per-bin index, read from its index files."""

    num_bins: int

    @abstractmethod
    def runs(self, lo: int, hi: int) -> Runs:
        """Where bins ``lo..hi-1`` are; a FormatError where the format's own index disagrees
        with itself (a pointer that does not follow the lengths, say)."""


class Locator:
    """Where every bin of a table is, in RAM, read once from its :class:`BinIndex`:
    ``locate(b)`` is ``(t0, t1, m0, s0, s1)``, bin ``b``'s tokens values ``t0..t1`` of the
    tokens column, its mask ``t1 - t0`` values from ``m0``, its starts values ``s0..s1``.

    Four lookups in ``memoryview`` s (Python ints, tens of nanoseconds) of four uint32 arrays
    where the shard's values fit (16 bytes a bin), int64 where they do not; a fifth array
    only where some bin's mask is not at its tokens' positions (foreign Arrow files)."""

    __slots__ = ("tokens", "lengths", "masks", "seqs", "counts", "nbytes")

    def __init__(self, index: BinIndex, each: Callable[[int, Runs], None] | None = None) -> None:
        """Read ``index`` ``CHUNK`` bins at a time, handing each chunk to ``each(lo, runs)``
        first (the structural check)."""
        n = index.num_bins
        parts = [np.empty(n, dtype=np.int64) for _ in range(5)]
        apart = False
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            runs = index.runs(lo, hi)
            if each is not None:
                each(lo, runs)
            for part, values in zip(parts, (runs.token_start, runs.packed_len, runs.mask_start,
                                            runs.seq_start, runs.num_seqs), strict=True):
                part[lo:hi] = values
            apart = apart or not np.array_equal(runs.mask_start, runs.token_start)
        arrays = [compact(part) for part in parts]
        self.tokens, self.lengths, self.masks, self.seqs, self.counts = (
            lookup(a) for a in arrays)
        if not apart:
            self.masks = None  # the tokens' positions
            arrays[2] = arrays[2][:0]
        self.nbytes = sum(a.nbytes for a in arrays)

    def locate(self, b: int) -> tuple[int, int, int, int, int]:
        t0 = self.tokens[b]
        s0 = self.seqs[b]
        return (t0, t0 + self.lengths[b], t0 if self.masks is None else self.masks[b],
                s0, s0 + self.counts[b])


class Placement(NamedTuple):
    """Where a shard's bins are, byte for byte: its three columns and its index.

    ``checksum``: bin ``b``'s recorded :func:`~packlab.bins.bin_checksum`, for ``verify=True``
    (None when the shard records none)."""

    tokens: Column
    mask: Column
    starts: Column
    index: BinIndex
    pack_size: int
    source: str
    checksum: Callable[[int], int] | None = None

    def table(self, reads: FileReads, *, verify: bool) -> BinTable:
        """The table of this placement, read through ``reads`` (what :class:`TableReads`
        reads)."""
        return BinTable.from_placement(self, reads, verify=verify)


class ShardTable:
    """What a table and an item table do alike once they can read a bin (``bin``, with its
    checks; ``view``, without): a pass over every bin, and the checksums checked."""

    __slots__ = ()
    reads: FileReads
    num_bins: int
    checksum: Callable[[int], int] | None
    source: str

    def bin(self, b: int) -> PackedBin:
        raise NotImplementedError

    def view(self, b: int) -> PackedBin:
        raise NotImplementedError

    def scan(self) -> Iterator[PackedBin]:
        """Every bin in order, with the kernel's sequential readahead while it lasts (on
        object storage, large ranged requests)."""
        with self.reads.sequential():
            for b in range(self.num_bins):
                yield self.bin(b)

    def check(self, b: int, packed: PackedBin) -> None:
        """What ``verify=True`` adds per bin: its checksum against the one recorded when it was
        written (which proves its content invariants too, see the module)."""
        assert self.checksum is not None
        check_bin_checksum(packed, self.checksum(b), self.source, b)

    def check_checksums(self, recorded: Callable[[int], int]) -> None:
        """Every bin against its recorded checksum (``validate``), in one sequential pass."""
        with self.reads.sequential():
            check_checksums(map(self.view, range(self.num_bins)),
                            map(recorded, range(self.num_bins)), self.source)


class BinTable(ShardTable):
    """One process's reads of a shard laid out as :class:`Placement` says (see the module)."""

    __slots__ = ("tokens", "mask", "starts", "index", "locate", "advice", "checksum",
                 "num_bins", "pack_size", "source", "reads")

    def __init__(self, tokens: Any, mask: Any, starts: Any,
                 index: BinIndex, *, pack_size: int, source: str, advice: Any = None,
                 checksum: Callable[[int], int] | None = None,
                 reads: FileReads | None = None, check: bool = True) -> None:
        """A table over three flat columns (columns of the shard's files, read as sliced, or
        arrays in RAM) and their index; every bin's structure is checked here (``check=False``:
        by the caller, as ``validate`` does with :meth:`check_contents`). ``advice``: the
        reads' advice (None: bins in RAM, never advised); ``checksum``: checked on every read
        when given; ``reads``: the shard's reads the columns come from."""
        self.tokens, self.mask, self.starts = tokens, mask, starts
        self.index = index
        self.num_bins = index.num_bins
        self.pack_size = pack_size
        self.source = source
        self.advice = advice if advice is not None else NoAdvice()
        self.checksum = checksum
        self.reads = reads or LocalReads()
        self.locate = Locator(index, self._check_structure if check else None).locate

    @classmethod
    def from_placement(cls, placement: Placement, reads: FileReads, *, verify: bool = False,
                       check: bool = True) -> BinTable:
        """The table of a shard's files as ``placement`` says, read through ``reads``: its tokens
        and mask data columns, its starts an index file."""
        refuse_unverifiable(placement.source, verify, placement.checksum is not None)
        advice = reads.advice(placement.tokens, placement.mask, placement.starts)
        return cls(reads.column(placement.tokens), reads.column(placement.mask),
                   reads.values(*placement.starts), placement.index, pack_size=placement.pack_size,
                   source=placement.source, advice=advice,
                   checksum=placement.checksum if verify else None, reads=reads, check=check)

    def bin(self, b: int) -> PackedBin:
        """Bin ``b`` (in ``[0, num_bins)``: callers check): three arrays of its own (read by
        ``pread`` from local files, fetched on object storage, views of bins in RAM)."""
        t0, t1, m0, s0, s1 = self.locate(b)
        advice = self.advice
        advice.due -= 1
        if advice.due < 0:
            advice.advise_bin(t0, m0, t1 - t0, s0, s1)
        packed = _new(PackedBin, (self.tokens[t0:t1], self.mask[m0:m0 + t1 - t0],
                                  self.starts[s0:s1]))
        if self.checksum is not None:
            self.check(b, packed)
        return packed

    def item(self, b: int) -> dict[str, np.ndarray]:
        """Bin ``b`` as the dict a Megatron-Bridge packed dataset returns (``dataset[i]``):
        :meth:`bin`'s arrays, and its boundaries. Written out, not calling :meth:`bin`: this
        is the path a training step waits on."""
        t0, t1, m0, s0, s1 = self.locate(b)
        advice = self.advice
        advice.due -= 1
        if advice.due < 0:
            advice.advise_bin(t0, m0, t1 - t0, s0, s1)
        ids, mask, starts = self.tokens[t0:t1], self.mask[m0:m0 + t1 - t0], self.starts[s0:s1]
        if self.checksum is not None:
            self.check(b, _new(PackedBin, (ids, mask, starts)))
        return {"input_ids": ids, "loss_mask": mask, "seq_boundaries": seq_boundaries(starts, t1 - t0)}

    def view(self, b: int) -> PackedBin:
        """Bin ``b`` without read advice or checks (a sequential pass has the readahead)."""
        t0, t1, m0, s0, s1 = self.locate(b)
        return _new(PackedBin, (self.tokens[t0:t1], self.mask[m0:m0 + t1 - t0],
                                self.starts[s0:s1]))

    def check_contents(self, *, token_limit: int) -> None:
        """Every invariant of every bin, its mask's included, and every token id in ``[0,
        token_limit)``: ``validate``'s pass over the data, ``CONTENT_CHUNK`` bins at a time
        (an :class:`~packlab.errors.InvariantError` names the rule a bin breaks)."""
        index, source = self.index, self.source
        with self.reads.sequential():
            for lo in range(0, self.num_bins, CONTENT_CHUNK):
                hi = min(lo + CONTENT_CHUNK, self.num_bins)
                runs = index.runs(lo, hi)
                _check_runs(self, runs, lo)
                token_offsets, seq_offsets = offsets_of(runs)
                check_csr(token_offsets, seq_offsets,
                          gather(self.starts, runs.seq_start, runs.num_seqs),
                          gather(self.mask, runs.mask_start, runs.packed_len),
                          pack_size=self.pack_size, source=source, first_bin=lo)
                check_token_ids(gather(self.tokens, runs.token_start, runs.packed_len),
                                token_offsets, token_limit=token_limit, source=source,
                                first_bin=lo)

    def packed_lengths(self) -> np.ndarray:
        """Every bin's packed length (int64), from the index."""
        index = self.index
        return np.concatenate([index.runs(lo, min(lo + CHUNK, self.num_bins)).packed_len
                               for lo in range(0, self.num_bins, CHUNK)])

    def _check_structure(self, lo: int, runs: Runs) -> None:
        """Bins ``lo...``: their structure (:func:`check_csr` without the mask) and runs
        inside their columns; a FormatError names the bin."""
        _check_runs(self, runs, lo, ("sequence starts",))
        token_offsets, seq_offsets = offsets_of(runs)
        try:
            check_csr(token_offsets, seq_offsets,
                      gather(self.starts, runs.seq_start, runs.num_seqs), None,
                      pack_size=self.pack_size, source=self.source, first_bin=lo)
        except InvariantError as exc:  # on disk: a damaged shard (validate names the invariant)
            raise FormatError(f"{exc} (corrupted shard; run validate)") from None
        _check_runs(self, runs, lo, ("tokens", "loss mask"))


def check_checksums(bins: Iterable[PackedBin], recorded: Iterable[int], source: str,
                    first_bin: int = 0) -> None:
    """Bins ``first_bin...`` of ``source`` against their recorded checksums (as many); the
    first that differs is a FormatError naming the bin."""
    for b, (packed, expected) in enumerate(zip(bins, recorded, strict=True)):
        check_bin_checksum(packed, expected, source, first_bin + b)


def refuse_unverifiable(source: object, verify: bool, has_checksums: bool) -> None:
    """``verify=True`` on a shard that records no per-bin checksums: refused when it opens."""
    if verify and not has_checksums:
        raise FormatError(f"{source}: records no per-bin checksums (written before packlab "
                          "stored them): verify=True cannot check its bins; `packlab validate` "
                          "checks its whole files")


# -- checks ------------------------------------------------------------------------------------------
def offsets_of(runs: Runs) -> tuple[np.ndarray, np.ndarray]:
    """The CSR token and sequence offsets (int64, from 0) of a chunk of bins' runs."""
    token_offsets = cumulative_offsets(runs.packed_len)
    seq_offsets = cumulative_offsets(runs.num_seqs)
    return token_offsets, seq_offsets


def gather(values: np.ndarray, first: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Runs ``values[first[i] : first[i] + counts[i]]`` concatenated (one slice when they are
    contiguous, as they are in every format packlab writes)."""
    first = np.asarray(first, dtype=np.int64)
    counts = np.asarray(counts, dtype=np.int64)
    if first.size == 0:
        return values[:0]
    ends = np.cumsum(counts)
    if np.array_equal(first[1:] - first[0], ends[:-1]):
        return values[int(first[0]):int(first[0] + ends[-1])]
    return values[np.repeat(first - (ends - counts), counts) + np.arange(int(ends[-1]))]


def _check_runs(table: BinTable, runs: Runs, lo: int,
                names: tuple[str, ...] = ("sequence starts", "tokens", "loss mask")) -> None:
    """Bins ``lo...``: every run (of ``names``) of at least one value, inside its column."""
    checks = {"tokens": (table.tokens, runs.token_start, runs.packed_len),
              "loss mask": (table.mask, runs.mask_start, runs.packed_len),
              "sequence starts": (table.starts, runs.seq_start, runs.num_seqs)}
    for name in names:
        column, first, length = checks[name]
        bad = (first < 0) | (length <= 0) | (first + length > len(column))
        if bad.any():
            b = int(np.argmax(bad))
            raise FormatError(f"{table.source}: bin {lo + b}: its {name} ({int(length[b])} "
                              f"values from {int(first[b])}) fall outside its column "
                              f"({len(column)} values; corrupted shard, run validate)")


# -- indexes most formats share --------------------------------------------------------------------
class CsrIndex(BinIndex):
    """Bins whose tokens (and mask: the same positions) and starts are delimited by two CSR
    offset arrays of ``num_bins + 1`` values: ``pbin``'s trailer (read as sliced), bins in
    RAM."""

    __slots__ = ("num_bins", "token_offsets", "seq_offsets")

    def __init__(self, token_offsets: np.ndarray, seq_offsets: np.ndarray) -> None:
        self.num_bins = len(token_offsets) - 1
        self.token_offsets, self.seq_offsets = token_offsets, seq_offsets

    def runs(self, lo: int, hi: int) -> Runs:
        tok = self.token_offsets[lo:hi + 1].astype(np.int64)
        seq = self.seq_offsets[lo:hi + 1].astype(np.int64)
        return Runs(tok[:-1], np.diff(tok), tok[:-1], seq[:-1], np.diff(seq))


# -- a reader whose bins are a table ---------------------------------------------------------------
class TableReads:
    """``read_bin``, ``read_bins``, ``item_read``, ``iter_bins`` and ``packed_lengths`` of a shard
    reader whose bins are a :class:`BinTable`. The reader gives :meth:`_placement` (called once
    per process, on the first read, with the shard's reads; None when its bins are not slices
    of its files: a compressed Arrow file, a plain Modalities file; then the ``_untabled_*``
    methods serve them), ``location`` (where the shard is: it picks the kind of its reads,
    :func:`~packlab.formats.read.shard_reads.reads_for`), ``num_bins``, ``verify`` and
    ``check_index``; its ``_handles`` name ``_table`` (dropped when pickled)."""

    _table: Any = None  # a BinTable (or an ItemTable: packlab.formats.read.item_table)
    _untabled: bool = False
    verify: bool = False
    num_bins: int
    location: Any  # ShardReader.location
    check_index: Any  # ShardReader.check_index

    def _placement(self, reads: FileReads) -> Any:
        """A :class:`Placement` (or :class:`~packlab.formats.read.item_table.ItemPlacement`), or None."""
        raise NotImplementedError

    def table(self) -> Any:
        """This process's table, built on first use (a forked child builds its own); None
        when the shard's bins are not slices of its files."""
        if self._table is None and not self._untabled:
            reads = reads_for(self.location)
            placement = self._placement(reads)
            if placement is None:
                self._untabled = True
                return None
            self._table = placement.table(reads, verify=self.verify)
            forget_after_fork(self)
        return self._table

    def placement(self) -> Placement | None:
        """Where this shard's bins are (None when they are not slices of its files): what
        the raw CSR floor reads."""
        return self._placement(reads_for(self.location))

    def forget_maps(self) -> None:
        """In a forked child: open the files again on the next read (:mod:`packlab.storage.reads`)."""
        self._table = None

    def read_bin(self, index: int) -> PackedBin:
        table = self._table or self.table()
        if not 0 <= index < self.num_bins:  # the common case skips the general check
            index = self.check_index(index)
        return self._untabled_bin(index) if table is None else table.bin(index)

    def read_bins(self, indices: Any) -> list[PackedBin]:
        table = self._table or self.table()
        if table is None:  # each record batch decoded once for the batch
            return self._untabled_bins([self.check_index(i) for i in index_list(indices)])
        return [self.read_bin(i) for i in index_list(indices)]

    def item_read(self) -> Callable[[int], dict[str, np.ndarray]]:
        table = self.table()
        return table.item if table is not None else self._untabled_item

    def _untabled_item(self, index: int) -> dict[str, np.ndarray]:
        return self._untabled_bin(index).item()

    def iter_bins(self) -> Iterator[PackedBin]:
        """Every bin in order, with the kernel's sequential readahead while it lasts."""
        table = self.table()  # a damaged shard fails here, not at the first next()
        return self._untabled_iter() if table is None else table.scan()

    def packed_lengths(self) -> np.ndarray:
        table = self.table()
        return self._untabled_lengths() if table is None else table.packed_lengths()

    # -- a shard whose bins are not slices of its files (overridden where that can happen) ------
    def _untabled_bin(self, index: int) -> PackedBin:
        raise NotImplementedError

    def _untabled_bins(self, indices: list[int]) -> list[PackedBin]:
        return [self._untabled_bin(i) for i in indices]

    def _untabled_iter(self) -> Iterator[PackedBin]:
        return (self._untabled_bin(i) for i in range(self.num_bins))

    def _untabled_lengths(self) -> np.ndarray:
        return np.array([self._untabled_bin(i).packed_len for i in range(self.num_bins)],
                        dtype=np.int64)
