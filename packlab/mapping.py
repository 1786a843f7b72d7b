"""Read-only memory maps that fetch from the device only the bytes a reader returns.

One module for every memory-mapped reader (``memmap_v1``, ``binidx``, ``pbin``, ``arrow_ipc``),
because two kernel defaults make a naive map slow when the page cache is cold:

- a page fault on a map with the default advice reads the device's read-around window
  (``read_ahead_kb``: 8 MB on the machine notebook 05 measured), so one cold 20 KB bin pulled
  about 1,100 pages and cost 100-250x a ``pread`` of its bytes;
- advised ``MADV_RANDOM`` a fault reads just its page, but a bin spanning five pages then
  costs five device round trips, one after the other.

So :class:`MappedFile` maps a whole file advised ``MADV_RANDOM``, and a reader announces the
byte ranges of the bin it is about to return: ``WILLNEED`` advice over a range starts all its
reads at once, so a cold bin costs about one round trip, like a ``pread`` of the same bytes
(notebook 05's probe: 336 us against 307 us for the ``pread``).

Advice costs a system call (under a microsecond over cached pages, a tenth of a warm read),
so a reader asks for it only when it pays (:class:`ReadAdvice`): after a cold read (and when
it opens) it advises every read, all of a bin's ranges at once, for 64 reads; then it checks
one read in 16 only, without waiting, whether the bin's first page is cached
(``preadv2(RWF_NOWAIT)``), so 15 warm reads in 16 cost no system call, and a cold one puts it
back to advising every read. A wrong guess costs time, never data: a page nobody advised is
read by its own fault.

Sequential passes (``iter_bins``, ``validate``) switch their maps to the kernel's sequential
readahead while they last (:func:`sequential`, :func:`scan`): a ``MADV_RANDOM`` map has none.

What it costs instead: a reader keeps its per-bin index (offsets, lengths, and every bin's
sequence starts: :mod:`packlab.formats.bintable`) in RAM, loaded with :func:`load_array` on
first read, so a cold read never waits for an index page before it knows where the bin is, and
waits for two ranges (tokens, mask), not three; and one descriptor per mapped file besides the
one Python's ``mmap`` holds (closed with the reader). A forked child (a DataLoader worker)
maps its own: :func:`forget_after_fork`.

Arrays are numpy views of the map; each holds the ``mmap`` through its ``base``, so arrays a
reader returned stay valid after it is closed or collected (the mapping goes with the last
view). Nothing here closes a map explicitly.
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import numpy as np

from packlab.errors import FormatError

WILLNEED = os.POSIX_FADV_WILLNEED
RANDOM = mmap.MADV_RANDOM
STAY = 64  # reads advised after the last cold one
SAMPLE = 16  # then one read in SAMPLE is advised, to notice cold bins again
SCAN_BYTES = 8 << 20  # window a sequential scan advises ahead
SCAN_AHEAD = 2  # windows advised ahead of the one being read
ADVISE_CHUNK = 128 << 10  # the smallest common read_ahead_kb: what one advice call surely reads
_fadvise = os.posix_fadvise
_preadv = os.preadv
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)
T = TypeVar("T")

# Bumped in every forked child: a reader (or dataset) remembers the value it opened its maps
# under and compares, so a DataLoader worker reopens its own without a getpid() system call
# per read (see also :func:`forget_after_fork`).
FORKS = [0]


class MappedFile:
    """One file mapped read-only (advised ``MADV_RANDOM`` unless ``random=False``), with a
    descriptor for read advice (``posix_fadvise``: a quarter cheaper than ``madvise``) of its
    own, advised ``POSIX_FADV_RANDOM``.

    ``view`` gives numpy views of the map. The descriptor is closed with :meth:`close` or when
    this object is collected; views keep the map (not this object) alive.
    """

    __slots__ = ("path", "map", "fd", "size", "_closer", "__weakref__")

    def __init__(self, path: str | os.PathLike[str], *, random: bool = True) -> None:
        self.path = path
        fd = self._open(path)
        try:
            self.size = os.fstat(fd).st_size
            if self.size == 0:
                raise FormatError(f"{path}: empty file (truncated shard?)")
            self.map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)  # holds its own descriptor
            if random:
                # Advice and probes go through a descriptor of their own, advised random: a
                # probe of a cold page (preadv2 RWF_NOWAIT) starts reading that page only, not a
                # readahead window around it, and the map's own readahead (a sequential scan's)
                # is left as it is.
                self.map.madvise(RANDOM)
                advice_fd = self._open(path)
                os.posix_fadvise(advice_fd, 0, 0, os.POSIX_FADV_RANDOM)
                os.close(fd)
                fd = advice_fd
        except OSError as exc:
            os.close(fd)
            raise FormatError(f"{path}: cannot map: {exc.strerror}") from None
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self._closer = weakref.finalize(self, os.close, fd)

    @staticmethod
    def _open(path: str | os.PathLike[str]) -> int:
        try:
            return os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise FormatError(f"{path}: cannot open: {exc.strerror}") from None

    def view(self, dtype: Any, offset: int, count: int) -> np.ndarray:
        """``count`` values of ``dtype`` at byte ``offset``, as a read-only numpy view; a file
        too short for them is a :class:`FormatError` naming it."""
        dtype = np.dtype(dtype)
        end = offset + count * dtype.itemsize
        if offset < 0 or count < 0 or end > self.size:
            raise FormatError(f"{self.path}: {self.size} bytes, too short for {count} values of "
                              f"{dtype} at byte {offset} (truncated or corrupted)")
        if count == 0:
            return np.empty(0, dtype=dtype)
        return np.frombuffer(self.map, dtype=dtype, count=count, offset=offset)

    def close(self) -> None:
        """Close the descriptor (views and the map stay valid)."""
        self._closer()


def load_array(path: str | os.PathLike[str], dtype: Any, offset: int, count: int) -> np.ndarray:
    """``count`` values at byte ``offset`` of a file, read into RAM in native byte order (an
    index a reader keeps in memory); a short file is a :class:`FormatError` naming it."""
    dtype = np.dtype(dtype)
    try:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            raw = f.read(count * dtype.itemsize)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    if len(raw) != count * dtype.itemsize:
        raise FormatError(f"{path}: {len(raw)} of the {count * dtype.itemsize} index bytes at "
                          f"byte {offset} (truncated)")
    return np.frombuffer(raw, dtype=dtype).astype(dtype.newbyteorder("="))


def advise(fd: int, start: int, length: int) -> None:
    """Start reading bytes ``[start, start + length)`` of the file (``POSIX_FADV_WILLNEED``).

    The kernel reads at most one readahead window (``read_ahead_kb``, or the device's optimal
    I/O size) per call and silently drops the rest, so a long range goes in ``ADVISE_CHUNK``
    pieces.
    """
    if length <= ADVISE_CHUNK:
        if length > 0:
            _fadvise(fd, start, length, WILLNEED)
        return
    for lo in range(start, start + length, ADVISE_CHUNK):
        _fadvise(fd, lo, min(ADVISE_CHUNK, start + length - lo), WILLNEED)


class ReadAdvice:
    """When one reader advises the kernel before a read: the policy of the module docstring.

    ``first(start, length)`` is called with the largest byte range of every bin about to be
    returned (in the file of ``fd``); True means "advised: advise the bin's other ranges too"
    (:func:`advise`), so all of them are read at once. Two states:

    - *cold* (``credit > 0``: the reader just opened, or a read found its bin cold within the
      last ``STAY`` reads): every read is advised at once, no question asked (two advice calls,
      each under a microsecond over cached pages);
    - *warm* (credit spent): every ``SAMPLE``-th read asks the kernel, without waiting, whether
      its first byte is cached (``preadv2`` with ``RWF_NOWAIT`` fails at once when it is not;
      the descriptor is advised random, so that read starts one page, not a window around it);
      cold: the range is advised and the state is cold again.

    ``due`` counts the reads until the next :meth:`probe` (below 0: now), so a hot path can
    keep the count itself (``advice.due -= 1; if advice.due < 0: ...``) and make no call on
    the other reads.
    """

    __slots__ = ("fd", "credit", "due", "_probe")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.credit = STAY
        self.due = 0
        self._probe = [bytearray(1)]

    def first(self, start: int, length: int) -> bool:
        self.due -= 1
        if self.due >= 0:
            return False
        return self.probe(start, length)

    def probe(self, start: int, length: int) -> bool:
        """Advise ``[start, start + length)`` when it is (or is likely) cold; whether it did.
        Sets ``due`` for the next call: the next read while cold, ``SAMPLE`` reads once warm."""
        if self.credit > 0:  # cold lately: advise without asking (the next read too)
            self.credit -= 1
            self.due = 0
            _fadvise(self.fd, start, length, WILLNEED)
            return True
        try:
            _preadv(self.fd, self._probe, start, _NOWAIT)
        except OSError:  # EAGAIN: not cached (or no RWF_NOWAIT here: advise anyway)
            _fadvise(self.fd, start, length, WILLNEED)
            self.credit = STAY
            self.due = 0
            return True
        self.due = SAMPLE - 1
        return False


class NoAdvice:
    """The advice of bins already in RAM: never due (a hot path counts ``due`` down from 2**62)."""

    __slots__ = ("due",)

    def __init__(self) -> None:
        self.due = 1 << 62


# -- forked children -----------------------------------------------------------------------------
_FORGET: weakref.WeakSet[Any] = weakref.WeakSet()


def forget_after_fork(owner: Any) -> None:
    """Call ``owner.forget_maps()`` in every forked child (a DataLoader worker), so the child
    maps and opens its own files on its first read instead of sharing the parent's descriptors.
    Costs nothing per read; ``owner`` is held weakly."""
    _FORGET.add(owner)


def _after_fork_in_child() -> None:
    FORKS[0] += 1
    for owner in list(_FORGET):
        owner.forget_maps()


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def sequential(*maps: mmap.mmap) -> Iterator[None]:
    """A pass in file order over ``maps``: the kernel's sequential readahead (``MADV_SEQUENTIAL``)
    while it lasts, ``MADV_RANDOM`` again after. Measured on a cold 90 MB shard: 2.5-3.1e8
    tokens/s, against 1.8e8 advising 4 MB windows ahead ourselves."""
    for m in maps:
        m.madvise(mmap.MADV_SEQUENTIAL)
    try:
        yield
    finally:
        for m in maps:
            m.madvise(RANDOM)


def scan(read: Callable[[int], T], count: int, maps: tuple[mmap.mmap, ...]) -> Iterator[T]:
    """``read(i)`` for ``i`` in ``0..count``, under :func:`sequential` advice over ``maps``."""
    with sequential(*maps):
        for i in range(count):
            yield read(i)
