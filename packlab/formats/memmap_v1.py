"""Format ``memmap_v1`` (RFC Option A): a directory of padded fixed-shape ``.npy`` arrays.

One shard is one directory (manifest ``format`` is ``memmap_padded_v1``, as in the design)::

    input_ids.npy    <i4 [num_bins, pack_size]   tokens, zero padded after packed_len
    loss_mask.npy    |u1 [num_bins, pack_size]   0/1, zero padded
    packed_len.npy   <u4 [num_bins]              tokens in each bin
    seq_offsets.npy  <u4 [num_bins + 1]          CSR pointers into seq_starts
    seq_starts.npy   <u4 [num_seqs]              seq_start_id of every bin, concatenated
    checksums.npy    <u8 [num_bins]              each bin's xxh3_64 (packlab.bins.bin_checksum:
                                                 its packed_len tokens as int32, mask, starts)
    manifest.json    written last: format, version, num_bins, pack_size, dtypes (with byte
                     order), "bin_checksum": "xxh3_64", and for every file its bytes and sha256

Shards written before per-bin checksums have no ``checksums.npy`` (and no ``bin_checksum``):
they open and read as before; ``verify=True`` refuses them (``validate`` checks their files).

Writer: rows go to the files through ordinary buffered writes (no memory map, so the
process's RSS does not grow with the pages it wrote) and are hashed as they are written. The
``.npy`` headers leave room for any row count (numpy pads them for that), so the number of
bins need not be known up front: when it is not, the header is rewritten at finalize and the
file hashed once more. The directory is built under a temporary name and published with ONE
rename (the design's five renames can leave a mix after a crash).

Reader: the manifest at construction; in each process, on first read, the data files mapped
and the index (``packed_len``, ``seq_offsets``, the starts) read into RAM and checked, through
:mod:`packlab.formats.bintable` (the read path of every memory-mapped format), so the reader
pickles without them and a cold read waits for the bin's tokens and mask only. Bins are
read-only views of the maps, valid after the reader is closed. ``verify=True`` checks each
bin's checksum and mask as it is read.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
from numpy.lib import format as npy_format

from packlab.bins import CHECKSUM, PackedBin, records_checksum, stored_checksum
from packlab.errors import FormatError, PacklabError
from packlab.files import HashedFile, fsync_directory, fsync_file, read_json, verify_files
from packlab.formats.base import (
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    read_directory_manifest,
)
from packlab.formats.bintable import (
    Column,
    Layout,
    TableReads,
    check_checksums,
    refuse_unverifiable,
)
from packlab.invariants import check_csr
from packlab.mapping import MappedFile, load_array, sequential
from packlab.safe_pickle import read_npy_header

FORMAT = "memmap_v1"
SUFFIX = ""
MANIFEST_FORMAT = "memmap_padded_v1"
VERSION = "1.0"
MANIFEST = "manifest.json"
DTYPES: dict[str, np.dtype] = {
    "input_ids": np.dtype("<i4"),
    "loss_mask": np.dtype("|u1"),
    "packed_len": np.dtype("<u4"),
    "seq_offsets": np.dtype("<u4"),
    "seq_starts": np.dtype("<u4"),
}
FILES = {name: f"{name}.npy" for name in DTYPES}
CHECKSUMS = "checksums.npy"  # <u8 per bin (absent in shards written before per-bin checksums)
CHECKSUM_DTYPE = np.dtype("<u8")
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
_VALIDATE_CHUNK_BYTES = 32 << 20  # validate() holds this much of the padded arrays at a time


def detect(path: Path) -> bool:
    """A directory whose manifest says ``memmap_padded_v1`` (or, unreadable, beside input_ids.npy)."""
    if not path.is_dir():
        return False
    try:
        manifest = read_json(path / MANIFEST)
        return isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT
    except FormatError:
        return (path / FILES["input_ids"]).is_file()  # unfinished or damaged: let the reader say


class MemmapFacts(FormatFacts):
    """What ``memmap_v1`` is: a padded memmap shard (RFC Option A)."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    MANIFEST = MANIFEST
    MANIFEST_FORMAT = MANIFEST_FORMAT
    FILES = (*FILES.values(), CHECKSUMS)
    ZERO_COPY = True
    PADDED = True
    detect = staticmethod(detect)


def npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The ``.npy`` v1.0 header for an array; its length does not depend on the first axis."""
    buffer = io.BytesIO()
    npy_format.write_array_header_1_0(
        buffer, {"descr": npy_format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape})
    return buffer.getvalue()


def sha256_small_buffer(path: Path, chunk: int = 1 << 20) -> str:
    """SHA-256 of a file read into one reused buffer: no allocation per block, flat RSS."""
    digest = hashlib.sha256()
    buffer = bytearray(chunk)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


class NpyStream:
    """A ``.npy`` file written row by row, hashed on the way; the row count fixed at close."""

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...],
                 rows: int | None) -> None:
        self.path = path
        self.dtype = dtype
        self.row_shape = row_shape
        self.row_size = int(np.prod(row_shape, dtype=np.int64))
        self.header = npy_header(dtype, (rows or 0, *row_shape))
        self.file = HashedFile(path)
        self.file.write(self.header)
        self.values = 0

    def write(self, values: np.ndarray) -> None:
        """Append values (already of ``dtype``; whole rows)."""
        self.file.write(values)
        self.values += values.size

    def close(self) -> dict[str, Any]:
        """Finish the file; the manifest entry (bytes, sha256)."""
        entry = self.file.close()
        header = npy_header(self.dtype, (self.values // self.row_size, *self.row_shape))
        if header == self.header:
            return entry
        if len(header) != len(self.header):  # cannot happen below 10**21 rows; never guess
            raise PacklabError(f"{self.path}: .npy header grew; cannot rewrite it in place")
        with open(self.path, "r+b") as f:
            f.write(header)
        fsync_file(self.path)
        return {"bytes": self.path.stat().st_size, "sha256": sha256_small_buffer(self.path)}

    def discard(self) -> None:
        self.file.discard()


class Writer(MemmapFacts, ShardWriter):
    """Streams padded rows into the five ``.npy`` files; memory is one bin of scratch."""

    def _open(self) -> None:
        self.tmp_path.mkdir()
        n, p = self.expected_bins, self.pack_size
        row = (p,)
        self._streams = {
            "input_ids": NpyStream(self.tmp_path / FILES["input_ids"], DTYPES["input_ids"], row, n),
            "loss_mask": NpyStream(self.tmp_path / FILES["loss_mask"], DTYPES["loss_mask"], row, n),
            "packed_len": NpyStream(self.tmp_path / FILES["packed_len"], DTYPES["packed_len"],
                                    (), n),
            "seq_offsets": NpyStream(self.tmp_path / FILES["seq_offsets"], DTYPES["seq_offsets"],
                                     (), None if n is None else n + 1),
            "seq_starts": NpyStream(self.tmp_path / FILES["seq_starts"], DTYPES["seq_starts"],
                                    (), None),
            "checksums": NpyStream(self.tmp_path / CHECKSUMS, CHECKSUM_DTYPE, (), n),
        }
        self._checksum = np.zeros(1, dtype=CHECKSUM_DTYPE)
        self._ids_row = np.zeros(p, dtype=DTYPES["input_ids"])
        self._mask_row = np.zeros(p, dtype=DTYPES["loss_mask"])
        self._len = np.zeros(1, dtype=DTYPES["packed_len"])
        self._offset = np.zeros(1, dtype=DTYPES["seq_offsets"])
        self._row_used = 0
        self._num_starts = 0
        self._streams["seq_offsets"].write(self._offset)

    def _write(self, packed: PackedBin) -> None:
        ids, mask, starts = packed
        n = int(ids.shape[0])
        if not 0 < n <= self.pack_size or mask.shape != ids.shape:  # even with check=False
            raise PacklabError(f"{self.path}: bin {self.bins_written}: {n} tokens and "
                               f"{mask.shape[0]} mask values for pack_size {self.pack_size}")
        if ids.dtype.itemsize >= 4 and ids.dtype != DTYPES["input_ids"]:
            if int(ids.max()) > _INT32_MAX or int(ids.min()) < 0:
                raise PacklabError(f"{self.path}: bin {self.bins_written}: token ids outside "
                                   f"[0, {_INT32_MAX}] do not fit {DTYPES['input_ids']}")
        self._num_starts += int(starts.shape[0])
        if self._num_starts > _UINT32_MAX:
            raise PacklabError(f"{self.path}: more than {_UINT32_MAX} sequences in one shard "
                               "(seq_offsets is uint32): use more shards")
        self._ids_row[:n] = ids
        self._mask_row[:n] = mask
        if n < self._row_used:  # zero only what the previous bin left behind
            self._ids_row[n:self._row_used] = 0
            self._mask_row[n:self._row_used] = 0
        self._row_used = n
        self._len[0] = n
        self._offset[0] = self._num_starts
        self._streams["input_ids"].write(self._ids_row)
        self._streams["loss_mask"].write(self._mask_row)
        self._streams["packed_len"].write(self._len)
        self._streams["seq_starts"].write(starts.astype(DTYPES["seq_starts"], copy=False))
        self._streams["seq_offsets"].write(self._offset)
        self._checksum[0] = stored_checksum(self._ids_row[:n], self._mask_row[:n], starts, "<i4")
        self._streams["checksums"].write(self._checksum)

    def _close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        files = {stream.path.name: stream.close() for stream in self._streams.values()}
        manifest = {
            **manifest,
            "format": MANIFEST_FORMAT,
            "packlab_format": FORMAT,
            "version": VERSION,
            "dtypes": {name: dt.str for name, dt in DTYPES.items()},
            # the keys the design's reader and manifest use, kept for compatibility
            "dtype": DTYPES["input_ids"].str,
            "loss_mask_dtype": "<u1",
            "index_dtype": DTYPES["packed_len"].str,
            "bins_written": self.bins_written,
            "bin_checksum": CHECKSUM,
            "files": files,
        }
        manifest_path = self.tmp_path / MANIFEST
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        fsync_file(manifest_path)
        fsync_directory(self.tmp_path)
        return manifest

    def _discard(self) -> None:
        for stream in getattr(self, "_streams", {}).values():
            stream.discard()


def read_manifest(path: Path) -> dict[str, Any]:
    """The shard's manifest, checked; every error names the file."""
    manifest_path = path / MANIFEST
    manifest = read_directory_manifest(path, MANIFEST, kind="memmap",
                                       expect={"format": MANIFEST_FORMAT, "version": VERSION})
    for key in ("num_bins", "pack_size", "num_seqs", "num_tokens"):
        count_field(manifest, key, manifest_path)
    if manifest["num_bins"] == 0 or manifest["pack_size"] == 0:
        raise FormatError(f"{manifest_path}: empty shard (num_bins or pack_size is 0)")
    dtypes = manifest.get("dtypes")
    if dtypes != {name: dt.str for name, dt in DTYPES.items()}:
        raise FormatError(f"{manifest_path}: dtypes {dtypes}, this packlab reads "
                          f"{ {name: dt.str for name, dt in DTYPES.items()} }")
    files = manifest.get("files")
    expected = set(FILES.values()) | ({CHECKSUMS} if "bin_checksum" in manifest else set())
    if not isinstance(files, dict) or set(files) != expected:
        raise FormatError(f"{manifest_path}: 'files' must list {sorted(expected)}")
    records_checksum(manifest, manifest_path)
    return manifest


class Reader(MemmapFacts, TableReads, ShardReader):
    """Lazy, picklable reader; O(1) access to any bin through the memory maps.

    Bins are read-only views of the maps (valid after the reader is closed: each keeps its
    map alive). The index (``packed_len``, ``seq_offsets`` and every bin's starts: about 30
    bytes per bin) is read into RAM and checked on first use (:mod:`packlab.formats.bintable`),
    so a cold read waits for the bin's tokens and mask only. ``verify=True``: each bin read is
    checked against its checksum (:meth:`~packlab.formats.bintable.BinTable.check`).
    """

    @property
    def metadata(self) -> dict[str, Any]:
        found = self.manifest.get("metadata")
        return found if isinstance(found, dict) else {}

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        super().__init__(path)
        self.manifest = read_manifest(self.path)
        self.num_bins = int(self.manifest["num_bins"])
        self.pack_size = int(self.manifest["pack_size"])
        self.num_tokens = int(self.manifest["num_tokens"])
        self.num_seqs = int(self.manifest["num_seqs"])
        self.has_checksums = "bin_checksum" in self.manifest
        self.verify = bool(verify)
        refuse_unverifiable(self.path, self.verify, self.has_checksums)
        verify_files(self.path, self.manifest["files"], checksums=False)  # sizes: a few stats
        self._table = None

    def _handles(self) -> tuple[str, ...]:
        return ("_table",)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape each file must have, from the manifest."""
        n, p = self.num_bins, self.pack_size
        return {"input_ids": (n, p), "loss_mask": (n, p), "packed_len": (n,),
                "seq_offsets": (n + 1,), "seq_starts": (self.num_seqs,)}

    def _layout(self) -> Layout:
        """Where the bins are (headers checked, the index read into RAM and checked)."""
        at = self._check_headers()
        p, n = self.path, self.num_bins
        lengths = load_array(p / FILES["packed_len"], "<u4", at["packed_len"], n)
        offsets = load_array(p / FILES["seq_offsets"], "<u4", at["seq_offsets"], n + 1)
        self._check_index(lengths, offsets)
        size = n * self.pack_size
        first = np.arange(n, dtype=np.int64) * self.pack_size
        offsets = offsets.astype(np.int64)

        def column(name: str, count: int) -> Column:
            return Column(p / FILES[name], DTYPES[name], at[name], count)

        return Layout(column("input_ids", size), column("loss_mask", size),
                      column("seq_starts", self.num_seqs), first, first, lengths, offsets[:-1],
                      np.diff(offsets), self.pack_size, str(self.path),
                      self.checksums() if self.verify else None)

    def checksums(self) -> np.ndarray | None:
        """Every bin's recorded checksum (uint64), or None for a shard without them."""
        if not self.has_checksums:
            return None
        file = self.path / CHECKSUMS
        with open(file, "rb") as fp:
            header = read_npy_header(fp, source=str(file))
        if header.dtype != CHECKSUM_DTYPE or header.shape != (self.num_bins,):
            raise FormatError(f"{file}: header says {header.dtype.str}{list(header.shape)}, "
                              f"expected {CHECKSUM_DTYPE.str}[{self.num_bins}]")
        return load_array(file, CHECKSUM_DTYPE, header.data_offset, self.num_bins)

    def _check_index(self, lengths: np.ndarray, offsets: np.ndarray) -> None:
        """Every packed_len in (0, pack_size], every bin's starts inside seq_starts."""
        bad = (lengths == 0) | (lengths > self.pack_size)
        if bad.any():
            k = int(np.argmax(bad))
            raise self._corrupt(k, f"packed_len {int(lengths[k])} not in (0, {self.pack_size}]")
        bad = (offsets[:-1] >= offsets[1:]) | (offsets[1:] > self.num_seqs)
        if bad.any():
            k = int(np.argmax(bad))
            raise self._corrupt(k, f"seq_offsets [{int(offsets[k])}, {int(offsets[k + 1])}) "
                                f"outside [0, {self.num_seqs}]")
        if offsets[0] != 0 or offsets[-1] != self.num_seqs:
            raise FormatError(f"{self.path / FILES['seq_offsets']}: runs from {int(offsets[0])} "
                              f"to {int(offsets[-1])}, not 0 to num_seqs {self.num_seqs} "
                              "(corrupted shard; run validate)")
        if int(lengths.sum(dtype=np.int64)) != self.num_tokens:
            raise FormatError(f"{self.path / FILES['packed_len']}: bins hold "
                              f"{int(lengths.sum(dtype=np.int64))} tokens, the manifest says "
                              f"{self.num_tokens} (corrupted shard; run validate)")

    def _corrupt(self, index: int, what: str) -> FormatError:
        return FormatError(f"{self.path}: bin {index}: {what} (corrupted shard; run validate)")

    def info(self) -> dict[str, Any]:
        return {**super().info(), "num_seqs": self.num_seqs}

    def validate(self) -> dict[str, Any]:
        """Sizes and checksums, headers, every invariant (vectorized), zero padding, and every
        bin's checksum."""
        verify_files(self.path, self.manifest["files"], checksums=True)
        layout = self._layout()  # the headers and the whole index (_check_index)
        lengths = np.asarray(layout.packed_len, dtype=np.int64)
        offsets = np.concatenate((layout.seq_start, [self.num_seqs]))
        source = str(self.path)
        step = max(1, _VALIDATE_CHUNK_BYTES // (5 * self.pack_size))
        maps = [MappedFile(column.path) for column in layout[:3]]
        ids, mask, starts = (f.view(c.dtype, c.offset, c.count)
                             for f, c in zip(maps, layout[:3], strict=True))
        with sequential(*(f.map for f in maps)):
            for a in range(0, self.num_bins, step):
                self._validate_chunk(ids, mask, starts, lengths, offsets, a,
                                     min(a + step, self.num_bins), source)
            if self.has_checksums:
                table = self.bin_table()
                assert table is not None
                check_checksums(table, self.checksums())
        return {"format": FORMAT, "path": source, "num_bins": self.num_bins,
                "num_tokens": self.num_tokens, "num_seqs": self.num_seqs,
                "pack_size": self.pack_size, "checksums": True,
                "bin_checksums": self.has_checksums}

    def _check_headers(self) -> dict[str, int]:
        """Every data file's .npy header against the manifest; where each file's data starts."""
        data_at = {}
        for name, shape in self.shapes().items():
            file = self.path / FILES[name]
            with open(file, "rb") as fp:
                header = read_npy_header(fp, source=str(file))
            size = header.data_offset + math.prod(shape) * DTYPES[name].itemsize
            if header.dtype != DTYPES[name] or header.shape != shape or header.fortran_order:
                raise FormatError(f"{file}: header says {header.dtype.str}{list(header.shape)}, "
                                  f"expected {DTYPES[name].str}{list(shape)}")
            if file.stat().st_size != size:
                raise FormatError(f"{file}: {file.stat().st_size} bytes, header and manifest "
                                  f"need {size}")
            data_at[name] = header.data_offset
        return data_at

    def _validate_chunk(self, all_ids: np.ndarray, all_mask: np.ndarray, all_starts: np.ndarray,
                        lengths: np.ndarray, offsets: np.ndarray, a: int, b: int,
                        source: str) -> None:
        """Bins a..b: check_csr on the unpadded masks, tokens non-negative, padding zero."""
        n = lengths[a:b]
        bad = (n <= 0) | (n > self.pack_size)
        if bad.any():
            k = a + int(np.argmax(bad))
            raise FormatError(f"{source}: bin {k}: packed_len {int(lengths[k])} not in "
                              f"(0, {self.pack_size}] (corrupted)")
        valid = np.arange(self.pack_size) < n[:, None]
        p = self.pack_size
        ids = all_ids[a * p:b * p].reshape(b - a, p)
        mask = all_mask[a * p:b * p].reshape(b - a, p)
        token_offsets = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(n, out=token_offsets[1:])
        check_csr(token_offsets, offsets[a:b + 1] - offsets[a],
                  all_starts[offsets[a]:offsets[b]].astype(np.int64), mask[valid],
                  pack_size=self.pack_size, source=source, first_bin=a)
        negative = (ids < 0).any(axis=1)
        if negative.any():
            raise FormatError(f"{source}: bin {a + int(np.argmax(negative))}: negative token id")
        padded = (np.where(valid, 0, ids) != 0).any(axis=1) | (np.where(valid, 0, mask) != 0).any(
            axis=1)
        if padded.any():
            raise FormatError(f"{source}: bin {a + int(np.argmax(padded))}: non-zero padding "
                              "beyond packed_len (corrupted)")

