"""A shard's reads: its files as one process reads them, local or ranged, the kind chosen once.

:func:`reads_for` is the one place that asks where the shard is
(:attr:`~packlab.storage.location.Location.is_local`), as Megatron-core's ``IndexedDataset``
picks its one ``_BinReader`` (a file's or object storage's) when it initializes and never asks
again.

- :class:`LocalReads`: a local shard's files, each opened once per process and read by
  ``pread`` into arrays of their own (:func:`~packlab.storage.reads.opened`,
  :class:`~packlab.storage.reads.FileColumn`), cold pages asked for before a read
  (:class:`TableAdvice`);
- :class:`RangedReads`: a shard on object storage, its data files read where they are, one
  ranged request per run of a bin (:mod:`packlab.formats.read.ranged`).

What a format's placement names comes in two kinds, and the format says which by the method it
calls, never by testing a path's type:

- a **data** column (tokens and masks in a format's ``DATA_FILES``, an item table's items):
  :meth:`FileReads.column`, read where the shard is;
- an **index** file (lengths, offsets, sequence starts, checksums): :meth:`FileReads.values`
  and :meth:`FileReads.lookups`, always a local file read by ``pread``: the shard's own, or,
  for a shard on object storage, its copy fetched once into the local cache
  (:func:`packlab.storage.objects.fetch_files`).

Where a format checks a shard otherwise when its bins are read by ranges (whole-file
fingerprints of a data file only where reads are local: on object storage the per-bin checksums
stand), it asks :attr:`FileReads.in_place`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from packlab.formats.read.ranged import RangedAdvice, RangedColumn, RangedFiles, scanning
from packlab.storage.location import Location
from packlab.storage.reads import (
    FileColumn,
    ReadAdvice,
    ReadFile,
    advise,
    lookup,
    opened,
    sequential,
)


class Column(NamedTuple):
    """One column's values in a file: ``count`` values of ``dtype`` from byte ``offset``
    (``path``: a local file; or, for a data column of a shard on object storage, that file's
    :class:`~packlab.storage.location.Location`)."""

    path: Path | Location
    dtype: np.dtype
    offset: int
    count: int


class FileReads(ABC):
    """One process's reads of one shard's files (see the module): its local files, each opened
    once (:attr:`files`), and its data columns, read as the kind says."""

    #: data columns are read where the shard is, by ranged requests (object storage)
    in_place: ClassVar[bool]

    def __init__(self) -> None:
        self.files: dict[Any, ReadFile] = {}

    # -- local files: the shard's index, or its copy in the cache ---------------------------------
    def file(self, path: Path) -> ReadFile:
        if path not in self.files:
            self.files[path] = opened(path)
        return self.files[path]

    def values(self, path: Path, dtype: Any, offset: int, count: int) -> FileColumn:
        """``count`` values of ``dtype`` at byte ``offset`` of the local file ``path``, read
        as sliced."""
        return self.file(path).column(dtype, offset, count)

    def lookups(self, path: Path, dtype: Any, offset: int, count: int) -> Callable[[int], int]:
        """``f(b)``: value ``b`` of ``count`` values of ``dtype`` at byte ``offset`` of ``path``,
        all of them read into RAM on the first call (a shard's per-bin checksums, which
        ``verify=True`` asks for on every read and ``validate`` in one pass)."""
        column = self.values(path, dtype, offset, count)
        loaded: list[memoryview] = []

        def value(b: int) -> int:
            if not loaded:
                loaded.append(lookup(column[:]))
            return loaded[0][b]
        return value

    # -- data columns: where the shard is ------------------------------------------------------
    @abstractmethod
    def column(self, column: Column) -> Any:
        """A data column's values, sliced as a numpy array is."""

    @abstractmethod
    def advice(self, tokens: Column, mask: Column, starts: Column) -> Any:
        """The read advice of a table over these columns (``advise_bin``, ``due``)."""

    @abstractmethod
    def item_advice(self, items: Column) -> ReadAdvice | None:
        """The read advice of an item table over ``items`` (None: none needed)."""

    @contextmanager
    def sequential(self) -> Iterator[None]:
        """A pass over the shard in file order: the kernel's sequential readahead over its
        local files while it lasts."""
        with sequential(*self.files.values()):
            yield


class LocalReads(FileReads):
    """A local shard: every file read by ``pread``, cold pages advised before a read."""

    in_place = False

    def column(self, column: Column) -> FileColumn:
        return self.values(*column)

    def advice(self, tokens: Column, mask: Column, starts: Column) -> TableAdvice:
        """Cold pages of a bin's tokens, mask and starts asked for together."""
        return TableAdvice(self.file(tokens.path).fd, np.dtype(tokens.dtype).itemsize,
                           tokens.offset, self.file(mask.path).fd, mask.offset,
                           self.file(starts.path).fd, starts.offset,
                           np.dtype(starts.dtype).itemsize)

    def item_advice(self, items: Column) -> ReadAdvice:
        return ReadAdvice(self.file(items.path).fd)


class RangedReads(FileReads):
    """A shard on object storage: its data files read by ranges, each through one window
    (:class:`~packlab.formats.read.ranged.RangedFiles`); its index from the local cache."""

    in_place = True

    def __init__(self) -> None:
        super().__init__()
        self.ranged = RangedFiles()

    def column(self, column: Column) -> RangedColumn:
        return RangedColumn(self.ranged.window(column.path), *column[1:])

    def advice(self, tokens: Column, mask: Column, starts: Column) -> RangedAdvice:
        """"Advising" a bin fetches its tokens and mask (the starts are in the cache)."""
        return RangedAdvice(self.column(tokens), self.column(mask))

    def item_advice(self, items: Column) -> None:
        return None  # a read is one request of exactly its item

    @contextmanager
    def sequential(self) -> Iterator[None]:
        """A pass in file order: large ranged requests (and the local files' readahead)."""
        with scanning(self.ranged.windows.values()), super().sequential():
            yield


def reads_for(location: Location) -> FileReads:
    """New reads of the shard at ``location``: the one place the kind is chosen."""
    return LocalReads() if location.is_local else RangedReads()


class TableAdvice(ReadAdvice):
    """Read advice for a table: where its tokens, mask and sequence starts are, in bytes."""

    __slots__ = ("width", "ids_at", "mask_fd", "mask_at", "starts_fd", "starts_at",
                 "starts_width")

    def __init__(self, fd: int, width: int, ids_at: int, mask_fd: int, mask_at: int,
                 starts_fd: int, starts_at: int, starts_width: int) -> None:
        super().__init__(fd)
        self.width = width
        self.ids_at = ids_at
        self.mask_fd, self.mask_at = mask_fd, mask_at
        self.starts_fd, self.starts_at, self.starts_width = starts_fd, starts_at, starts_width

    def advise_bin(self, t0: int, m0: int, n: int, s0: int, s1: int) -> None:
        """The advice is due for the bin whose ``n`` tokens start at value ``t0``, its mask at
        value ``m0``, its starts values ``s0..s1``. Cold lately
        (:class:`~packlab.storage.reads.ReadAdvice`'s credit), all three ranges are asked for
        without a probe, the tokens last (the reader reads them first, then finds the others
        there); otherwise the tokens' first page is probed, and when cold the others are asked
        for too."""
        if self.credit > 0:
            self.credit -= 1
            self.due = 0
            self._others(m0, n, s0, s1)
            advise(self.fd, self.ids_at + self.width * t0, self.width * n)
        elif self.probe(self.ids_at + self.width * t0, self.width * n):
            self._others(m0, n, s0, s1)

    def _others(self, m0: int, n: int, s0: int, s1: int) -> None:
        advise(self.mask_fd, self.mask_at + m0, n)
        w = self.starts_width
        advise(self.starts_fd, self.starts_at + w * s0, w * (s1 - s0))
