"""Format ``pbin``: packlab's shard as a Modalities packed data file, plus a trailer.

The Modalities file itself (header, tokens, pickled index; read without running pickle code)
is :mod:`packlab.formats.pbin.codec`. How pbin fits the registry (Modalities has no loss mask
and no bins of its own), two uses:

1. ``Writer`` (the registered shard writer): one Modalities document per packed bin, so
   Modalities reads the packed rows' tokens unchanged, and a packlab *trailer* after the
   pickle carries what the format lacks. ``pickle.loads`` ignores bytes after the pickle's
   STOP, so the file stays a valid Modalities pbin. The trailer, each section 8-byte aligned::

       loss_mask      uint8[num_tokens]
       token_offsets  int64[num_bins + 1]    bin b = tokens[token_offsets[b]:token_offsets[b+1]]
       seq_offsets    int64[num_bins + 1]    CSR of the bins' seq_start_id
       seq_starts     int32[num_seqs]
       checksums      uint64[num_bins]       each bin's xxh3_64 (packlab.bins.bin_checksum)
       footer         JSON: counts, pack_size, token width, section offsets, sha256 of
                      bytes [12, footer) (the header is patched last, so it is checked by field),
                      "bin_checksum": "xxh3_64"
       <Q             footer length
       magic          b"PLKPBIN1"

   Each section is ``[start, bytes]``, ``start`` counted from the index (the byte after the
   data). For example the footer of two bins, ``[5, 6, 7]`` (sequences start at 0 and 2) and
   ``[8, 9]``, in 2-byte tokens (keys sorted, one line in the file; here the index starts at
   byte 22, so the loss mask at 56)::

       {"bin_checksum": "xxh3_64", "format": "pbin", "layout": "pbin_packlab_v1",
        "metadata": {}, "num_bins": 2, "num_seqs": 3, "num_tokens": 5, "pack_size": 4,
        "packlab_version": "0.1.0",
        "sections": {"checksums": [104, 16], "index": [0, 28], "loss_mask": [34, 5],
                     "seq_offsets": [66, 24], "seq_starts": [90, 12], "token_offsets": [42, 24]},
        "sha256": "e6379d69...b3a87b35", "sha256_of": "bytes from 12 to the footer",
        "token_width": 2, "vocab_size": 1000}

   Files written before per-bin checksums have no ``checksums`` section (and no
   ``bin_checksum``): they read as before and ``verify=True`` refuses them. The reader uses the
   trailer's arrays (opening reads the header and footer only;
   :mod:`packlab.formats.read.table` maps the file on the first read); it never needs the
   pickle. ``validate`` unpickles the index (restricted) and checks it agrees.
2. A plain Modalities file (:func:`packlab.formats.pbin.codec.write_pbin` exports a spool as
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

from packlab.bins import CHECKSUM, PackedBin, check_csr, records_checksum, stored_checksum
from packlab.errors import FormatError, PacklabError
from packlab.formats.pbin.codec import (
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
from packlab.formats.read.shard_reads import reads_for
from packlab.formats.read.table import (
    BinTable,
    Column,
    CsrIndex,
    FileReads,
    Placement,
    TableReads,
    refuse_unverifiable,
)
from packlab.formats.shared.base import (
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    ends_with,
)
from packlab.formats.shared.scratch import ScratchArray
from packlab.storage.files import parse_json, temporary_sibling
from packlab.storage.location import Location
from packlab.storage.reads import MappedFile, ReadAdvice, scan

FORMAT = "pbin"
VERSION = "pbin_packlab_v1"  # the footer's "layout" key
TRAILER_MAGIC = b"PLKPBIN1"
TAIL = struct.Struct("<Q8s")  # footer JSON length, magic
_CHECK_CHUNK = 1 << 16
_COPY_VALUES = 1 << 20  # values moved per step from the scratch files into the trailer


def detect(location: Location) -> bool:
    """A file named ``*.pbin``, or any file ending with packlab's pbin trailer magic."""
    return location.suffix == SUFFIX or ends_with(location, TRAILER_MAGIC,
                                                  min_size=HEADER_SIZE + TAIL.size)


class PbinFacts(FormatFacts):
    """What ``pbin`` is: a Modalities packed data file with packlab's trailer."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    READ_BY = ("Modalities",)
    RAW_RUNS = True
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
    footer = parse_json(f.read(length), path, unreadable="unreadable packlab footer")
    if not isinstance(footer, dict) or footer.get("layout") != VERSION:
        raise FormatError(f"{path}: packlab footer of unknown version {footer.get('layout')!r}"
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
            "sums": ScratchArray(Path(f"{scratch}.sums"), "<u8"),
        }

    def _write(self, packed: PackedBin) -> None:
        tokens = packed.input_ids
        lo, hi = int(tokens.min()), int(tokens.max())
        if lo < 0 or hi > np.iinfo(self.token_dtype).max:
            raise PacklabError(f"{self.path}: bin {self.bins_written}: token ids {lo}..{hi} do "
                               f"not fit {self.token_width}-byte tokens (vocab_size "
                               f"{self.vocab_size}); pass token_width=4")
        tokens = np.ascontiguousarray(tokens, dtype=self.token_dtype)
        self._out.write(tokens)
        self._scratch["sums"].append(np.array([stored_checksum(
            tokens, packed.loss_mask, packed.seq_start_id, self.token_dtype)], dtype=np.uint64))
        self._scratch["lengths"].append(np.array([tokens.shape[0]]))
        self._scratch["nseqs"].append(np.array([packed.seq_start_id.shape[0]]))
        self._scratch["starts"].append(packed.seq_start_id)
        self._scratch["loss"].append(packed.loss_mask)

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
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
            ("loss_mask", self._scratch["loss"].chunks(_COPY_VALUES)),  # uint8[num_tokens]
            ("token_offsets", _running_offsets(self._scratch["lengths"])),  # int64[num_bins + 1]
            ("seq_offsets", _running_offsets(self._scratch["nseqs"])),  # int64[num_bins + 1]
            ("seq_starts", self._scratch["starts"].chunks(_COPY_VALUES)),  # int32[num_seqs]
            ("checksums", self._scratch["sums"].chunks(_COPY_VALUES)),  # uint64[num_bins]
        ):
            out.align()
            start = out.bytes
            for chunk in chunks:
                out.write(chunk)
            sections[name] = [start - index_offset, out.bytes - start]
        record.update(layout=VERSION, token_width=self.token_width, vocab_size=self.vocab_size,
                        bin_checksum=CHECKSUM, sections=sections, sha256=out.hexdigest(),
                        sha256_of="bytes from 12 to the footer")
        footer = json.dumps(record, sort_keys=True).encode()
        out.write(footer + TAIL.pack(len(footer), TRAILER_MAGIC), hashed=False)
        finish_output(out, data_len, self.token_width)
        for scratch in self._scratch.values():
            scratch.discard()
        return record

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
    for chunk in counts.chunks(_COPY_VALUES):
        ends = np.cumsum(chunk, dtype=np.int64) + total
        total = int(ends[-1])
        yield ends


class _Documents(NamedTuple):
    """A plain pbin's documents, mapped: each one bin learning every next token."""

    tokens: np.ndarray
    token_offsets: np.ndarray  # int64[num_docs + 1], running sum of the lengths
    doc_starts: np.ndarray  # where each document starts (tokens)
    advice: ReadAdvice
    file: MappedFile


class Reader(PbinFacts, TableReads, ShardReader):
    """Bins of a packlab pbin from its trailer (arrays of their own, valid after close).

    On first read (in each process) the file is opened and every bin's structure checked over
    the trailer's offsets (:mod:`packlab.formats.read.table`). ``verify=True``: each bin
    read is checked against its checksum.

    A plain pbin (no trailer) is refused unless ``lossy=True``: then each document is one bin
    learning every next token (see the module docstring); ``pack_size`` defaults to the longest.
    """

    RECORD_ATTRIBUTE = "footer"  # packlab's record, None in a file another program wrote

    def __init__(self, path: str | os.PathLike[str], *, lossy: bool = False,
                 pack_size: int | None = None, verify: bool = False) -> None:
        super().__init__(path)
        self.file = PbinFile(self.path)
        self.footer = self.file.footer
        self.lossy = self.footer is None
        self.token_dtype = self.file.token_dtype
        self.verify = bool(verify)
        self.has_checksums = False
        self._table = None
        self._docs: _Documents | None = None
        if self.footer is None:
            if not lossy:
                self.file.index()  # a cut trailer or index is damage: said as such
                raise FormatError(
                    f"{self.path}: a Modalities pbin without packlab's trailer (token "
                    "documents only: no loss masks, no packed bins), so not a shard to train "
                    "from (packlab pack --format pbin writes one)")
            lengths = self.file.index()[:, 1] // self.file.token_width
            self.num_bins = int(lengths.shape[0])
            self.num_tokens = int(lengths.sum())
            self.pack_size = int(pack_size or (lengths.max() if lengths.size else 0))
            self.vocab_size: int | None = None
        else:
            self._read_footer_fields()
        refuse_unverifiable(self.path, self.verify, self.has_checksums)

    def _read_footer_fields(self) -> None:
        footer = self.footer
        assert footer is not None
        for key in ("pack_size", "num_bins", "num_tokens", "num_seqs", "token_width"):
            count_field(footer, key, f"{self.path}: packlab footer")
        self.pack_size = footer["pack_size"]
        self.num_bins = footer["num_bins"]
        self.num_tokens = footer["num_tokens"]
        self.num_seqs = footer["num_seqs"]
        self.vocab_size = footer.get("vocab_size")
        if self.vocab_size is not None:
            count_field(footer, "vocab_size", f"{self.path}: packlab footer", minimum=1)
        if (self.file.token_width, self.file.num_tokens) != (footer["token_width"],
                                                             self.num_tokens):
            raise FormatError(f"{self.path}: header says {self.file.num_tokens} tokens of "
                              f"{self.file.token_width} bytes, the footer {self.num_tokens} of "
                              f"{footer['token_width']} (corrupted)")
        expected = {"loss_mask": self.num_tokens, "token_offsets": 8 * (self.num_bins + 1),
                    "seq_offsets": 8 * (self.num_bins + 1), "seq_starts": 4 * self.num_seqs}
        self.has_checksums = records_checksum(footer, self.path)
        if self.has_checksums:
            expected["checksums"] = 8 * self.num_bins
        sections = footer.get("sections", {})
        base = self.file.index_offset
        for name, nbytes in expected.items():
            where = sections.get(name)
            if (not isinstance(where, list) or len(where) != 2 or where[1] != nbytes
                    or isinstance(where[0], bool) or not isinstance(where[0], int)
                    or where[0] < 0 or base + where[0] + nbytes > footer["footer_offset"]):
                raise FormatError(f"{self.path}: packlab trailer section {name!r} is missing, "
                                  "of the wrong size or past the footer (corrupted)")

    def _handles(self) -> tuple[str, ...]:
        return ("_table", "_docs")

    def _at(self) -> dict[str, int]:
        """Byte offset of each trailer section in the file."""
        assert self.footer is not None
        base = self.file.index_offset
        return {name: base + where[0] for name, where in self.footer["sections"].items()}

    def _placement(self, reads: FileReads) -> Placement | None:
        """Where a packlab pbin's bins are: the trailer's offsets and starts, read as sliced
        (None for a plain pbin: its documents are served one by one)."""
        if self.footer is None:
            return None
        at, n, p = self._at(), self.num_bins, self.path
        index = CsrIndex(reads.values(p, "<i8", at["token_offsets"], n + 1),
                         reads.values(p, "<i8", at["seq_offsets"], n + 1))
        checksum = (reads.lookups(p, "<u8", at["checksums"], n)
                    if self.has_checksums else None)
        return Placement(Column(p, self.token_dtype, HEADER_SIZE, self.num_tokens),
                      Column(p, np.dtype("|u1"), at["loss_mask"], self.num_tokens),
                      Column(p, np.dtype("<i4"), at["seq_starts"], self.num_seqs),
                      index, self.pack_size, str(p), checksum)

    def _documents(self) -> _Documents:
        """A plain pbin's documents, mapped (once per process)."""
        if self._docs is None:
            mapped = MappedFile(self.path)
            index = self.file.index() // self.file.token_width
            self._docs = _Documents(mapped.view(self.token_dtype, HEADER_SIZE, self.num_tokens),
                                    np.concatenate(([0], np.cumsum(index[:, 1]))),
                                    index[:, 0].copy(), ReadAdvice(mapped.fd), mapped)
        return self._docs

    def _untabled_bin(self, i: int) -> PackedBin:
        """Document ``i`` of a plain pbin as a bin learning every next token."""
        docs = self._documents()
        start = int(docs.doc_starts[i])
        n = int(docs.token_offsets[i + 1] - docs.token_offsets[i])
        if n == 0:
            raise FormatError(f"{self.path}: document {i} is empty: not a bin")
        docs.advice.first(HEADER_SIZE + self.file.token_width * start, self.file.token_width * n)
        loss = np.ones(n, dtype=np.uint8)
        loss[-1:] = 0
        return PackedBin(docs.tokens[start : start + n], loss, np.zeros(1, dtype=np.int32))

    def _untabled_iter(self) -> Iterator[PackedBin]:
        return scan(self._untabled_bin, self.num_bins, (self._documents().file,))

    def _untabled_lengths(self) -> np.ndarray:
        return np.diff(self._documents().token_offsets)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "token_width": self.file.token_width, "lossy": self.lossy}

    def validate(self) -> dict[str, Any]:
        """Checksum, the pickled index against the trailer, token range, every bin invariant,
        every bin's checksum."""
        index = self.file.index()
        if self.footer is None:
            offsets = self._documents().token_offsets
            if offsets[-1] != self.num_tokens:
                raise FormatError(f"{self.path}: documents cover {offsets[-1]} tokens, not all "
                                  f"{self.num_tokens}")
            for lo in range(0, self.num_bins, _CHECK_CHUNK):
                hi = min(lo + _CHECK_CHUNK, self.num_bins)
                tok = offsets[lo : hi + 1] - offsets[lo]
                check_csr(tok, np.arange(hi - lo + 1, dtype=np.int64),
                          np.zeros(hi - lo, dtype=np.int64), None, pack_size=self.pack_size,
                          source=str(self.path), first_bin=lo)
            return self._summary()
        self._verify_checksum()
        reads = reads_for(self.location)
        placement = self._placement(reads)
        assert placement is not None
        table = BinTable.from_placement(placement, reads, check=False)
        table.check_contents(token_limit=self.vocab_size  # every invariant of every bin
                             or int(np.iinfo(self.token_dtype).max) + 1)
        offsets = np.concatenate(([0], np.cumsum(table.packed_lengths())))
        width = self.file.token_width
        expected = np.stack([offsets[:-1] * width, np.diff(offsets) * width], axis=1)
        if index.shape != expected.shape or not np.array_equal(index, expected):
            raise FormatError(f"{self.path}: the pickled index disagrees with the packlab "
                              "trailer (corrupted)")
        if placement.checksum is not None:
            table.check_checksums(placement.checksum)
        return self._summary()

    def _summary(self) -> dict[str, Any]:
        return {"format": FORMAT, "num_bins": self.num_bins, "num_tokens": self.num_tokens,
                "pack_size": self.pack_size, "token_width": self.file.token_width,
                "lossy": self.lossy, "bytes_on_disk": self.bytes_on_disk(),
                "bin_checksums": self.has_checksums}

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
