"""The dataset record (``dataset.json``): what a shard directory holds, written first,
finished last.

``packlab pack`` (and every shard directory of an output layout) writes ``OUT/dataset.json``
*before* the first shard, listing the shards to expect, and rewrites it *after* the last one,
with each shard's size and checksum. So a reader can tell a whole dataset from an interrupted
or tampered one without hashing anything:

- ``"state": "writing"``: the job has not finished; ``open_dataset`` and ``validate`` refuse
  the directory, and the same job run again finishes it (shards whose receipts vouch for them
  are kept);
- a shard listed but missing, a shard-like entry not listed, or a shard whose size differs is
  refused at open, naming it;
- a shard in another shard's place (swapped or copied over, receipts and all) is refused at
  open where its format records the bins it holds (every packlab shard does, in its metadata),
  and by ``validate`` (full checksums) everywhere.

A literal dataset record (``state`` complete)::

    {"version": "packlab_dataset_v1", "state": "complete", "format": "parquet",
     "pack_size": 4096, "packlab_version": "0.1.0", "command": "pack",
     "job": {"spool": {"path": "/data/chat", "manifest_sha256": "9f2c...",
                       "num_sequences": 20000, "num_tokens": 10234112},
             "assignment_sha256": "41d0...", "bins_per_shard": 2048,
             "format_options": {}},
     "job_hash": "c0ffee0123456789",
     "num_shards": 3, "num_bins": 4502, "num_tokens": 10234112,
     "shards": [{"name": "shard_000000.parquet", "bins": [0, 2048], "num_bins": 2048,
                 "num_tokens": 4655873, "bytes": 4417028, "sha256": "77a1...",
                 "sha256_of": "shard_000000.parquet"}, ...]}

While ``"writing"``, a shard's ``num_tokens``, ``bytes``, ``sha256`` and ``sha256_of`` are
null. ``sha256`` is the receipt's: the file, or a directory shard's own record (which lists
every file's checksum). Directories written before dataset records existed (and Nemotron's
output) have none: they open with the checks they allow (receipts, when present).

An exclusive ``flock`` on the directory keeps two jobs from writing it at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packlab.errors import FormatError, PacklabError, PacklabWarning
from packlab.pipeline.receipts import shard_bytes
from packlab.storage.files import json_default, json_kind, parse_versioned_json, short_hash, staged
from packlab.storage.location import Location, as_location
from packlab.version import __version__

DATASET_RECORD = "dataset.json"
VERSION = "packlab_dataset_v1"
STATES = ("writing", "complete")
COMMANDS = ("pack", "convert")  # what writes a dataset record (older records name none: pack)
_IDENTITY = ("num_tokens", "bytes", "sha256", "sha256_of")


def dataset_record_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / DATASET_RECORD


def new_dataset_record(*, format: str, pack_size: int, job: dict[str, Any],
                       shards: Sequence[tuple[str, tuple[int, int]]],
                       command: str = "pack") -> dict[str, Any]:
    """The dataset record a job writes before its first shard: names and bin ranges, no checksums;
    ``command`` is the ``packlab`` command that writes it (the one to rerun to finish it)."""
    return {
        "version": VERSION, "state": "writing", "format": format, "pack_size": int(pack_size),
        "packlab_version": __version__, "command": command, "job": job,
        "job_hash": short_hash(job),
        "num_shards": len(shards), "num_bins": int(shards[-1][1][1]) if shards else 0,
        "num_tokens": None,
        "shards": [{"name": name, "bins": [int(a), int(b)], "num_bins": int(b - a),
                    **dict.fromkeys(_IDENTITY)} for name, (a, b) in shards],
    }


def completed(record: dict[str, Any], receipts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The dataset record with every shard's identity from its receipt, ``state`` complete."""
    shards = record["shards"]
    if len(receipts) != len(shards):
        raise PacklabError(f"{len(receipts)} receipts for {len(shards)} shards (a pipeline bug)")
    out = []
    for entry, receipt in zip(shards, receipts, strict=True):
        if receipt.get("shard") != entry["name"] or receipt.get("bins") != entry["bins"]:
            raise PacklabError(f"receipt of {receipt.get('shard')} does not match "
                               f"{entry['name']} (a pipeline bug)")
        out.append({**entry, **{k: receipt.get(k) for k in _IDENTITY}})
    return {**record, "state": "complete", "shards": out,
            "num_tokens": sum(int(s["num_tokens"]) for s in out)}


def as_writing(record: dict[str, Any]) -> dict[str, Any]:
    """The record as it stood before the first shard (``state`` writing, no identities): what
    an upload puts first, so the destination reads as incomplete until the real one lands."""
    return {**record, "state": "writing", "num_tokens": None,
            "shards": [{**s, **dict.fromkeys(_IDENTITY)} for s in record["shards"]]}


def write_dataset_record(directory: str | os.PathLike[str], record: dict[str, Any]) -> Path:
    """Publish ``dataset.json`` atomically (readers may be looking)."""
    final = dataset_record_path(directory)
    final.parent.mkdir(parents=True, exist_ok=True)
    with staged(final, overwrite=True) as tmp:
        tmp.write_text(json.dumps(record, indent=2, default=json_default) + "\n")
    return final


def read_dataset_record(directory: str | os.PathLike[str] | Location) -> dict[str, Any] | None:
    """The dataset record of ``directory`` (a local folder or a prefix on object storage),
    checked field by field; None when it has none."""
    path = as_location(directory) / DATASET_RECORD
    if not path.is_file():
        return None
    return parse_dataset_record(path.read_bytes(), path)


def parse_dataset_record(raw: bytes, where: object) -> dict[str, Any]:
    """A dataset record read from anywhere (a local file, an object store), checked."""
    record = parse_versioned_json(raw, where, version=VERSION, kind="dataset record",
                                  unreadable="unreadable dataset record")
    return check_dataset_record(record, where)


def check_dataset_record(record: dict[str, Any], where: object) -> dict[str, Any]:
    """Every field a reader relies on, of the right kind, or one error naming ``where``."""
    def bad(what: str) -> FormatError:
        return FormatError(f"{where}: {what} (a damaged dataset record)")

    if record.get("state") not in STATES:
        raise bad(f"state {record.get('state')!r} is not one of {STATES}")
    shards = record.get("shards")
    if not isinstance(shards, list) or not isinstance(record.get("format"), str):
        raise bad("no 'shards' list or 'format'")
    names: set[str] = set()
    stop = 0
    for k, entry in enumerate(shards):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise bad(f"shard entry {k} has no name")
        name, bins = entry["name"], entry.get("bins")
        if "/" in name or name in ("", ".", "..") or name in names:
            raise bad(f"shard entry {k}: name {name!r} is not a plain, unique file name")
        names.add(name)
        if not (isinstance(bins, list) and len(bins) == 2 and all(_is_int(b) for b in bins)
                and bins[0] == stop and bins[1] > bins[0]):
            raise bad(f"{name}: bins {bins!r} do not continue the previous shard's at {stop}")
        stop = bins[1]
        if record["state"] == "complete" and not (_is_int(entry.get("bytes"))
                                                    and isinstance(entry.get("sha256"), str)):
            raise bad(f"{name}: no bytes/sha256 in a complete dataset record")
    if _is_int(record.get("num_bins")) and record["num_bins"] != stop:
        raise bad(f"num_bins {record['num_bins']} but the shards hold {stop}")
    if not isinstance(record.get("job", {}), dict):
        raise bad(f"'job' is {json_kind(record['job'])}, not an object")
    return record


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def require_complete(directory: Any, record: dict[str, Any]) -> None:
    """Refuse a directory (local, or a prefix on object storage) whose job has not finished,
    saying how far it got."""
    if record["state"] == "complete":
        return
    names = {p.name for p in directory.iterdir()}
    present = sum(1 for s in record["shards"] if s["name"] in names)
    command = record.get("command") if record.get("command") in COMMANDS else "pack"
    raise FormatError(f"{directory}: incomplete output ({present} of {len(record['shards'])} "
                      "shards written; the job that writes it was interrupted or is running: "
                      f"run the same `packlab {command}` again to finish it)")


def listed_shards(directory: Any, record: dict[str, Any], is_shard_like: Any,
                  size_of: Any = shard_bytes) -> list[tuple[Any, dict[str, Any]]]:
    """The shards the dataset record lists, in order, each present with its recorded size. Entries
    it does not list (a folder or file a person put there, ``is_shard_like(path)``) are
    ignored, said in one warning: they are not the dataset's, and the dataset is whole without
    them. Cheap: names and sizes only. ``directory`` is a local folder or a prefix on object
    storage (``size_of`` then says how big a shard there is)."""
    require_complete(directory, record)
    listed = {s["name"] for s in record["shards"]}
    children = {p.name: p for p in directory.iterdir()}
    extra = sorted(name for name, p in children.items()
                   if name not in listed and is_shard_like(p))
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        warnings.warn(f"{directory}: {extra[0]}{more} not listed in its {DATASET_RECORD}: not "
                      "part of the dataset, ignored", PacklabWarning, stacklevel=2)
    out = []
    for entry in record["shards"]:
        path = directory / entry["name"]
        if entry["name"] not in children or (isinstance(path, Path) and not path.exists()):
            raise FormatError(f"{path}: missing ({DATASET_RECORD} lists it: bins "
                              f"{entry['bins'][0]}..{entry['bins'][1] - 1})")
        size = size_of(path)
        if size != entry["bytes"]:
            raise FormatError(f"{path}: {size} bytes, {DATASET_RECORD} says {entry['bytes']} "
                              "(replaced, truncated, or another shard in its place)")
        out.append((path, entry))
    return out


@contextmanager
def writing_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on the directory itself for the block (no lock file to
    leave behind); another job already writing there is refused at once, never waited for."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PacklabError(f"{directory}: another packlab job is writing here; wait for it "
                               "to finish, or write elsewhere") from None
        yield
    finally:
        os.close(fd)  # releases the lock
