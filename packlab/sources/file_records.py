"""The record of a one-file output that has no room for one of its own.

A spool, a pack output, a layout and every shard carry their record inside them (``manifest.json``,
``dataset.json``, ``blend.json``, a footer or trailer). A chat JSONL (``packlab corpus``), a
JSONL line index (``corpus --index``) and Modalities' raw index (``packlab raw-index``) are
read by other programs as they are, so packlab keeps their record beside them, hidden:
``.NAME.record.json``::

    {"version": "packlab_file_v1", "kind": "jsonl", "command": "corpus",
     "state": "complete", "file": "docs.jsonl", "bytes": 51234, "sha256": "9f2c..."}

It is what lets ``--overwrite`` tell packlab's own file (the record names it, and its bytes are
the ones recorded) from a file a person wrote or edited since (refused), and what
``packlab validate``/``inspect`` check such a file against. Like ``dataset.json`` it is written
first (``"writing"``: what was there before, and once the new file is built, what comes) and
finished last, so a run interrupted anywhere leaves a record the same command recognises and
finishes, never a file that looks like someone else's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packlab.errors import FormatError
from packlab.storage.files import parse_versioned_json, sha256_file, staged
from packlab.storage.location import Location, as_location
from packlab.storage.objects import cache_entry, cache_root, download_file, put_object

VERSION = "packlab_file_v1"
STATES = ("writing", "complete")
#: what each kind of one-file output is, in words, and the command that writes it
FILE_KINDS = {"jsonl": ("a chat JSONL", "corpus"),
              "jsonl_index": ("a JSONL line index", "corpus --index"),
              "raw_index": ("a Modalities raw index (.idx)", "raw-index"),
              "packed_data": ("a Modalities packed data file (.pbin)", "pbin")}


def record_path(path: Any) -> Any:
    """``docs.jsonl`` -> ``.docs.jsonl.record.json`` beside it (a Path or a Location)."""
    return path.parent / f".{path.name}.record.json"


def recorded_file(path: Path) -> Path:
    """The file a record path (:func:`record_path`) describes; any other path as it is."""
    name = path.name
    if name.startswith(".") and name.endswith(".record.json") and len(name) > 13:
        return path.with_name(name[1:-len(".record.json")])
    return path


def identity(path: Path) -> dict[str, Any]:
    """What a file is, for its record: its size and SHA-256."""
    return {"bytes": path.stat().st_size, "sha256": sha256_file(path)}


def read_file_record(path: Any) -> dict[str, Any] | None:
    """The record beside ``path`` (local or on object storage), checked; None without one."""
    where = as_location(record_path(path))
    if not where.is_file():
        return None
    record = parse_versioned_json(where.read_bytes(), where, version=VERSION,
                                  kind="file record", unreadable="unreadable file record")
    if record.get("state") not in STATES or record.get("kind") not in FILE_KINDS:
        raise FormatError(f"{where}: state {record.get('state')!r:.20} or kind "
                          f"{record.get('kind')!r:.20} unknown (a damaged file record)")
    return record


def write_file_record(path: Any, record: dict[str, Any]) -> None:
    """Publish the record beside ``path`` atomically (a local rename, or a copy on the store)."""
    data = (json.dumps(record, indent=2) + "\n").encode()
    where = as_location(record_path(path))
    if where.local_path is None:
        put_object(data, where)
        return
    with staged(where.local_path, overwrite=True) as tmp:
        tmp.write_bytes(data)


def new_file_record(path: Any, *, kind: str, state: str, **identities: Any) -> dict[str, Any]:
    """A record of ``kind`` in ``state``; ``identities``: ``bytes``/``sha256`` when complete,
    ``previous``/``next`` (each an :func:`identity` or None) while writing."""
    return {"version": VERSION, "kind": kind, "command": FILE_KINDS[kind][1], "state": state,
            "file": path.name, **identities}


def recognised(path: Any, kind: str) -> bool:
    """Whether ``path`` is packlab's own output of ``kind``: its record names it, and it is
    the file recorded (or, while its writer was interrupted, absent, the one it replaces or
    the one it was publishing). On object storage sizes are compared (no download)."""
    try:
        record = read_file_record(path)
    except FormatError:
        return False
    if record is None or record["kind"] != kind or record.get("file") != path.name:
        return False
    location = as_location(path)
    if record["state"] == "writing":
        if not location.exists():
            return True
        candidates = [record.get("previous"), record.get("next")]
    else:
        candidates = [{"bytes": record.get("bytes"), "sha256": record.get("sha256")}]
    if not location.is_file():
        return False
    for candidate in candidates:
        if isinstance(candidate, dict) and _same(location, candidate):
            return True
    return False


def _same(location: Location, recorded: dict[str, Any]) -> bool:
    if location.size() != recorded.get("bytes"):
        return False
    local = location.local_path
    return local is None or sha256_file(local) == recorded.get("sha256")


def check_file(path: Any) -> dict[str, Any]:
    """``validate`` of a one-file output: its record complete and its bytes the recorded ones;
    returns the record. One error naming the file (and the command to rerun) otherwise."""
    record = read_file_record(path)
    if record is None:
        raise FormatError(f"{path}: not a file packlab wrote (no record beside it)")
    if record["state"] == "writing":
        raise FormatError(f"{path}: incomplete output (the `packlab {record['command']}` that "
                          "writes it was interrupted or is running: run the same command again "
                          "to finish it)")
    location = as_location(path)
    if not location.is_file():
        raise FormatError(f"{path}: missing (its record {record_path(location).name} exists)")
    if not _same(location, record):
        raise FormatError(f"{path}: {location.size()} bytes that are not the ones its record "
                          "lists (edited, truncated or replaced since packlab wrote it)")
    return record


def file_output(path: Any, *, check: bool) -> tuple[Path | None, dict[str, Any]] | None:
    """The one-file output packlab wrote that ``path`` names (a local path or a URI) as a
    local file and its record; None when ``path`` names none. With ``check`` its record must
    be complete and its bytes the recorded ones (:func:`check_file`). A file on object storage
    is downloaded once into the cache, checked against its record's checksum; the local file
    is None while its record says ``"writing"``."""
    if isinstance(path, list | tuple):
        return None
    location = as_location(path)
    if not location.is_file():
        return None
    record = read_file_record(location)
    if record is None:
        return None
    if check or (not location.is_local and record["state"] == "complete"):
        record = check_file(location)
    if location.is_local:
        return Path(location.local_path), record
    if record["state"] != "complete":
        return None, record
    local = cache_entry(cache_root() / "files", location, record["sha256"]) / location.name
    if not local.is_file():
        download_file(location, local, expect=record)
    return local, record


def describe_file(path: Any, *, check: bool = False) -> dict[str, Any]:
    """What ``packlab inspect`` (and ``validate``, with ``check``) says of a one-file output
    packlab wrote, local or on object storage: its record and what the file holds (documents,
    records or index entries), read the way its readers read it."""
    found = file_output(path, check=check)
    if found is None:
        raise FormatError(f"{path}: not a file packlab wrote (no record beside it)")
    local, record = found
    out: dict[str, Any] = {"path": str(path), "kind": record["kind"],
                           "what": FILE_KINDS[record["kind"]][0],
                           "written_by": f"packlab {record['command']}",
                           "state": record["state"], "bytes_on_disk": as_location(path).size()}
    if record["state"] == "complete" and local is not None:
        out.update(_contents(local, record["kind"]))
    return out


def _contents(path: Path, kind: str) -> dict[str, Any]:
    if kind == "packed_data":
        from packlab.formats.pbin.codec import ModalitiesFile

        pbin = ModalitiesFile(path)
        return {"documents": len(pbin), "num_tokens": pbin.num_tokens,
                "token_width": pbin.token_width}
    if kind == "raw_index":
        from packlab.formats.pbin.codec import parse_index

        return {"records": int(parse_index(path.read_bytes(), source=str(path)).shape[0])}
    if kind == "jsonl_index":
        from packlab.codecs.jsonl_index import JsonlIndex

        jsonl = path.with_name(path.name[: -len(path.suffix)])
        with JsonlIndex(jsonl, path) as index:
            return {"records": len(index), "indexes": str(jsonl)}
    from packlab.codecs.jsonl_index import iter_jsonl_lines

    return {"records": sum(1 for _ in iter_jsonl_lines(path))}
