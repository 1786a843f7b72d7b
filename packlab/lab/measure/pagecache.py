"""The page cache, seen and emptied: ``mincore`` residency and ``posix_fadvise`` eviction.

A "cold" figure is only honest when the pages are really gone. ``posix_fadvise(DONTNEED)``
cannot evict a page that some process still has mapped, and a memory-mapped reader keeps
every page it touched mapped; so :func:`drop_cache` first releases this process's own
read-only mappings of the file (``madvise(MADV_DONTNEED)``: the mapping stays valid, the next
access faults the page back in from the file), then evicts, then counts what is left with
``mincore``. Pages another process keeps mapped stay resident and are reported, never hidden.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from packlab.errors import PacklabError
from packlab.formats import files_of_shard
from packlab.storage.location import as_location

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def shard_files(path: str | os.PathLike[str]) -> list[Path]:
    """Every regular file of a shard (a file and its companions, a Megatron pair's ``.bin``
    and sidecar; or all files under a directory shard)."""
    p = Path(path)
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file())
    if p.is_file():
        return [Path(f.path) for f in files_of_shard(as_location(p))]
    raise PacklabError(f"{p}: no such file or directory")


def resident_pages(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(resident, total)`` pages of one file in the page cache, by ``mincore``."""
    resident = resident_map(path)
    return int(resident.sum()), int(resident.shape[0])


def resident_once(path: str | os.PathLike[str], at_least: int, *, timeout: float = 10.0) -> int:
    """The resident pages of one file once there are ``at_least`` (or when ``timeout`` seconds
    have passed): readahead and advised reads are asynchronous, and on a loaded machine the
    pages they asked for land later than on a quiet one."""
    deadline = time.monotonic() + timeout
    while (pages := resident_pages(path)[0]) < at_least and time.monotonic() < deadline:
        time.sleep(0.005)
    return pages


def resident_map(path: str | os.PathLike[str]) -> np.ndarray:
    """Which pages of one file are in the page cache (one bool per page), by ``mincore``."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return np.zeros(0, dtype=bool)
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, _MAP_FAILED):
            raise PacklabError(f"{path}: mmap for mincore failed: {os.strerror(ctypes.get_errno())}")
        try:
            pages = (size + PAGE - 1) // PAGE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise PacklabError(f"{path}: mincore failed: {os.strerror(ctypes.get_errno())}")
            return (np.frombuffer(vec, dtype=np.uint8) & 1).astype(bool)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def mapping_ranges(*paths: str | os.PathLike[str]) -> list[tuple[int, int]]:
    """``(start, length)`` of this process's read-only mappings of any of ``paths`` (one
    read of ``/proc/self/maps`` for all of them)."""
    targets = {os.path.realpath(path) for path in paths}
    ranges = []
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or parts[5].rstrip("\n") not in targets or "w" in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        ranges.append((lo, hi - lo))
    return ranges


def release_ranges(ranges: Iterable[tuple[int, int]]) -> int:
    """``madvise(MADV_DONTNEED)`` over read-only file mappings: drops them from this process's
    page tables (the next access faults the page back in). Returns the bytes released."""
    released = 0
    for start, length in ranges:
        if _libc.madvise(start, length, _MADV_DONTNEED) == 0:
            released += length
    return released


def drop_cache(path: str | os.PathLike[str]) -> int:
    """Evict one file from the page cache; returns the pages still resident (0 when it worked).

    Order: release this process's mappings, ``fdatasync`` (dirty pages cannot be evicted),
    ``posix_fadvise(0, 0, DONTNEED)``, then count with ``mincore``.
    """
    return drop_shard([Path(path)])


def drop_shard(path: str | os.PathLike[str] | Iterable[Path]) -> int:
    """Evict every file of a shard (:func:`drop_cache`'s order, the mappings of all of them
    released at once); returns the pages still resident across them.

    As little work as it can: a cold read is timed right after it, and whatever it does
    empties CPU caches that read then refills, while the ``pread`` it is compared with
    follows the drop of one file. Reading ``/proc/self/maps`` once per file made memmap_v1's
    seven-file shard read cold at 1.21-1.31x a ``pread``; once for the shard, 1.14-1.19x
    (notebook 05's shards, two runs each)."""
    files = shard_files(path) if isinstance(path, str | os.PathLike) else list(path)
    release_ranges(mapping_ranges(*files))
    for file in files:
        fd = os.open(file, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return sum(resident_pages(f)[0] for f in files)


def drop_until_cold(files: Sequence[Path], *, tries: int = 20) -> int:
    """Evict ``files`` until ``mincore`` finds no page left (readahead still in flight when
    the first eviction ran lands afterwards); returns the pages left after the last try."""
    left = drop_shard(files)
    for _ in range(tries):
        if left == 0:
            break
        time.sleep(0.001)
        left = drop_shard(files)
    return left


def read_all(path: str | os.PathLike[str], chunk: int = 8 << 20) -> int:
    """Read a file once, sequentially, into one reused buffer (fills the page cache; timed, the
    raw read floor of a scan); returns the bytes read."""
    total = 0
    buf = bytearray(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            total += n
    return total
