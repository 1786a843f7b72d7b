"""Format ``arrow_ipc``: one Arrow IPC *file* (not stream), its bins read as runs of its values.

Same schema as ``parquet`` (``input_ids`` list<int32>, ``loss_mask`` list<uint8>,
``seq_start_id`` list<int32>), in record batches of ``batch_size`` bins (the last may be
shorter). Uncompressed by default, so a bin is three runs of the file's values, read as they
are; lz4 or zstd buffer compression is optional (then batches are decompressed into a small LRU
cache).

Where the metadata lives (IPC writes the schema first, so the schema cannot hold final counts):

- schema metadata ``b"packlab"``, written at open: the static facts::

      {"format": "arrow_ipc", "version": "packlab_arrow_ipc_v1", "packlab_version": "0.1.0",
       "pack_size": 4096, "batch_size": 1000, "compression": "none", "metadata": {},
       "bin_checksum": "xxh3_64"}

- each record batch's custom metadata ``b"packlab"``: where it sits and its checksums::

      {"first_bin": 1000, "num_bins": 1000, "num_tokens": 3951020, "num_seqs": 5203,
       "total_bins": 2000, "total_tokens": 7900312, "total_seqs": 10411, "crc32": 291047811,
       "bin_checksums": "kX3...Q=="}

  so the last batch carries the shard's final counts (the reader reads it at open), and
  ``validate`` proves every batch whole (Arrow IPC itself has no checksums). ``bin_checksums``
  is base64 of each bin's xxh3_64 (:func:`packlab.bins.bin_checksum`, little-endian uint64),
  what ``verify=True`` checks a bin against as it is read; files written before it have
  none (and no ``bin_checksum`` in the schema metadata) and ``verify=True`` refuses them.

The IPC footer, written at close, is what makes the file openable: a truncated file or one
from a killed writer (which never reaches the final name anyway) does not open.

The file is mapped with Python's ``mmap`` (:mod:`packlab.storage.reads`: advised for random access;
pyarrow's ``memory_map`` takes no advice) and handed to ``pa.ipc.open_file`` as a buffer, which
reads its schema and record batches. On the first read an uncompressed packlab file decodes
every record batch's list offsets into RAM and indexes the whole file as flat columns
(:mod:`packlab.formats.read.table`, the read path every format whose bins are runs of its files
shares), and the map's pages are released: a read is then a ``pread`` per column into arrays of
its own, with no decoding, and a cold read waits for the bin's tokens and mask only. Arrays the
reader returns stay valid after it is closed and collected.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packlab.bins import CHECKSUM, PackedBin, records_checksum
from packlab.errors import FormatError, PacklabError
from packlab.formats.read.table import (
    Column,
    FileReads,
    Placement,
    TableReads,
    check_checksums,
    refuse_unverifiable,
)
from packlab.formats.shared.arrow_lists import (
    ARROW_ERRORS,
    DTYPES,
    MAX_LIST_VALUES,
    METADATA_KEY,
    BinColumns,
    ListBuffer,
    ListIndex,
    LRUCache,
    check_schema,
    decode,
    dump_metadata,
    list_buffers,
    load_metadata,
    parse_error,
    schema_with_metadata,
)
from packlab.formats.shared.base import (
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    starts_with,
)
from packlab.storage.files import AlignedWriter, fsync_file
from packlab.storage.location import Location
from packlab.storage.reads import MappedFile, sequential

FORMAT = "arrow_ipc"
SUFFIX = ".arrow"
VERSION = "packlab_arrow_ipc_v1"
DEFAULT_BATCH_SIZE = 1000
DEFAULT_CACHE_BATCHES = 8
CODECS = ("none", "lz4", "zstd")
_MAGIC = b"ARROW1"


def detect(location: Location) -> bool:
    """A file that starts with the Arrow IPC file magic."""
    return starts_with(location, _MAGIC)


class ArrowIpcFacts(FormatFacts):
    """What ``arrow_ipc`` is: one Arrow IPC file, its bins runs of its values."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    READ_BY = ("HF datasets",)
    RAW_RUNS = True
    BUFFERED_BINS = DEFAULT_BATCH_SIZE
    detect = staticmethod(detect)


def normalize_codec(compression: str | None) -> str:
    codec = "none" if compression in (None, "uncompressed") else str(compression).lower()
    if codec == "lz4_frame":
        codec = "lz4"
    if codec not in CODECS:
        raise PacklabError(f"unknown Arrow IPC compression {compression!r}; choose from {CODECS}")
    return codec


class Writer(ArrowIpcFacts, ShardWriter):
    """Streaming Arrow IPC file writer; memory bounded by one record batch.

    Keyword options: ``batch_size`` (bins per record batch; default 1000, or as many as a
    batch's int32 list offsets hold at a large pack size), ``compression`` (none, lz4, zstd).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pack_size: int,
        batch_size: int | None = None,
        compression: str | None = None,
        **options: Any,
    ) -> None:
        if batch_size is None:  # the default, fewer bins a batch where large bins need it
            batch_size = max(1, min(DEFAULT_BATCH_SIZE, MAX_LIST_VALUES // max(int(pack_size), 1)))
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise PacklabError(f"{path}: batch_size must be a positive number of bins, "
                               f"got {batch_size!r}")
        self.batch_size = int(batch_size)
        self.compression = normalize_codec(compression)
        self.num_batches = 0
        super().__init__(path, pack_size=pack_size, **options)

    def _open(self) -> None:
        # A batch must hold exactly batch_size bins (the reader locates bins by division), so
        # the buffer's token bound (int32 offsets) is checked against the pack size up front.
        if self.batch_size * self.pack_size > MAX_LIST_VALUES:
            raise PacklabError(f"{self.path}: batch_size {self.batch_size} x pack_size "
                               f"{self.pack_size} overflows int32 list offsets; use smaller batches")
        self._buffer = ListBuffer(self.batch_size, source=str(self.path),
                                  capacity=self.batch_size * self.pack_size)
        self._bins_flushed = self._tokens_flushed = self._seqs_flushed = 0
        static = {"format": FORMAT, "version": VERSION, "pack_size": self.pack_size,
                  "batch_size": self.batch_size, "compression": self.compression,
                  "packlab_version": self.base_record()["packlab_version"],
                  "metadata": self.metadata, "bin_checksum": CHECKSUM}
        self._schema = schema_with_metadata({METADATA_KEY: dump_metadata(static)})
        options = pa.ipc.IpcWriteOptions(
            compression=None if self.compression == "none" else self.compression)
        # written in aligned chunks: huge page-cache folios, faster warm reads (AlignedWriter)
        self._sink: pa.NativeFile | None = pa.PythonFile(AlignedWriter(self.tmp_path),
                                                         mode="w")
        try:
            self._writer: pa.ipc.RecordBatchFileWriter | None = pa.ipc.new_file(
                self._sink, self._schema, options=options)
        except ARROW_ERRORS as exc:
            self._discard()
            self.tmp_path.unlink(missing_ok=True)
            raise PacklabError(f"{self.path}: cannot write Arrow IPC: {parse_error(exc)}") from None

    def _write(self, packed: PackedBin) -> None:
        self._buffer.add(packed, self.bins_written)
        if self._buffer.rows >= self.batch_size:
            self._flush()

    def _flush(self) -> None:
        buffer = self._buffer
        if buffer.rows == 0:
            return
        assert self._writer is not None
        # (called from _write before the base class has counted the bin just added)
        first = self._bins_flushed
        info = {"first_bin": first, "num_bins": buffer.rows, "num_tokens": buffer.tokens,
                "num_seqs": buffer.seqs, "total_bins": first + buffer.rows,
                "total_tokens": self._tokens_flushed + buffer.tokens,
                "total_seqs": self._seqs_flushed + buffer.seqs, "crc32": buffer.crc32(),
                "bin_checksums": base64.b64encode(
                    buffer.bin_checksums().astype("<u8").tobytes()).decode()}
        try:
            self._writer.write_batch(buffer.record_batch(self._schema),
                                     custom_metadata={METADATA_KEY: dump_metadata(info)})
        except ARROW_ERRORS as exc:
            raise PacklabError(f"{self.path}: writing record batch {self.num_batches} failed: "
                               f"{parse_error(exc)}") from None
        self._bins_flushed += buffer.rows
        self._tokens_flushed += buffer.tokens
        self._seqs_flushed += buffer.seqs
        self.num_batches += 1
        buffer.clear()

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        self._flush()
        assert self._writer is not None and self._sink is not None
        self._writer.close()
        self._sink.close()
        self._writer = self._sink = None
        fsync_file(self.tmp_path)
        record.update(version=VERSION, batch_size=self.batch_size, compression=self.compression)
        return {**record, "num_batches": self.num_batches, "bytes": self.tmp_path.stat().st_size}

    def _discard(self) -> None:
        writer, self._writer = getattr(self, "_writer", None), None
        sink, self._sink = getattr(self, "_sink", None), None
        for handle in (writer, sink):
            if handle is not None:
                try:
                    handle.close()
                except ARROW_ERRORS:
                    pass


class Reader(ArrowIpcFacts, TableReads, ShardReader):
    """Memory-mapped Arrow IPC reader; bins are zero-copy numpy views (read-only).

    Options: ``pack_size`` (for files without packlab metadata; otherwise must agree),
    ``cache_batches`` (decompressed batches kept when the file is compressed),
    ``verify_checksums`` (check each batch's CRC when it is first decoded; default: when
    the file is compressed; zero-copy: every batch on the first read),
    ``verify`` (each bin read checked against its checksum; a compressed file's batches are
    checked as they are decoded).
    """

    RECORD_ATTRIBUTE = "packlab"  # packlab's record, None in a file another program wrote

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pack_size: int | None = None,
        cache_batches: int = DEFAULT_CACHE_BATCHES,
        verify_checksums: bool | None = None,
        verify: bool = False,
    ) -> None:
        super().__init__(path)
        if self.path.is_dir():
            raise FormatError(f"{self.path}: is a directory, not an Arrow IPC file")
        self.cache_batches = int(cache_batches)
        self.verify = bool(verify)
        self._source: MappedFile | None = None
        self._reader: pa.ipc.RecordBatchFileReader | None = None
        self._cache: LRUCache[int, BinColumns] | None = None
        self._table = None
        self._sums: tuple[int, list[int]] | None = None  # the last batch's checksums
        self._pid = -1
        self._copied = False
        reader = self._file()
        check_schema(reader.schema, str(self.path))
        self.num_batches = reader.num_record_batches
        if self.num_batches == 0:
            raise FormatError(f"{self.path}: no record batches (empty shard)")
        self.packlab = _schema_metadata(reader.schema, self.path)
        self.compression = self.packlab.get("compression", "unknown") if self.packlab else "unknown"
        # Decompressing a batch costs more than its CRC, so compressed shards are verified on
        # every decode; zero-copy reads are not (that would read a whole batch per bin).
        self.verify_checksums = (self.compression != "none" if verify_checksums is None
                                 else verify_checksums or self.verify
                                 ) and self.packlab is not None
        self.has_checksums = records_checksum(self.packlab or {}, f"{self.path}: packlab metadata")
        refuse_unverifiable(self.path, self.verify, self.has_checksums)
        if self.packlab is not None:
            self._index_from_metadata(pack_size)
        else:
            self._index_by_scanning(pack_size)

    # -- opening ------------------------------------------------------------------------------
    def _file(self) -> pa.ipc.RecordBatchFileReader:
        """The open map and IPC reader, reopened after pickling or in a forked worker."""
        if self._reader is None or self._pid != os.getpid():
            self._cache = self._table = None  # views of a map this process did not open
            try:
                # Python's mmap, advised for random access (pyarrow's memory_map takes no
                # advice): a cold bin then reads its own pages, not 8 MB around them.
                self._source = MappedFile(self.path)
                self._base = pa.py_buffer(self._source.map)
                self._reader = pa.ipc.open_file(pa.BufferReader(self._base))
            except ARROW_ERRORS as exc:
                raise FormatError(f"{self.path}: not a readable Arrow IPC file (truncated or "
                                  f"corrupted?): {parse_error(exc)}") from None
            self._pid = os.getpid()
        return self._reader

    def _handles(self) -> Sequence[str]:
        return ("_source", "_reader", "_cache", "_table", "_base", "_sums")

    def _index_from_metadata(self, pack_size: int | None) -> None:
        info = self.packlab
        assert info is not None
        if info.get("format") != FORMAT:
            raise FormatError(f"{self.path}: packlab metadata names format {info.get('format')!r}")
        for key in ("pack_size", "batch_size"):
            count_field(info, key, f"{self.path}: packlab metadata", minimum=1)
        self.pack_size = int(info["pack_size"])
        if pack_size is not None and int(pack_size) != self.pack_size:
            raise PacklabError(f"{self.path}: pack_size {pack_size} given, the file says "
                               f"{self.pack_size}")
        self.batch_size: int | None = int(info["batch_size"])
        last = self._batch_info(self.num_batches - 1)
        self.num_bins = int(last["total_bins"])
        self.num_tokens = int(last["total_tokens"])
        self.num_seqs = int(last["total_seqs"])
        expected_first = (self.num_batches - 1) * self.batch_size
        if last["first_bin"] != expected_first or not 0 < last["num_bins"] <= self.batch_size:
            raise FormatError(f"{self.path}: last record batch starts at bin {last['first_bin']}"
                              f" with {last['num_bins']} bins; expected {expected_first} and at "
                              f"most {self.batch_size} (inconsistent shard)")
        self.batch_offsets = np.minimum(
            np.arange(self.num_batches + 1, dtype=np.int64) * self.batch_size, self.num_bins)
        self._cache = self._new_cache()

    def _index_by_scanning(self, pack_size: int | None) -> None:
        """Files written elsewhere: row counts and lengths from every batch (decoded once)."""
        self.batch_size = None
        self._cache = self._new_cache()
        rows, lengths = [], []
        first = seqs = 0
        for k in range(self.num_batches):
            cols = self._load(k, first_bin=first)
            rows.append(cols.rows)
            lengths.append(cols.packed_lengths())
            first += cols.rows
            seqs += int(cols.seq_offsets[-1])
        self.batch_offsets = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
        self.num_bins = int(self.batch_offsets[-1])
        if self.num_bins == 0:
            raise FormatError(f"{self.path}: no bins (empty shard)")
        all_lengths = np.concatenate(lengths)
        self.num_tokens = int(all_lengths.sum())
        self.num_seqs = seqs
        self.pack_size = int(pack_size) if pack_size else int(all_lengths.max())

    def _new_cache(self) -> LRUCache[int, BinColumns]:
        # Uncompressed batches are views into the map: keeping all of them costs no memory.
        zero_copy = self.packlab is not None and self.compression == "none"
        return LRUCache(None if zero_copy else self.cache_batches)

    def _read_batch(self, k: int, reader: pa.ipc.RecordBatchFileReader | None = None
                    ) -> tuple[pa.RecordBatch, dict[str, Any]]:
        try:
            batch, custom = (reader or self._file()).get_batch_with_custom_metadata(k)
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: record batch {k}: {parse_error(exc)}") from None
        raw = custom.get(METADATA_KEY) if custom is not None else None
        info = {} if raw is None else load_metadata(raw, f"{self.path}: record batch {k}")
        return batch, info

    def _batch_info(self, k: int) -> dict[str, Any]:
        _, info = self._read_batch(k)
        keys = ("first_bin", "num_bins", "num_tokens", "num_seqs", "total_bins", "total_tokens",
                "total_seqs", "crc32")
        for key in keys:
            count_field(info, key, f"{self.path}: record batch {k}: packlab batch metadata")
        return info

    def _load(self, k: int, first_bin: int | None = None) -> BinColumns:
        return self._checked(k, *self._read_batch(k), first_bin)

    def _checked(self, k: int, batch: pa.RecordBatch, info: dict[str, Any],
                 first_bin: int | None = None) -> BinColumns:
        """Record batch ``k`` decoded, its CRC checked when ``verify_checksums``."""
        first = int(self.batch_offsets[k]) if first_bin is None else first_bin
        if first_bin is None and batch.num_rows != int(self.batch_offsets[k + 1]) - first:
            raise FormatError(f"{self.path}: record batch {k} has {batch.num_rows} bins, "
                              f"expected {int(self.batch_offsets[k + 1]) - first}")
        cols = decode(batch, source=str(self.path), first_bin=first)
        where = f"{self.path}: record batch {k} (bins {first}..{first + cols.rows - 1})"
        if info and (info.get("first_bin"), info.get("num_bins"), info.get("num_tokens"),
                     info.get("num_seqs")) != (first, cols.rows, int(cols.token_offsets[-1]),
                                               int(cols.seq_offsets[-1])):
            raise FormatError(f"{where}: its metadata places it at bin {info.get('first_bin')} "
                              f"with {info.get('num_bins')} bins, {info.get('num_tokens')} "
                              f"tokens and {info.get('num_seqs')} sequences (corrupted)")
        if getattr(self, "verify_checksums", False):
            if cols.crc32() != info.get("crc32"):
                raise FormatError(f"{where}: checksum mismatch (corrupted data)")
        return cols

    def _batch(self, k: int) -> BinColumns:
        if self._cache is None or self._pid != os.getpid():
            self._file()
            if self._cache is None:
                self._cache = self._new_cache()
        return self._cache.get(k, self._load)

    def cache_stats(self) -> dict[str, Any]:
        return self._cache.stats() if self._cache is not None else {}

    def batch_of(self, index: int | np.ndarray) -> Any:
        """Record batch(es) holding bin(s) ``index``."""
        if self.batch_size is not None:
            return np.asarray(index) // self.batch_size
        return np.searchsorted(self.batch_offsets, index, side="right") - 1

    # -- the zero-copy reads: a table over the mapped file ----------------------------------------
    def _placement(self, reads: FileReads) -> Placement | None:
        """Where every record batch's buffers are in the mapped file, when the file allows
        zero-copy reads (packlab's uncompressed files: lists of int32 / uint8 / int32 without
        nulls); None otherwise (batches are decoded into the cache). Reads each batch's
        message and list offsets, never its values."""
        if self._copied or self.packlab is None or self.compression != "none":
            return None
        reader = self._file()  # this process's map (reopened in a forked worker), shared
        assert self._source is not None
        size = reads.file(self.path).size
        base = self._base
        batches = []
        for k in range(self.num_batches):
            batch, info = self._read_batch(k, reader)
            self._checked(k, batch, info)  # its place, counts (and CRC: verify_checksums)
            spans = [list_buffers(batch.column(name), dtype, base.address, size)
                     for name, dtype in DTYPES.items()]
            if None in spans:
                self._copied = True  # foreign types, nulls or offsets: decoded, not views
                return None
            batches.append((int(self.batch_offsets[k]), batch.num_rows, spans))
        checksum = self._checksum if self.has_checksums else None
        p = self.path
        self._source.release()  # the batches' headers it read: bins are read by pread
        return Placement(Column(p, np.dtype("<i4"), 0, size // 4),
                      Column(p, np.dtype("|u1"), 0, size),
                      Column(p, np.dtype("<i4"), 0, size // 4),
                      ListIndex(reads, p, batches, self.num_bins), self.pack_size, str(p), checksum)

    def _checksum(self, b: int) -> int:
        """Bin ``b``'s recorded checksum, from its record batch's metadata (decoded once per
        batch: the last batch's values kept)."""
        k = int(self.batch_of(b))
        if self._sums is None or self._sums[0] != k:
            info = self._read_batch(k)[1]
            rows = int(self.batch_offsets[k + 1] - self.batch_offsets[k])
            self._sums = (k, _bin_checksums(info, rows, f"{self.path}: record batch {k}").tolist())
        return self._sums[1][b - int(self.batch_offsets[k])]

    def checksums(self) -> np.ndarray | None:
        """Every bin's recorded checksum (uint64), or None for a file without them."""
        if not self.has_checksums:
            return None
        return np.concatenate([_bin_checksums(self._read_batch(k)[1], int(n),
                                              f"{self.path}: record batch {k}")
                               for k, n in enumerate(np.diff(self.batch_offsets))])

    def _untabled_bin(self, index: int) -> PackedBin:
        """A bin through the batch cache (compressed files, files written elsewhere)."""
        if self.batch_size is not None:
            k, j = divmod(index, self.batch_size)
        else:
            k = int(np.searchsorted(self.batch_offsets, index, side="right")) - 1
            j = index - int(self.batch_offsets[k])
        return self._batch(k).bin(j, copy=False)

    def _untabled_bins(self, indices: list[int]) -> list[PackedBin]:
        """Many bins, each record batch involved decoded at most once per call."""
        wanted = np.asarray(indices, dtype=np.int64)
        batches = np.asarray(self.batch_of(wanted), dtype=np.int64)
        local = (wanted - self.batch_offsets[batches]).tolist()
        out: list[PackedBin | None] = [None] * wanted.shape[0]
        order = np.argsort(batches, kind="stable")
        sorted_batches = batches[order]
        bounds = np.flatnonzero(np.diff(sorted_batches)) + 1
        for run in np.split(order, bounds):
            if run.size == 0:
                continue
            cols = self._batch(int(batches[run[0]]))
            for k in run.tolist():
                out[k] = cols.bin(local[k], copy=False)
        return out  # type: ignore[return-value]

    def _untabled_iter(self) -> Iterator[PackedBin]:
        self._file()
        with sequential(self._source):  # type: ignore[arg-type]
            for k in range(self.num_batches):
                cols = self._batch(k)
                for j in range(cols.rows):
                    yield cols.bin(j, copy=False)

    def _untabled_lengths(self) -> np.ndarray:
        return np.concatenate([self._batch(k).packed_lengths() for k in range(self.num_batches)])

    def validate(self) -> dict[str, Any]:
        """Footer, metadata, every batch's position, counts and CRC, every bin's invariants."""
        source = str(self.path)
        first = tokens = seqs = 0
        self._file()
        with sequential(self._source):  # type: ignore[arg-type]
            for k in range(self.num_batches):
                batch, info = self._read_batch(k)
                cols = decode(batch, source=source, first_bin=first)
                cols.check(pack_size=self.pack_size, source=source, first_bin=first)
                if self.packlab is not None:
                    self._check_batch(k, cols, info, first, tokens, seqs)
                if self.has_checksums:  # each bin as stored, batch by batch (bounded memory)
                    check_checksums(map(partial(cols.bin, copy=False), range(cols.rows)),
                                    _bin_checksums(info, cols.rows,
                                                   f"{self.path}: record batch {k}").tolist(),
                                    source, first)
                first += cols.rows
                tokens += int(cols.token_offsets[-1])
                seqs += int(cols.seq_offsets[-1])
        if (first, tokens, seqs) != (self.num_bins, self.num_tokens, self.num_seqs):
            raise FormatError(f"{self.path}: {first} bins, {tokens} tokens and {seqs} sequences "
                              f"found, the metadata says {self.num_bins}, {self.num_tokens} and "
                              f"{self.num_seqs}")
        return {**self.info(), "packlab_metadata": self.packlab is not None,
                "bin_checksums": self.has_checksums}

    def info(self) -> dict[str, Any]:
        return {**super().info(), "num_seqs": self.num_seqs, "num_batches": self.num_batches,
                "batch_size": self.batch_size, "compression": self.compression}

    def _check_batch(self, k: int, cols: BinColumns, info: dict[str, Any], first: int,
                     tokens: int, seqs: int) -> None:
        where = f"{self.path}: record batch {k} (bins {first}..{first + cols.rows - 1})"
        if not info:
            raise FormatError(f"{where}: missing packlab batch metadata")
        expected = {"first_bin": first, "num_bins": cols.rows,
                    "num_tokens": int(cols.token_offsets[-1]),
                    "num_seqs": int(cols.seq_offsets[-1]),
                    "total_bins": first + cols.rows,
                    "total_tokens": tokens + int(cols.token_offsets[-1]),
                    "total_seqs": seqs + int(cols.seq_offsets[-1])}
        for key, value in expected.items():
            if info.get(key) != value:
                raise FormatError(f"{where}: {key} is {value}, its metadata says {info.get(key)}")
        if k < self.num_batches - 1 and cols.rows != self.batch_size:
            raise FormatError(f"{where}: {cols.rows} bins, batch_size is {self.batch_size}")
        if cols.crc32() != info.get("crc32"):
            raise FormatError(f"{where}: checksum mismatch (corrupted data)")

    def close(self) -> None:
        source = self._source
        super().close()
        if source is not None:
            source.close()  # the descriptor; the map goes with the last view of it


def _bin_checksums(info: dict[str, Any], rows: int, where: str) -> np.ndarray:
    """A record batch's per-bin checksums from its metadata (base64 of uint64 LE)."""
    try:
        values = np.frombuffer(base64.b64decode(info["bin_checksums"], validate=True), "<u8")
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{where}: missing or unreadable bin_checksums (corrupted)") from None
    if values.shape[0] != rows:
        raise FormatError(f"{where}: {values.shape[0]} bin checksums for {rows} bins (corrupted)")
    return values


def _schema_metadata(schema: pa.Schema, path: Path) -> dict[str, Any] | None:
    raw = (schema.metadata or {}).get(METADATA_KEY)
    return None if raw is None else load_metadata(raw, f"{path}: schema")

