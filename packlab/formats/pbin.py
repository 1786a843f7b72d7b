"""Format ``pbin``: packlab's shard as a Modalities packed data file, plus a trailer.

The Modalities file itself (header, tokens, pickled index; read without running pickle code)
is :mod:`packlab.formats.modalities`. How pbin fits the registry (Modalities has no loss mask
and no bins of its own), two uses:

1. ``Writer`` (the registered shard writer): one Modalities document per packed bin, so
   Modalities reads the packed rows' tokens unchanged, and a packlab *trailer* after the
   pickle carries what the format lacks. ``pickle.loads`` ignores bytes after the pickle's
   STOP, so the file stays a valid Modalities pbin. The trailer, each section 8-byte aligned::

       loss_mask      uint8[num_tokens]
       token_offsets  int64[num_bins + 1]    bin b = tokens[token_offsets[b]:token_offsets[b+1]]
       seq_offsets    int64[num_bins + 1]    CSR of the bins' seq_start_id
       seq_starts     int32[num_seqs]
       footer         JSON: counts, pack_size, token width, section offsets, sha256 of
                      bytes [12, footer) (the header is patched last, so it is checked by field)
       <Q             footer length
       magic          b"PLKPBIN1"

   Each section is ``[start, bytes]``, ``start`` counted from the index (the byte after the
   data). For example the footer of two bins, ``[5, 6, 7]`` (sequences start at 0 and 2) and
   ``[8, 9]``, in 2-byte tokens (keys sorted, one line in the file; here the index starts at
   byte 22, so the loss mask at 56)::

       {"format": "pbin", "layout": "pbin_packlab_v1", "metadata": {}, "num_bins": 2,
        "num_seqs": 3, "num_tokens": 5, "pack_size": 4, "packlab_version": "0.1.0",
        "sections": {"index": [0, 28], "loss_mask": [34, 5], "seq_offsets": [66, 24],
                     "seq_starts": [90, 12], "token_offsets": [42, 24]},
        "sha256": "e6379d69...b3a87b35", "sha256_of": "bytes from 12 to the footer",
        "token_width": 2, "vocab_size": 1000}

   The reader uses the trailer's arrays (opening reads the header and footer only); it never
   needs the pickle. ``validate`` unpickles the index (restricted) and checks it agrees.
2. A plain Modalities file (:func:`packlab.formats.modalities.write_pbin` exports a spool as
   one; Modalities packs at train time) is *lossy* as a packlab shard: ``Reader(path,
   lossy=True)`` serves each document as one bin learning every next token (``loss_mask`` 1
   but the last position, ``seq_start_id`` ``[0]``), the pretraining convention Modalities
   trains with. :class:`PbinFile` reads the documents of either kind.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import numpy as np

from packlab.bins import PackedBin
from packlab.errors import FormatError, PacklabError
from packlab.files import temporary_sibling
from packlab.formats.base import FormatFacts, ShardReader, ShardWriter, index_list
from packlab.formats.binidx import ScratchArray
from packlab.formats.modalities import (
    COPY_CHUNK,
    HEADER_SIZE,
    SUFFIX,
    TOKEN_DTYPES,
    IndexWriter,
    ModalitiesFile,
    check_width,
    finish_output,
    open_output,
)
from packlab.invariants import check_csr
from packlab.mapping import MappedFile, ReadAdvice, advise, load_array, scan, sequential

FORMAT = "pbin"
LAYOUT = "pbin_packlab_v1"
TRAILER_MAGIC = b"PLKPBIN1"
TAIL = struct.Struct("<Q8s")  # footer JSON length, magic
_CHECK_CHUNK = 1 << 16
_new = tuple.__new__  # PackedBin without NamedTuple.__new__'s Python frame (hot path)


def detect(path: Path) -> bool:
    """A file named ``*.pbin``, or any file ending with packlab's pbin trailer magic."""
    if not path.is_file():
        return False
    if path.suffix == SUFFIX:
        return True
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() < HEADER_SIZE + TAIL.size:
                return False
            f.seek(-len(TRAILER_MAGIC), os.SEEK_END)
            return f.read() == TRAILER_MAGIC
    except OSError:
        return False


class PbinFacts(FormatFacts):
    """What ``pbin`` is: a Modalities packed data file with packlab's trailer."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    READ_BY = ("Modalities",)
    ZERO_COPY = True
    detect = staticmethod(detect)


class PbinFile(ModalitiesFile):
    """Any pbin, Modalities' or packlab's: ``footer`` is packlab's trailer footer, or None."""

    footer: dict[str, Any] | None

    def _index_end(self) -> int:
        """Where the pickled index ends: the end of the file, or where the trailer begins."""
        with open(self.path, "rb") as f:
            self.footer = _read_footer(f, self.path, self.size)
        if self.footer is None:
            return self.size
        where = self.footer.get("sections", {}).get("index") if isinstance(
            self.footer.get("sections"), dict) else None
        if (not isinstance(where, list) or len(where) != 2 or where[0] != 0
                or not isinstance(where[1], int)
                or self.index_offset + where[1] > self.footer["footer_offset"]):
            raise FormatError(f"{self.path}: packlab footer: bad 'index' section {where!r} "
                              "(corrupted)")
        return self.index_offset + where[1]


def _read_footer(f: BinaryIO, path: Path, size: int) -> dict[str, Any] | None:
    """packlab's trailer footer, or None for a plain pbin."""
    if size < HEADER_SIZE + TAIL.size:
        return None
    f.seek(size - TAIL.size)
    length, magic = TAIL.unpack(f.read(TAIL.size))
    if magic != TRAILER_MAGIC:
        return None
    if length > size - HEADER_SIZE - TAIL.size:
        raise FormatError(f"{path}: packlab footer length {length} exceeds the file (corrupted)")
    f.seek(size - TAIL.size - length)
    try:
        footer = json.loads(f.read(length))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: unreadable packlab footer: {exc}") from None
    if not isinstance(footer, dict) or footer.get("layout") != LAYOUT:
        raise FormatError(f"{path}: packlab footer of unknown layout {footer.get('layout')!r}"
                          if isinstance(footer, dict) else f"{path}: bad packlab footer")
    footer["footer_offset"] = size - TAIL.size - length
    return footer


class Writer(PbinFacts, ShardWriter):
    """One Modalities document per bin, plus packlab's trailer (loss mask, starts, footer).

    Extra keywords: ``token_width`` (1, 2, 4 or ``"auto"``) and ``vocab_size`` (for ``auto``;
    also read from ``metadata["vocab_size"]``; unknown means 4 bytes).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        token_width: int | str | None = "auto",
        vocab_size: int | None = None,
        **options: Any,
    ) -> None:
        metadata = options.get("metadata") or {}
        self.vocab_size = vocab_size if vocab_size is not None else metadata.get("vocab_size")
        self.token_width = check_width(token_width, self.vocab_size, str(path))
        self.token_dtype = TOKEN_DTYPES[self.token_width]
        super().__init__(path, **options)

    def _open(self) -> None:
        self._out = open_output(self.tmp_path)
        scratch = temporary_sibling(self.path)
        self._scratch = {
            "lengths": ScratchArray(Path(f"{scratch}.lengths"), "<i8"),
            "nseqs": ScratchArray(Path(f"{scratch}.nseqs"), "<i8"),
            "starts": ScratchArray(Path(f"{scratch}.starts"), "<i4"),
            "loss": ScratchArray(Path(f"{scratch}.loss"), "|u1"),
        }

    def _write(self, packed: PackedBin) -> None:
        tokens = packed.input_ids
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi > np.iinfo(self.token_dtype).max:
            raise PacklabError(f"{self.path}: bin {self.bins_written}: token ids {lo}..{hi} do "
                               f"not fit {self.token_width}-byte tokens (vocab_size "
                               f"{self.vocab_size}); pass token_width=4")
        self._out.write(tokens.astype(self.token_dtype, copy=False))
        self._scratch["lengths"].append(np.array([tokens.shape[0]]))
        self._scratch["nseqs"].append(np.array([packed.seq_start_id.shape[0]]))
        self._scratch["starts"].append(packed.seq_start_id)
        self._scratch["loss"].append(packed.loss_mask)

    def _close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        for scratch in self._scratch.values():
            scratch.finish()
        out = self._out
        data_len = self.tokens_written * self.token_width
        index_offset = HEADER_SIZE + data_len  # section offsets are relative to the index
        index = IndexWriter(out, self.token_width)
        for lengths in self._scratch["lengths"].chunks():
            index.add(lengths)
        index.close()
        sections = {"index": [0, out.bytes - index_offset]}
        for name, chunks in (
            ("loss_mask", self._scratch["loss"].chunks(COPY_CHUNK)),  # uint8[num_tokens]
            ("token_offsets", _running_offsets(self._scratch["lengths"])),  # int64[num_bins + 1]
            ("seq_offsets", _running_offsets(self._scratch["nseqs"])),  # int64[num_bins + 1]
            ("seq_starts", self._scratch["starts"].chunks(COPY_CHUNK)),  # int32[num_seqs]
        ):
            out.align()
            start = out.bytes
            for chunk in chunks:
                out.write(chunk)
            sections[name] = [start - index_offset, out.bytes - start]
        manifest.update(layout=LAYOUT, token_width=self.token_width, vocab_size=self.vocab_size,
                        sections=sections, sha256=out.hexdigest(),
                        sha256_of="bytes from 12 to the footer")
        footer = json.dumps(manifest, sort_keys=True).encode()
        out.write(footer + TAIL.pack(len(footer), TRAILER_MAGIC), hashed=False)
        finish_output(out, data_len, self.token_width)
        for scratch in self._scratch.values():
            scratch.discard()
        return manifest

    def _discard(self) -> None:
        out = getattr(self, "_out", None)
        if out is not None:
            out.discard()
        for scratch in getattr(self, "_scratch", {}).values():
            scratch.discard()


def _running_offsets(counts: ScratchArray) -> Iterator[np.ndarray]:
    """``int64[n + 1]``: 0 then the running sum of the counts, chunk by chunk."""
    total = 0
    yield np.zeros(1, dtype="<i8")
    for chunk in counts.chunks():
        ends = np.cumsum(chunk, dtype=np.int64) + total
        total = int(ends[-1])
        yield ends


class _Mapped(NamedTuple):
    """One process's view of a pbin: the file mapped, the bins' offsets in RAM (16 bytes/bin)."""

    tokens: np.ndarray
    loss: np.ndarray | None  # None: a plain pbin (no trailer)
    starts: np.ndarray | None
    token_offsets: memoryview  # int64[num_bins + 1]: a Python int per lookup
    seq_offsets: memoryview | None
    fd: int  # for read advice
    advice: ReadAdvice  # when to advise a bin's tokens before a read
    token_offsets_array: np.ndarray
    seq_offsets_array: np.ndarray | None
    doc_starts: np.ndarray | None  # a plain pbin's documents: where each starts (tokens)
    loss_at: int  # byte offsets of the trailer's loss mask and starts in the file
    starts_at: int
    file: MappedFile


class Reader(PbinFacts, ShardReader):
    """Bins of a packlab pbin from its trailer (views, valid after close).

    On first read (in each process) the file is mapped for random access and the trailer's
    offsets are read into RAM and checked, so a cold read waits for the bin's own bytes only
    (see :mod:`packlab.mapping`).

    A plain pbin (no trailer) is refused unless ``lossy=True``: then each document is one bin
    learning every next token (see the module docstring); ``pack_size`` defaults to the longest.
    """

    @property
    def metadata(self) -> dict[str, Any]:
        found = (self.footer or {}).get("metadata")
        return found if isinstance(found, dict) else {}

    def __init__(self, path: str | os.PathLike[str], *, lossy: bool = False,
                 pack_size: int | None = None) -> None:
        super().__init__(path)
        self.file = PbinFile(self.path)
        self.footer = self.file.footer
        self.lossy = self.footer is None
        self.token_dtype = self.file.token_dtype
        self._maps: _Mapped | None = None
        if self.footer is None:
            if not lossy:
                raise FormatError(
                    f"{self.path}: a plain Modalities pbin (token documents only, no loss mask "
                    "or bins); open it with lossy=True to read each document as one bin learning "
                    "every next token, or read its documents with packlab.formats.pbin.PbinFile")
            lengths = self.file.index()[:, 1] // self.file.token_width
            self.num_bins = int(lengths.shape[0])
            self.num_tokens = int(lengths.sum())
            self.pack_size = int(pack_size or (lengths.max() if lengths.size else 0))
            self.vocab_size: int | None = None
        else:
            self._read_footer_fields()

    def _read_footer_fields(self) -> None:
        footer = self.footer
        assert footer is not None
        for key in ("pack_size", "num_bins", "num_tokens", "num_seqs", "token_width"):
            value = footer.get(key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FormatError(f"{self.path}: packlab footer: bad or missing {key!r}")
        self.pack_size = footer["pack_size"]
        self.num_bins = footer["num_bins"]
        self.num_tokens = footer["num_tokens"]
        self.num_seqs = footer["num_seqs"]
        self.vocab_size = footer.get("vocab_size")
        if (self.file.token_width, self.file.num_tokens) != (footer["token_width"],
                                                             self.num_tokens):
            raise FormatError(f"{self.path}: header says {self.file.num_tokens} tokens of "
                              f"{self.file.token_width} bytes, the footer {self.num_tokens} of "
                              f"{footer['token_width']} (corrupted)")
        expected = {"loss_mask": self.num_tokens, "token_offsets": 8 * (self.num_bins + 1),
                    "seq_offsets": 8 * (self.num_bins + 1), "seq_starts": 4 * self.num_seqs}
        sections = footer.get("sections", {})
        base = self.file.index_offset
        for name, nbytes in expected.items():
            where = sections.get(name)
            if (not isinstance(where, list) or len(where) != 2 or where[1] != nbytes
                    or base + where[0] + nbytes > footer["footer_offset"]):
                raise FormatError(f"{self.path}: packlab trailer section {name!r} is missing, "
                                  "of the wrong size or past the footer (corrupted)")

    def _handles(self) -> tuple[str, ...]:
        return ("_maps",)

    def _map(self) -> _Mapped:
        """Map the file, load the bins' offsets into RAM and check them (once per process)."""
        if self._maps is None:
            mapped = MappedFile(self.path)
            tokens = mapped.view(self.token_dtype, HEADER_SIZE, self.num_tokens)
            if self.footer is None:  # a plain pbin: one document per bin, tokens only
                index = self.file.index() // self.file.token_width
                token_offsets = np.concatenate(([0], np.cumsum(index[:, 1])))
                self._maps = _Mapped(tokens, None, None, memoryview(token_offsets), None,
                                     mapped.fd, ReadAdvice(mapped.fd), token_offsets, None,
                                     index[:, 0].copy(), 0, 0, mapped)
                return self._maps
            base = self.file.index_offset
            at = {name: base + where[0] for name, where in self.footer["sections"].items()}
            token_offsets = load_array(self.path, "<i8", at["token_offsets"], self.num_bins + 1)
            seq_offsets = load_array(self.path, "<i8", at["seq_offsets"], self.num_bins + 1)
            bad = ((token_offsets[:-1] < 0) | (token_offsets[:-1] >= token_offsets[1:])
                   | (token_offsets[1:] > self.num_tokens) | (seq_offsets[:-1] < 0)
                   | (seq_offsets[:-1] >= seq_offsets[1:]) | (seq_offsets[1:] > self.num_seqs))
            if bad.any():
                i = int(np.argmax(bad))
                raise FormatError(f"{self.path}: bin {i}: trailer offsets {int(token_offsets[i])}:"
                                  f"{int(token_offsets[i + 1])} / {int(seq_offsets[i])}:"
                                  f"{int(seq_offsets[i + 1])} fall outside the data (corrupted)")
            self._maps = _Mapped(
                tokens, mapped.view("|u1", at["loss_mask"], self.num_tokens),
                mapped.view("<i4", at["seq_starts"], self.num_seqs), memoryview(token_offsets),
                memoryview(seq_offsets), mapped.fd, ReadAdvice(mapped.fd), token_offsets,
                seq_offsets, None,
                at["loss_mask"], at["seq_starts"], mapped)
        return self._maps

    def read_bin(self, index: int) -> PackedBin:
        m = self._maps if self._maps is not None else self._map()
        if not 0 <= index < self.num_bins:  # the common case skips the general check
            index = self.check_index(index)
        if m.loss is None:
            return self._document(m, index)
        tokens, loss, starts, token_offsets, seq_offsets, fd, advice = m[:7]
        t0 = token_offsets[index]
        t1 = token_offsets[index + 1]
        s0 = seq_offsets[index]
        s1 = seq_offsets[index + 1]
        width = self.file.token_width
        if advice.first(HEADER_SIZE + width * t0, width * (t1 - t0)):  # cold: the rest too
            advise(fd, m.loss_at + t0, t1 - t0)
            advise(fd, m.starts_at + 4 * s0, 4 * (s1 - s0))
        return _new(PackedBin, (tokens[t0:t1], loss[t0:t1], starts[s0:s1]))

    def _document(self, m: _Mapped, i: int) -> PackedBin:
        """Document ``i`` of a plain pbin as a bin learning every next token."""
        start = int(m.doc_starts[i])
        n = m.token_offsets[i + 1] - m.token_offsets[i]
        if n == 0:
            raise FormatError(f"{self.path}: document {i} is empty: not a bin")
        m.advice.first(HEADER_SIZE + self.file.token_width * start, self.file.token_width * n)
        loss = np.ones(n, dtype=np.uint8)
        loss[-1:] = 0
        return PackedBin(m.tokens[start : start + n], loss, np.zeros(1, dtype=np.int32))

    def read_bins(self, indices: Any) -> list[PackedBin]:
        """A batch: :meth:`read_bin` without its per-call overhead (one loop, no dispatch)."""
        m = self._maps if self._maps is not None else self._map()
        if m.loss is None:
            return [self._document(m, self.check_index(i)) for i in index_list(indices)]
        tokens, loss, starts, token_offsets, seq_offsets, fd, advice = m[:7]
        width, loss_at, starts_at, count = (self.file.token_width, m.loss_at, m.starts_at,
                                            self.num_bins)
        out = []
        for index in index_list(indices):
            if not 0 <= index < count:
                index = self.check_index(index)
            t0 = token_offsets[index]
            t1 = token_offsets[index + 1]
            s0 = seq_offsets[index]
            s1 = seq_offsets[index + 1]
            if advice.first(HEADER_SIZE + width * t0, width * (t1 - t0)):
                advise(fd, loss_at + t0, t1 - t0)
                advise(fd, starts_at + 4 * s0, 4 * (s1 - s0))
            out.append(_new(PackedBin, (tokens[t0:t1], loss[t0:t1], starts[s0:s1])))
        return out

    def iter_bins(self) -> Iterator[PackedBin]:
        """Every bin in order, with the kernel's sequential readahead while it lasts."""
        m = self._map()
        read = (lambda i: self._document(m, i)) if m.loss is None else self._view_bin
        return scan(read, self.num_bins, (m.file.map,))

    def _view_bin(self, i: int) -> PackedBin:
        m = self._map()
        t0, t1 = m.token_offsets[i], m.token_offsets[i + 1]
        s0, s1 = m.seq_offsets[i], m.seq_offsets[i + 1]
        return _new(PackedBin, (m.tokens[t0:t1], m.loss[t0:t1], m.starts[s0:s1]))

    def packed_lengths(self) -> np.ndarray:
        return np.diff(self._map().token_offsets_array)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "token_width": self.file.token_width, "lossy": self.lossy}

    def validate(self) -> dict[str, Any]:
        """Checksum, the pickled index against the trailer, token range, every bin invariant."""
        index = self.file.index()
        if self.footer is not None:
            self._verify_checksum()
        m = self._map()
        offsets = m.token_offsets_array
        if self.footer is not None:
            width = self.file.token_width
            expected = np.stack([offsets[:-1] * width, np.diff(offsets) * width], axis=1)
            if index.shape != expected.shape or not np.array_equal(index, expected):
                raise FormatError(f"{self.path}: the pickled index disagrees with the packlab "
                                  "trailer (corrupted)")
        elif offsets[-1] != self.num_tokens:
            raise FormatError(f"{self.path}: documents cover {offsets[-1]} tokens, not all "
                              f"{self.num_tokens}")
        with sequential(m.file.map):
            for lo in range(0, self.num_bins, _CHECK_CHUNK):
                hi = min(lo + _CHECK_CHUNK, self.num_bins)
                self._check_chunk(lo, hi, offsets)
        return {"format": FORMAT, "num_bins": self.num_bins, "num_tokens": self.num_tokens,
                "pack_size": self.pack_size, "token_width": self.file.token_width,
                "lossy": self.lossy, "bytes_on_disk": self.bytes_on_disk()}

    def _check_chunk(self, lo: int, hi: int, offsets: np.ndarray) -> None:
        m = self._map()
        tok = offsets[lo : hi + 1] - offsets[lo]
        if self.footer is None:
            ones = np.arange(hi - lo + 1, dtype=np.int64)
            check_csr(tok, ones, np.zeros(hi - lo, dtype=np.int64), None,
                      pack_size=self.pack_size, source=str(self.path), first_bin=lo)
            return
        so = m.seq_offsets_array[lo : hi + 1]
        t0, t1 = int(offsets[lo]), int(offsets[hi])
        check_csr(tok, so - so[0], m.starts[so[0] : so[-1]], m.loss[t0:t1],
                  pack_size=self.pack_size, source=str(self.path), first_bin=lo)
        if self.vocab_size and t1 > t0 and int(m.tokens[t0:t1].max()) >= self.vocab_size:
            pos = int(np.argmax(m.tokens[t0:t1] >= self.vocab_size))
            b = lo + int(np.searchsorted(tok, pos, side="right") - 1)
            raise FormatError(f"{self.path}: bin {b}: token id outside the vocabulary "
                              f"[0, {self.vocab_size})")

    def _verify_checksum(self) -> None:
        assert self.footer is not None
        digest = hashlib.sha256()
        end = self.footer["footer_offset"]
        with open(self.path, "rb") as f:
            f.seek(HEADER_SIZE)
            remaining = end - HEADER_SIZE
            while remaining > 0 and (block := f.read(min(COPY_CHUNK, remaining))):
                digest.update(block)
                remaining -= len(block)
        if digest.hexdigest() != self.footer.get("sha256"):
            raise FormatError(f"{self.path}: checksum mismatch (corrupted)")
