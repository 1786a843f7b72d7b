"""Shards up to object storage and down to a local cache, whole or not at all.

Directory shards (``memmap_v1``, ``binidx``, ``packed_index``, and spools) carry a
``manifest.json`` listing every file with its size and SHA-256. That record is the commit
point on object storage, where a directory cannot appear in one step:

- upload (:func:`upload_shard`): check the local shard against its record, remove an old
  remote record first (when overwriting), upload every listed file, checking that what was
  sent hashes as the record says, then upload the record **last**. A reader requires the
  record, so it never sees a partial shard: before the last PUT there is no shard at all.
- download (:func:`download_shard`): read the record, download every file it lists into a
  hidden temporary folder, hashing while downloading, and refuse the shard (nothing cached, a
  :class:`~packlab.errors.FormatError` naming the file) if a size or checksum differs; else
  rename the folder into the cache. The cache key includes the record's own hash, so a
  re-uploaded shard is a new entry, never a mix of old and new files.

Single-file shards (``parquet``, ``arrow_ipc``, ``pbin``, ``legacy_npy_pickle``) are uploaded
through a temporary key and published by a server-side copy (:func:`packlab.storage.objects.upload_file`).
A one-file shard with companions (``megatron_sft``: a Megatron pair and packlab's sidecar) is
uploaded companions first and its own file last (its commit point; an old one removed first),
and downloaded whole.
Downloaded, they are checked against the store's size and then by their format's own
``validate()`` (Arrow's batch CRCs, pbin's SHA-256, Parquet's page CRCs; the legacy pickle has
no checksum at all) before they enter the cache, keyed by URI, size and modification time.

The cache lives in ``$PACKLAB_CACHE_DIR`` (default ``~/.cache/packlab/remote``); entries are
published by rename, so processes sharing it never see a half download.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from packlab.errors import FormatError, PacklabError
from packlab.formats import files_of_shard
from packlab.storage.files import (
    DIRECTORY_RECORD,
    TMP_MARKER,
    parse_json,
    remove,
    short_digest,
    staged,
    verify_files,
)
from packlab.storage.location import Location, as_location, resolve
from packlab.storage.objects import (
    cache_entry,
    cache_root,
    download_file,
    fetch_files,
    put_object,
    upload_file,
)


class NoFileList(FormatError):
    """A directory's record lists no files with checksums, so it cannot be fetched verified
    (a Nemotron spool, for one): callers that know what the directory is say so."""


# -- records -----------------------------------------------------------------------------------
def parse_file_list(raw: bytes, source: str) -> dict[str, Any]:
    """A directory shard's record, with a ``files`` table of plain names (no ``/``, no ``..``:
    a record must not name files outside its shard)."""
    record = parse_json(raw, source, unreadable="unreadable record")
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(files, dict) or not files:
        raise NoFileList(f"{source}: the record lists no files (not a directory shard)")
    for name, entry in files.items():
        if not isinstance(name, str) or not name or "/" in name or "\\" in name or name in (
                ".", "..") or name == DIRECTORY_RECORD:
            raise FormatError(f"{source}: the record names a file {name!r} outside its shard")
        if not (isinstance(entry, dict) and isinstance(entry.get("bytes"), int)
                and isinstance(entry.get("sha256"), str)):
            raise FormatError(f"{source}: record entry {name!r} has no bytes/sha256")
    return record


def remote_record(location: Location) -> tuple[bytes, dict[str, Any]] | None:
    """The raw and parsed record of a directory shard at ``location``; None if it has none."""
    target = location / DIRECTORY_RECORD
    if not target.is_file():
        return None
    raw = target.read_bytes()
    return raw, parse_file_list(raw, str(target))


# -- up ----------------------------------------------------------------------------------------
def upload_shard(local: str | os.PathLike[str], uri: str | Location, *, filesystem: Any = None,
                 overwrite: bool = False) -> dict[str, Any]:
    """Upload the local shard ``local`` (a directory shard, a spool, or a one-file shard) to
    ``uri``; returns ``{"uri", "files", "bytes"}``. See the module docstring for the order."""
    source = Path(local)
    target = resolve(uri, filesystem)
    if source.is_dir():
        return _upload_directory(source, target, overwrite=overwrite)
    if not source.is_file():
        raise FormatError(f"{source}: no such shard to upload")
    if not overwrite and target.exists():
        raise PacklabError(f"{target}: already exists (pass overwrite=True to replace it)")
    companions = files_of_shard(as_location(source))[:-1]
    if companions and target.exists():
        target.delete()  # the old shard's commit point first: it disappears whole
    total = 0
    for part in companions:
        total += upload_file(Path(part.path), target.parent / part.name, overwrite=True)["bytes"]
    entry = upload_file(source, target, overwrite=overwrite, atomic=True)
    return {"uri": target.uri, "files": 1 + len(companions), "bytes": entry["bytes"] + total}


def _upload_directory(source: Path, target: Location, *, overwrite: bool) -> dict[str, Any]:
    record_path = source / DIRECTORY_RECORD
    if not record_path.is_file():
        raise FormatError(f"{record_path}: missing (an unfinished shard is never uploaded)")
    raw = record_path.read_bytes()
    files = parse_file_list(raw, str(record_path))["files"]
    verify_files(source, files, checksums=True)
    if target.exists():
        if not overwrite:
            raise PacklabError(f"{target}: already exists (pass overwrite=True to replace it)")
        (target / DIRECTORY_RECORD).delete()  # the old shard disappears first, as a whole
        target.delete()
    total = 0
    for name, entry in files.items():
        sent = upload_file(source / name, target / name, atomic=False)
        if sent != {"bytes": entry["bytes"], "sha256": entry["sha256"]}:
            raise FormatError(f"{source / name}: changed while uploading (it no longer matches "
                              f"its record); {target} left without a record")
        total += sent["bytes"]
    put_object(raw, target / DIRECTORY_RECORD)
    return {"uri": target.uri, "files": len(files) + 1, "bytes": total + len(raw)}


# -- down --------------------------------------------------------------------------------------
def download_shard(uri: str | Location, *, filesystem: Any = None,
                   cache_dir: str | os.PathLike[str] | None = None,
                   format: str | None = None, validate: bool = True) -> Path:
    """The local, verified copy of the shard at ``uri`` (downloaded once into the cache).

    A directory shard is checked file by file against its record; a one-file shard against
    the store's size and, with ``validate``, its format's own checks (``format`` or detected).
    """
    location = resolve(uri, filesystem)
    found = remote_record(location) if not location.is_file() else None
    if found is not None:
        return _download_directory(location, *found, cache_root(cache_dir))
    if not location.is_file():
        raise FormatError(f"{location}: no such shard (no object, and no {DIRECTORY_RECORD} under it)")
    return _download_object(location, cache_root(cache_dir), format=format, validate=validate)


def _download_directory(location: Location, raw: bytes, record: dict[str, Any],
                        cache: Path) -> Path:
    final = cache_entry(cache, location, short_digest(raw)) / (location.name or "shard")
    return fetch_files(location, record["files"], final, last={DIRECTORY_RECORD: raw})


def _download_object(location: Location, cache: Path, *, format: str | None,
                     validate: bool) -> Path:
    info = location.info()
    companions = files_of_shard(location)[:-1]
    if companions:  # every file of the shard, in one cache folder
        version = ",".join(f"{c.name}:{c.info().size}:{c.info().mtime_ns}" for c in companions)
        folder = cache_entry(cache, location, f"{info.size}:{info.mtime_ns}:{version}")
        final = folder / location.name
        if final.is_file():
            return final
        fetch_files(location.parent, {c.name: None for c in companions}, folder,
                    last={location.name: location.read_bytes()})
        if validate:
            try:
                _validate_local(final, location, format)
            except PacklabError:
                remove(folder)
                raise
        return final
    final = cache_entry(cache, location, f"{info.size}:{info.mtime_ns}") / location.name
    if final.is_file() and final.stat().st_size == info.size:
        return final
    with staged(final, overwrite=True) as tmp:
        got = download_file(location, tmp)
        if got["bytes"] != info.size:
            raise FormatError(f"{location}: {got['bytes']} bytes downloaded, the store lists "
                              f"{info.size} (replaced while reading?)")
        if validate:
            _validate_local(tmp, location, format)
    return final


def _validate_local(path: Path, location: Location, format: str | None) -> None:
    """Run the format's whole-shard check on a downloaded file; errors name the remote URI."""
    from packlab.formats import detect_format, get_format

    name = format or detect_format(path)
    try:
        with get_format(name).Reader(path) as reader:
            reader.validate()
    except PacklabError as exc:
        raise type(exc)(f"{location}: refused: {str(exc).replace(str(path), location.name)}"
                        ) from None


# -- housekeeping ------------------------------------------------------------------------------
def sweep_temporaries(uri: str | Location, *, filesystem: Any = None,
                      older_than_s: float = 3600.0) -> list[str]:
    """Delete leftover temporary objects (``.name.tmp-*``) under ``uri`` older than
    ``older_than_s``: what a writer killed between its upload and its publishing copy leaves.
    (A writer killed mid-upload leaves only an incomplete multipart upload, which no listing
    shows; a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` removes those.)"""
    location = resolve(uri, filesystem)
    cutoff = time.time_ns() - int(older_than_s * 1e9)
    removed = []
    for info in location.walk_files():
        base = info.base_name
        if base.startswith(".") and TMP_MARKER in base and (info.mtime_ns or 0) < cutoff:
            Location(location.filesystem, info.path, location.scheme).delete()
            removed.append(f"{location.scheme}://{info.path}")
    return removed



def download_prefix(uri: str | Location, *, filesystem: Any = None,
                    cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The local copy of the Megatron prefix at ``uri`` (``PREFIX.bin``/``.idx`` and, when
    there, packlab's mask sidecar and record: :mod:`packlab.spool.prefix`), downloaded once
    into the cache: each file checked against the record packlab's export wrote, else against
    the store's sizes (a prefix Megatron wrote records nothing more)."""
    from packlab.spool.prefix import PREFIX_VERSION, prefix_files

    location = resolve(uri, filesystem)
    folder = location.parent
    names = {key: file.name for key, file in prefix_files(Path(location.name)).items()}
    if not (folder / names["idx"]).is_file():
        raise FormatError(f"{location}: no Megatron prefix there (no {names['idx']})")
    raw = (folder / names["record"]).read_bytes() if (folder / names["record"]).is_file() \
        else None
    if raw is not None:
        record = parse_json(raw, folder / names["record"])
        if not isinstance(record, dict) or record.get("version") != PREFIX_VERSION:
            raise FormatError(f"{folder / names['record']}: not a {PREFIX_VERSION} record")
        files = {name: record["files"].get(name) for name in record.get("files", {})}
        version, last = short_digest(raw), {names["record"]: raw}
    else:
        files = {names[k]: None for k in ("bin", "idx")}  # the reader checks one by the other
        version = ",".join(f"{n}:{(folder / n).info().size}:{(folder / n).info().mtime_ns}"
                           for n in files)
        last = None
    final = cache_entry(cache_root(cache_dir), location, version)
    fetch_files(folder, files, final, last=last)
    return final / location.name
