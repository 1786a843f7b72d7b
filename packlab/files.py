"""Atomic publishing and checksums, shared by the spool and every shard writer.

Work happens under a hidden temporary name beside the final one (same filesystem), and one
``rename`` publishes it: a crash leaves a temporary to sweep, never a half file under the
final name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from packlab.errors import FormatError, PacklabError

TMP_MARKER = ".tmp-"


def temporary_sibling(final: Path) -> Path:
    """A unique hidden name beside ``final``, so the rename that publishes it is atomic."""
    return final.parent / f".{final.name}{TMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def is_temporary(path: Path) -> bool:
    return path.name.startswith(".") and TMP_MARKER in path.name


def parse_versioned_json(data: str | bytes, where: object, *, version: str, kind: str,
                         unreadable: str = "unreadable") -> dict[str, Any]:
    """A JSON object whose ``version`` is ``version`` (spool manifests, blend files, chunk
    layouts); anything else is one FormatError naming ``where``: ``"{where}: {unreadable}:
    ..."`` for bad JSON, ``"{where}: not a {version} {kind}"`` for the wrong document."""
    try:
        obj = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{where}: {unreadable}: {exc}") from None
    if not isinstance(obj, dict) or obj.get("version") != version:
        raise FormatError(f"{where}: not a {version} {kind}")
    return obj


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
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: {unreadable}: {exc}") from None
    return parse_versioned_json(data, path, version=version, kind=kind, unreadable=unreadable)


def publish(tmp: Path, final: Path, *, overwrite: bool) -> None:
    """Rename a finished file or directory into place in one step."""
    if final.exists() or final.is_symlink():
        if not overwrite:
            remove(tmp)
            raise PacklabError(f"{final}: already exists (pass overwrite=True to replace it)")
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


def sha256_file(path: Path, chunk: int = 8 << 20) -> str:
    """Streamed SHA-256 of a file (bounded memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_entry(path: Path) -> dict[str, Any]:
    """The manifest entry of a finished file: its size and checksum."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


class HashedFile:
    """An append-only binary file that hashes what it writes, so no second read is needed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = open(path, "wb")  # noqa: SIM115 - closed in close()
        self._hash = hashlib.sha256()
        self.bytes = 0

    @property
    def closed(self) -> bool:
        return self._file.closed

    def write(self, data: np.ndarray | bytes) -> None:
        if isinstance(data, np.ndarray):
            view = memoryview(np.ascontiguousarray(data)).cast("B")
        else:
            view = memoryview(data)
        self._file.write(view)
        self._hash.update(view)
        self.bytes += view.nbytes

    def close(self) -> dict[str, Any]:
        """Flush to disk and return the manifest entry (bytes, sha256)."""
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        return {"bytes": self.bytes, "sha256": self._hash.hexdigest()}

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()


def verify_files(directory: Path, files: dict[str, dict[str, Any]], *, checksums: bool) -> None:
    """Check that every file a manifest lists is present, of its size, and (optionally) its hash."""
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise FormatError(f"{path}: missing (the manifest lists it)")
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise FormatError(f"{path}: {size} bytes, manifest says {entry.get('bytes')} (truncated?)")
        if checksums and sha256_file(path) != entry.get("sha256"):
            raise FormatError(f"{path}: checksum mismatch (corrupted)")
