"""Bins gathered from a spool: the read path of ``packed_index``, and the per-sequence checksums
it records.

:func:`build_gather` maps the spool's tokens and masks for random access and computes, in RAM,
where every sequence of every bin starts and how much of it the bin keeps (checked as the
materializer checks); :func:`gather_bin` copies a bin out, its loss mask aligned per
sub-sequence as it goes. :func:`sequence_checksums` hashes each indexed sequence as a bin uses
it (its kept tokens' bytes as int32 seeding its mask's: a uint16 Megatron prefix and the int32
spool it was exported from hash alike), reading the spool in file order through two reused
buffers, so a writer's memory stays flat.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from xxhash import xxh3_64_intdigest

from packlab.bins import PackedBin
from packlab.errors import FormatError
from packlab.mapping import MappedFile, ReadAdvice, advise
from packlab.materialize import BinMaterializer
from packlab.spool import SpoolReader

SUMS = "seq_checksums.npy"
_new = tuple.__new__  # PackedBin without NamedTuple.__new__'s Python frame (hot path)


class Gather(NamedTuple):
    """What a read gathers from: the spool's data mapped, the bins' sequences in RAM."""

    tokens: np.ndarray  # the spool's tokens (int32; a Megatron prefix's uint16 or int32), mapped
    masks: np.ndarray  # its masks.bin (uint8, unshifted)
    bin_of: memoryview  # int64[num_bins + 1]: bin b holds sequences bin_of[b]:bin_of[b + 1]
    start_of: memoryview  # int64 per sequence (layout order): its first token in the spool
    kept_of: memoryview  # int64 per sequence: its tokens in the bin (truncated to pack_size)
    packed_of: memoryview  # int64[num_bins]: each bin's packed length
    token_fd: int
    mask_fd: int
    advice: ReadAdvice  # when to advise a bin's sequences before a read
    files: tuple[MappedFile, MappedFile]
    mask_bytes: memoryview  # the mask map as bytes, for the checksums (verify)
    sums: memoryview | None  # each sequence's recorded checksum (verify), else None


def build_gather(source: Path, materializer: BinMaterializer,
                 sums: np.ndarray | None = None) -> Gather:
    """Gather tables from the assignment and the spool, checked as the materializer checks."""
    spool, part = materializer.spool, materializer.assignment
    offsets = np.array(part.bin_offsets, dtype=np.int64)
    indices = np.asarray(part.seq_indices)
    lengths = spool.lengths[indices].astype(np.int64)
    long = lengths > part.pack_size
    if part.overlong != "truncate" and long.any():
        b = int(np.searchsorted(offsets, int(np.argmax(long)), side="right") - 1)
        raise FormatError(f"{source}: bin {b}: a sequence longer than pack_size "
                          f"{part.pack_size} and the policy is {part.overlong!r} (corrupted)")
    kept = np.minimum(lengths, part.pack_size)
    starts, outside = _spool_starts(spool, indices, kept)
    ends = np.zeros(indices.shape[0] + 1, dtype=np.int64)
    np.cumsum(kept, out=ends[1:])
    packed = ends[offsets[1:]] - ends[offsets[:-1]]
    bad = (np.diff(offsets) <= 0) | (packed > part.pack_size)
    if bad.any() or outside.any():
        b = int(np.argmax(bad)) if bad.any() else int(np.searchsorted(
            offsets, int(np.argmax(outside)), side="right") - 1)
        raise FormatError(f"{source}: bin {b} does not fit its spool {spool.path} "
                          "(empty, over pack_size or past the spool's tokens; run validate)")
    token_file, mask_file, dtype = gathered_files(spool)
    files = (MappedFile(token_file), MappedFile(mask_file))
    if sums is not None and sums.shape[0] != indices.shape[0]:
        raise FormatError(f"{source / SUMS}: {sums.shape[0]} checksums for "
                          f"{indices.shape[0]} sequences (corrupted)")
    tokens = files[0].view(dtype.str, 0, spool.num_tokens)
    masks = files[1].view("|u1", 0, spool.num_tokens)
    return Gather(tokens, masks, memoryview(offsets), memoryview(starts), memoryview(kept),
                   memoryview(packed), files[0].fd, files[1].fd, ReadAdvice(files[0].fd), files,
                   memoryview(masks),
                   None if sums is None else memoryview(np.ascontiguousarray(sums)))


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


def _spool_starts(spool: SpoolReader, indices: np.ndarray, kept: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Where each indexed sequence starts in the spool (int64), and which of them do not fit
    (empty, or its kept tokens past the spool's): the uint64 offsets read from disk are
    compared before any conversion can wrap them."""
    raw = spool.offsets[indices]
    outside = (kept <= 0) | (raw > np.uint64(spool.num_tokens)) | (
        raw.astype(np.int64) > spool.num_tokens - kept)
    return raw.astype(np.int64), outside


def gather_bin(g: Gather, b: int) -> PackedBin:
    """Bin ``b`` copied out of the spool, its loss mask aligned per sub-sequence as it goes
    (``loss[j] = mask[j + 1]`` inside a sequence, 0 at its last token)."""
    tokens, masks, bin_of, start_of, kept_of, packed_of = g[:6]
    lo = bin_of[b]
    hi = bin_of[b + 1]
    size = tokens.itemsize
    if g.advice.first(size * start_of[lo], size * kept_of[lo]):  # cold: every sequence at once
        for k in range(lo, hi):
            advise(g.token_fd, size * start_of[k], size * kept_of[k])
            advise(g.mask_fd, start_of[k], kept_of[k])
    n = packed_of[b]
    ids = np.empty(n, dtype=np.int32)
    loss = np.empty(n, dtype=np.uint8)
    starts = []
    pos = 0
    for k in range(lo, hi):
        s = start_of[k]
        c = kept_of[k]
        end = pos + c
        ids[pos:end] = tokens[s:s + c]
        loss[pos:end - 1] = masks[s + 1:s + c]
        loss[end - 1] = 0
        starts.append(pos)
        pos = end
    return _new(PackedBin, (ids, loss, np.array(starts, dtype=np.int32)))


def sequence_checksum(token_bytes: Any, mask_bytes: Any) -> int:
    """One sequence's checksum as a bin uses it: xxh3_64 of its mask bytes, seeded by the
    xxh3_64 of its kept tokens' bytes (int32, whatever dtype the spool stores)."""
    return xxh3_64_intdigest(mask_bytes, xxh3_64_intdigest(token_bytes))


def _as_int32(tokens: np.ndarray) -> np.ndarray:
    """The tokens as the checksums hash them (no copy when they are int32 already)."""
    return tokens.astype("<i4", copy=False)


def changed_sequence(g: Gather, b: int) -> int | None:
    """The first sequence of bin ``b`` (counted in the bin) whose bytes in the spool no longer
    match the checksum recorded at pack time, or None (needs ``g.sums``)."""
    tokens, masks, sums = g.tokens, g.mask_bytes, g.sums
    assert sums is not None
    lo = g.bin_of[b]
    for k in range(lo, g.bin_of[b + 1]):
        s, c = g.start_of[k], g.kept_of[k]
        if sequence_checksum(_as_int32(tokens[s:s + c]), masks[s:s + c]) != sums[k]:
            return k - lo
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
    first, outside = _spool_starts(spool, index, kept)
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


