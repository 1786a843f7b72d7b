"""Format ``memmap_v1`` (RFC Option A): a directory of padded fixed-shape ``.npy`` arrays.

One shard is one directory (manifest ``format`` is ``memmap_padded_v1``, as in the design)::

    input_ids.npy    <i4 [num_bins, pack_size]   tokens, zero padded after packed_len
    loss_mask.npy    |u1 [num_bins, pack_size]   0/1, zero padded
    packed_len.npy   <u4 [num_bins]              tokens in each bin
    seq_offsets.npy  <u4 [num_bins + 1]          CSR pointers into seq_starts
    seq_starts.npy   <u4 [num_seqs]              seq_start_id of every bin, concatenated
    manifest.json    written last: format, version, num_bins, pack_size, dtypes (with byte
                     order), and for every file its bytes and sha256

Writer: rows go to the files through ordinary buffered writes (no memory map, so the
process's RSS does not grow with the pages it wrote) and are hashed as they are written. The
``.npy`` headers leave room for any row count (numpy pads them for that), so the number of
bins need not be known up front: when it is not, the header is rewritten at finalize and the
file hashed once more. The directory is built under a temporary name and published with ONE
rename (the design's five renames can leave a mix after a crash).

Reader: the manifest at construction; in each process, on first read, the data files mapped
(advised for random access, see :mod:`packlab.mapping`) and the index (``packed_len``,
``seq_offsets``) read into RAM and checked, so the reader pickles without them and a cold read
waits for the bin's own bytes only. Bins are read-only views of the maps, valid after the
reader is closed; ``read_bins`` gathers the index of a whole batch at once.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from numpy.lib import format as npy_format

from packlab.bins import PackedBin
from packlab.errors import FormatError, PacklabError
from packlab.files import HashedFile, fsync_directory, fsync_file, read_json, verify_files
from packlab.formats.base import (
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    index_list,
    read_directory_manifest,
)
from packlab.invariants import check_csr
from packlab.mapping import MappedFile, ReadAdvice, advise, load_array, scan, sequential
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
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
_VALIDATE_CHUNK_BYTES = 32 << 20  # validate() holds this much of the padded arrays at a time
_new = tuple.__new__  # PackedBin without NamedTuple.__new__'s Python frame (hot path)


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
    FILES = tuple(FILES.values())
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
        }
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

    def _close(self, manifest: dict[str, Any]) -> dict[str, Any]:
        files = {FILES[name]: stream.close() for name, stream in self._streams.items()}
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
    if not isinstance(files, dict) or set(files) != set(FILES.values()):
        raise FormatError(f"{manifest_path}: 'files' must list {sorted(FILES.values())}")
    return manifest


class _Mapped(NamedTuple):
    """One process's view of a shard: the data mapped (views), the index in RAM."""

    ids: np.ndarray  # int32[num_bins * pack_size]: input_ids.npy's rows, flattened
    mask: np.ndarray  # uint8, the same shape
    starts: np.ndarray  # int32 view of seq_starts.npy (every start is below pack_size)
    lengths: np.ndarray  # uint32[num_bins], in RAM
    offsets: np.ndarray  # uint32[num_bins + 1], in RAM
    length_of: memoryview  # the same two as memoryviews: indexing one gives a Python int
    offset_of: memoryview
    files: tuple[MappedFile, MappedFile, MappedFile]  # input_ids, loss_mask, seq_starts
    fds: tuple[int, int, int]  # their descriptors, for read advice
    bases: tuple[int, int, int]  # where each file's data starts (after its .npy header)
    advice: ReadAdvice  # when to advise input_ids.npy before a read


class Reader(MemmapFacts, ShardReader):
    """Lazy, picklable reader; O(1) access to any bin through the memory maps.

    Bins are read-only views of the maps (valid after the reader is closed: each keeps its
    map alive). The index (``packed_len``, ``seq_offsets``: 8 bytes per bin) is read into RAM
    and checked on first use, so a cold read waits for the bin's bytes only; see
    :mod:`packlab.mapping` for how those are fetched.
    """

    @property
    def metadata(self) -> dict[str, Any]:
        found = self.manifest.get("metadata")
        return found if isinstance(found, dict) else {}

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.manifest = read_manifest(self.path)
        self.num_bins = int(self.manifest["num_bins"])
        self.pack_size = int(self.manifest["pack_size"])
        self.num_tokens = int(self.manifest["num_tokens"])
        self.num_seqs = int(self.manifest["num_seqs"])
        verify_files(self.path, self.manifest["files"], checksums=False)  # sizes: a few stats
        self._arrays: _Mapped | None = None

    def _handles(self) -> tuple[str, ...]:
        return ("_arrays",)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape each file must have, from the manifest."""
        n, p = self.num_bins, self.pack_size
        return {"input_ids": (n, p), "loss_mask": (n, p), "packed_len": (n,),
                "seq_offsets": (n + 1,), "seq_starts": (self.num_seqs,)}

    def _maps(self) -> _Mapped:
        """Map the data and load the index (once per process)."""
        if self._arrays is None:
            at = self._check_headers()
            p, size = self.path, self.num_bins * self.pack_size
            files = tuple(MappedFile(p / FILES[name])
                          for name in ("input_ids", "loss_mask", "seq_starts"))
            ids = files[0].view("<i4", at["input_ids"], size)
            mask = files[1].view("|u1", at["loss_mask"], size)
            starts = files[2].view("<i4", at["seq_starts"], self.num_seqs)
            lengths = load_array(p / FILES["packed_len"], "<u4", at["packed_len"], self.num_bins)
            offsets = load_array(p / FILES["seq_offsets"], "<u4", at["seq_offsets"],
                                 self.num_bins + 1)
            self._check_index(lengths, offsets)
            self._arrays = _Mapped(ids, mask, starts, lengths, offsets, memoryview(lengths),
                                   memoryview(offsets), files,  # type: ignore[arg-type]
                                   tuple(f.fd for f in files),  # type: ignore[arg-type]
                                   (at["input_ids"], at["loss_mask"], at["seq_starts"]),
                                   ReadAdvice(files[0].fd))
        return self._arrays

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

    def read_bin(self, index: int) -> PackedBin:
        m = self._arrays if self._arrays is not None else self._maps()
        if not 0 <= index < self.num_bins:  # the common case skips the general check
            index = self.check_index(index)
        ids, mask, starts, _, _, length_of, offset_of, _, fds, bases, advice = m
        n = length_of[index]
        lo = offset_of[index]
        hi = offset_of[index + 1]
        at = index * self.pack_size
        if advice.first(bases[0] + 4 * at, 4 * n):  # cold: fetch the rest at once too
            advise(fds[1], bases[1] + at, n)
            advise(fds[2], bases[2] + 4 * lo, 4 * (hi - lo))
        return _new(PackedBin, (ids[at:at + n], mask[at:at + n], starts[lo:hi]))

    def read_bins(self, indices: Any) -> list[PackedBin]:
        """A batch: :meth:`read_bin` without its per-call overhead (one loop, no dispatch)."""
        m = self._arrays if self._arrays is not None else self._maps()
        ids, mask, starts, _, _, length_of, offset_of, _, fds, bases, advice = m
        p, count = self.pack_size, self.num_bins
        out = []
        for index in index_list(indices):
            if not 0 <= index < count:
                index = self.check_index(index)
            n = length_of[index]
            lo = offset_of[index]
            hi = offset_of[index + 1]
            at = index * p
            if advice.first(bases[0] + 4 * at, 4 * n):
                advise(fds[1], bases[1] + at, n)
                advise(fds[2], bases[2] + 4 * lo, 4 * (hi - lo))
            out.append(_new(PackedBin, (ids[at:at + n], mask[at:at + n], starts[lo:hi])))
        return out

    def iter_bins(self) -> Iterator[PackedBin]:
        """Every bin in order, with the kernel's sequential readahead while it lasts."""
        m = self._maps()  # a damaged shard fails here, not at the first next()
        return scan(self._row, self.num_bins, tuple(f.map for f in m.files))

    def _row(self, index: int) -> PackedBin:
        m = self._maps()
        n, lo, hi = m.length_of[index], m.offset_of[index], m.offset_of[index + 1]
        at = index * self.pack_size
        return _new(PackedBin, (m.ids[at:at + n], m.mask[at:at + n], m.starts[lo:hi]))

    def packed_lengths(self) -> np.ndarray:
        return self._maps().lengths.astype(np.int64)

    def info(self) -> dict[str, Any]:
        return {**super().info(), "num_seqs": self.num_seqs}

    def validate(self) -> dict[str, Any]:
        """Sizes and checksums, headers, every invariant (vectorized), zero padding."""
        verify_files(self.path, self.manifest["files"], checksums=True)
        m = self._maps()  # checks the headers and the index
        lengths = m.lengths.astype(np.int64)
        offsets = m.offsets.astype(np.int64)
        source = str(self.path)
        steps = np.diff(offsets)
        if offsets[0] != 0 or offsets[-1] != self.num_seqs or (steps <= 0).any():
            where = f"bin {int(np.argmax(steps <= 0))}: " if (steps <= 0).any() else ""
            raise FormatError(f"{self.path / FILES['seq_offsets']}: {where}sequence offsets must "
                              f"rise from 0 to num_seqs {self.num_seqs} (corrupted)")
        if int(lengths.sum()) != self.num_tokens:
            raise FormatError(f"{self.path / FILES['packed_len']}: {int(lengths.sum())} tokens, "
                              f"the manifest says {self.num_tokens}")
        step = max(1, _VALIDATE_CHUNK_BYTES // (5 * self.pack_size))
        with sequential(*(f.map for f in m.files)):
            for a in range(0, self.num_bins, step):
                self._validate_chunk(m, lengths, offsets, a, min(a + step, self.num_bins), source)
        return {"format": FORMAT, "path": source, "num_bins": self.num_bins,
                "num_tokens": self.num_tokens, "num_seqs": self.num_seqs,
                "pack_size": self.pack_size, "checksums": True}

    def _check_headers(self) -> dict[str, int]:
        """Every file's .npy header against the manifest; where each file's data starts."""
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

    def _validate_chunk(self, m: _Mapped, lengths: np.ndarray,
                        offsets: np.ndarray, a: int, b: int, source: str) -> None:
        """Bins a..b: check_csr on the unpadded masks, tokens non-negative, padding zero."""
        n = lengths[a:b]
        bad = (n <= 0) | (n > self.pack_size)
        if bad.any():
            k = a + int(np.argmax(bad))
            raise FormatError(f"{source}: bin {k}: packed_len {int(lengths[k])} not in "
                              f"(0, {self.pack_size}] (corrupted)")
        valid = np.arange(self.pack_size) < n[:, None]
        p = self.pack_size
        ids = m.ids[a * p:b * p].reshape(b - a, p)
        mask = m.mask[a * p:b * p].reshape(b - a, p)
        token_offsets = np.zeros(b - a + 1, dtype=np.int64)
        np.cumsum(n, out=token_offsets[1:])
        check_csr(token_offsets, offsets[a:b + 1] - offsets[a],
                  m.starts[offsets[a]:offsets[b]], mask[valid],
                  pack_size=self.pack_size, source=source, first_bin=a)
        negative = (ids < 0).any(axis=1)
        if negative.any():
            raise FormatError(f"{source}: bin {a + int(np.argmax(negative))}: negative token id")
        padded = (np.where(valid, 0, ids) != 0).any(axis=1) | (np.where(valid, 0, mask) != 0).any(
            axis=1)
        if padded.any():
            raise FormatError(f"{source}: bin {a + int(np.argmax(padded))}: non-zero padding "
                              "beyond packed_len (corrupted)")
