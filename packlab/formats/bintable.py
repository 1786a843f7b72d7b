"""Bins as slices of flat arrays: the read path every memory-mapped format shares.

``memmap_v1``, ``binidx``, ``arrow_ipc`` and ``pbin`` store a bin's tokens, loss mask and
sequence starts as runs of values in their files. Each says where, bin by bin (a
:class:`Layout`: which file, dtype and byte offset holds each column, and per bin where its
runs begin and how long they are); this module does the rest for all of them:

- :func:`map_layout` maps the files (advised for random access, :mod:`packlab.mapping`) and
  builds a :class:`BinTable`, once per process, on the first read. In RAM it keeps, per bin,
  where its tokens and mask start and stop, and every bin's *boundaries* (its
  ``seq_start_id`` followed by its ``packed_len``, int32): what ``dataset[i]`` returns as
  ``seq_boundaries`` is then a view, like the tokens and the mask, and a cold read waits for
  two ranges (tokens, mask), never a third for the starts. Memory: 4 bytes per sequence and
  about 16 per bin (40 bytes for a bin of five sequences, 0.2% of its 20 KB of tokens and
  mask at 4096 tokens).
- **The structural invariants of every bin are checked there**, vectorized, before any bin is
  returned (:func:`packlab.invariants.check_csr` without the mask: ``packed_len`` in
  ``(0, pack_size]``, ``seq_start_id`` from 0, strictly increasing, below ``packed_len``, each
  run inside its file), so a read itself checks nothing and slices safely. The content
  invariants (mask values 0/1, 0 at the last token of every sub-sequence) are proven per bin
  read by its checksum when the reader was opened with ``verify=True``
  (:class:`VerifiedTable`: the writer checked them, and a changed byte changes the checksum);
  notebook 05 measures what each costs.
- :meth:`BinTable.bin` / :meth:`BinTable.item` are the reads: three slices (views, valid after
  the reader is closed: each holds its map) and a count-down of the read advice; the dataset
  calls :meth:`~BinTable.item` directly (:mod:`packlab.dataset`).

The raw CSR floor of notebook 05 (:mod:`packlab.lab.measure.floors`) gathers the same bins from the
same :class:`Layout` with plain numpy memory maps: one description of where the bytes are,
two readers of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from packlab.bins import PackedBin, bin_checksum
from packlab.errors import FormatError, InvariantError
from packlab.formats.base import index_list
from packlab.invariants import check_csr
from packlab.mapping import (
    MappedFile,
    NoAdvice,
    ReadAdvice,
    advise,
    forget_after_fork,
    scan,
    sequential,
)

try:  # dataset[i] compiled (packlab/_views.c), built by the install when a C compiler is there
    from packlab._views import TableReader as CompiledReader
except ImportError:  # not built: the same reads as Python closures, ~0.4 µs a read slower
    CompiledReader = None

_new = tuple.__new__  # PackedBin without NamedTuple.__new__'s Python frame (hot path)
_GATHER_BINS = 1 << 16  # bins whose starts are gathered per step (a bounded temporary)


class Column(NamedTuple):
    """One column's values in a file: ``count`` values of ``dtype`` from byte ``offset``."""

    path: Path
    dtype: np.dtype
    offset: int
    count: int


class Layout(NamedTuple):
    """Where a shard's bins are, byte for byte (what a plain numpy CSR reader needs too).

    Bin ``b``: tokens ``tokens[token_start[b] : token_start[b] + packed_len[b]]``, its mask
    the same length from ``mask_start[b]`` (the same array object as ``token_start`` when the
    two columns are indexed alike), its starts ``starts[seq_start[b] : seq_start[b] +
    num_seqs[b]]``; indices count values of each column, not bytes. ``checksums``: the
    per-bin :func:`~packlab.bins.bin_checksum` the shard records (uint64), when asked for;
    ``None`` when not asked, or when the shard has none (then ``verify=True`` is refused).
    """

    tokens: Column
    mask: Column
    starts: Column
    token_start: np.ndarray
    mask_start: np.ndarray
    packed_len: np.ndarray
    seq_start: np.ndarray
    num_seqs: np.ndarray
    pack_size: int
    source: str
    checksums: np.ndarray | None = None


class TableAdvice(ReadAdvice):
    """Read advice for a table: where a bin's tokens and mask are in bytes, for the probe."""

    __slots__ = ("width", "ids_at", "mask_fd", "mask_at")

    def __init__(self, fd: int, width: int, ids_at: int, mask_fd: int, mask_at: int) -> None:
        super().__init__(fd)
        self.width = width
        self.ids_at = ids_at
        self.mask_fd = mask_fd
        self.mask_at = mask_at

    def advise_bin(self, t0: int, m0: int, n: int) -> bool:
        """The advice is due for the bin whose ``n`` tokens start at value ``t0`` and mask at
        byte ``m0``; whether it was cold (both ranges asked for).

        Cold lately (:class:`~packlab.mapping.ReadAdvice`'s credit), both ranges are asked for
        without a probe, the mask first: the device serves the two requests in turn, and with
        the tokens last the reader waits once, for them, not once for the tokens and again
        for the mask (4-5% of a cold read). Otherwise the tokens' first page is probed, and
        when cold the mask is asked for too. One method on this object, not the table's:
        a cold read runs right after the CPU caches were emptied, and every object it
        touches costs (this path: 3% of a cold read less, measured on notebook 05's shards)."""
        if self.credit > 0:
            self.credit -= 1
            self.due = 0
            advise(self.mask_fd, self.mask_at + m0, n)
            advise(self.fd, self.ids_at + self.width * t0, self.width * n)
            return True
        if self.probe(self.ids_at + self.width * t0, self.width * n):
            advise(self.mask_fd, self.mask_at + m0, n)
            return True
        return False


def index_view(values: np.ndarray) -> memoryview:
    """Per-bin positions as a memoryview (indexing it gives a Python int, the cheapest lookup
    there is), uint32 when every value fits, else int64."""
    values = np.asarray(values)
    small = values.size == 0 or (int(values.min()) >= 0 and int(values.max()) < 1 << 32)
    return memoryview(np.ascontiguousarray(values, dtype=np.uint32 if small else np.int64))


def _out_of_range(table: Any) -> Callable[[Any], Any]:
    """What a table's :meth:`~BinTable.reader` does with an index it does not serve: callers
    check indices, so this is a bug's IndexError naming the shard."""

    def refuse(b: Any) -> Any:
        raise IndexError(f"{table.source}: bin {b!r} is not in [0, {table.num_bins})")

    return refuse


class BinTable(NamedTuple):
    """One process's view of a shard whose bins are slices of flat arrays (see the module).

    Bin ``b`` is ``input_ids[start[b]:stop[b]]``, ``loss_mask`` over the same positions (a
    :class:`MaskApartTable` when the mask is indexed apart) and ``bounds[bound_at[b]:
    bound_at[b + 1]]`` (its starts, then its packed length). Indices given to the reads must
    be in ``[0, num_bins)``: callers check them.
    """

    input_ids: np.ndarray
    loss_mask: np.ndarray
    bounds: np.ndarray
    start: memoryview
    stop: memoryview
    mask_start: memoryview
    bound_at: memoryview
    advice: Any  # TableAdvice, or NoAdvice for bins in RAM
    checksums: memoryview | None
    files: tuple[MappedFile, ...]
    source: str

    def bin(self, b: int) -> PackedBin:
        """Bin ``b`` as three views (read-only for a mapped file)."""
        ids, mask, bounds, start, stop, _, bound_at, advice, _, _, _ = self
        t0 = start[b]
        t1 = stop[b]
        advice.due -= 1
        if advice.due < 0:
            self.advise(b)
        return _new(PackedBin, (ids[t0:t1], mask[t0:t1], bounds[bound_at[b]:bound_at[b + 1] - 1]))

    def item(self, b: int) -> dict[str, np.ndarray]:
        """Bin ``b`` as the dict a Megatron-Bridge packed dataset returns (three views); a
        loop of reads takes :meth:`reader` once instead."""
        return self.reader(_out_of_range(self))(b)

    def reader(self, other: Callable[[Any], dict[str, np.ndarray]], *, compiled: bool = True
               ) -> Callable[[Any], dict[str, np.ndarray]]:
        """``dataset[i]`` of this table as one callable: bin ``b`` (an ``int`` in ``[0,
        num_bins)``) as the dict :meth:`item` returns; any other index goes to ``other``.

        The compiled :class:`~packlab._views.TableReader` when it was built (and
        ``compiled``): the same views and advice, ~0.4 µs a read less (notebook 11); it
        also reads a batch (``.items``). Else a closure, its reads local variables: 0.25 µs
        a read less than a method unpacking the table."""
        fast = self.compiled_reader(other) if compiled else None
        return fast if fast is not None else self.python_reader(other)

    def python_reader(self, other: Callable[[Any], dict[str, np.ndarray]]
                      ) -> Callable[[Any], dict[str, np.ndarray]]:
        """:meth:`reader` as a Python closure (the mask indexed as the tokens)."""
        ids, mask, bounds, start, stop, _, bound_at, advice, _, _, _ = self
        n = len(start)

        def read(b: Any) -> dict[str, np.ndarray]:
            if type(b) is not int or not 0 <= b < n:
                return other(b)
            t0 = start[b]
            t1 = stop[b]
            advice.due -= 1
            if advice.due < 0:
                advice.advise_bin(t0, t0, t1 - t0)
            return {"input_ids": ids[t0:t1], "loss_mask": mask[t0:t1],
                    "seq_boundaries": bounds[bound_at[b]:bound_at[b + 1]]}

        return read

    def compiled_reader(self, other: Callable[[Any], dict[str, np.ndarray]]) -> Any:
        """:meth:`reader`, compiled (``packlab/_views.c``; None when it was not built)."""
        if CompiledReader is None:
            return None
        ids, mask, bounds, start, stop, mask_start, bound_at, advice, _, _, _ = self
        return CompiledReader(ids, mask, bounds, start, stop, mask_start, bound_at, advice,
                              other, self.advise_batch)

    def bins(self, indices: Sequence[int]) -> list[PackedBin]:
        """Many bins in one comprehension; the read advice counted (and, when due, probed)
        once for the batch (:meth:`advise_batch`)."""
        ids, mask, bounds, start, stop, _, bound_at, advice, _, _, _ = self
        advice.due -= len(indices)
        if advice.due < 0 and indices:
            self.advise_batch(indices)
        return [_new(PackedBin, (ids[(t0 := start[b]):(t1 := stop[b])], mask[t0:t1],
                                 bounds[bound_at[b]:bound_at[b + 1] - 1])) for b in indices]

    def items(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Many items in one comprehension, the advice once for the batch (:meth:`bins`)."""
        ids, mask, bounds, start, stop, _, bound_at, advice, _, _, _ = self
        advice.due -= len(indices)
        if advice.due < 0 and indices:
            self.advise_batch(indices)
        return [{"input_ids": ids[(t0 := start[b]):(t1 := stop[b])], "loss_mask": mask[t0:t1],
                 "seq_boundaries": bounds[bound_at[b]:bound_at[b + 1]]} for b in indices]

    def advise_batch(self, indices: Sequence[int]) -> None:
        """The advice is due for a batch: probe its first bin; cold, ask for every range of
        every bin of the batch at once (their reads overlap, as one bin's two ranges do)."""
        if self.advise(indices[0]):  # cold: the rest of the batch at once too
            advice = self.advice
            width, start, stop, mask_start = advice.width, self.start, self.stop, self.mask_start
            for b in indices[1:]:
                t0, n = start[b], stop[b] - start[b]
                advise(advice.fd, advice.ids_at + width * t0, width * n)
                advise(advice.mask_fd, advice.mask_at + mask_start[b], n)

    def view(self, b: int) -> PackedBin:
        """Bin ``b`` without read advice (a sequential scan has the kernel's readahead)."""
        t0, t1, m0, s0 = self.start[b], self.stop[b], self.mask_start[b], self.bound_at[b]
        return _new(PackedBin, (self.input_ids[t0:t1], self.loss_mask[m0:m0 + t1 - t0],
                                self.bounds[s0:self.bound_at[b + 1] - 1]))

    def advise(self, b: int) -> bool:
        """The read advice is due for bin ``b`` (:meth:`TableAdvice.advise_bin`): both its
        ranges asked for at once when cold (:mod:`packlab.mapping`). Whether it was cold."""
        t0 = self.start[b]
        return self.advice.advise_bin(t0, self.mask_start[b], self.stop[b] - t0)

    def packed_lengths(self) -> np.ndarray:
        return np.asarray(self.stop, dtype=np.int64) - np.asarray(self.start, dtype=np.int64)

    @property
    def num_bins(self) -> int:
        return len(self.start)

    def check(self, b: int, ids: np.ndarray, mask: np.ndarray, starts: np.ndarray) -> None:
        """What ``verify=True`` adds per bin: its checksum against the one recorded when it was
        written. That proves its content invariants too (mask values 0 or 1, 0 at the last
        token of every sub-sequence): its writer checked them (``check=False`` aside, which
        ``validate`` catches), and any changed byte changes the checksum."""
        if bin_checksum(ids, mask, starts) != self.checksums[b]:  # type: ignore[index]
            raise FormatError(f"{self.source}: bin {b}: checksum mismatch: its tokens, loss "
                              "mask or starts changed since it was written (corrupted)")


class MaskApartTable(BinTable):
    """A :class:`BinTable` whose mask is indexed apart from its tokens (``arrow_ipc``: each
    record batch's buffers sit elsewhere in the file)."""

    __slots__ = ()

    def bin(self, b: int) -> PackedBin:
        ids, mask, bounds, start, stop, mask_start, bound_at, advice, _, _, _ = self
        t0 = start[b]
        t1 = stop[b]
        advice.due -= 1
        if advice.due < 0:
            self.advise(b)
        m0 = mask_start[b]
        return _new(PackedBin, (ids[t0:t1], mask[m0:m0 + t1 - t0],
                                bounds[bound_at[b]:bound_at[b + 1] - 1]))

    def python_reader(self, other: Callable[[Any], dict[str, np.ndarray]]
                      ) -> Callable[[Any], dict[str, np.ndarray]]:
        ids, mask, bounds, start, stop, mask_start, bound_at, advice, _, _, _ = self
        n = len(start)

        def read(b: Any) -> dict[str, np.ndarray]:
            if type(b) is not int or not 0 <= b < n:
                return other(b)
            t0 = start[b]
            t1 = stop[b]
            m0 = mask_start[b]
            advice.due -= 1
            if advice.due < 0:
                advice.advise_bin(t0, m0, t1 - t0)
            return {"input_ids": ids[t0:t1], "loss_mask": mask[m0:m0 + t1 - t0],
                    "seq_boundaries": bounds[bound_at[b]:bound_at[b + 1]]}

        return read

    def bins(self, indices: Sequence[int]) -> list[PackedBin]:
        return [self.bin(b) for b in indices]

    def items(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        read = self.reader(_out_of_range(self))
        return [read(b) for b in indices]


class VerifiedTable(BinTable):
    """A :class:`BinTable` whose every read is checked (``verify=True``): see
    :meth:`BinTable.check`."""

    __slots__ = ()

    def bin(self, b: int) -> PackedBin:
        self.advice.due -= 1
        if self.advice.due < 0:
            self.advise(b)
        packed = self.view(b)
        self.check(b, *packed)
        return packed

    def compiled_reader(self, other: Callable[[Any], dict[str, np.ndarray]]) -> None:
        """None: every read of this table is checked, in Python."""
        return None

    def python_reader(self, other: Callable[[Any], dict[str, np.ndarray]]
                      ) -> Callable[[Any], dict[str, np.ndarray]]:
        """Every read checked (the checksum)."""
        bounds, bound_at, n = self.bounds, self.bound_at, len(self.start)

        def read(b: Any) -> dict[str, np.ndarray]:
            if type(b) is not int or not 0 <= b < n:
                return other(b)
            ids, mask, _ = self.bin(b)
            return {"input_ids": ids, "loss_mask": mask,
                    "seq_boundaries": bounds[bound_at[b]:bound_at[b + 1]]}

        return read

    def bins(self, indices: Sequence[int]) -> list[PackedBin]:
        return [self.bin(b) for b in indices]

    def items(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        read = self.reader(_out_of_range(self))
        return [read(b) for b in indices]


# -- building a table --------------------------------------------------------------------------
def boundaries(packed_len: np.ndarray, num_seqs: np.ndarray, starts: np.ndarray, *,
               pack_size: int, source: str, chunk: int = 1 << 13) -> tuple[np.ndarray, np.ndarray]:
    """Every bin's structure checked (:func:`check_csr` without the mask) and its boundaries:
    ``(bounds, bound_at)``, bin ``b``'s being ``bounds[bound_at[b]:bound_at[b + 1]]`` (int32,
    its starts then its packed length). ``chunk`` bins at a time, so the temporaries stay
    small whatever the shard's size (what remains is ``bounds`` and ``bound_at``)."""
    lengths = np.asarray(packed_len)
    counts = np.asarray(num_seqs, dtype=np.int64)
    n = lengths.shape[0]
    bound_at = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts + 1, out=bound_at[1:])
    bounds = np.empty(int(bound_at[-1]), dtype=np.int32)
    first_seq = 0
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        part = lengths[lo:hi].astype(np.int64)
        token_offsets = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(part, out=token_offsets[1:])
        seq_offsets = bound_at[lo:hi + 1] - bound_at[lo] - np.arange(hi - lo + 1)
        seqs = starts[first_seq:first_seq + int(seq_offsets[-1])]
        try:
            check_csr(token_offsets, seq_offsets, seqs, None, pack_size=pack_size,
                      source=source, first_bin=lo)
        except InvariantError as exc:  # on disk: a damaged shard (validate names the invariant)
            raise FormatError(f"{exc} (corrupted shard; run validate)") from None
        window = bounds[bound_at[lo]:bound_at[hi]]
        ends = bound_at[lo + 1:hi + 1] - bound_at[lo] - 1
        is_start = np.ones(window.shape[0], dtype=bool)
        is_start[ends] = False
        window[is_start] = seqs
        window[ends] = part
        first_seq += int(seq_offsets[-1])
    return bounds, bound_at


def _gather_starts(view: np.ndarray, seq_start: np.ndarray, num_seqs: np.ndarray) -> np.ndarray:
    """Every bin's starts, in bin order, into RAM (one copy when they are contiguous)."""
    first = np.asarray(seq_start, dtype=np.int64)
    counts = np.asarray(num_seqs, dtype=np.int64)
    ends = np.cumsum(counts)
    if first.size and np.array_equal(first[1:] - first[0], ends[:-1]):
        return np.array(view[int(first[0]):int(first[0] + ends[-1])], dtype=np.int32)
    out = np.empty(int(ends[-1]) if ends.size else 0, dtype=np.int32)
    for lo in range(0, first.shape[0], _GATHER_BINS):
        hi = min(lo + _GATHER_BINS, first.shape[0])
        base = int(ends[lo - 1]) if lo else 0
        where = np.arange(base, int(ends[hi - 1]), dtype=np.int64)
        where += np.repeat(first[lo:hi] - (ends[lo:hi] - counts[lo:hi]), counts[lo:hi])
        out[base:int(ends[hi - 1])] = view[where]
    return out


def _check_runs(layout: Layout) -> None:
    """Every bin's runs inside their columns (before anything is sliced)."""
    lengths = np.asarray(layout.packed_len, dtype=np.int64)
    counts = np.asarray(layout.num_seqs, dtype=np.int64)
    runs = (("tokens", layout.tokens, layout.token_start, lengths),
            ("loss mask", layout.mask, layout.mask_start, lengths),
            ("sequence starts", layout.starts, layout.seq_start, counts))
    for name, column, first, length in runs:
        first = np.asarray(first, dtype=np.int64)
        bad = (first < 0) | (length <= 0) | (first + length > column.count)
        if bad.any():
            b = int(np.argmax(bad))
            raise FormatError(f"{layout.source}: bin {b}: its {name} ({int(length[b])} values "
                              f"from {int(first[b])}) fall outside {column.path} "
                              f"({column.count} values; corrupted shard, run validate)")


def refuse_unverifiable(source: object, verify: bool, has_checksums: bool) -> None:
    """``verify=True`` on a shard that records no per-bin checksums: refused when it opens."""
    if verify and not has_checksums:
        raise FormatError(f"{source}: records no per-bin checksums (written before packlab "
                          "stored them): verify=True cannot check its bins; `packlab validate` "
                          "checks its whole files")


def map_layout(layout: Layout, *, verify: bool = False,
               mapped: dict[Path, MappedFile] | None = None) -> BinTable:
    """The files of ``layout`` mapped, its bins checked and indexed: a :class:`BinTable`
    (a :class:`VerifiedTable` with ``verify=True``). ``mapped``: files already mapped."""
    refuse_unverifiable(layout.source, verify, layout.checksums is not None)
    _check_runs(layout)
    files = dict(mapped or {})
    for column in (layout.tokens, layout.mask, layout.starts):
        if column.path not in files:
            files[column.path] = MappedFile(column.path)

    def values(column: Column) -> np.ndarray:
        return files[column.path].view(column.dtype, column.offset, column.count)

    ids, mask = values(layout.tokens), values(layout.mask)
    starts = _gather_starts(values(layout.starts), layout.seq_start, layout.num_seqs)
    bounds, bound_at = boundaries(layout.packed_len, layout.num_seqs, starts,
                                  pack_size=layout.pack_size, source=layout.source)
    token_start = np.asarray(layout.token_start, dtype=np.int64)
    start = index_view(token_start)
    same = layout.mask_start is layout.token_start
    width = np.dtype(layout.tokens.dtype).itemsize
    advice = TableAdvice(files[layout.tokens.path].fd, width, layout.tokens.offset,
                         files[layout.mask.path].fd, layout.mask.offset)
    checksums = (None if layout.checksums is None
                 else memoryview(np.ascontiguousarray(layout.checksums, dtype=np.uint64)))
    kind = VerifiedTable if verify else BinTable if same else MaskApartTable
    return kind(ids, mask, bounds, start,
                index_view(token_start + np.asarray(layout.packed_len, dtype=np.int64)),
                start if same else index_view(layout.mask_start), index_view(bound_at),
                advice, checksums, tuple(files.values()), layout.source)


def ram_table(input_ids: np.ndarray, loss_mask: np.ndarray, seq_starts: np.ndarray,
              token_offsets: np.ndarray, seq_offsets: np.ndarray, *, pack_size: int,
              source: str) -> BinTable:
    """A :class:`BinTable` over bins already in RAM (CSR arrays): the Python floor's reads."""
    lengths = np.diff(np.asarray(token_offsets, dtype=np.int64))
    bounds, bound_at = boundaries(lengths, np.diff(np.asarray(seq_offsets, dtype=np.int64)),
                                  np.asarray(seq_starts), pack_size=pack_size, source=source)
    start = index_view(np.asarray(token_offsets)[:-1])
    return BinTable(input_ids, loss_mask, bounds, start, index_view(token_offsets[1:]), start,
                    index_view(bound_at), NoAdvice(), None, (), source)


def check_checksums(table: BinTable, recorded: np.ndarray) -> None:
    """Every bin of ``table`` against its recorded checksum (``validate``); the first that
    differs is a FormatError naming the shard and the bin."""
    with sequential(*(f.map for f in table.files)):  # the table's maps are advised random
        check_bin_checksums(table.view, table.num_bins, recorded, table.source)


def check_bin_checksums(view: Callable[[int], PackedBin], count: int, recorded: np.ndarray,
                        source: str, first_bin: int = 0) -> None:
    """Bins ``view(0)..view(count - 1)`` (bins ``first_bin...`` of the shard ``source``) against
    their recorded checksums; the first that differs is a FormatError naming the bin."""
    values = np.asarray(recorded).tolist()
    if len(values) != count:
        raise FormatError(f"{source}: {len(values)} per-bin checksums for {count} bins "
                          "(corrupted)")
    for b in range(count):
        ids, mask, starts = view(b)
        if bin_checksum(ids, mask, starts) != values[b]:
            raise FormatError(f"{source}: bin {first_bin + b}: checksum mismatch: its tokens, "
                              "loss mask or starts differ from what was written (corrupted)")


# -- the reads of a reader with a table ---------------------------------------------------------
class TableReads:
    """``read_bin`` / ``read_bins`` / ``iter_bins`` / ``packed_lengths`` for a shard reader
    whose bins are a :class:`BinTable`. The reader gives its :meth:`_layout` (called once per
    process, on the first read; None when its bins cannot be views: then the ``_untabled_*``
    methods serve them), ``num_bins``, ``verify`` and ``check_index``; its ``_handles`` name
    ``_table`` (dropped when pickled)."""

    _table: BinTable | None = None
    verify: bool = False
    num_bins: int
    check_index: Any  # ShardReader.check_index

    def _layout(self) -> Layout | None:
        raise NotImplementedError

    def layout(self) -> Layout | None:
        """Where this shard's bins are, byte for byte (None when they are not slices of its
        files): what the raw CSR floor (:class:`packlab.lab.measure.floors.RawCsr`) reads."""
        return self._layout()

    def _mapped(self) -> dict[Path, MappedFile] | None:
        """Files the reader has mapped already (reused by the table)."""
        return None

    def bin_table(self) -> BinTable | None:
        """This process's table, built on first use (a forked child builds its own); None
        when the shard's bins are not slices of its files."""
        if self._table is None:
            layout = self._layout()
            if layout is None:
                return None
            self._table = map_layout(layout, verify=self.verify, mapped=self._mapped())
            forget_after_fork(self)
        return self._table

    def forget_maps(self) -> None:
        """In a forked child: map the files again on the next read (:mod:`packlab.mapping`)."""
        self._table = None

    def read_bin(self, index: int) -> PackedBin:
        table = self._table if self._table is not None else self.bin_table()
        if not 0 <= index < self.num_bins:  # the common case skips the general check
            index = self.check_index(index)
        if table is None:
            return self._untabled_bin(index)
        return table.bin(index)

    def read_bins(self, indices: Any) -> list[PackedBin]:
        """A batch in one loop (:meth:`BinTable.bins`)."""
        table = self._table if self._table is not None else self.bin_table()
        count = self.num_bins
        wanted = [i if 0 <= i < count else self.check_index(i) for i in index_list(indices)]
        if table is None:
            return self._untabled_bins(wanted)
        return table.bins(wanted)

    def iter_bins(self) -> Iterator[PackedBin]:
        """Every bin in order, with the kernel's sequential readahead while it lasts."""
        table = self.bin_table()  # a damaged shard fails here, not at the first next()
        if table is None:
            return self._untabled_iter()
        return scan(table.view, self.num_bins, tuple(f.map for f in table.files))

    def packed_lengths(self) -> np.ndarray:
        table = self.bin_table()
        return self._untabled_lengths() if table is None else table.packed_lengths()

    # -- a shard whose bins are not views (overridden where that can happen) -------------------
    def _untabled_bin(self, index: int) -> PackedBin:
        raise NotImplementedError

    def _untabled_bins(self, indices: list[int]) -> list[PackedBin]:
        return [self._untabled_bin(i) for i in indices]

    def _untabled_iter(self) -> Iterator[PackedBin]:
        return (self._untabled_bin(i) for i in range(self.num_bins))

    def _untabled_lengths(self) -> np.ndarray:
        return np.array([self._untabled_bin(i).packed_len for i in range(self.num_bins)],
                        dtype=np.int64)
