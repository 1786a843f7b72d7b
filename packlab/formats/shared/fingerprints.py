"""Fingerprints of files that have no room for their shard's identity: megatron-core's
``data.bin``/``data.idx`` in a ``binidx`` shard, Bridge's ``.sft.bin``/``.sft.idx`` in a
``megatron_sft`` shard. Their bytes stay the other project's, so packlab's record of the shard
(a record file, a sidecar) keeps a fingerprint of each, and the reader checks it on the first read:
a file exchanged with another shard's is refused before a bin is served.

An index is fingerprinted whole (it is small, and read whole anyway); a data file by its first
and last :data:`BLOCK` bytes, one small read (two ranged reads on object storage).
"""

from __future__ import annotations

import os
from typing import Any

from xxhash import xxh3_64_hexdigest

from packlab.errors import FormatError
from packlab.storage.location import as_location

BLOCK = 4096  # bytes of a data file's start and end its fingerprint covers


def fingerprint(path: str | os.PathLike[str] | Any, *, whole: bool) -> str:
    """xxh3_64 (hex) of a file (a local path or a :class:`~packlab.storage.location.Location`) whole,
    or of its first and last :data:`BLOCK` bytes."""
    location = as_location(path)
    if whole:
        return xxh3_64_hexdigest(location.read_bytes())
    size = location.size()
    head = location.read_range(0, min(BLOCK, size))
    tail = location.read_range(max(size - BLOCK, 0), min(BLOCK, size))
    return xxh3_64_hexdigest(head + tail)


def check_fingerprints(recorded: Any, files: dict[str, tuple[Any, bool]], record: object) -> None:
    """Each of ``files`` (its name in the record: its path and whether it is fingerprinted
    whole) against the fingerprint ``recorded`` (a dict from the record, or None for a shard
    written before fingerprints: nothing to check); one FormatError naming the file."""
    if not isinstance(recorded, dict):
        return
    for name, (path, whole) in files.items():
        if fingerprint(path, whole=whole) != recorded.get(name):
            raise FormatError(f"{path}: not this shard's (its fingerprint differs from the one "
                              f"{record} records): a file exchanged with another shard's, or "
                              "corrupted; refused")
