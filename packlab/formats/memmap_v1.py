"""Format ``memmap_v1`` (RFC Option A): a directory of padded fixed-shape ``.npy`` arrays.

One shard is one directory (record ``format`` is ``memmap_padded_v1``, as in the design)::

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

Reader: the record at construction; in each process, on first read, every file opened and
every bin's structure checked over the index (``packed_len``, ``seq_offsets``), through
:mod:`packlab.formats.read.table` (the read path of every format whose bins are runs of its
files), so the reader pickles without them. Bins are arrays of their own (a ``pread`` per
column), valid after the reader is closed;
``seq_start_id`` comes back as int32 (the file's uint32 values, all below ``pack_size``). ``verify=True`` checks each
bin's checksum and mask as it is read.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import CHECKSUM, PackedBin, records_checksum, stored_checksum
from packlab.codecs.safe_pickle import read_npy_header
from packlab.errors import FormatError, PacklabError
from packlab.formats.read.shard_reads import reads_for
from packlab.formats.read.table import (
    BinIndex,
    BinTable,
    Column,
    FileReads,
    Placement,
    Runs,
    TableReads,
    refuse_unverifiable,
)
from packlab.formats.shared.base import (
    SHARD_RECORD,
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    read_shard_record,
)
from packlab.formats.shared.npy_identity import check_identity, npy_header
from packlab.storage.files import (
    HashedFile,
    fsync_directory,
    fsync_file,
    parse_json,
    short_hash,
    verify_files,
)
from packlab.storage.location import Location

FORMAT = "memmap_v1"
SUFFIX = ""
RECORD_FORMAT = "memmap_padded_v1"
VERSION = "1.0"
RECORD = SHARD_RECORD
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


MAX_PADDED_ROW = 64 << 20  # bytes of one padded bin (what the writer holds, a reader maps)
PADDED_NOTICE = 1 << 30  # a plan that pads to more than this says so before it starts


def padded_plan(pack_size: int, num_bins: int, num_tokens: int, where: object) -> list[str]:
    """A padded plan's bounds: one padded bin at most :data:`MAX_PADDED_ROW` bytes (refused
    above, naming the bytes); more than :data:`PADDED_NOTICE` bytes that are mostly padding
    said before the work starts."""
    per_position = sum(DTYPES[name].itemsize for name in ("input_ids", "loss_mask"))
    row = pack_size * per_position
    total = row * num_bins
    if row > MAX_PADDED_ROW:
        raise PacklabError(f"{where}: memmap_v1 pads every bin to pack_size {pack_size:,}: one "
                           f"bin would be {human_bytes(row)}, {num_bins:,} bin{'s' * (num_bins != 1)} "
                           f"{human_bytes(total)} for {human_bytes(num_tokens * per_position)} "
                           f"of tokens (at most {human_bytes(MAX_PADDED_ROW)} a bin: choose a "
                           "smaller pack size, or a format that does not pad)")
    filled = num_tokens / (pack_size * num_bins) if num_bins else 1.0
    if total > PADDED_NOTICE and filled < 0.5:
        return [f"memmap_v1 pads every bin to pack_size {pack_size:,}: {num_bins:,} bins will "
                f"write {human_bytes(total)}, {filled:.0%} of it tokens"]
    return []


def human_bytes(n: float) -> str:
    """``5.0 GB``: bytes for a person (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def detect(location: Location) -> bool:
    """A directory whose record says ``memmap_padded_v1`` (or, unreadable, beside input_ids.npy)."""
    try:
        record = parse_json((location / RECORD).read_bytes(), location / RECORD)
        return isinstance(record, dict) and record.get("format") == RECORD_FORMAT
    except FormatError:
        return (location / FILES["input_ids"]).is_file()  # unfinished or damaged: the reader says


class MemmapFacts(FormatFacts):
    """What ``memmap_v1`` is: a padded memmap shard (RFC Option A)."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    RECORD = RECORD
    RECORD_FORMAT = RECORD_FORMAT
    FILES = (*FILES.values(), CHECKSUMS)
    RAW_RUNS = True
    detect = staticmethod(detect)

    @classmethod
    def plan_limits(cls, *, pack_size: int, num_bins: int, num_tokens: int,
                    where: object) -> list[str]:
        notes = super().plan_limits(pack_size=pack_size, num_bins=num_bins,
                                    num_tokens=num_tokens, where=where)
        return notes + padded_plan(pack_size, num_bins, num_tokens, where)


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
                 rows: int | None, identity: str | None = None) -> None:
        self.path = path
        self.dtype = dtype
        self.row_shape = row_shape
        self.identity = identity
        self.row_size = int(np.prod(row_shape, dtype=np.int64))
        self.header = npy_header(dtype, (rows or 0, *row_shape), identity)
        # the padded rows through large aligned writes (huge page-cache folios: faster mapped
        # reads); the per-bin sidecars, a few bytes a bin, through a plain buffered file, so
        # no buffer grows with the bins until the shard is closed
        self.file = HashedFile(path, aligned=bool(row_shape))
        self.file.write(self.header)
        self.values = 0

    def write(self, values: np.ndarray) -> None:
        """Append values (already of ``dtype``; whole rows)."""
        self.file.write(values)
        self.values += values.size

    def close(self) -> dict[str, Any]:
        """Finish the file; the record entry (bytes, sha256)."""
        entry = self.file.close()
        header = npy_header(self.dtype, (self.values // self.row_size, *self.row_shape),
                            self.identity)
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
        # what this shard is, known before its first byte: its metadata (where the pipeline
        # records its place in its dataset) and pack size, so the same job writes the same bytes
        self.identity = short_hash({"metadata": self.metadata, "pack_size": p})

        def stream(name: str, dtype: np.dtype, shape: tuple[int, ...],
                   rows: int | None) -> NpyStream:
            return NpyStream(self.tmp_path / name, dtype, shape, rows, self.identity)

        self._streams = {
            "input_ids": stream(FILES["input_ids"], DTYPES["input_ids"], row, n),
            "loss_mask": stream(FILES["loss_mask"], DTYPES["loss_mask"], row, n),
            "packed_len": stream(FILES["packed_len"], DTYPES["packed_len"], (), n),
            "seq_offsets": stream(FILES["seq_offsets"], DTYPES["seq_offsets"], (),
                                  None if n is None else n + 1),
            "seq_starts": stream(FILES["seq_starts"], DTYPES["seq_starts"], (), None),
            "checksums": stream(CHECKSUMS, CHECKSUM_DTYPE, (), n),
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

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        files = {stream.path.name: stream.close() for stream in self._streams.values()}
        record = {
            **record,
            "format": RECORD_FORMAT,
            "packlab_format": FORMAT,
            "version": VERSION,
            "dtypes": {name: dt.str for name, dt in DTYPES.items()},
            # the keys the design's reader and record use, kept for compatibility
            "dtype": DTYPES["input_ids"].str,
            "loss_mask_dtype": "<u1",
            "index_dtype": DTYPES["packed_len"].str,
            "bins_written": self.bins_written,
            "bin_checksum": CHECKSUM,
            "identity": self.identity,
            "files": files,
        }
        record_path = self.tmp_path / RECORD
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        fsync_file(record_path)
        fsync_directory(self.tmp_path)
        return record

    def _discard(self) -> None:
        for stream in getattr(self, "_streams", {}).values():
            stream.discard()


def shard_record(path: Path) -> dict[str, Any]:
    """The shard's record, checked; every error names the file."""
    record_path = path / RECORD
    record = read_shard_record(path, RECORD, kind="memmap",
                                       expect={"format": RECORD_FORMAT, "version": VERSION})
    for key in ("num_bins", "pack_size", "num_seqs", "num_tokens"):
        count_field(record, key, record_path)
    if record["num_bins"] == 0 or record["pack_size"] == 0:
        raise FormatError(f"{record_path}: empty shard (num_bins or pack_size is 0)")
    dtypes = record.get("dtypes")
    if dtypes != {name: dt.str for name, dt in DTYPES.items()}:
        raise FormatError(f"{record_path}: dtypes {dtypes}, this packlab reads "
                          f"{ {name: dt.str for name, dt in DTYPES.items()} }")
    files = record.get("files")
    expected = set(FILES.values()) | ({CHECKSUMS} if "bin_checksum" in record else set())
    if not isinstance(files, dict) or set(files) != expected:
        raise FormatError(f"{record_path}: 'files' must list {', '.join(sorted(expected))}")
    records_checksum(record, record_path)
    return record


class Reader(MemmapFacts, TableReads, ShardReader):
    """Lazy, picklable reader; O(1) access to any bin (a ``pread`` per column).

    Bins are arrays of their own (valid after the reader is closed). Where every bin is, read
    once from the index files, is kept in RAM (:mod:`packlab.formats.read.table`).
    ``verify=True``: each bin read is checked against its checksum.
    """

    @property
    def metadata(self) -> dict[str, Any]:
        found = self.record.get("metadata")
        return found if isinstance(found, dict) else {}

    def __init__(self, path: str | os.PathLike[str], *, verify: bool = False) -> None:
        super().__init__(path)
        self.record = shard_record(self.path)
        self.num_bins = int(self.record["num_bins"])
        self.pack_size = int(self.record["pack_size"])
        self.num_tokens = int(self.record["num_tokens"])
        self.num_seqs = int(self.record["num_seqs"])
        self.has_checksums = "bin_checksum" in self.record
        self.verify = bool(verify)
        refuse_unverifiable(self.path, self.verify, self.has_checksums)
        verify_files(self.path, self.record["files"], checksums=False)  # sizes: a few stats
        self._table = None

    def _handles(self) -> tuple[str, ...]:
        return ("_table",)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """The shape each file must have, from the record."""
        n, p = self.num_bins, self.pack_size
        return {"input_ids": (n, p), "loss_mask": (n, p), "packed_len": (n,),
                "seq_offsets": (n + 1,), "seq_starts": (self.num_seqs,)}

    def _placement(self, reads: FileReads) -> Placement:
        """Where the bins are: the headers checked, the index read as sliced."""
        at = self._check_headers()
        p, n = self.path, self.num_bins
        checksum = None
        if self.has_checksums:
            checksum = reads.lookups(p / CHECKSUMS, CHECKSUM_DTYPE, self._checksums_at(), n)
        size = n * self.pack_size

        def column(name: str, count: int, dtype: np.dtype | None = None) -> Column:
            return Column(p / FILES[name], dtype or DTYPES[name], at[name], count)

        index = _Index(reads, column("packed_len", n), column("seq_offsets", n + 1),
                       self.pack_size, self.num_seqs, str(p))
        return Placement(column("input_ids", size), column("loss_mask", size),
                      column("seq_starts", self.num_seqs, np.dtype("<i4")), index,
                      self.pack_size, str(p), checksum)

    def _checksums_at(self) -> int:
        """Where ``checksums.npy``'s values start (its header checked against the shard)."""
        file = self.path / CHECKSUMS
        with open(file, "rb") as fp:
            header = read_npy_header(fp, source=str(file))
            fp.seek(0)
            raw = fp.read(header.data_offset)
        if header.dtype != CHECKSUM_DTYPE or header.shape != (self.num_bins,):
            raise FormatError(f"{file}: header says {header.dtype.str}{list(header.shape)}, "
                              f"expected {CHECKSUM_DTYPE.str}[{self.num_bins}]")
        self._check_identity(file, raw)
        return int(header.data_offset)

    def _corrupt(self, index: int, what: str) -> FormatError:
        return FormatError(f"{self.path}: bin {index}: {what} (corrupted shard; run validate)")

    def info(self) -> dict[str, Any]:
        return {**super().info(), "num_seqs": self.num_seqs}

    def validate(self) -> dict[str, Any]:
        """Sizes and checksums, headers, every invariant, zero padding, every bin's checksum."""
        verify_files(self.path, self.record["files"], checksums=True)
        reads = reads_for(self.location)
        placement = self._placement(reads)
        table = BinTable.from_placement(placement, reads, check=False)
        table.check_contents(token_limit=_INT32_MAX + 1)  # every invariant of every bin
        if int(table.packed_lengths().sum()) != self.num_tokens:
            raise FormatError(f"{self.path / FILES['packed_len']}: bins hold "
                              f"{int(table.packed_lengths().sum())} tokens, the record says "
                              f"{self.num_tokens} (corrupted)")
        self._check_padding(reads, placement, table.packed_lengths())
        if placement.checksum is not None:
            table.check_checksums(placement.checksum)
        return {"format": FORMAT, "path": str(self.path), "num_bins": self.num_bins,
                "num_tokens": self.num_tokens, "num_seqs": self.num_seqs,
                "pack_size": self.pack_size, "checksums": True,
                "bin_checksums": self.has_checksums}

    def _check_headers(self) -> dict[str, int]:
        """Every data file's .npy header against the record; where each file's data starts."""
        data_at = {}
        for name, shape in self.shapes().items():
            file = self.path / FILES[name]
            with open(file, "rb") as fp:
                header = read_npy_header(fp, source=str(file))
                fp.seek(0)
                raw = fp.read(header.data_offset)  # the header again, from the same buffer
            size = header.data_offset + math.prod(shape) * DTYPES[name].itemsize
            if header.dtype != DTYPES[name] or header.shape != shape or header.fortran_order:
                raise FormatError(f"{file}: header says {header.dtype.str}{list(header.shape)}, "
                                  f"expected {DTYPES[name].str}{list(shape)}")
            if file.stat().st_size != size:
                raise FormatError(f"{file}: {file.stat().st_size} bytes, header and record "
                                  f"need {size}")
            self._check_identity(file, raw)
            data_at[name] = header.data_offset
        return data_at

    def _check_identity(self, file: Path, header: bytes) -> None:
        """The file's header names this shard (the header its reader reads anyway: no extra
        read); a shard written before identities were recorded has none to check."""
        check_identity(file, header, self.record.get("identity"))

    def _check_padding(self, reads: FileReads, placement: Placement, lengths: np.ndarray) -> None:
        """Every position past a bin's packed_len is zero, tokens and mask."""
        p = self.pack_size
        step = max(1, _VALIDATE_CHUNK_BYTES // (5 * p))
        ids, mask = reads.column(placement.tokens), reads.column(placement.mask)
        with reads.sequential():
            for a in range(0, self.num_bins, step):
                b = min(a + step, self.num_bins)
                pad = np.arange(p) >= lengths[a:b, None]
                rows = (ids[a * p:b * p].reshape(b - a, p), mask[a * p:b * p].reshape(b - a, p))
                padded = np.zeros(b - a, dtype=bool)
                for values in rows:
                    padded |= (np.where(pad, values, 0) != 0).any(axis=1)
                if padded.any():
                    raise FormatError(f"{self.path}: bin {a + int(np.argmax(padded))}: non-zero "
                                      "padding beyond packed_len (corrupted)")


class _Index(BinIndex):
    """``packed_len.npy`` and ``seq_offsets.npy``, read as sliced: bin ``b`` is row ``b`` of
    the padded arrays, ``packed_len[b]`` values of it."""

    __slots__ = ("num_bins", "stride", "_lengths", "_seqs", "num_seqs", "source")

    def __init__(self, reads: FileReads, lengths: Column, seqs: Column, stride: int, num_seqs: int,
                 source: str) -> None:
        self.num_bins, self.stride, self.num_seqs, self.source = lengths.count, stride, num_seqs, source
        self._lengths, self._seqs = reads.values(*lengths), reads.values(*seqs)

    def runs(self, lo: int, hi: int) -> Runs:
        """Bins ``lo..hi-1``: the starts must run from 0 to ``num_seqs`` in order."""
        seqs = self._seqs[lo:hi + 1].astype(np.int64)
        bad = seqs[:-1] >= seqs[1:]
        if (lo == 0 and seqs[0] != 0) or (hi == self.num_bins and seqs[-1] != self.num_seqs):
            bad[0 if lo == 0 and seqs[0] != 0 else -1] = True
        if bad.any():
            b = int(np.argmax(bad))
            raise FormatError(f"{self.source}: bin {lo + b}: seq_offsets [{int(seqs[b])}, "
                              f"{int(seqs[b + 1])}) outside [0, {self.num_seqs}] (corrupted "
                              "shard; run validate)")
        first = np.arange(lo, hi, dtype=np.int64) * self.stride
        return Runs(first, self._lengths[lo:hi].astype(np.int64), first, seqs[:-1],
                    np.diff(seqs))
