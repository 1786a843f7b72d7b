"""The one read path where a shard's data files are on object storage: bins by ranged GETs.

A format that reads in place (``READS_IN_PLACE``) describes its bins exactly as it does for
local files (:mod:`packlab.formats.read.table`: a :class:`~packlab.formats.read.table.Placement` of columns
and an index, or an :class:`~packlab.formats.read.item_table.ItemPlacement`), with one difference: a column
in a data file on object storage has that file's :class:`~packlab.storage.location.Location` as its
path, not a local ``Path``. The shard's reads, chosen once for where it is
(:class:`~packlab.formats.read.shard_reads.RangedReads`), read those columns with what is here.
Its index files were fetched once into a local cache
(:func:`packlab.storage.objects.fetch_files`: verified against the shard's record where it has one)
and are read by ``pread`` like any local file, so a DataLoader worker reads the cached copy
instead of fetching it again. This is what Megatron-core's object-storage path does (the ``.idx``
cached locally, the ``.bin`` read by ranges), except that packlab asks for exactly a bin's
bytes (Megatron-core fetches blocks of ``bin_chunk_nbytes``, 256 MiB by default).

- :class:`Window`: one data file's bytes fetched last. A read first fetches its bin's runs
  (:class:`RangedAdvice`: the tokens and the mask, one request each, or one for both when
  they are adjacent in one file; a bin that is one item: one request), then slices them out
  of the window, so a bin costs one ranged GET per file run and no other request;
- :class:`RangedColumn`: a column of such a file, sliced as a numpy array is;
- a sequential pass (``iter_bins``, convert) fetches ``SCAN_BYTES`` at a time instead
  (:func:`scanning`), as a local pass lets the kernel read ahead.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from packlab.storage.location import Location, RangedFile

SCAN_BYTES = 16 << 20  # what a sequential pass fetches per request


class Window:
    """One file on object storage read by ranges; the bytes of its last request kept, so the
    runs of one bin inside them are sliced without another request."""

    __slots__ = ("file", "at", "data", "ahead")

    def __init__(self, location: Location) -> None:
        self.file = RangedFile(location)
        self.at = 0
        self.data = b""
        self.ahead = 0  # a sequential pass: bytes to fetch per request at least

    @property
    def location(self) -> Location:
        return self.file.location

    def holds(self, offset: int, nbytes: int) -> bool:
        return self.at <= offset and offset + nbytes <= self.at + len(self.data)

    def fetch(self, offset: int, nbytes: int) -> None:
        """Bring bytes ``[offset, offset + nbytes)`` (one request, unless they are here
        already; during a pass, up to ``ahead`` bytes more, never past the end)."""
        if self.holds(offset, nbytes):
            return
        if self.ahead:
            nbytes = max(nbytes, min(self.ahead, self.file.size() - offset))
        self.data = self.file.read(offset, nbytes)
        self.at = offset

    def values(self, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        """``count`` values of ``dtype`` at byte ``offset`` (fetched if not here): a read-only
        array that keeps its bytes (valid after the window moves on)."""
        nbytes = count * dtype.itemsize
        if count == 0:
            return np.empty(0, dtype=dtype)
        self.fetch(offset, nbytes)
        return np.frombuffer(self.data, dtype=dtype, count=count, offset=offset - self.at)

    def close(self) -> None:
        self.file.close()
        self.data = b""


class RangedColumn:
    """A column of a file on object storage: ``column[a:b]`` is values ``a..b-1`` (a
    read-only array), from the window when the bin's read brought them."""

    __slots__ = ("window", "dtype", "offset", "count")

    def __init__(self, window: Window, dtype: Any, offset: int, count: int) -> None:
        self.window = window
        self.dtype = np.dtype(dtype)
        self.offset = offset
        self.count = count

    def __len__(self) -> int:
        return self.count

    def byte_range(self, first: int, count: int) -> tuple[int, int]:
        """Where values ``first..first+count-1`` are in the file: ``(offset, nbytes)``."""
        return self.offset + first * self.dtype.itemsize, count * self.dtype.itemsize

    def __getitem__(self, key: slice) -> np.ndarray:
        start, stop = int(key.start or 0), int(self.count if key.stop is None else key.stop)
        return self.window.values(self.dtype, self.offset + start * self.dtype.itemsize,
                                  stop - start)


class RangedAdvice:
    """The advice of a table whose tokens and mask are :class:`RangedColumn` s: "advising" a
    bin fetches its runs (the tokens and the mask: one request each, or one when they are
    adjacent in one file), due before every read (``due`` never counts below 0 for long)."""

    __slots__ = ("tokens", "mask", "due", "credit")

    def __init__(self, tokens: RangedColumn, mask: RangedColumn) -> None:
        self.tokens, self.mask = tokens, mask
        self.due = 0
        self.credit = 0

    def advise_bin(self, t0: int, m0: int, n: int, s0: int, s1: int) -> None:
        self.due = 0
        at, nbytes = self.tokens.byte_range(t0, n)
        mask_at, mask_bytes = self.mask.byte_range(m0, n)
        if self.mask.window is self.tokens.window and (at + nbytes == mask_at
                                                      or mask_at + mask_bytes == at):
            lo = min(at, mask_at)
            self.tokens.window.fetch(lo, nbytes + mask_bytes)
            return
        self.tokens.window.fetch(at, nbytes)
        self.mask.window.fetch(mask_at, mask_bytes)


class RangedFiles:
    """The windows of one table's files on object storage (one per file)."""

    def __init__(self) -> None:
        self.windows: dict[Location, Window] = {}

    def window(self, location: Location) -> Window:
        if location not in self.windows:
            self.windows[location] = Window(location)
        return self.windows[location]

    def close(self) -> None:
        for window in self.windows.values():
            window.close()


@contextmanager
def scanning(windows: Any) -> Iterator[None]:
    """A pass in file order over ``windows``: each request fetches ``SCAN_BYTES`` at least."""
    windows = list(windows)
    for window in windows:
        window.ahead = SCAN_BYTES
    try:
        yield
    finally:
        for window in windows:
            window.ahead = 0
