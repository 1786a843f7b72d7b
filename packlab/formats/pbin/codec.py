"""The Modalities packed data file, ``.pbin``: a codec, not a shard format.

Modalities' file, field by field (``EmbeddedStreamData`` / ``TokenizedFileWriter``)::

    data length   <Q     bytes in the data section
    token width   <I     bytes per token: 1, 2 or 4 (unsigned little-endian tokens)
    data          tokens of every document, concatenated
    index         pickle of [(byte_offset, byte_length), ...], offsets relative to the data

For example two documents, ``[5, 6, 7]`` and ``[8, 9]``, in 2-byte tokens (:func:`write_pbin`
writes exactly these 50 bytes)::

    0a 00 00 00 00 00 00 00                      data length: 10 bytes
    02 00 00 00                                  token width: 2
    05 00 06 00 07 00 | 08 00 09 00              data: document 0 | document 1
    80 02 5d 28                                  index: PROTO 2, EMPTY_LIST, MARK
    4a 00 00 00 00 4a 06 00 00 00 86             (0, 6): BININT 0, BININT 6, TUPLE2
    4a 06 00 00 00 4a 04 00 00 00 86             (6, 4)
    65 2e                                        APPENDS, STOP: [(0, 6), (6, 4)]

Modalities reads the index with ``pickle.loads``, which would run any code a crafted file
names. :func:`parse_index` reads it with :func:`packlab.codecs.safe_pickle.restricted_load` allowing
no global at all (a list of int tuples needs none): a file that tries to run something is
refused before anything runs. ``pickle.loads`` ignores bytes after the pickle's STOP, which
lets a file carry more after the index (packlab's shard trailer, :mod:`packlab.formats.pbin`).

This module is the codec: reading any such file (:class:`ModalitiesFile`), writing one
(:func:`open_output`, :class:`IndexWriter`, :func:`finish_output`) and exporting a spool as a
plain Modalities file, one document per sequence (:func:`write_pbin`). It is not in the
format registry: the shard format that builds on it is ``pbin``.
"""

from __future__ import annotations

import io
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packlab.codecs.safe_pickle import NO_GLOBALS, restricted_load
from packlab.errors import FormatError, PacklabError
from packlab.spool import SpoolReader
from packlab.storage.files import HashedFile, refuse_existing, staged
from packlab.storage.reads import RESIDENT, in_pieces

SUFFIX = ".pbin"
HEADER = struct.Struct("<QI")  # data section length in bytes, token width in bytes
HEADER_SIZE = HEADER.size  # 12, Modalities' HEADER_SIZE_IN_BYTES
TOKEN_DTYPES = {1: np.dtype("|u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4")}
COPY_CHUNK = 1 << 22  # tokens (or bytes) moved per step when streaming a file
_INT32_MAX = (1 << 31) - 1

# Pickle opcodes the index writer emits (protocol 2, no memo): the file stays readable by any
# Python's pickle.loads, and the writer never builds a Python list per document.
_PROTO2, _EMPTY_LIST, _MARK, _APPENDS, _STOP = b"\x80\x02", b"]", b"(", b"e", b"."
_SMALL = np.dtype([("j1", "u1"), ("off", "<i4"), ("j2", "u1"), ("len", "<i4"), ("t", "u1")])
_LARGE = np.dtype([("l1", "u1"), ("n", "u1"), ("off", "<i8"), ("j2", "u1"), ("len", "<i4"),
                   ("t", "u1")])
_BININT, _LONG1, _TUPLE2 = 0x4A, 0x8A, 0x86


def token_width_for(vocab_size: int | None) -> int:
    """The narrowest width Modalities reads that holds every id of the vocabulary (4 if unknown)."""
    if vocab_size is None:
        return 4
    return 1 if vocab_size <= 1 << 8 else 2 if vocab_size <= 1 << 16 else 4


def check_width(width: int | str | None, vocab_size: int | None, source: str) -> int:
    """A token width asked for (1, 2, 4, or ``auto``/None: :func:`token_width_for`)."""
    if width is None or width == "auto":
        return token_width_for(vocab_size)
    if width not in TOKEN_DTYPES:
        raise PacklabError(f"{source}: token width must be 1, 2 or 4 bytes, got {width!r}")
    return int(width)


# -- writing ----------------------------------------------------------------------------------
def encode_index(offsets: np.ndarray, lengths: np.ndarray) -> bytes:
    """The pickle of ``[(offset, length), ...]`` for a run of documents, built with numpy.

    Ints below 2**31 are BININT (5 bytes), larger offsets LONG1 with 8 bytes. Emitted between
    MARK and APPENDS by :class:`IndexWriter`.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and int(lengths.max()) > _INT32_MAX:
        raise PacklabError(f"a document of {int(lengths.max())} bytes is too long for a pbin")
    split = int(np.searchsorted(offsets, _INT32_MAX, side="right"))
    small = np.empty(split, dtype=_SMALL)
    small["j1"], small["off"], small["j2"], small["len"], small["t"] = (
        _BININT, offsets[:split], _BININT, lengths[:split], _TUPLE2)
    large = np.empty(offsets.shape[0] - split, dtype=_LARGE)
    large["l1"], large["n"], large["off"], large["j2"], large["len"], large["t"] = (
        _LONG1, 8, offsets[split:], _BININT, lengths[split:], _TUPLE2)
    return small.tobytes() + large.tobytes()


def open_output(path: Path) -> HashedFile:
    """A new pbin at ``path`` (a temporary): the header reserved, filled in by
    :func:`finish_output`; the hash covers every byte after it."""
    out = HashedFile(path)
    out.write(bytes(HEADER_SIZE), hashed=False)
    return out


def finish_output(out: HashedFile, data_len: int, token_width: int) -> None:
    """Fill in the header now that the sizes are known, and make the file durable."""
    out.patch(0, HEADER.pack(data_len, token_width))
    out.close()


class IndexWriter:
    """Streams the pickled Modalities index: documents' lengths in tokens in, pickle bytes out."""

    def __init__(self, out: HashedFile, token_width: int) -> None:
        self.out = out
        self.width = token_width
        self.offset = 0
        out.write(_PROTO2 + _EMPTY_LIST)

    def add(self, token_lengths: np.ndarray) -> None:
        nbytes = np.asarray(token_lengths, dtype=np.int64) * self.width
        ends = np.cumsum(nbytes) + self.offset
        self.add_entries(ends - nbytes, nbytes)
        self.offset = int(ends[-1]) if ends.size else self.offset

    def add_entries(self, offsets: np.ndarray, lengths: np.ndarray) -> None:
        """Append ``(offset, length)`` pairs as they are (a JSONL line index's, say)."""
        self.out.write(_MARK + encode_index(offsets, lengths) + _APPENDS)

    def close(self) -> None:
        self.out.write(_STOP)


def write_pbin(
    spool: str | os.PathLike[str] | SpoolReader,
    path: str | os.PathLike[str],
    *,
    token_width: int | str | None = "auto",
    overwrite: bool = False,
) -> dict[str, Any]:
    """A plain Modalities pbin of a spool: one document per sequence, tokens only (no masks).

    ``auto`` width follows the spool's vocab_size, else its largest token id. Streams in chunks;
    published atomically. Returns what it wrote.
    """
    reader = spool if isinstance(spool, SpoolReader) else SpoolReader(spool)
    final = Path(path)
    refuse_existing(final, overwrite=overwrite)  # before reading the whole spool for its ids
    vocab = reader.vocab_size
    if vocab is None and token_width in (None, "auto"):
        vocab = max(int(piece.max()) for piece in in_pieces(reader.tokens, 4 * COPY_CHUNK)) + 1
    width = check_width(token_width, vocab, str(final))
    dtype = TOKEN_DTYPES[width]
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=overwrite) as tmp, open_output(tmp) as out:
        for lo in range(0, reader.num_tokens, COPY_CHUNK):
            chunk = np.asarray(reader.tokens[lo : lo + COPY_CHUNK])
            if int(chunk.min()) < 0 or int(chunk.max()) > np.iinfo(dtype).max:
                raise PacklabError(f"{final}: spool tokens {int(chunk.min())}..{int(chunk.max())}"
                                   f" do not fit {width}-byte tokens")
            out.write(chunk.astype(dtype))
            RESIDENT.check()  # the spool's pages this chunk touched, released past the budget
        index = IndexWriter(out, width)
        for lo in range(0, reader.num_sequences, 1 << 20):
            index.add(np.asarray(reader.lengths[lo : lo + (1 << 20)]))
        index.close()
        finish_output(out, reader.num_tokens * width, width)
    return {"path": str(final), "format": "pbin", "documents": reader.num_sequences,
            "num_tokens": reader.num_tokens, "token_width": width,
            "bytes": final.stat().st_size}


# -- reading ----------------------------------------------------------------------------------
def parse_index(raw: bytes, *, source: str) -> np.ndarray:
    """``int64[n, 2]`` (byte offset, byte length) from the pickled index, without running code."""
    stream = io.BytesIO(raw)
    index = restricted_load(stream, source=source, allowed=NO_GLOBALS, what="pbin index",
                            needs="a pbin index is a list of (offset, length) ints and needs none")
    if stream.tell() != len(raw):
        raise FormatError(f"{source}: {len(raw) - stream.tell()} stray bytes after the pickled "
                          "index (a cut packlab trailer, or corrupted)")
    if not isinstance(index, list) or not all(
        type(e) is tuple and len(e) == 2 and type(e[0]) is int and type(e[1]) is int
        for e in index
    ):
        raise FormatError(f"{source}: the pbin index is not a list of (offset, length) int pairs")
    return np.array(index, dtype=np.int64).reshape(-1, 2)


class ModalitiesFile:
    """A Modalities pbin: its header, token data and documents, the index up to the file's end.

    Opening reads the header; the index is parsed (restricted) on first use. A subclass that
    knows of bytes after the index says where it ends (:meth:`_index_end`).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FormatError(f"{self.path}: no such pbin file")
        self.size = self.path.stat().st_size
        with open(self.path, "rb") as f:
            raw = f.read(HEADER_SIZE)
        if len(raw) < HEADER_SIZE:
            raise FormatError(f"{self.path}: {len(raw)} bytes, shorter than the 12-byte "
                              "pbin header (truncated)")
        self.data_len, self.token_width = HEADER.unpack(raw)
        self.index_offset = HEADER_SIZE + self.data_len
        self.index_end = self._index_end()
        if self.token_width not in TOKEN_DTYPES:
            raise FormatError(f"{self.path}: token width {self.token_width} (Modalities writes "
                              "1, 2 or 4; corrupted header?)")
        self.token_dtype = TOKEN_DTYPES[self.token_width]
        if self.data_len % self.token_width or self.index_offset >= self.index_end:
            raise FormatError(f"{self.path}: header says {self.data_len} data bytes of "
                              f"{self.token_width}-byte tokens, the file has {self.size} bytes "
                              "(truncated or corrupted)")
        self.num_tokens = self.data_len // self.token_width
        self._index: np.ndarray | None = None

    def _index_end(self) -> int:
        """Where the pickled index ends: here, the end of the file."""
        return self.size

    def index(self) -> np.ndarray:
        """``int64[n, 2]``: each document's byte offset and byte length in the data section."""
        if self._index is None:
            with open(self.path, "rb") as f:
                f.seek(self.index_offset)
                raw = f.read(self.index_end - self.index_offset)
            index = parse_index(raw, source=str(self.path))
            offsets, lengths = index[:, 0], index[:, 1]
            bad = (offsets < 0) | (lengths < 0) | (offsets + lengths > self.data_len) \
                | (offsets % self.token_width != 0) | (lengths % self.token_width != 0)
            if bad.any():
                d = int(np.argmax(bad))
                raise FormatError(f"{self.path}: document {d}: index entry {tuple(index[d])} "
                                  f"falls outside the {self.data_len}-byte data section")
            self._index = index
        return self._index

    def tokens(self) -> np.ndarray:
        """Every token, memory-mapped (unsigned, the file's width)."""
        return np.memmap(self.path, self.token_dtype, "r", HEADER_SIZE, (self.num_tokens,))

    def __len__(self) -> int:
        return int(self.index().shape[0])

    def document(self, i: int) -> np.ndarray:
        offset, length = (int(v) // self.token_width for v in self.index()[i])
        return self.tokens()[offset : offset + length].view(np.ndarray)

    def iter_documents(self) -> Iterator[np.ndarray]:
        tokens = self.tokens()
        for offset, length in (self.index() // self.token_width).tolist():
            yield tokens[offset : offset + length].view(np.ndarray)
