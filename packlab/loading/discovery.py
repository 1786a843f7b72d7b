"""Finding shards wherever they live: a shard, a directory of shards, a glob, or a list of
those, on a local disk or on object storage, through one :class:`~packlab.storage.location.Location`.

Every shard is returned with its format, detected by the registry
(:func:`packlab.formats.detect_format`: a few bytes read, one ranged request on object
storage). In a directory, hidden temporaries, receipts and records (``*.json``), notes and
layout folders are skipped; anything else that no format claims is an error, so a damaged shard
is never silently left out.

A one-file shard may have companions (a Megatron pair's ``train.sft.bin`` and packlab's
sidecar beside its ``train.sft.idx``): they belong to their shard, never shards themselves,
and a path naming one of them, or the prefix they share (``train.sft``, as Megatron's tools
name a pair), names the shard (:func:`packlab.formats.shard_entry`); a companion without its
shard is refused as an unfinished one.

A spool beside the shards, or a folder of spools, is no shard and is skipped too: Nemotron's
output directory holds ``shard_000000.parquet``... beside ``spool/shard_000000/``..., the
spools it packed them from (finished, empty or still being written).

A directory with a dataset record (``dataset.json``, :mod:`packlab.pipeline.dataset_record`) is
its shards as listed there, refused while the job that writes it has not finished; a shard named
by itself (a path, a glob match, a layout's link) must be listed in its folder's record, when
the folder has one (:func:`placed`). :func:`dataset_directories` finds the outputs under a run
folder. A local shard comes back as a ``Path``, one on object storage as its ``Location``.

Layouts (``splits/``, ``blend.json``) and run folders sit above this module
(:mod:`packlab.pipeline.layout`); :mod:`packlab.sources.resolve` resolves them all.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.errors import FormatError
from packlab.formats import (
    detect_format,
    directory_shard_files,
    format_names,
    get_format,
    is_companion,
    prefixed_entries,
    shard_entry,
    shard_size,
)
from packlab.formats.shared.base import SHARD_RECORD
from packlab.pipeline.dataset_record import (
    DATASET_RECORD,
    listed_shards,
    read_dataset_record,
    require_complete,
)
from packlab.pipeline.receipts import read_receipt, receipt_places
from packlab.spool import FILES as SPOOL_FILES
from packlab.spool.prefix import is_prefix_folder
from packlab.storage.files import is_temporary
from packlab.storage.location import Location, as_location, is_remote, resolve

PathLike = str | os.PathLike[str]
# Entries of a shard directory that are never shards: layout folders, receipts, notes.
IGNORED_NAMES = {"splits", "runs", "receipts", "README", "README.md", "_SUCCESS"}
IGNORED_SUFFIXES = (".json", ".txt", ".md", ".log", ".lock")  # locks: Bridge's X.sft.lock


class NoShardsError(FormatError):
    """A directory that holds no shard at all (a layout root, say: its caller may know more)."""


class ShardRef(tuple):
    """``(path, format)``, and where a dataset record lists the shard, ``bins``: the range of
    the dataset's bins it must hold (:class:`packlab.loading.dataset.PackedDataset` checks it), and
    ``sha256``: its identity there (``packlab validate`` compares it)."""

    bins: tuple[int, int] | None
    sha256: str | None

    def __new__(cls, path: Any, format: str, bins: tuple[int, int] | None = None,
                sha256: str | None = None) -> ShardRef:
        ref = super().__new__(cls, (_named(path), format))
        ref.bins = bins
        ref.sha256 = sha256
        return ref

    @classmethod
    def listed(cls, path: Any, format: str, entry: dict[str, Any]) -> ShardRef:
        """A shard as its dataset record's ``entry`` places it."""
        return cls(path, format, (int(entry["bins"][0]), int(entry["bins"][1])),
                   entry.get("sha256"))

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self[0], self[1], self.bins, self.sha256)


def _named(path: Any) -> Any:
    """A shard as callers hold it: a local one as a ``Path``, one on object storage as given
    (its ``Location``, or its URI)."""
    return path if is_remote(path) else as_location(path).local_path


def is_ignored_name(name: str) -> bool:
    """A name in a shard directory (or under a prefix) that is never a shard."""
    return name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def expect_format(where: object, detected: str, wanted: str | None) -> str:
    """The detected format, refusing a shard of another format than the one asked for."""
    if wanted is not None and wanted != detected:
        get_format(wanted)  # an unknown name is its own error
        raise FormatError(f"{where}: a {detected} shard, not {wanted}")
    return detected


def _ignored(location: Location) -> bool:
    return is_ignored_name(location.name) or is_temporary(Path(location.name))


def _detect(location: Location) -> str | None:
    try:
        return detect_format(location)
    except FormatError:
        return None


def _is_main_entry(location: Location, name: str) -> bool:
    """Whether ``location`` is the shard itself, not a companion file its format also claims."""
    suffix = get_format(name).Reader.SUFFIX
    return location.name.endswith(suffix) if suffix else location.is_dir()


def _is_spool(location: Location) -> bool:
    """A spool directory, finished or not (Nemotron writes ``tokens.bin.tmp`` first): it holds
    a spool data file (no shard format keeps files of those names), or one Megatron prefix."""
    if not location.is_dir():
        return False
    names = {c.name for c in location.iterdir()}
    return any(n in names or f"{n}.tmp" in names for n in SPOOL_FILES.values()) or (
        is_prefix_folder(names) and not any(is_companion(n) for n in names))  # not a .sft pair


def holds_spools(location: Location) -> bool:
    """A spool, or a folder of nothing but spools (Nemotron's ``spool/``): never a shard."""
    if _is_spool(location):
        return True
    if not location.is_dir() or location.is_link():
        return False
    entries = list(location.iterdir())
    return bool(entries) and all(_is_spool(c) for c in entries)


def is_shard_like(location: Any) -> bool:
    """An entry of a shard directory that could be a shard (what a dataset record must
    list): anything but hidden names, temporaries, receipts, notes, layout and spool folders."""
    location = resolve(location)
    return not _ignored(location) and not is_companion(location.name) \
        and not holds_spools(location)


def find_shards(path: PathLike | Location | Sequence[PathLike | Location], *,
                format: str | None = None, filesystem: Any = None) -> list[ShardRef]:
    """Resolve a shard, a directory of shards, a glob, or a list of those into shards with
    their formats, in order (a URI, or a path in ``filesystem``, on object storage)."""
    if isinstance(path, list | tuple):
        return [ref for item in path for ref in find_shards(item, format=format,
                                                             filesystem=filesystem)]
    location = resolve(path, filesystem)
    if not location.exists() and _has_magic(location):
        return _globbed(location, format)
    named = shard_entry(location)
    if named != location and (named.exists() or not location.exists()):
        location = named  # a pair's other file, or its prefix: the pair
    if not location.exists():  # a bare prefix a pair was written under
        location = next((p for p in prefixed_entries(location) if p.exists()), location)
    if not location.exists():
        raise FormatError(f"{_shown(path)}: no such file or directory")
    if not location.is_dir():
        return [named_shard(location, expect_format(location, format or detect_format(location),
                                               format))]
    own = _detect(location)
    if own is not None and _is_main_entry(location, own):
        _refuse_unfinished(location, own)
        return [named_shard(location, expect_format(location, own, format))]
    record = read_dataset_record(location)
    if record is not None:
        return [ShardRef.listed(p, expect_format(p, record["format"], format), entry)
                for p, entry in listed_shards(location, record, is_shard_like,
                                              shard_size)]
    if holds_spools(location):
        what = "a spool (spool_v1)" if _is_spool(location) else "a folder of spools (spool_v1)"
        raise FormatError(f"{_shown(path)}: {what}, not packed shards: pack it first "
                          "(`packlab pack`)")
    shards = shards_in_directory(location, format=format)
    if not shards:
        raise NoShardsError(f"{_shown(path)}: no shards in this directory")
    return shards


def _shown(path: Any) -> str:
    """A path as messages name it: as the caller gave it (a Location prints as its URI on
    object storage)."""
    return str(path)


def _has_magic(location: Location) -> bool:
    return any(c in location.path for c in "*?[")


def _globbed(location: Location, format: str | None) -> list[ShardRef]:
    matches = location.glob() or shard_entry(location).glob()  # a pattern of prefixes
    if not matches:
        raise FormatError(f"{location}: the pattern matches nothing")
    picked: list[ShardRef] = []
    records: RecordEntries = {}
    seen: set[str] = set()
    for match in matches:
        match = shard_entry(match)  # a pair matched by any of its files is the pair, once
        if _ignored(match) or match.path in seen:
            continue
        seen.add(match.path)
        if not match.exists():
            raise FormatError(f"{match}: missing beside the files the pattern matched (an "
                              "unfinished pair?)")
        name = detect_format(match)
        if _is_main_entry(match, name):
            picked.append(named_shard(match, expect_format(match, name, format), records))
    if not picked:
        raise FormatError(f"{location}: the pattern matches no shard")
    return picked


def shards_in_directory(directory: Location, *, format: str | None = None) -> list[ShardRef]:
    """The shards directly inside ``directory``, sorted by name, each with its format.

    Hidden temporaries, receipts/records (``*.json``) and layout folders are skipped. A file
    that is no shard but shares its stem with one (``x.idx`` beside ``x.bin``) is a companion;
    anything else unrecognised is an error, so a damaged shard is never silently left out; a
    folder holding a directory shard's files but not its record is an unfinished one.

    A directory without a dataset record (written before them) is checked as its receipts
    allow: a receipt must name its shard, and their bins must follow one another (a gap is a
    missing shard, an overlap a duplicated one); each shard then carries the bins its receipt
    gives it (:class:`ShardRef`), as a link into a dataset directory carries its dataset record's.
    """
    children = [c for c in directory.iterdir() if not _ignored(c)]
    parts = sorted({c.name for c in children} & (directory_shard_files() - {SHARD_RECORD}))
    if parts:
        raise FormatError(f"{directory}: holds {', '.join(parts)} but no {SHARD_RECORD}: "
                          "a directory shard that did not finish (or not a shard); refused")
    found: list[ShardRef] = []
    unknown: list[Location] = []
    records: RecordEntries = {}
    for child in children:
        if child.is_link() and not child.resolved().exists():
            raise FormatError(f"{child}: broken link to {child.link_target()} (its shard is "
                              "missing; rerun `packlab pack` to rewrite it)")
        if holds_spools(child):
            continue
        if is_companion(child.name):
            if not any(shard_entry(child).name == c.name for c in children):
                raise FormatError(f"{child}: no {shard_entry(child).name} beside it (an "
                                  "unfinished or damaged pair; refused)")
            continue
        name = _detect(child)
        if name is None:
            unknown.append(child)
            continue
        if not _is_main_entry(child, name):
            continue  # a companion file the format also recognises (e.g. the .idx of a .bin)
        name = expect_format(child, name, format)
        found.append(named_shard(child, name, records) if child.is_link() else ShardRef(child, name))
    stems = {_stem(p.name) for p, _ in found}
    strays = [p for p in unknown if _stem(p.name) not in stems]
    if strays:
        raise FormatError(f"{strays[0]}: not a shard of any known format (in a shard directory)")
    _refuse_shared_targets([resolve(p) for p, _ in found])
    places = receipt_places([p for p, _ in found if not resolve(p).is_link()])
    return [ShardRef(p, name, places[p]) if p in places else ref
            for ref in found for p, name in [ref]]


def _refuse_unfinished(location: Location, format: str) -> None:
    """A directory shard's files without the record its writer publishes last: its upload
    or its copy did not finish (a writer that dies never leaves one under its final name)."""
    record = get_format(format).Reader.RECORD
    if record and not (location / record).is_file():
        parts = sorted(c.name for c in location.iterdir())
        raise FormatError(f"{location}: holds {', '.join(parts)} but no {record}: a {format} "
                          "shard whose upload or copy did not finish (or not a shard); refused")


def _refuse_shared_targets(shards: list[Location]) -> None:
    """Two links to one shard would serve its bins twice."""
    targets: dict[str, Location] = {}
    for link in (s for s in shards if s.is_link()):
        first = targets.setdefault(link.resolved().path, link)
        if first != link:
            raise FormatError(f"{link}: links to the same shard as {first.name} "
                              f"({link.resolved()}): its bins would be served twice")


def _stem(name: str) -> str:
    return name.split(".", 1)[0]


#: dataset records already read while finding shards, per directory: the record's entries
#: by shard name (None: a directory without one), so finding N shards reads each record once
RecordEntries = dict[str, "dict[str, dict[str, Any]] | None"]


def named_shard(shard: Any, format: str, records: RecordEntries | None = None) -> ShardRef:
    """One shard named by itself (a path, a glob match, a layout's link): where the directory
    it lives in has a dataset record, the shard must be listed there and the dataset
    complete (a shard of an interrupted job is refused like the whole directory); where it has
    none (written before them), the shard is where its receipt puts it, if it has one.
    ``records`` keeps the records read across the calls of one walk."""
    location = resolve(shard)
    real = location.resolved() if location.is_link() else location
    directory = real.parent
    if records is not None and directory.path in records:
        entries = records[directory.path]
    else:
        entries = _record_entries(directory)
        if records is not None:
            records[directory.path] = entries
    if entries is None:  # written before dataset records: where its receipt puts it
        receipt = read_receipt(_named(real))
        bins = None if receipt is None else receipt.get("bins")
        return ShardRef(location, format, None if bins is None else (bins[0], bins[1]))
    entry = entries.get(real.name)
    if entry is None:
        raise FormatError(f"{real}: not listed in {directory / DATASET_RECORD} (copied in from "
                          "elsewhere?)")
    return ShardRef.listed(location, format, entry)


def _record_entries(directory: Location) -> dict[str, dict[str, Any]] | None:
    """The complete dataset record of ``directory``, its entries by shard name (the first
    of a name), or None where there is none."""
    record = read_dataset_record(directory)
    if record is None:
        return None
    require_complete(directory, record)
    entries: dict[str, dict[str, Any]] = {}
    for entry in record["shards"]:
        entries.setdefault(entry["name"], entry)
    return entries


#: how deep below a run folder its outputs are: ``runs/<run_hash>/datasets/<name>/<config>``
RUN_DEPTH = 4


def dataset_directories(path: Any, *, depth: int = RUN_DEPTH) -> list[Any]:
    """The directories under ``path`` (itself included) that hold a dataset record, in path
    order, not looking inside them: a run folder (``OUT/runs/<run_hash>``), ``OUT/runs``, or
    any folder of pack outputs. At most ``depth`` folders down, and never into a folder that
    holds a file of its own (a run folder's levels hold folders and records only): ``/`` or
    ``/usr`` is refused at once, not walked. Spool folders and links are not followed;
    one-file shards are known by name, without a request."""
    location = resolve(path)
    if (location / DATASET_RECORD).is_file():
        return [_named(location)]
    if depth == 0:
        return []
    suffixes = tuple(get_format(n).Reader.SUFFIX for n in _one_file_formats())
    found: list[Any] = []
    for child in location.iterdir():
        if _ignored(child) or child.name.endswith(suffixes) or child.is_link():
            continue
        if child.is_dir() and (_leads_to_outputs(child) and not holds_spools(child)):
            found.extend(dataset_directories(child, depth=depth - 1))
    return found


def _leads_to_outputs(folder: Location) -> bool:
    """A folder that may be, or lead to, a pack output: it has a dataset record, or holds
    nothing but folders and ignored names (records, notes)."""
    if (folder / DATASET_RECORD).is_file():
        return True
    try:
        return all(_ignored(c) or c.is_dir() for c in folder.iterdir())
    except FormatError:
        return False  # a folder it may not read (``/proc``'s): no output of this user's


def _one_file_formats() -> list[str]:
    return [n for n in format_names() if get_format(n).Reader.SUFFIX]
