"""Bins that are one item each: the read path of a format whose bin is one contiguous run of
values it decodes. That format is ``megatron_sft``: Megatron-Bridge's packed items of int32
words, a header, the sequence starts and the tokens with the loss-mask bit on top.

What :mod:`packlab.formats.read.table` does for bins laid out as three columns, this module does
for bins laid out as items: a format says where its items are (:class:`ItemPlacement`: the
column of every item's values end to end, an :class:`ItemIndex` giving bin ``b``'s first value
and count, read from its index file, and ``decode``, which checks what one item says about
itself and returns its :class:`~packlab.bins.PackedBin`), and :class:`ItemTable` reads, through
the shard's reads (:class:`~packlab.formats.read.shard_reads.FileReads`):

- a read is one lookup in the index, one slice of the items and the format's decode. Locally
  the slice is one ``pread`` of the whole item, asked for at once when its pages are cold
  (:class:`~packlab.storage.reads.ReadAdvice`); on object storage it is exactly one ranged GET of
  exactly the item's bytes (:mod:`packlab.formats.read.ranged`);
- an item carries its own structure (how many sequences, where they start), so it is checked
  as it is read (as Megatron-Bridge checks every row it decodes); what the index says
  (items inside the file, one after the other) is checked once per process on the first read;
- ``validate`` decodes every item and checks every invariant of every bin
  (:meth:`ItemTable.check_contents`); ``verify=True`` checks each bin read against its
  recorded checksum. Bins are arrays of their own (decoded, the starts copied).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import NamedTuple

import numpy as np

from packlab.bins import PackedBin, check_csr, check_token_ids, cumulative_offsets
from packlab.formats.read.shard_reads import Column, FileReads
from packlab.formats.read.table import (
    CHUNK,
    CONTENT_CHUNK,
    ShardTable,
    compact,
    lookup,
    refuse_unverifiable,
)

SPAN_BYTES = 64 << 20  # bytes one request (or one pread) brings while summarizing items


class ItemIndex(ABC):
    """A format's per-bin index of items, read from its index file."""

    num_bins: int

    @abstractmethod
    def runs(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """Bins ``lo..hi-1``'s items: their first values and their counts (int64 arrays)."""

    @abstractmethod
    def check(self, lo: int, hi: int, num_values: int) -> None:
        """What the index says of bins ``lo..hi-1`` against itself and a column of
        ``num_values`` values (items inside it, one after the other); a FormatError naming
        the bin."""


class ItemPlacement(NamedTuple):
    """Where a shard's items are and how one becomes a bin.

    ``decode(b, item)``: bin ``b`` from its item's values (a read-only array), every
    structural rule of the item checked (a FormatError naming the file and the bin);
    ``summarize(lo, values, firsts, counts)``: the packed length and the number of sequences
    of bins ``lo...`` whose items start at ``firsts`` (relative to ``values``), read from their
    headers only; ``checksum``: bin ``b``'s recorded checksum, or None."""

    items: Column
    index: ItemIndex
    decode: Callable[[int, np.ndarray], PackedBin]
    summarize: Callable[[int, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
    pack_size: int
    source: str
    checksum: Callable[[int], int] | None = None

    def table(self, reads: FileReads, *, verify: bool) -> ItemTable:
        return ItemTable(self, reads, verify=verify)


class ItemTable(ShardTable):
    """One process's reads of a shard laid out as :class:`ItemPlacement` says (see the module)."""

    __slots__ = ("items", "index", "firsts", "counts", "locator_bytes", "decode", "summarize",
                 "checksum", "num_bins", "pack_size", "source", "reads", "advice", "width",
                 "offset")

    def __init__(self, placement: ItemPlacement, reads: FileReads, *, verify: bool = False) -> None:
        refuse_unverifiable(placement.source, verify, placement.checksum is not None)
        self.items = reads.column(placement.items)
        self.width = np.dtype(placement.items.dtype).itemsize
        self.offset = placement.items.offset
        self.advice = reads.item_advice(placement.items)
        self.index = placement.index
        self.decode = placement.decode
        self.summarize = placement.summarize
        self.checksum = placement.checksum if verify else None
        self.num_bins = placement.index.num_bins
        self.pack_size = placement.pack_size
        self.source = placement.source
        self.reads = reads
        self.firsts, self.counts, self.locator_bytes = self._locator(len(self.items))

    def _locator(self, num_values: int) -> tuple[memoryview, memoryview, int]:
        """Every bin's item (first value, count) in RAM, its index checked on the way: a cold
        read waits for its item's pages only (8 bytes a bin where the shard's values fit 32
        bits, 12 or 16 where they do not)."""
        n = self.num_bins
        firsts, counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
        for lo in range(0, n, CHUNK):
            hi = min(lo + CHUNK, n)
            self.index.check(lo, hi, num_values)
            firsts[lo:hi], counts[lo:hi] = self.index.runs(lo, hi)
        firsts, counts = compact(firsts), compact(counts)
        return lookup(firsts), lookup(counts), firsts.nbytes + counts.nbytes

    def locate(self, b: int) -> tuple[int, int]:
        """Bin ``b``'s item: its first value and its count of values (Python ints)."""
        return self.firsts[b], self.counts[b]

    def values(self, first: int, count: int) -> np.ndarray:
        """An item's values, asked for at once: locally one ``pread``, the whole item advised
        when cold; on object storage one ranged GET of exactly its bytes."""
        if self.advice is not None:  # probes (one read in 16 once warm), advises when cold
            self.advice.first(self.offset + first * self.width, count * self.width)
        return self.items[first:first + count]

    def bin(self, b: int) -> PackedBin:
        """Bin ``b`` (in ``[0, num_bins)``: callers check), decoded from its item."""
        first, count = self.locate(b)
        packed = self.decode(b, self.values(first, count))
        if self.checksum is not None:
            self.check(b, packed)
        return packed

    def item(self, b: int) -> dict[str, np.ndarray]:
        """Bin ``b`` as the dict a Megatron-Bridge packed dataset returns."""
        return self.bin(b).item()

    def view(self, b: int) -> PackedBin:
        """Bin ``b`` without read advice or checksum (a sequential pass)."""
        first, count = self.locate(b)
        return self.decode(b, self.items[first:first + count])

    # -- what the items' headers say, without decoding them ----------------------------------
    def spans(self) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
        """``(lo, values, firsts, counts)`` per run of consecutive items (at most
        ``SPAN_BYTES`` of them, ``CHUNK`` bins): their values in one read (one ``pread``
        locally, one request on object storage), the firsts relative to it."""
        lo = 0
        while lo < self.num_bins:
            firsts, counts = self.index.runs(lo, min(lo + CHUNK, self.num_bins))
            ends = firsts + counts - firsts[0]
            take = max(1, int(np.searchsorted(ends, SPAN_BYTES // self.width, side="right")))
            firsts, counts = firsts[:take], counts[:take]
            first = int(firsts[0])
            values = self.items[first:int(firsts[-1] + counts[-1])]
            yield lo, values, firsts - first, counts
            lo += take

    def summary(self) -> tuple[np.ndarray, np.ndarray]:
        """Every bin's packed length and number of sequences (int64), from the headers."""
        lengths, seqs = [], []
        # large requests on object storage; locally each span is one large pread already
        with self.reads.sequential() if self.reads.in_place else nullcontext():
            for lo, values, firsts, counts in self.spans():
                packed_len, num_seqs = self.summarize(lo, values, firsts, counts)
                lengths.append(packed_len)
                seqs.append(num_seqs)
        if not lengths:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(lengths), np.concatenate(seqs)

    def packed_lengths(self) -> np.ndarray:
        return self.summary()[0]

    def check_contents(self, *, token_limit: int, convention: str = "packlab") -> None:
        """Every item decoded and every invariant of every bin checked (its mask's too), every
        token id in ``[0, token_limit)``, ``CONTENT_CHUNK`` bins at a time (``validate``)."""
        with self.reads.sequential():
            for lo in range(0, self.num_bins, CONTENT_CHUNK):
                bins = [self.view(b) for b in range(lo, min(lo + CONTENT_CHUNK, self.num_bins))]
                token_offsets = cumulative_offsets([p.packed_len for p in bins])
                seq_offsets = cumulative_offsets([p.num_seqs for p in bins])
                check_csr(token_offsets, seq_offsets,
                          np.concatenate([p.seq_start_id for p in bins]),
                          np.concatenate([p.loss_mask for p in bins]),
                          pack_size=self.pack_size, source=self.source, first_bin=lo,
                          convention=convention)
                check_token_ids(np.concatenate([p.input_ids for p in bins]), token_offsets,
                                token_limit=token_limit, source=self.source, first_bin=lo)
