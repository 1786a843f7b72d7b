"""Megatron-core's ``MMIDIDX`` index (``.idx``): one implementation of its fields, its writing
and its checks. ``binidx`` and ``megatron_sft`` write and read it, and spools exported as
Megatron prefixes (:mod:`packlab.spool.prefix`) too (a layer below the spool and the formats,
so both use it).

Field by field, little-endian, as megatron-core's ``_IndexWriter`` writes it::

    magic          9 bytes  b"MMIDIDX\\x00\\x00"
    version        <Q       1
    dtype code     <B       the .bin's values (megatron-core's DType: uint8 1, int8 2, int16 3,
                            int32 4, int64 5, float64 6, float32 7, uint16 8)
    sequence count <Q       n   (packlab: one sequence per bin)
    document count <Q       n + 1
    lengths        int32    [n]      values per sequence
    pointers       int64    [n]      byte offset of each sequence in the .bin
    doc indices    int64    [n + 1]  0, 1, ..., n (one document per sequence)

Sequences fill the ``.bin`` in order, from its first byte to its last: a pointer that does not
follow the lengths before it is damage (:func:`first_stray`).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packlab.errors import FormatError
from packlab.storage.files import HashedFile

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, doc count
HEADER_SIZE = HEADER.size  # 34
#: megatron-core's DType codes
DTYPES: dict[int, np.dtype] = {1: np.dtype("u1"), 2: np.dtype("i1"), 3: np.dtype("<i2"),
                               4: np.dtype("<i4"), 5: np.dtype("<i8"), 6: np.dtype("<f8"),
                               7: np.dtype("<f4"), 8: np.dtype("<u2")}
CODE_OF = {dt.str: code for code, dt in DTYPES.items()}
_STEP = 1 << 17  # values written per chunk (the writer's memory: one chunk)


class Chunked(Protocol):
    """Values read back a chunk at a time (``formats.scratch.ScratchArray``, a spool's lengths)."""

    def chunks(self) -> Iterator[np.ndarray]: ...


def index_size(num_items: int) -> int:
    """Bytes of an index of ``num_items`` sequences, one document each."""
    return HEADER_SIZE + 4 * num_items + 8 * num_items + 8 * (num_items + 1)


def pointers_at(num_items: int) -> int:
    """Byte offset of the pointers (after the header and the lengths)."""
    return HEADER_SIZE + 4 * num_items


def documents_at(num_items: int) -> int:
    """Byte offset of the document indices."""
    return HEADER_SIZE + 12 * num_items


def write_index(path: Path, lengths: Chunked, num_items: int, dtype: np.dtype
                ) -> dict[str, Any]:
    """The index of ``num_items`` sequences of ``dtype`` values whose lengths ``lengths`` holds,
    one document each, byte for byte as megatron-core writes it; its record entry."""
    idx = HashedFile(path)
    idx.write(HEADER.pack(
        MAGIC,  # magic
        VERSION,  # version 1
        CODE_OF[np.dtype(dtype).str],  # dtype code of the .bin
        num_items,  # sequence count
        num_items + 1,  # document count: document indices 0..n
    ))
    for chunk in lengths.chunks():  # lengths: int32[n]
        idx.write(chunk.astype("<i4", copy=False))
    pointer = 0  # pointers: int64[n], byte offset of each sequence
    for chunk in lengths.chunks():
        ends = np.cumsum(chunk, dtype=np.int64) * np.dtype(dtype).itemsize + pointer
        idx.write(np.concatenate(([pointer], ends[:-1])).astype("<i8"))
        pointer = int(ends[-1])
    for lo in range(0, num_items + 1, _STEP):  # document indices: int64[n + 1], 0..n
        idx.write(np.arange(lo, min(lo + _STEP, num_items + 1), dtype="<i8"))
    return idx.close()


def parse_header(raw: bytes, where: object) -> tuple[int, int, int]:
    """``(dtype code, sequence count, document count)`` of an index's first bytes; a short
    file, another magic or version is a FormatError naming ``where``."""
    if len(raw) < HEADER_SIZE:
        raise FormatError(f"{where}: {len(raw)} bytes, shorter than its {HEADER_SIZE}-byte "
                          "header (truncated)")
    magic, version, code, sequences, documents = HEADER.unpack(raw[:HEADER_SIZE])
    if magic != MAGIC:
        raise FormatError(f"{where}: not a Megatron MMIDIDX index (bad magic {magic!r})")
    if version != VERSION:
        raise FormatError(f"{where}: MMIDIDX version {version}, this reader knows {VERSION}")
    return code, sequences, documents


def entries_outside(pointers: np.ndarray, lengths: np.ndarray, width: int, data_bytes: int,
                    min_length: int = 1) -> np.ndarray:
    """Which of these entries (int64 arrays) cannot be sequences of a ``.bin`` of
    ``data_bytes`` bytes: a negative or unaligned pointer, fewer than ``min_length`` values, or
    past the end."""
    return (pointers < 0) | (pointers % width != 0) | (lengths < min_length) \
        | (pointers + lengths * width > data_bytes)


def end_before(pointers: np.ndarray, lengths: np.ndarray, lo: int, width: int) -> int:
    """The byte where the sequence before ``lo`` ends (0 for the first): where ``lo``'s must
    start."""
    return int(pointers[lo - 1] + lengths[lo - 1] * width) if lo else 0


def first_stray(pointers: np.ndarray, lengths: np.ndarray, width: int, previous_end: int,
                data_end: int | None) -> int:
    """The first of these sequences (int64 arrays, the ones after a sequence ending at byte
    ``previous_end``) whose pointer does not follow the lengths before it, or whose last one
    does not end the ``.bin`` at ``data_end`` (None: not the last); -1 when all follow."""
    follows = np.concatenate(([previous_end], pointers[:-1] + lengths[:-1] * width))
    stray = pointers != follows
    if data_end is not None:
        stray[-1] |= pointers[-1] + lengths[-1] * width != data_end
    return int(np.argmax(stray)) if stray.any() else -1


def check_documents(documents: np.ndarray, num_items: int, where: object) -> None:
    """Document indices ``0..n``: one document per sequence, as packlab and Bridge write."""
    if not np.array_equal(documents, np.arange(num_items + 1)):
        raise FormatError(f"{where}: document indices are not 0..{num_items} (one document per "
                          "sequence)")
