"""Format ``parquet`` (RFC Option B): one Parquet file per shard, one row per bin.

Schema (what Nemotron writes and Megatron-Bridge reads)::

    input_ids     list<int32>   the packed tokens
    loss_mask     list<uint8>   next-token loss mask (0/1)
    seq_start_id  list<int32>   sub-sequence starts [0, s1, ...]

Written in the ``"compact"`` encoding by default (:mod:`packlab.formats.parquet.encoding`: zstd
level 9, PLAIN tokens, DELTA_BINARY_PACKED starts, 16 MiB pages; ``encoding="dictionary"``
writes what Nemotron writes, zstd level 1 with dictionary encoding everywhere), standard
encodings only,
``row_group_size`` bins per row group, CRC-32 page checksums, and the packlab metadata as JSON
under the footer key ``b"packlab"``, added at close (the footer is written last, so the counts
there are final)::

    {"format": "parquet", "version": "packlab_parquet_v1", "packlab_version": "0.1.0",
     "pack_size": 4096, "num_bins": 2000, "num_tokens": 7900312, "num_seqs": 10411,
     "row_group_size": 1000, "compression": "zstd", "compression_level": 9,
     "layout": "zstd-9 plain starts-delta page-16384K", "metadata": {}}

The writer buffers one row group as flat numpy arrays + offsets (allocated for a full row
group once, filled in place) and hands it to ``pq.ParquetWriter`` (on a temporary name,
published by rename) as one row group; after each it gives the Arrow pool's freed memory back,
so its memory is one row group (plus what pyarrow needs to encode it) whatever the shard's
size.

The reader parses only the footer at open; row groups are decoded on demand into numpy
(offsets + values buffers) and kept in a small LRU cache (``cache_row_groups``). Page
checksums are verified on every read, so a flipped bit is an error, never a wrong token: they
are Parquet's own per-page CRC-32 (a page holds about 50 bins of 4096 tokens), stored where
every reader expects them and ignored by those that do not check, so Parquet needs no per-bin
checksum of packlab's. Every decoded row group's bins are checked against every invariant
(structure and mask values: :meth:`BinColumns.check`, vectorized, a few percent of the
decode); ``verify=True`` forces the page checksums on if ``verify_checksums`` turned them off.
Files without packlab metadata (Nemotron's today) are read too: counts come from the footer's
column statistics and ``pack_size`` from the keyword or the longest bin.

:class:`OneRowGroupReader` reproduces Megatron-Bridge's current policy (one cached row group,
rows through ``as_py``) as the baseline for the benchmarks.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packlab.bins import PackedBin, check_convention
from packlab.errors import FormatError, PacklabError
from packlab.formats.parquet.encoding import (
    DEFAULT_ENCODING,
    ENCODINGS,
    ParquetEncoding,
    encoding_named,
    with_options,
)
from packlab.formats.shared import stacks
from packlab.formats.shared.arrow_lists import (
    ARROW_ERRORS,
    COLUMNS,
    METADATA_KEY,
    SCHEMA,
    BinColumns,
    ListBuffer,
    LRUCache,
    check_schema,
    decode,
    dump_metadata,
    load_metadata,
    parse_error,
    to_numpy,
)
from packlab.formats.shared.base import (
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    index_list,
    starts_with,
)
from packlab.storage.location import Location

FORMAT = "parquet"
SUFFIX = ".parquet"
VERSION = "packlab_parquet_v1"
DEFAULT_ROW_GROUP_SIZE = 1000
DEFAULT_CACHE_ROW_GROUPS = 4
_MAGIC = b"PAR1"
TAIL_BYTES = 64 << 10  # bytes of the file's tail read at open (pyarrow's own default)
_FOOTER_TRAILER = 8  # <i4 footer length + b"PAR1"


def detect(location: Location) -> bool:
    """A file that starts with the Parquet magic (the reader then checks the schema)."""
    return starts_with(location, _MAGIC)


class ParquetFacts(FormatFacts):
    """What ``parquet`` is: one Parquet file (RFC Option B)."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    READ_BY = ("Megatron-Bridge", "DuckDB", "HF datasets")
    STACK_INPUTS = (stacks.PACKED_PARQUET,)
    STREAMS = True
    READS_IN_PLACE = True
    SQL_READABLE = True
    BUFFERED_BINS = DEFAULT_ROW_GROUP_SIZE
    detect = staticmethod(detect)


class Writer(ParquetFacts, ShardWriter):
    """Streaming Parquet writer; memory bounded by one row group.

    Keyword options: ``encoding`` (``"compact"``, the default; ``"smallest"``; or
    ``"dictionary"``, the old default and Nemotron's: :data:`~packlab.formats.parquet.encoding.ENCODINGS`; or a
    :class:`~packlab.formats.parquet.encoding.ParquetEncoding`), ``row_group_size`` (bins per
    row group), and, over the encoding's choice, ``compression`` (zstd, snappy, gzip, brotli,
    lz4, none), ``compression_level``, ``use_dictionary`` (True: every column
    dictionary-encoded; False: none).

    Memory: the row group's numpy buffers (5 bytes per token), what pyarrow holds while it
    encodes one (its levels and pages, about 2-3x the row group's bytes) and a constant; freed
    memory goes back after each row group (``MemoryPool.release_unused``), so nothing grows with
    the number of row groups (the writer-memory contract test, notebook 04).
    """

    ENCODING_NAMES: ClassVar[tuple[str, ...]] = (DEFAULT_ENCODING,
                                                 *(n for n in ENCODINGS if n != DEFAULT_ENCODING))

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pack_size: int,
        encoding: str | ParquetEncoding = DEFAULT_ENCODING,
        row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
        compression: str | None = None,
        compression_level: int | None = None,
        use_dictionary: bool | None = None,
        **options: Any,
    ) -> None:
        if isinstance(row_group_size, bool) or int(row_group_size) < 1:
            raise PacklabError(f"{path}: row_group_size must be a positive number of bins, "
                               f"got {row_group_size!r}")
        self.encoding = with_options(encoding_named(encoding), row_group_size=row_group_size,
                                     compression=compression,
                                     compression_level=compression_level,
                                     use_dictionary=use_dictionary)
        self.row_group_size = int(row_group_size)
        self.compression = self.encoding.codec
        self.compression_level = self.encoding.level
        self.num_row_groups = 0
        super().__init__(path, pack_size=pack_size, **options)

    def _open(self) -> None:
        self._buffer = ListBuffer(self.row_group_size, source=str(self.path),
                                  capacity=self.row_group_size * self.pack_size)
        self._pool = pa.default_memory_pool()
        try:
            self._writer: pq.ParquetWriter | None = pq.ParquetWriter(
                self._sink(), SCHEMA, **self.encoding.writer_options())
        except ARROW_ERRORS as exc:
            self._remove_temporary()
            raise PacklabError(f"{self.path}: cannot write Parquet: {parse_error(exc)}") from None

    def _write(self, packed: PackedBin) -> None:
        if not self._buffer.fits(packed):
            self._flush()
        self._buffer.add(packed, self.bins_written)
        if self._buffer.rows >= self.row_group_size:
            self._flush()

    def _flush(self) -> None:
        if self._buffer.rows == 0:
            return
        assert self._writer is not None
        table = pa.Table.from_batches([self._buffer.record_batch()])
        try:
            self._writer.write_table(table, row_group_size=table.num_rows)
        except ARROW_ERRORS as exc:
            raise PacklabError(f"{self.path}: writing row group {self.num_row_groups} failed: "
                               f"{parse_error(exc)}") from None
        del table
        self.num_row_groups += 1
        self._buffer.clear()
        self._pool.release_unused()  # what encoding the row group took goes back now

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        self._flush()
        assert self._writer is not None
        record.update(
            version=VERSION, row_group_size=self.row_group_size, compression=self.compression,
            compression_level=self.compression_level, layout=self.encoding.name,
        )
        self._writer.add_key_value_metadata({METADATA_KEY: dump_metadata(record)})
        self._writer.close()
        self._writer = None
        return {**record, "num_row_groups": self.num_row_groups, "bytes": self._finish_file()}

    def _discard(self) -> None:
        writer, self._writer = getattr(self, "_writer", None), None
        if writer is not None:
            try:
                writer.close()
            except ARROW_ERRORS:
                pass


class Reader(ParquetFacts, ShardReader):
    """Lazy Parquet reader: footer at open, row groups decoded on demand into an LRU cache.

    ``read_bin`` returns copies (writable, and they do not pin a row group in memory).
    Options: ``pack_size`` (for files without packlab metadata; otherwise must agree),
    ``convention`` (what that pack size counts, for files without packlab metadata:
    ``"megatron_bridge"`` for Megatron-Bridge's packer, see :data:`packlab.bins.CONVENTIONS`),
    ``cache_row_groups`` (decoded row groups kept, default 4),
    ``verify_checksums`` (page CRCs on every read, default on), ``verify`` (page CRCs on,
    whatever ``verify_checksums`` says), ``use_threads``,
    ``one_row_group_cache`` (the Megatron-Bridge baseline instead, see below).
    """

    RECORD_ATTRIBUTE = "packlab"  # packlab's record, None in a file another program wrote

    COPY_BINS: ClassVar[bool] = True

    def __new__(cls, *args: Any, one_row_group_cache: bool = False, **options: Any) -> Reader:
        """``one_row_group_cache=True`` gives the :class:`OneRowGroupReader` baseline, so
        ``open_shard``/``open_dataset`` options can ask for it."""
        return super().__new__(OneRowGroupReader if one_row_group_cache else cls)

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        pack_size: int | None = None,
        convention: str = "packlab",
        cache_row_groups: int = DEFAULT_CACHE_ROW_GROUPS,
        verify_checksums: bool = True,
        use_threads: bool = False,
        one_row_group_cache: bool = False,
        tail_bytes: int = TAIL_BYTES,
        verify: bool = False,
    ) -> None:
        super().__init__(path, stat=False)  # opening the footer is the first request
        self.tail_bytes = max(int(tail_bytes), _FOOTER_TRAILER)
        self._footer: bytes | None = None  # the file's footer, kept to reopen it
        self._input: pa.NativeFile | None = None
        self._input_pid = -1
        self.size = 0
        self.cache_row_groups = int(cache_row_groups)
        self.verify = bool(verify)
        self.verify_checksums = verify_checksums or self.verify
        self.use_threads = use_threads
        self._pf: pq.ParquetFile | None = None
        self._pid = -1
        self._cache: LRUCache[int, BinColumns] | None = LRUCache(self.cache_row_groups)
        self._lengths: np.ndarray | None = None
        self._group_starts: list[int] | None = None
        meta = self._read_footer()
        self.num_row_groups = meta.num_row_groups
        rows = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)],
                        dtype=np.int64)
        self.row_group_offsets = np.concatenate(([0], np.cumsum(rows))).astype(np.int64)
        self.num_bins = int(meta.num_rows)
        if self.num_bins == 0:
            raise FormatError(f"{self.path}: no bins (empty Parquet file)")
        if int(self.row_group_offsets[-1]) != self.num_bins:
            raise FormatError(f"{self.path}: row groups hold {int(self.row_group_offsets[-1])} "
                              f"rows, the footer says {self.num_bins} (corrupted footer)")
        self._meta: pq.FileMetaData | None = meta
        self.num_tokens = _leaf_values(meta, "input_ids")
        self.num_seqs = _leaf_values(meta, "seq_start_id")
        self.packlab = _packlab_metadata(meta, self.path)
        codec = meta.row_group(0).column(0).compression.lower()
        self.compression = "none" if codec == "uncompressed" else codec
        self.convention = check_convention(convention)
        if self.packlab is not None:
            if convention != "packlab":
                raise PacklabError(f"{self.path}: written by packlab, whose bins follow the "
                                   f"'packlab' pack-size convention, not {convention!r}")
            self._check_metadata(pack_size)
        else:
            self.pack_size = int(pack_size) if pack_size else int(self.packed_lengths().max())

    # -- opening ------------------------------------------------------------------------------
    def _read_footer(self) -> pq.FileMetaData:
        """The size (a HEAD on object storage), the tail (one ranged read), and the rest of
        the footer if it is longer."""
        f = self._input = self._open_input()  # kept: the first row group reads through it
        self.size = int(f.size())
        if self.size < 12:
            raise FormatError(f"{self.path}: {self.size} bytes, too short for Parquet")
        tail = self._read_at(f, self.size - min(self.size, self.tail_bytes), self.size)
        if tail[-4:] != _MAGIC:
            raise FormatError(f"{self.path}: no Parquet magic at the end (truncated?)")
        length = int.from_bytes(tail[-8:-4], "little")
        need = length + _FOOTER_TRAILER
        if need > self.size - 4:
            raise FormatError(f"{self.path}: footer of {length} bytes in a file of "
                              f"{self.size} (corrupted)")
        if need > len(tail):
            tail = self._read_at(f, self.size - need, self.size - len(tail)) + tail
        self._footer = tail[-need:]
        meta = self._parse_footer()
        try:
            schema = meta.schema.to_arrow_schema()
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: not a readable Parquet file (corrupted "
                              f"footer?): {parse_error(exc)}") from None
        check_schema(schema, str(self.path))
        return meta

    def _open_input(self) -> pa.NativeFile:
        """This process's random-access file, read (not mapped: a row group's pages would stay
        in the process's resident set, up to the whole file over an epoch)."""
        self._input_pid = os.getpid()
        try:
            return self.location.open_input()
        except FormatError:
            if self.location.is_dir():
                raise FormatError(f"{self.path}: is a directory, not a Parquet file") from None
            raise

    def _check_metadata(self, pack_size: int | None) -> None:
        info = self.packlab
        assert info is not None
        if info.get("format") != FORMAT:
            raise FormatError(f"{self.path}: packlab metadata names format {info.get('format')!r}")
        for key in ("pack_size", "num_bins", "num_tokens", "num_seqs"):
            count_field(info, key, f"{self.path}: packlab metadata")
        self.pack_size = int(info["pack_size"])
        if pack_size is not None and int(pack_size) != self.pack_size:
            raise PacklabError(f"{self.path}: pack_size {pack_size} given, the file says "
                               f"{self.pack_size}")
        found = {"num_bins": self.num_bins, "num_tokens": self.num_tokens,
                 "num_seqs": self.num_seqs}
        for key, value in found.items():
            if info[key] != value:
                raise FormatError(f"{self.path}: footer has {value} {key[4:]}, packlab metadata "
                                  f"says {info[key]} (inconsistent shard)")

    def _read_at(self, f: pa.NativeFile, start: int, end: int) -> bytes:
        try:
            return f.read_at(end - start, start)
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: reading bytes {start}..{end}: "
                              f"{parse_error(exc)}") from None

    def _parse_footer(self) -> pq.FileMetaData:
        assert self._footer is not None
        try:
            return pq.read_metadata(pa.BufferReader(self._footer))
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: not a readable Parquet footer: "
                              f"{parse_error(exc)}") from None

    def _handles(self) -> Sequence[str]:
        # _lengths: decoded from every row group, 8 bytes a bin; a worker recomputes it if asked
        return ("_pf", "_cache", "_meta", "_input", "_lengths")

    def _file(self) -> pq.ParquetFile:
        """The open file, reopened after pickling or in a forked worker."""
        if self._pf is None or self._pid != os.getpid():
            self._pf = self._open_file(self.verify_checksums)
            self._pid = os.getpid()
        return self._pf

    def _open_file(self, verify: bool) -> pq.ParquetFile:
        try:
            meta = self._meta if self._meta is not None else self._parse_footer()
            if self._input is None or self._input_pid != os.getpid():
                self._input = self._open_input()
            # the three column chunks of a row group are adjacent: one coalesced read (one
            # ranged GET on object storage)
            return pq.ParquetFile(self._input, metadata=meta, pre_buffer=True,
                                  page_checksum_verification=verify)
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: cannot open: {parse_error(exc)}") from None

    # -- decoding -----------------------------------------------------------------------------
    def row_group_of(self, index: int | np.ndarray) -> Any:
        """Row group(s) holding bin(s) ``index`` (for row-group-aware samplers)."""
        return np.searchsorted(self.row_group_offsets, index, side="right") - 1

    def _decode(self, pf: pq.ParquetFile, group: int, columns: Sequence[str] = COLUMNS
                ) -> pa.Table:
        first, last = int(self.row_group_offsets[group]), int(self.row_group_offsets[group + 1])
        try:
            table = pf.read_row_group(group, columns=list(columns), use_threads=self.use_threads)
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: row group {group} (bins {first}..{last - 1}): "
                              f"{parse_error(exc)}") from None
        if table.num_rows != last - first:
            raise FormatError(f"{self.path}: row group {group}: {table.num_rows} rows, the footer "
                              f"says {last - first}")
        return table

    def _load(self, group: int) -> BinColumns:
        """Row group ``group`` decoded, every bin's invariants checked (a few percent of the
        decode: notebook 05)."""
        first = int(self.row_group_offsets[group])
        cols = decode(self._decode(self._file(), group), source=str(self.path), first_bin=first)
        cols.check(pack_size=self.pack_size, source=str(self.path), first_bin=first,
                   convention=self.convention)
        # what the decode's temporaries held goes back to the system: Arrow's allocator keeps
        # freed memory (3x the decoded row groups after 3,000 random reads of one shard)
        pa.default_memory_pool().release_unused()
        return cols

    def _group(self, group: int) -> BinColumns:
        if self._cache is None:
            self._cache = LRUCache(self.cache_row_groups)
        return self._cache.get(group, self._load)

    def cache_stats(self) -> dict[str, Any]:
        return self._cache.stats() if self._cache is not None else {}

    # -- reading ------------------------------------------------------------------------------
    def read_bin(self, index: int) -> PackedBin:
        index = self.check_index(index)
        group = int(np.searchsorted(self.row_group_offsets, index, side="right")) - 1
        return self._group(group).bin(index - int(self.row_group_offsets[group]),
                                      copy=self.COPY_BINS)

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        """Many bins; each row group involved is decoded once, whatever the order asked.

        A plain loop (bisect over the row-group starts, a sort of the batch by row group):
        for the batches a DataLoader asks, a dozen small numpy calls cost more than the bins.
        """
        starts = self._group_starts
        if starts is None:
            starts = self._group_starts = self.row_group_offsets[:-1].tolist()
        count = self.num_bins
        wanted = [i if 0 <= i < count else self.check_index(i) for i in index_list(indices)]
        groups = [bisect_right(starts, i) - 1 for i in wanted]
        out: list[PackedBin | None] = [None] * len(wanted)
        current, cols = -1, None
        for k in sorted(range(len(wanted)), key=groups.__getitem__):
            group = groups[k]
            if group != current:
                current, cols = group, self._group(group)
            out[k] = cols.bin(wanted[k] - starts[group], copy=self.COPY_BINS)  # type: ignore[union-attr]
        return out  # type: ignore[return-value]

    def iter_bins(self) -> Iterator[PackedBin]:
        """Every bin in order, one row group decoded at a time (bypasses the cache)."""
        pf = self._file()
        for group in range(self.num_row_groups):
            cols = decode(self._decode(pf, group), source=str(self.path),
                          first_bin=int(self.row_group_offsets[group]))
            for j in range(cols.rows):
                yield cols.bin(j, copy=self.COPY_BINS)

    def packed_lengths(self) -> np.ndarray:
        """Packed length of every bin, from the list offsets of the (small) loss_mask column."""
        if self._lengths is None:
            pf = self._file()
            parts = []
            for group in range(self.num_row_groups):
                cached = self._cache.peek(group) if self._cache is not None else None
                if cached is not None:
                    parts.append(cached.packed_lengths())
                    continue
                column = self._decode(pf, group, ["loss_mask"]).column("loss_mask")
                offsets = to_numpy(column.combine_chunks().offsets)
                parts.append(np.diff(offsets.astype(np.int64)))
            self._lengths = np.concatenate(parts)
        return self._lengths

    def validate(self) -> dict[str, Any]:
        """Footer, metadata, every page's CRC, counts, and every bin's invariants."""
        pf = self._open_file(verify=True)
        tokens = seqs = 0
        source = str(self.path)
        try:
            for group in range(self.num_row_groups):
                first = int(self.row_group_offsets[group])
                cols = decode(self._decode(pf, group), source=source, first_bin=first)
                cols.check(pack_size=self.pack_size, source=source, first_bin=first,
                           convention=self.convention)
                tokens += int(cols.token_offsets[-1])
                seqs += int(cols.seq_offsets[-1])
        finally:
            pf.close()
        if (tokens, seqs) != (self.num_tokens, self.num_seqs):
            raise FormatError(f"{self.path}: {tokens} tokens and {seqs} sequences decoded, the "
                              f"footer says {self.num_tokens} and {self.num_seqs}")
        return {**self.info(), "packlab_metadata": self.packlab is not None}

    def info(self) -> dict[str, Any]:
        rows = np.diff(self.row_group_offsets)
        return {**super().info(), "num_seqs": self.num_seqs, "num_row_groups": self.num_row_groups,
                "row_group_size": int(rows.max()), "compression": self.compression}

    def row_group_bytes(self, group: int) -> int:
        """Bytes a read of row group ``group`` fetches: its column chunks, compressed."""
        meta = self._meta if self._meta is not None else self._file().metadata
        rg = meta.row_group(group)
        return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))

    @property
    def footer_bytes(self) -> int:
        """The file's footer with its 8-byte trailer (what opening it fetched)."""
        return len(self._footer or b"")

    def bytes_on_disk(self) -> int:
        return self.size

    def close(self) -> None:
        if self._pf is not None:
            self._pf.close()
        if self._input is not None and self._input_pid == os.getpid():
            self._input.close()
        super().close()


class OneRowGroupReader(Reader):
    """Megatron-Bridge's current policy, kept as a baseline: exactly one cached row group,
    held as an Arrow table, rows extracted with ``as_py`` (then turned into numpy)."""

    def __init__(self, path: str | os.PathLike[str], **options: Any) -> None:
        options["cache_row_groups"] = 1
        options.pop("one_row_group_cache", None)
        super().__init__(path, **options)
        self._table: pa.Table | None = None
        self._table_group = -1

    def _handles(self) -> Sequence[str]:
        return (*super()._handles(), "_table")

    def read_bin(self, index: int) -> PackedBin:
        index = self.check_index(index)
        group = int(np.searchsorted(self.row_group_offsets, index, side="right")) - 1
        if self._table is None or self._table_group != group:
            self._table = self._decode(self._file(), group)
            self._table_group = group
        j = index - int(self.row_group_offsets[group])
        return PackedBin(
            np.array(self._table.column("input_ids")[j].as_py(), dtype=np.int32),
            np.array(self._table.column("loss_mask")[j].as_py(), dtype=np.uint8),
            np.array(self._table.column("seq_start_id")[j].as_py(), dtype=np.int32),
        )

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        return [self.read_bin(int(i)) for i in np.asarray(indices).reshape(-1)]


def _leaf_values(meta: pq.FileMetaData, name: str) -> int:
    """Values of a list column from the footer (no data read): every bin is non-empty, so the
    column chunks' value counts are the tokens (or sequence starts)."""
    index = meta.schema.to_arrow_schema().get_field_index(name)
    leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == name]
    if index < 0 or len(leaf) != 1:
        return 0
    return sum(meta.row_group(g).column(leaf[0]).num_values for g in range(meta.num_row_groups))


def _packlab_metadata(meta: pq.FileMetaData, path: Path) -> dict[str, Any] | None:
    raw = (meta.metadata or {}).get(METADATA_KEY)
    return None if raw is None else load_metadata(raw, f"{path}: footer")
