"""Atomic publishing and checksums, shared by the spool and every shard writer.

Work happens under a hidden temporary name beside the final one (same filesystem), and one
``rename`` publishes it: a crash leaves a temporary to sweep, never a half file under the
final name. ``with staged(final) as tmp:`` is the whole pattern (write ``tmp``; a normal exit
publishes it, an exception removes it); :class:`Staging` is the same for a writer whose
publish and abort are methods of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from xxhash import xxh3_64

from packlab.errors import FormatError, PacklabError, one_line

#: the record a directory (a directory shard, a spool) publishes last: its counts and every
#: file's size and SHA-256, so a copy (an upload, a download) can prove itself whole
DIRECTORY_RECORD = "manifest.json"

TMP_MARKER = ".tmp-"


def check_path_name(path: str | os.PathLike[str]) -> None:
    """A path the OS accepts but UTF-8 cannot spell (bytes that are no character) is refused,
    one line, before anything is read or written: the filesystems, records and SQL packlab
    uses name paths in UTF-8."""
    try:
        os.fsdecode(path).encode("utf-8")
    except UnicodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")  # as `ls -b` shows it
        raise PacklabError(f"{shown:.200}: the path is not valid UTF-8 (rename it, or choose "
                           "another path)") from None


def temporary_sibling(final: Path) -> Path:
    """A unique hidden name beside ``final``, so the rename that publishes it is atomic:
    ``.NAME.tmp-PID-XXXXXXXX``, the writing process's id in it (what ``packlab gc`` reads to
    tell a killed writer's temporary from a live one's; scratch files add a suffix)."""
    return final.parent / f".{final.name}{TMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and TMP_MARKER in path.name


def stands_for(path: Path) -> Path:
    """The path a temporary (:func:`temporary_sibling`) is written for; any other path as it
    is. What a message names: the user's path, not ``.NAME.tmp-PID-XXXXXXXX``."""
    if not is_temporary(path):
        return path
    return path.with_name(path.name[1:path.name.index(TMP_MARKER)])


_OWNER = re.compile(re.escape(TMP_MARKER) + r"(\d+)-[0-9a-f]{8}")


def temporary_owner(path: Path) -> int | None:
    """The process id in a temporary's name (:func:`temporary_sibling`), or None."""
    found = _OWNER.search(path.name) if is_temporary(path) else None
    return int(found.group(1)) if found else None


def process_running(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine (a zombie, killed and not yet reaped by
    its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc here: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def left_by_a_dead_writer(path: Path) -> bool:
    """A temporary whose writer (the process id in its name) no longer runs: a killed run's,
    which no one will finish or remove (``packlab gc`` and every writer sweep them)."""
    owner = temporary_owner(path)
    return owner is not None and not process_running(owner)


def parse_json(data: str | bytes, where: object, *, unreadable: str = "unreadable JSON") -> Any:
    """JSON from bytes read off disk (records, receipts, footers), whatever they hold: bytes
    that are not UTF-8, broken syntax, nesting deeper than the parser's recursion limit, an
    integer of more digits than Python converts: one FormatError ``"{where}: {unreadable}:
    ..."``, never the parser's own exception."""
    try:
        return json.loads(data)
    except RecursionError:
        raise FormatError(f"{where}: {unreadable}: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise FormatError(f"{where}: {unreadable}: {one_line(exc, 200)}") from None


def read_bytes(path: Path, *, unreadable: str = "unreadable") -> bytes:
    """The bytes of a small file (a record, a receipt); an OSError is one FormatError
    ``"{path}: {unreadable}: ..."``."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: {unreadable}: {exc.strerror}") from None


def read_json(path: Path, *, unreadable: str = "unreadable JSON") -> Any:
    """:func:`parse_json` of the file at ``path`` (an OSError is a FormatError too)."""
    return parse_json(read_bytes(path, unreadable=unreadable), path, unreadable=unreadable)


def parse_versioned_json(data: str | bytes, where: object, *, version: str, kind: str,
                         unreadable: str = "unreadable") -> dict[str, Any]:
    """A JSON object whose ``version`` is ``version`` (spool records, blend files, chunk
    plans); anything else is one FormatError naming ``where``: ``"{where}: {unreadable}:
    ..."`` for bad JSON, ``"{where}: not a {version} {kind}"`` for the wrong document."""
    obj = parse_json(data, where, unreadable=unreadable)
    if not isinstance(obj, dict) or obj.get("version") != version:
        raise FormatError(f"{where}: not a {version} {kind}")
    return obj


def canonical(obj: Any) -> bytes:
    """The one JSON spelling of ``obj`` that is hashed (sorted keys, compact)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      default=json_default).encode()


def short_digest(data: str | bytes, digits: int = 16) -> str:
    """The first ``digits`` hex digits of ``data``'s sha256 (a string hashed as UTF-8)."""
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()[:digits]


def short_hash(obj: Any, digits: int = 16) -> str:
    """A short, stable identity of a JSON-able object (run, configuration and job hashes)."""
    return short_digest(canonical(obj), digits)


def json_default(value: Any) -> Any:
    """``json.dumps(..., default=json_default)``: numpy arrays as lists, numpy scalars as Python
    numbers, anything else as its string. (``tolist`` does both for numpy; ``item`` alone fails
    on an array of more than one element.)"""
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def read_versioned_json(path: Path, *, version: str, kind: str,
                        unreadable: str = "unreadable") -> dict[str, Any] | None:
    """:func:`parse_versioned_json` of the file at ``path``; None when there is no such file
    (each caller says what a missing one means), a FormatError when it cannot be read."""
    if not path.is_file():
        return None
    return parse_versioned_json(read_bytes(path, unreadable=unreadable), path, version=version,
                                kind=kind, unreadable=unreadable)


def json_kind(value: Any) -> str:
    """A parsed JSON value in JSON's words (``a string``, ``an array``, ``null``), for
    messages about a user's records: never a Python type name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()}"
    kinds = ((str, "a string"), (int | float, "a number"), (list, "an array"), (dict, "an object"))
    return next((word for kind, word in kinds if isinstance(value, kind)), "another value")


def require_file(path: str | os.PathLike[str], expected: str,
                 describe: Callable[[Path], str] | None = None) -> Path:
    """``path`` when it is a file; else one line saying what it is and that ``expected`` (``a
    chat JSONL file``) was: missing, or a folder (``describe`` names what a folder is where the
    caller knows more: a spool, a pack output).
    A folder given where a file goes is not "no such file": the user has something there."""
    path = Path(path)
    if path.is_file():
        return path
    if path.is_dir():
        what = describe(path) if describe is not None else "a folder"
        raise PacklabError(f"{path}: {what}, not {expected}")
    raise PacklabError(f"{path}: no such file ({expected} expected)")


def refuse_existing(final: Path, *, overwrite: bool) -> None:
    """Refuse to replace ``final`` (a file, directory or link) unless ``overwrite``."""
    if not overwrite and (final.exists() or final.is_symlink()):
        raise PacklabError(f"{final}: already exists (pass overwrite=True to replace it)")


def publish(tmp: Path, final: Path, *, overwrite: bool) -> None:
    """Rename a finished file or directory into place in one step."""
    if final.exists() or final.is_symlink():
        if not overwrite:
            remove(tmp)
            refuse_existing(final, overwrite=overwrite)
        if final.is_dir() and not final.is_symlink():
            trash = temporary_sibling(final)
            os.rename(final, trash)
            os.rename(tmp, final)
            remove(trash)
        else:
            os.replace(tmp, final)
    else:
        os.rename(tmp, final)
    fsync_directory(final.parent)


class Staging:
    """``final`` in the making, under a hidden temporary sibling (``path``): :meth:`publish`
    renames it into place, :meth:`discard` removes it. For a writer that publishes or aborts
    in methods of its own; a block of code uses :func:`staged`.

    An existing ``final`` is refused now, before any work, unless ``overwrite`` (and again at
    publish). With ``directory`` the temporary is made as an empty directory. The parent
    directory must exist.
    """

    def __init__(self, final: Path, *, overwrite: bool = False, directory: bool = False) -> None:
        refuse_existing(final, overwrite=overwrite)
        self.final = final
        self.overwrite = overwrite
        self.path = temporary_sibling(final)
        if directory:
            self.path.mkdir()

    def publish(self) -> None:
        """One rename (replacing ``final`` if allowed), then the parent directory's fsync."""
        publish(self.path, self.final, overwrite=self.overwrite)

    def discard(self) -> None:
        """Remove the temporary (whatever was written so far); ``final`` is untouched."""
        remove(self.path)


@contextmanager
def staged(final: Path, *, overwrite: bool = False, directory: bool = False) -> Iterator[Path]:
    """``with staged(final) as tmp:`` write ``tmp``; a normal exit publishes it as ``final``
    (one rename, the parent fsynced), any exception removes it, so ``final`` is either the
    old one or the whole new one. ``overwrite`` and ``directory`` as for :class:`Staging`
    (make ``tmp`` durable first where it matters: a file's fsync is the writer's)."""
    staging = Staging(final, overwrite=overwrite, directory=directory)
    try:
        yield staging.path
        staging.publish()
    except BaseException:
        staging.discard()
        raise


def remove(path: Path) -> None:
    """Remove a file or directory tree if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a directory's entries (so a rename in it survives a crash)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


fsync_directory = fsync_path
fsync_file = fsync_path


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Streamed SHA-256 of a file through a 1 MiB buffer (a writer hashing what it wrote keeps
    its memory flat; larger reads hash no faster)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def xxh3_of_range(path: Path, start: int, stop: int, chunk: int = 1 << 20) -> int:
    """xxh3_64 of bytes ``[start, stop)`` of a file, read (not mapped: nothing stays in the
    process's resident set) through one reused buffer; a short file is a FormatError."""
    digest = xxh3_64()
    buffer = bytearray(min(chunk, max(0, stop - start)))
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY)
    try:
        at = start
        while at < stop:
            want = min(len(buffer), stop - at)
            got = os.preadv(fd, [view[:want]], at)
            if got <= 0:
                raise FormatError(f"{path}: {at} bytes, shorter than its record says "
                                  "(truncated)")
            digest.update(view[:got])
            at += got
    finally:
        os.close(fd)
    return digest.intdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """The record entry of a finished file: its size and checksum."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


WRITE_BUFFER = 4 << 20
WRITE_ALIGN = 2 << 20  # a huge page (x86-64, arm64 with 4 KB pages): the largest page-cache folio


class AlignedWriter:
    """A new binary file whose writes reach the kernel at least ``WRITE_BUFFER`` bytes at a
    time, each ending at a multiple of ``WRITE_ALIGN`` bytes of the file (but the last).

    Why: the page cache keeps a file in folios as large as the writes that made it allow (up
    to a huge page, when a write covers an aligned one), and a warm mapped read copies out of
    large folios faster. Measured on notebook 11's bins, plain maps of the same bytes: 5.3 µs
    a bin from a file written 8 KB at a time (a bin per write), 4.9 µs from 4 MB writes,
    4.8 µs from one write. packlab's mapped formats against raw CSR numpy (``np.save``: one
    write, large folios) on the same bins: 1.08x written a bin at a time, 1.01-1.03x in
    aligned writes (the copy then costs the same; what is left is the dataset's API).
    Memory: ``WRITE_BUFFER`` plus the largest single write.

    The file-object methods packlab's writers use: ``write``, ``tell``, ``seek`` (writes
    out what is buffered first), ``flush``, ``fileno``, ``close``, ``closed``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._raw = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._buffer = bytearray()
        self._at = 0  # where the buffer's first byte goes in the file

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._buffer += view
        if len(self._buffer) >= WRITE_BUFFER:
            self._drain(aligned=True)
        return view.nbytes

    def _drain(self, *, aligned: bool) -> None:
        """Write the buffer out: all of it, or (``aligned``) up to the last ``WRITE_ALIGN``
        boundary of the file it reaches."""
        end = self._at + len(self._buffer)
        count = (end - end % WRITE_ALIGN if aligned else end) - self._at
        if count <= 0:
            return
        with memoryview(self._buffer) as view:
            done = 0
            while done < count:
                done += self._raw.write(view[done:count])
        del self._buffer[:count]
        self._at += count

    def tell(self) -> int:
        return self._at + len(self._buffer)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._drain(aligned=False)
        self._at = self._raw.seek(offset, whence)
        return self._at

    def flush(self) -> None:
        self._drain(aligned=False)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self._raw.closed:
            try:
                self._drain(aligned=False)
            finally:
                self._raw.close()


class HashedFile:
    """An append-only binary file that hashes what it writes, so no second read is needed.

    ``bytes`` is its length so far (where the next write lands). A file whose checksum covers
    part of it writes the rest with ``hashed=False`` (a header reserved now and filled in last
    with :meth:`patch`, a footer that records :meth:`hexdigest`).
    """

    def __init__(self, path: Path, *, aligned: bool = True) -> None:
        """``aligned``: through an :class:`AlignedWriter` (shard data, read through maps);
        False for a writer that sizes its own writes (the spool flushes ``_FLUSH_TOKENS`` at a
        time) and keeps its memory to what it set."""
        self.path = path
        self._file = AlignedWriter(path) if aligned else open(path, "wb")  # noqa: SIM115
        self._hash = hashlib.sha256()
        self.bytes = 0

    def __enter__(self) -> HashedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()  # closed already by close() when the block finished its file

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, data: np.ndarray | bytes, *, hashed: bool = True) -> None:
        if isinstance(data, np.ndarray):
            view = memoryview(np.ascontiguousarray(data)).cast("B")
        else:
            view = memoryview(data).cast("B")
        self._file.write(view)
        if hashed:
            self._hash.update(view)
        self.bytes += view.nbytes

    def align(self, boundary: int = 8) -> None:
        """Zero padding (hashed) up to the next multiple of ``boundary`` bytes."""
        self.write(bytes(-self.bytes % boundary))

    def hexdigest(self) -> str:
        """SHA-256 of the hashed bytes written so far."""
        return self._hash.hexdigest()

    def patch(self, offset: int, data: bytes) -> None:
        """Overwrite bytes already written at ``offset`` (unhashed: a header whose fields are
        known only at the end); writing carries on at the end of the file."""
        if offset < 0 or offset + len(data) > self.bytes:
            raise ValueError(f"{self.path}: patch of {len(data)} bytes at {offset} is outside "
                             f"the {self.bytes} bytes written")
        self._file.seek(offset)
        self._file.write(data)
        self._file.seek(0, os.SEEK_END)

    def close(self) -> dict[str, Any]:
        """Flush to disk and return the record entry (bytes, sha256)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"bytes": self.bytes, "sha256": self._hash.hexdigest()}

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()


def verify_files(directory: Path, files: dict[str, dict[str, Any]], *, checksums: bool) -> None:
    """Check that every file a record lists is present, of its size, and (optionally) its hash."""
    if not isinstance(files, dict) or not all(
            isinstance(name, str) and "/" not in name and name not in ("", ".", "..")
            and isinstance(entry, dict) for name, entry in files.items()):
        raise FormatError(f"{directory}: its record's 'files' is not a map of file names to "
                          "sizes and checksums (corrupted)")
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise FormatError(f"{path}: missing (the record lists it)")
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise FormatError(f"{path}: {size} bytes, record says {entry.get('bytes')} (truncated?)")
        if checksums and sha256_file(path) != entry.get("sha256"):
            raise FormatError(f"{path}: checksum mismatch (corrupted)")
