"""Single objects moved between stores and the local cache, whole or not at all.

A local file goes up to a :class:`~packlab.storage.location.Location`, or a small object is put
there, each through a temporary key published in one step
(:meth:`~packlab.storage.location.Location.publish_from`); an object comes down into a local
file, hashed as it comes and refused unless it matches its record; a shard's files are fetched
once into a cache entry (:func:`fetch_files`: how a reader that reads in place keeps its index
locally). Whole shards, their records and spools go up and down one layer above, in
:mod:`packlab.cloud.transfer`.

The cache lives in ``$PACKLAB_CACHE_DIR`` (default ``~/.cache/packlab/remote``,
:func:`cache_root`); entries are published by rename, so processes sharing it never see a
half download.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from packlab.errors import FormatError, PacklabError
from packlab.storage.files import HashedFile, short_digest, staged
from packlab.storage.location import Location

CHUNK = 8 << 20  # bytes per read/write when streaming a file up or down


def cache_root(given: str | os.PathLike[str] | None = None) -> Path:
    """Where packlab keeps what it fetched from object storage (verified downloads, the
    indexes of shards read in place): ``given`` (a reader's ``cache_dir=``), else
    ``$PACKLAB_CACHE_DIR``, default ``~/.cache/packlab/remote``."""
    if given:
        return Path(given)
    env = os.environ.get("PACKLAB_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "packlab" / "remote"


# -- streams ------------------------------------------------------------------------------
def stream_into(source: BinaryIO, out: pa.NativeFile, digest: Any = None) -> int:
    """Copy a binary stream into ``out`` in chunks, hashing as it goes; bytes copied."""
    total = 0
    while block := source.read(CHUNK):
        out.write(block)
        if digest is not None:
            digest.update(block)
        total += len(block)
    return total


def upload_file(local: str | os.PathLike[str], final: Location, *, overwrite: bool = False,
                atomic: bool = True) -> dict[str, Any]:
    """Upload a local file; with ``atomic`` through a temporary key, published by
    :meth:`~packlab.storage.location.Location.publish_from`. Returns its record entry
    (``bytes``, ``sha256``, computed while uploading)."""
    local = Path(local)
    if not local.is_file():
        raise FormatError(f"{local}: no such file to upload")
    target = final.temporary() if atomic else final
    digest = hashlib.sha256()
    out = target.open_output()
    try:
        with open(local, "rb") as f:
            size = stream_into(f, out, digest)
        out.close()
    except BaseException:
        _drop(out, target)
        raise
    if atomic:
        final.publish_from(target, overwrite=overwrite)
    return {"bytes": size, "sha256": digest.hexdigest()}


def put_object(data: bytes, final: Location, *, overwrite: bool = True) -> None:
    """Write small ``data`` (a record, a blend file) as ``final``, atomically."""
    tmp = final.temporary()
    out = tmp.open_output()
    try:
        out.write(data)
        out.close()
    except BaseException:
        _drop(out, tmp)
        raise
    final.publish_from(tmp, overwrite=overwrite)


def _drop(out: pa.NativeFile, target: Location) -> None:
    """After a failure: close the stream (pyarrow would complete it anyway) and delete it."""
    try:
        out.close()
    except (OSError, pa.ArrowException):
        pass
    try:
        target.delete()
    except PacklabError:
        pass


def download_file(source: Location, local: str | os.PathLike[str], *,
                  expect: dict[str, Any] | None = None) -> dict[str, Any]:
    """Download ``source`` to ``local`` (through a local temporary, renamed when whole),
    hashing as it goes. With ``expect`` (a record entry), a size or checksum that differs
    is refused: nothing is left at ``local``. Returns ``bytes`` and ``sha256``."""
    local = Path(local)
    local.parent.mkdir(parents=True, exist_ok=True)
    with staged(local, overwrite=True) as tmp:
        with source.open_input() as f, HashedFile(tmp) as out:
            while block := f.read(CHUNK):
                out.write(block)
            entry = out.close()
        if expect is not None:
            if entry["bytes"] != expect.get("bytes"):
                raise FormatError(f"{source}: {entry['bytes']} bytes, the record says "
                                  f"{expect.get('bytes')} (truncated or replaced?)")
            if entry["sha256"] != expect.get("sha256"):
                raise FormatError(f"{source}: checksum mismatch with its record (corrupted); "
                                  "the shard is refused")
    return entry


def cache_entry(cache: Path, location: Location, version: str) -> Path:
    """The cache folder of ``location``'s bytes as of ``version`` (a record's hash, a size
    and modification time): a replaced object is a new entry, never a mix of old and new."""
    return cache / short_digest(location.uri) / short_digest(version)


def fetch_files(folder: Location, files: dict[str, dict[str, Any] | None], final: Path, *,
                last: dict[str, bytes] | None = None) -> Path:
    """The files ``files`` names under ``folder`` downloaded whole into the local folder
    ``final`` (a cache entry), each refused unless it matches its expected record entry
    (``bytes``, ``sha256``) where one is given; ``last`` (name: bytes) written after them, as
    a record is on the store. Published by one rename, so processes sharing the cache never
    see a half download; a folder already there is checked by its sizes only (cheap)."""
    marker = next(iter(last)) if last else next(iter(files))
    if (final / marker).is_file():
        for name, entry in files.items():
            have = (final / name).stat().st_size if (final / name).is_file() else -1
            if entry is not None and have != entry.get("bytes"):
                raise FormatError(f"{final / name}: {have} bytes in the cache, its record says "
                                  f"{entry.get('bytes')} (remove the cache entry)")
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=True, directory=True) as tmp:
        for name, entry in files.items():
            download_file(folder / name, tmp / name, expect=entry)
        for name, data in (last or {}).items():
            (tmp / name).write_bytes(data)
    return final

