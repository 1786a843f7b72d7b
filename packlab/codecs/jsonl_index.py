"""A line index of a JSONL file: random access to record ``i`` without reading the file.

Modalities' index generator does the same, but with a small labelled binary
file instead of a pickle, built streaming (memory bounded by one buffer of entries, never by
the JSONL). The index sits beside the data as ``<name>.jsonl.idx``::

    magic          8 bytes   b"PLJSIDX\\x00"
    version        <u8       1
    count          <u8       number of records (non-blank lines)
    source_bytes   <u8       size of the JSONL when indexed
    source_mtime   <i8       its st_mtime_ns when indexed
    entries        count x {offset <u8, length <u8, line <u8}

``offset``/``length`` locate the record's bytes (without the line terminator); ``line`` is its
1-based line number, so errors name the line a person sees in an editor even when blank lines
are skipped. An index whose source size or mtime changed is refused as stale: rebuild it.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import FormatError, PacklabError
from packlab.storage.files import json_kind, require_file, staged

MAGIC = b"PLJSIDX\x00"
VERSION = 1
HEADER = struct.Struct("<8sQQQq")
ENTRY = np.dtype([("offset", "<u8"), ("length", "<u8"), ("line", "<u8")])
SUFFIX = ".idx"
_BOM = b"\xef\xbb\xbf"
_FLUSH_ENTRIES = 1 << 16


def index_path(jsonl: str | os.PathLike[str]) -> Path:
    """Where the index of ``jsonl`` lives: beside it, with ``.idx`` appended."""
    jsonl = Path(jsonl)
    return jsonl.with_name(jsonl.name + SUFFIX)


def iter_jsonl_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, int, bytes]]:
    """Stream ``(line_number, byte_offset, raw_bytes)`` of every non-blank line.

    Line numbers are 1-based; ``raw_bytes`` excludes the line terminator (``\\n`` or ``\\r\\n``)
    and a leading UTF-8 byte order mark. Reading is buffered: one line in memory at a time.
    """
    path = Path(path)
    if path.is_dir():
        raise PacklabError(f"{path}: is a directory, expected a JSONL file")
    offset = 0
    with open(path, "rb") as f:
        for number, line in enumerate(f, start=1):
            start, size = offset, len(line)
            offset += size
            if number == 1 and line.startswith(_BOM):
                line, start = line[len(_BOM):], start + len(_BOM)
            body = line.rstrip(b"\r\n")
            if body.strip():
                yield number, start, body


def count_lines(path: str | os.PathLike[str]) -> int:
    """The lines of a file (a last one without a terminator counts), read a megabyte at a
    time."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            lines += chunk.count(b"\n")
            last = chunk[-1:]
    return lines + (last != b"\n")


def parse_json_line(path: str | os.PathLike[str], line: int, raw: bytes) -> dict[str, Any]:
    """One JSONL record as a dict; any defect is a PacklabError naming file and line."""
    try:
        record = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise PacklabError(f"{path}: line {line}: not valid UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise PacklabError(f"{path}: line {line}: malformed JSON: {exc.msg} "
                           f"(column {exc.colno})") from None
    except RecursionError:
        raise PacklabError(f"{path}: line {line}: JSON nested too deeply") from None
    if not isinstance(record, dict):
        raise PacklabError(f"{path}: line {line}: expected a JSON object, "
                           f"got {json_kind(record)}")
    return record


def build_jsonl_index(
    jsonl: str | os.PathLike[str],
    index: str | os.PathLike[str] | None = None,
    *,
    validate: bool = True,
) -> Path:
    """Index ``jsonl`` streaming and publish the index atomically; returns the index path.

    With ``validate`` every line is parsed once, so a malformed line fails here (naming its
    line number) rather than at training time.
    """
    jsonl = Path(jsonl)
    out = Path(index) if index is not None else index_path(jsonl)
    require_file(jsonl, "a JSONL file")
    before = jsonl.stat()
    with staged(out, overwrite=True) as tmp:
        count = _write_entries(jsonl, tmp, validate=validate)
        after = jsonl.stat()
        if (after.st_size, after.st_mtime_ns) != (before.st_size, before.st_mtime_ns):
            raise PacklabError(f"{jsonl}: changed while it was being indexed")
        with open(tmp, "r+b") as f:
            f.write(HEADER.pack(MAGIC, VERSION, count, before.st_size, before.st_mtime_ns))
            f.flush()
            os.fsync(f.fileno())
    return out


def _write_entries(jsonl: Path, tmp: Path, *, validate: bool) -> int:
    """Write a placeholder header and every entry; return the count (header patched later)."""
    buffer = np.empty(_FLUSH_ENTRIES, dtype=ENTRY)
    count = filled = 0
    with open(tmp, "wb") as f:
        f.write(b"\x00" * HEADER.size)
        for line, offset, raw in iter_jsonl_lines(jsonl):
            if validate:
                parse_json_line(jsonl, line, raw)
            buffer[filled] = (offset, len(raw), line)
            filled += 1
            if filled == _FLUSH_ENTRIES:
                f.write(buffer.tobytes())
                count, filled = count + filled, 0
        f.write(buffer[:filled].tobytes())
        count += filled
    return count


class JsonlIndex:
    """Random access into a JSONL file through its index; lazy and picklable.

    Opening reads the 40-byte header; the entries are a read-only memory map and the JSONL is
    opened on first access (and reopened after unpickling, e.g. in a DataLoader worker).
    """

    def __init__(
        self, jsonl: str | os.PathLike[str], index: str | os.PathLike[str] | None = None
    ) -> None:
        self.jsonl = Path(jsonl)
        self.index = Path(index) if index is not None else index_path(self.jsonl)
        self.count = self._check_header()
        self._entries: np.ndarray | None = None
        self._file: Any = None

    def _check_header(self) -> int:
        if not self.index.is_file():
            raise FormatError(f"{self.index}: no such JSONL index (build it first)")
        if not self.jsonl.is_file():
            raise FormatError(f"{self.jsonl}: no such file (the index {self.index.name} "
                              f"points to it)")
        size = self.index.stat().st_size
        with open(self.index, "rb") as f:
            head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise FormatError(f"{self.index}: {len(head)} bytes, shorter than the header")
        magic, version, count, source_bytes, source_mtime = HEADER.unpack(head)
        if magic != MAGIC:
            raise FormatError(f"{self.index}: not a packlab JSONL index (bad magic {magic!r})")
        if version != VERSION:
            raise FormatError(f"{self.index}: index version {version}, expected {VERSION}")
        want = HEADER.size + count * ENTRY.itemsize
        if size != want:
            raise FormatError(f"{self.index}: {size} bytes, header says {want} "
                              f"({count} entries): truncated or corrupted")
        stat = self.jsonl.stat()
        if (stat.st_size, stat.st_mtime_ns) != (source_bytes, source_mtime):
            raise FormatError(f"{self.index}: stale: {self.jsonl} changed since it was "
                              f"indexed (rebuild the index)")
        return int(count)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_entries"] = None
        state["_file"] = None
        return state

    @property
    def entries(self) -> np.ndarray:
        """The entries as a structured array (``offset``, ``length``, ``line``), memory-mapped."""
        if self._entries is None:
            if self.count == 0:
                self._entries = np.empty(0, dtype=ENTRY)
            else:
                self._entries = np.memmap(self.index, dtype=ENTRY, mode="r",
                                          offset=HEADER.size, shape=(self.count,))
        return self._entries

    def __len__(self) -> int:
        return self.count

    def read_bytes(self, i: int) -> bytes:
        """The raw bytes of record ``i`` (one ``pread``)."""
        if not -self.count <= i < self.count:
            raise IndexError(f"{self.jsonl}: record {i} out of range [0, {self.count})")
        entry = self.entries[i]
        offset, length = int(entry["offset"]), int(entry["length"])
        if self._file is None:
            self._file = open(self.jsonl, "rb")  # noqa: SIM115 - kept open for reuse
        raw = os.pread(self._file.fileno(), length, offset)
        if len(raw) != length:
            raise FormatError(f"{self.jsonl}: line {int(entry['line'])}: file ends early "
                              f"(truncated since indexing?)")
        return raw

    def read_record(self, i: int) -> dict[str, Any]:
        """Record ``i`` parsed; a malformed line is a PacklabError naming file and line."""
        raw = self.read_bytes(i)
        return parse_json_line(self.jsonl, int(self.entries[i]["line"]), raw)

    __getitem__ = read_record

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> JsonlIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def open_jsonl_index(jsonl: str | os.PathLike[str], *, build: bool = True) -> JsonlIndex:
    """Open the index beside ``jsonl``, (re)building it when missing or stale and ``build``."""
    path = index_path(jsonl)
    if build:
        try:
            return JsonlIndex(jsonl, path)
        except FormatError:
            if not Path(jsonl).is_file():
                raise
            build_jsonl_index(jsonl, path)
    return JsonlIndex(jsonl, path)
