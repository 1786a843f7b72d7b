"""What a URI names on object storage: shards (each with its format), or a layout's split.

A URI may name one shard (an object, or a prefix holding a directory shard's manifest), a
prefix of shards (hidden names, ``*.json``/``*.txt``, ``splits/``, ``runs/`` skipped, as
locally), or a layout root with ``blend.json`` (then a split is required: object storage has
no ``splits/`` symlinks, the split's shard list is the blend's).

Formats are known without downloading, from the format contract
(:class:`~packlab.formats.base.FormatFacts`): a one-file shard by its ``SUFFIX``, a directory
shard by its manifest's ``format`` (``MANIFEST_FORMAT``).
"""

from __future__ import annotations

import fnmatch
import glob as globlib
from typing import Any

import pyarrow.fs as pafs

from packlab.cloud.transfer import MANIFEST, parse_manifest, remote_manifest
from packlab.discovery import ShardRef, expect_format, is_ignored_name
from packlab.errors import FormatError, PacklabError
from packlab.formats import directory_shard_files, manifest_formats, suffix_formats
from packlab.layout.blend import BLEND_FILE, blend_format, parse_blend
from packlab.pipeline.manifest import MANIFEST_FILE, listed_shards
from packlab.pipeline.manifest import parse_manifest as parse_dataset_manifest
from packlab.spool import FILES as SPOOL_FILES
from packlab.spool import SPOOL_VERSION
from packlab.storage import Location, resolve


def object_format(location: Location) -> str | None:
    """The format of a one-file shard, from its name."""
    return suffix_formats().get(location.suffix)


def directory_format(location: Location, manifest: dict[str, Any]) -> str:
    """The format a directory shard's manifest names."""
    kind = manifest.get("format")
    known = manifest_formats()
    if kind in known:
        return known[kind]
    if manifest.get("version") == SPOOL_VERSION:
        raise FormatError(f"{location}: a spool ({SPOOL_VERSION}), not packed shards: pack it first")
    raise FormatError(f"{location / MANIFEST}: names format {kind!r}, not a packed shard")


def find_shards(uri: str | Location, *, filesystem: Any = None, format: str | None = None
                ) -> list[tuple[Location, str]]:
    """The shards ``uri`` names (see the module docstring), each with its format, in order."""
    location = resolve(uri, filesystem)
    if location.is_file():
        name = format or object_format(location)
        if name is None:
            raise FormatError(f"{location}: not a shard of any known format "
                              f"(suffixes: {', '.join(suffix_formats())})")
        return [(location, expect_format(location, name, format))]
    found = remote_manifest(location)
    if found is not None:
        return [(location, expect_format(location, directory_format(location, found[1]), format))]
    if (location / BLEND_FILE).is_file():
        raise PacklabError(f"{location}: an output layout: choose a split (see its blend.json)")
    dataset = read_remote_dataset_manifest(location)
    if dataset is not None:
        return [ShardRef.listed(loc, expect_format(loc, dataset["format"], format), entry)
                for loc, entry in listed_shards(location, dataset, is_shard_like, remote_size)]
    if is_remote_spool(location):
        raise FormatError(f"{location}: a spool or a folder of spools ({SPOOL_VERSION}), not "
                          "packed shards: pack it first")
    named = [c for c in location.iterdir() if not is_ignored_name(c.name)]
    parts = sorted({c.name for c in named}
                   & (directory_shard_files() | set(SPOOL_FILES.values())))
    if parts:
        raise FormatError(f"{location}: holds {', '.join(parts)} but no {MANIFEST}: a directory "
                          "shard whose upload did not finish (or not a shard); refused")
    shards: list[tuple[Location, str]] = []
    for child in (c for c in named if is_shard_like(c)):
        shards.extend(_child_shard(child, format))
    if not shards:
        if not location.exists():
            raise FormatError(f"{location}: no such file or directory")
        raise FormatError(f"{location}: no shards under this prefix")
    return shards


def read_remote_dataset_manifest(location: Location) -> dict[str, Any] | None:
    """``location/dataset.json`` (:mod:`packlab.pipeline.manifest`), checked; None if absent."""
    target = location / MANIFEST_FILE
    if not target.is_file():
        return None
    return parse_dataset_manifest(target.read_bytes(), target)


def remote_size(location: Location) -> int:
    """Bytes of an object, or of every object under a prefix (a directory shard)."""
    info = location.info()
    if info.type == pafs.FileType.File:
        return int(info.size)
    return sum(int(i.size) for i in location.walk_files())


def is_remote_spool(location: Location) -> bool:
    """A spool, finished or being written (a spool data file, or its ``.tmp``), or a folder
    of nothing but spools (Nemotron's ``spool/`` beside its shards): never a shard."""
    if location.is_file():
        return False
    names = {c.name for c in location.iterdir()}
    spool_files = set(SPOOL_FILES.values())
    if names & (spool_files | {f"{n}.tmp" for n in spool_files}):
        return True
    children = [location / n for n in names]
    return bool(children) and all(not c.is_file() and is_remote_spool(c) for c in children)


def is_shard_like(location: Location) -> bool:
    """An entry under a shard prefix that could be a shard (as locally: hidden names,
    receipts, notes, layout and spool folders are not)."""
    if is_ignored_name(location.name):
        return False
    return object_format(location) is not None or not is_remote_spool(location)


def remote_dataset_directories(location: Location) -> list[Location]:
    """The prefixes under ``location`` (itself included) holding a dataset manifest, in path
    order: a run folder, ``OUT/runs``, a folder of pack outputs (spools are not entered)."""
    if (location / MANIFEST_FILE).is_file():
        return [location]
    found: list[Location] = []
    for child in location.iterdir():
        if is_ignored_name(child.name) or object_format(child) is not None:
            continue  # a one-file shard: no request needed to know it holds no output
        if child.is_dir() and not is_remote_spool(child):
            found.extend(remote_dataset_directories(child))
    return found


def glob_remote(pattern: str, filesystem: Any = None) -> list[Location]:
    """Objects and prefixes matching a glob URI (``s3://lab/out/shard_00000[0-3].parquet``),
    sorted; ``*`` does not cross ``/``. The listing starts at the last prefix before the
    first wildcard."""
    location = resolve(pattern, filesystem)
    parts = location.path.split("/")
    fixed = next(i for i, part in enumerate(parts) if globlib.has_magic(part))
    base = Location(location.filesystem, "/".join(parts[:fixed]), location.scheme)
    depth = len(parts)
    found = set()
    for info in base.walk_files():
        pieces = info.path.split("/")
        if len(pieces) >= depth:
            candidate = "/".join(pieces[:depth])
            if fnmatch.fnmatchcase(candidate, location.path):
                found.add(candidate)
    return [Location(location.filesystem, p, location.scheme) for p in sorted(found)
            if not any(is_ignored_name(x) for x in p.split("/")[fixed:])]


def _child_shard(child: Location, format: str | None) -> list[tuple[Location, str]]:
    name = object_format(child)
    if name is not None:
        return [(child, expect_format(child, name, format))]
    manifest = child / MANIFEST
    if manifest.is_file():
        parsed = parse_manifest(manifest.read_bytes(), str(manifest))
        return [(child, expect_format(child, directory_format(child, parsed), format))]
    if child.is_dir():
        if (child / MANIFEST_FILE).is_file():
            raise FormatError(f"{child}: a pack output (it has a {MANIFEST_FILE}), inside "
                              "another shard folder: name it, or the folder above")
        raise FormatError(f"{child}: no {MANIFEST} (an unfinished upload, or not a shard)")
    raise FormatError(f"{child}: not a shard of any known format (under a shard prefix)")


def read_remote_blend(root: Location) -> dict[str, Any] | None:
    """``root/blend.json`` on the store, checked; None when absent."""
    target = root / BLEND_FILE
    if not target.is_file():
        return None
    return parse_blend(target.read_bytes(), target)


def split_shards(root: Location, split: str, *, format: str | None = None
                 ) -> list[tuple[Location, str]]:
    """The shards of ``split`` as the remote ``blend.json`` lists them, with their format."""
    blend = read_remote_blend(root)
    if blend is None:
        raise FormatError(f"{root}: no {BLEND_FILE}, so split {split!r} cannot be resolved "
                          "(object storage has no splits/ links)")
    if split not in blend["splits"]:
        raise FormatError(f"{root}: no split {split!r}; splits here: "
                          f"{', '.join(blend['splits']) or 'none'}")
    paths = blend["splits"][split].get("shards", [])
    if not paths:
        raise FormatError(f"{root / BLEND_FILE}: split {split!r} is empty (no sequence fell "
                          "into it)")
    kind = blend_format(blend)
    if format is not None and kind is not None and format != kind:
        raise FormatError(f"{root}: a {kind} layout, not {format}")
    shards = [root / p for p in paths]
    if kind is None:
        return [s for loc in shards for s in find_shards(loc)]
    return [(loc, kind) for loc in shards]
