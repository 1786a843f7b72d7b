"""Parquet shards on object storage, written and read through ``pyarrow.fs`` with no local copy.

Writing (:class:`Writer`): pyarrow streams the file to a temporary key beside the final one
(its S3 output stream uploads parts as row groups fill, so memory stays one row group plus a
part), and :meth:`~packlab.formats.base.ShardWriter.finalize` publishes it with a server-side
copy, then deletes the temporary (see :mod:`packlab.storage` for why not the final key
directly: pyarrow cannot abort an upload, dropping the stream completes it). So:

- finished: the final key appears in one step (``CopyObject``), complete;
- failed with an exception: the temporary is closed and deleted, the final key never exists;
- killed: the multipart upload of the temporary is never completed, so no object exists at
  all (the store keeps the parts until a lifecycle rule ``AbortIncompleteMultipartUpload``,
  or an abort, removes them; they are invisible and unreadable meanwhile).

Reading (:class:`Reader`): the footer first, then row groups on demand, each a ranged GET::

    open         HEAD (size) + GET of the file's tail: max(footer + 8, tail_bytes) bytes
    bin i        GET of exactly the column chunks of the row group holding it (pre-buffered:
                 the three chunks are adjacent, so one coalesced request), then cached (LRU)

so a random access costs one row group plus, the first time, the footer; the tests check this
against the server's own request log. ``tail_bytes`` (default 64 KiB, pyarrow's own) trades a
second round trip for bytes: a footer larger than the tail costs one more GET.

The reader pickles (filesystem options, path and the footer's bytes), so a DataLoader worker
reopens it without reading the footer again.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from packlab.errors import FormatError, PacklabError
from packlab.formats import parquet
from packlab.formats.arrow_lists import ARROW_ERRORS, check_schema, parse_error
from packlab.storage import Location, publish_object, resolve

TAIL_BYTES = 64 << 10
_FOOTER_TRAILER = 8  # <i4 footer length + b"PAR1"


class Writer(parquet.Writer):
    """The ``parquet`` writer, streaming to object storage (a temporary key, then published).

    ``Writer("s3://bucket/out/shard_000000.parquet", pack_size=4096, filesystem=None, ...)``:
    the same keyword options as :class:`packlab.formats.parquet.Writer`.
    """

    def __init__(self, path: str | os.PathLike[str] | Location, *, filesystem: Any = None,
                 **options: Any) -> None:
        self.location = resolve(path, filesystem)
        self._stream: pa.NativeFile | None = None
        super().__init__(self.location, **options)

    # -- where the shard goes (hooks of ShardWriter) -----------------------------------------
    def _target(self, path: Any) -> Any:
        return self.location

    def _target_exists(self) -> bool:
        return self.location.exists()

    def _make_temporary(self) -> Any:
        return self.location.temporary()

    def _sink(self) -> Any:
        self._stream = self.tmp_path.open_output()
        return self._stream

    def _finish_file(self) -> int:
        stream, self._stream = self._stream, None
        assert stream is not None
        try:
            stream.close()  # completes the upload of the temporary
        except ARROW_ERRORS as exc:
            raise PacklabError(f"{self.path}: upload failed: {parse_error(exc)}") from None
        return self.tmp_path.size()

    def _publish(self) -> None:
        publish_object(self.tmp_path, self.location, overwrite=self.overwrite)

    def _remove_temporary(self) -> None:
        stream, self._stream = getattr(self, "_stream", None), None
        if stream is not None:
            try:
                stream.close()  # pyarrow cannot abort: close it, then delete what it made
            except ARROW_ERRORS:
                pass
        tmp = getattr(self, "tmp_path", None)
        if isinstance(tmp, Location):
            try:
                tmp.delete()
            except PacklabError:
                pass


class Reader(parquet.Reader):
    """The ``parquet`` reader over a remote object: footer first, ranged row-group reads.

    ``Reader("s3://bucket/shard.parquet", filesystem=None, tail_bytes=65536, ...)``, other
    options as :class:`packlab.formats.parquet.Reader` (``memory_map`` does not apply).
    """

    def __new__(cls, *args: Any, **options: Any) -> Reader:
        return object.__new__(cls)

    def __init__(self, path: str | os.PathLike[str] | Location, *, filesystem: Any = None,
                 tail_bytes: int = TAIL_BYTES, **options: Any) -> None:
        if options.pop("one_row_group_cache", False):
            raise PacklabError(f"{path}: one_row_group_cache is a local baseline only")
        options.pop("memory_map", None)
        self.location = resolve(path, filesystem)
        self.tail_bytes = max(int(tail_bytes), _FOOTER_TRAILER)
        self._footer: bytes | None = None
        self._input: pa.NativeFile | None = None
        self._input_pid = -1
        self.size = 0
        super().__init__(self.location, memory_map=False, **options)

    def _read_footer(self) -> pq.FileMetaData:
        """HEAD for the size, then the tail (and the rest of the footer if it is longer)."""
        f = self._input = self.location.open_input()  # kept: the first read needs no HEAD
        self._input_pid = os.getpid()
        self.size = int(f.size())
        if self.size < 12:
            raise FormatError(f"{self.path}: {self.size} bytes, too short for Parquet")
        tail = self._read_at(f, self.size - min(self.size, self.tail_bytes), self.size)
        if tail[-4:] != b"PAR1":
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
        check_schema(meta.schema.to_arrow_schema(), str(self.path))
        return meta

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
        return (*super()._handles(), "_input")

    def _open_file(self, verify: bool) -> pq.ParquetFile:
        meta = self._meta if self._meta is not None else self._parse_footer()
        if self._input is None or self._input_pid != os.getpid():
            self._input, self._input_pid = self.location.open_input(), os.getpid()
        try:
            return pq.ParquetFile(self._input, metadata=meta, pre_buffer=True,
                                  page_checksum_verification=verify)
        except ARROW_ERRORS as exc:
            raise FormatError(f"{self.path}: cannot open: {parse_error(exc)}") from None

    def row_group_bytes(self, group: int) -> int:
        """Bytes a read of row group ``group`` fetches: its column chunks, compressed."""
        meta = self._meta if self._meta is not None else self._parse_footer()
        rg = meta.row_group(group)
        return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))

    @property
    def footer_bytes(self) -> int:
        """The footer with its 8-byte trailer."""
        return len(self._footer or b"")

    def bytes_on_disk(self) -> int:
        return self.size

    def close(self) -> None:
        if self._input is not None and self._input_pid == os.getpid():
            self._input.close()
        super().close()
