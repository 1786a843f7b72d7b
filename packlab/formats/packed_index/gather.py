"""The per-sequence checksums of ``packed_index``: what a shard records of each sequence it
gathers from its spool, and the check of a gathered bin against them.

:func:`sequence_checksums` hashes each indexed sequence as a bin uses it (its kept tokens'
bytes as int32 seeding its mask's: a uint16 Megatron prefix and the int32 spool it was
exported from hash alike), reading the spool in file order through two reused buffers, so a
writer's memory stays flat; :func:`changed_sequence` checks a bin just gathered (by
:class:`~packlab.packing.materialize.BinMaterializer`) against them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
from xxhash import xxh3_64_intdigest

from packlab.errors import FormatError
from packlab.spool import SpoolReader

SUMS = "seq_checksums.npy"
_new = tuple.__new__  # PackedBin without NamedTuple.__new__'s Python frame (hot path)


GATHERED_TOKENS = (np.dtype("<i4"), np.dtype("<u2"))  # a spool's; a Megatron prefix's either


def gathered_files(spool: SpoolReader) -> tuple[Path, Path, np.dtype]:
    """The files a gather reads whole, from their first byte, and the tokens' dtype: a spool's
    int32 tokens, or a Megatron prefix's ``.bin`` (uint16 below 65,500 ids, else int32), and the
    uint8 masks (the spool's, or packlab's sidecar beside the prefix)."""
    tokens, masks = spool.columns["tokens"], spool.columns.get("masks")
    if tokens.dtype not in GATHERED_TOKENS or tokens.offset:
        raise FormatError(f"{tokens.path}: {tokens.dtype.name} tokens from byte {tokens.offset}; "
                          "packed_index gathers int32 or uint16 ones from the first byte: pack "
                          "these into a format that copies its tokens")
    if masks is None:
        raise FormatError(f"{spool.path}: packed_index reads the masks from a file: export the "
                          "prefix with its mask sidecar (packlab export --chat-markers ...)")
    return tokens.path, masks.path, tokens.dtype


def sequence_checksum(token_bytes: Any, mask_bytes: Any) -> int:
    """One sequence's checksum as a bin uses it: xxh3_64 of its mask bytes, seeded by the
    xxh3_64 of its kept tokens' bytes (int32, whatever dtype the spool stores)."""
    return xxh3_64_intdigest(mask_bytes, xxh3_64_intdigest(token_bytes))


def _as_int32(tokens: np.ndarray) -> np.ndarray:
    """The tokens as the checksums hash them (no copy when they are int32 already)."""
    return tokens.astype("<i4", copy=False)


def changed_sequence(ids: np.ndarray, raw_mask: np.ndarray, starts: np.ndarray,
                     sums: Any, first: int) -> int | None:
    """The first sequence of a bin just materialized (``ids`` int32, its unshifted
    ``raw_mask``, its ``starts``; its sequences' recorded checksums ``sums[first...]``) whose
    bytes no longer match the checksum recorded at pack time (counted in the bin), or None."""
    tokens, masks = memoryview(ids).cast("B"), memoryview(raw_mask)
    bounds = [*starts.tolist(), ids.shape[0]]
    for k in range(len(bounds) - 1):
        a, e = bounds[k], bounds[k + 1]
        if sequence_checksum(tokens[4 * a:4 * e], masks[a:e]) != sums[first + k]:
            return k
    return None


def sequence_checksums(spool: SpoolReader, indices: np.ndarray, pack_size: int,
                       window: int = 1 << 20) -> np.ndarray:
    """Each indexed sequence's xxh3_64 as a bin uses it: its first ``min(length, pack_size)``
    tokens' bytes (as int32) seeding the hash of as many mask bytes (uint8).

    The spool is read in file order, ``window`` tokens at a time into two reused buffers
    (``preadv``, no memory map), the sequences hashed where they fall (Python ints for one
    window's sequences at a time) and the checksums put back in the order asked: beyond the
    index arrays (8 bytes a sequence each), the writer's memory stays flat.
    """
    index = np.asarray(indices, dtype=np.int64)
    kept = np.minimum(np.asarray(spool.lengths[index], dtype=np.int64), pack_size)
    raw = spool.offsets[index]  # compared before any conversion can wrap them
    outside = (kept <= 0) | (raw > np.uint64(spool.num_tokens)) | (
        raw.astype(np.int64) > spool.num_tokens - kept)
    first = raw.astype(np.int64)
    if outside.any():
        k = int(np.argmax(outside))
        raise FormatError(f"{spool.path}: sequence {int(index[k])}: empty, or its offset "
                          "points past tokens.bin (corrupted spool; run validate)")
    order = np.argsort(first, kind="stable")
    first, kept = first[order], kept[order]
    out = np.empty(index.shape[0], dtype=np.uint64)
    token_file, mask_file, dtype = gathered_files(spool)
    size = dtype.itemsize
    tokens = bytearray(size * window)
    masks = bytearray(window)
    fds = [os.open(f, os.O_RDONLY) for f in (token_file, mask_file)]
    try:
        k, count = 0, index.shape[0]
        while k < count:
            # the sequences that fit in one window from sequence k (in file order)
            lo = int(first[k])
            j = k + int(np.searchsorted(first[k:k + window] + kept[k:k + window] - lo,
                                        window, side="right"))
            j = max(j, k + 1)
            hi = int((first[k:j] + kept[k:j]).max())
            if size * (hi - lo) > len(tokens):  # one sequence longer than the window
                tokens, masks = bytearray(size * (hi - lo)), bytearray(hi - lo)
            mv = memoryview(masks)
            _read_exactly(fds[0], memoryview(tokens)[:size * (hi - lo)], size * lo, spool.path)
            _read_exactly(fds[1], mv[:hi - lo], lo, spool.path)
            tv = memoryview(_as_int32(np.frombuffer(tokens, dtype, hi - lo))).cast("B")
            sums = [sequence_checksum(tv[4 * a:4 * (a + n)], mv[a:a + n])
                    for a, n in zip((first[k:j] - lo).tolist(), kept[k:j].tolist(), strict=True)]
            out[order[k:j]] = sums
            k = j
    finally:
        for fd in fds:
            os.close(fd)
    return out


def _read_exactly(fd: int, into: memoryview, offset: int, where: Path) -> None:
    if os.preadv(fd, [into], offset) != into.nbytes:
        raise FormatError(f"{where}: spool files shorter than its offsets say (truncated)")


