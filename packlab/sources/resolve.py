"""What "a dataset" is, wherever it lives: the one resolver every command and
:func:`packlab.open_dataset` use.

A dataset path is any of (``s3://`` or another URI works for every one):

============================  ==================================================================
what                          resolves to
============================  ==================================================================
a shard                       itself (a file, or a shard directory); where the folder it is in
                              has a dataset manifest, the shard must be listed there and the
                              output complete
a directory of shards         the shards ``OUT/dataset.json`` lists (refused while ``"writing"``),
                              or, without one (older outputs, Nemotron's output directory:
                              ``shard_*.parquet`` beside ``spool/``), every shard in it
a glob, a list                every shard matched or named, in order
an output layout root         every split (``split``: only that one), from ``splits/`` (links)
                              or ``blend.json`` (on object storage, always)
``ROOT/splits/<split>``       that split (on object storage, through ``ROOT/blend.json``)
a run folder                  ``ROOT/runs/<run_hash>``, ``ROOT/runs``, or any folder of pack
                              outputs: every output under it (``split``: those of that split,
                              by their ``config.json``)
============================  ==================================================================

The result, a :class:`Source`, lists its shards (:class:`Shard`: path or
:class:`~packlab.storage.Location`, format, place in its dataset, split and dataset
names) and remembers the layout it came from, so ``validate`` can check counts against
``blend.json``. Nothing here reads a bin.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packlab.cloud.discovery import find_shards as remote_find_shards
from packlab.cloud.discovery import (
    glob_remote,
    read_remote_blend,
    read_remote_dataset_manifest,
    remote_dataset_directories,
    split_shards,
)
from packlab.discovery import PathLike, ShardRef, dataset_directories, find_shards
from packlab.errors import FormatError, PacklabError
from packlab.files import parse_json
from packlab.layout.blend import (
    LINK_SEPARATOR,
    SPLITS_DIR,
    is_layout,
    known_splits,
    read_blend,
    split_source,
)
from packlab.layout.build import CONFIG_FILE
from packlab.pipeline.manifest import MANIFEST_FILE, require_complete
from packlab.storage import Location, is_remote, resolve


@dataclass(frozen=True)
class Shard:
    """One shard of a resolved dataset."""

    path: Any  # a Path, or a Location on object storage
    format: str
    bins: tuple[int, int] | None = None  # its place in its dataset (dataset.json), if recorded
    sha256: str | None = None  # its identity in dataset.json, if recorded
    split: str | None = None
    dataset: str | None = None
    name: str = ""  # what listings show: the link name in a layout, else the shard's name

    @property
    def ref(self) -> ShardRef:
        """``(path, format)`` with ``bins``, as :class:`~packlab.dataset.PackedDataset` takes."""
        return ShardRef(self.path, self.format, self.bins, self.sha256)

    @property
    def remote(self) -> bool:
        return isinstance(self.path, Location)


@dataclass
class Source:
    """A resolved dataset: its shards in reading order, and where they came from."""

    given: str  # the path or URI as given (what messages name)
    kind: str  # shard, directory, glob, list, layout, split, run
    shards: list[Shard]
    layout: Any = None  # the layout root (Path or Location) when the path is one, or its split
    blend: dict[str, Any] | None = None
    empty_splits: list[str] = field(default_factory=list)  # layout splits no sequence fell into

    @property
    def remote(self) -> bool:
        return any(s.remote for s in self.shards)

    @property
    def splits(self) -> list[str]:
        """The splits present, in reading order (empty when the shards carry none)."""
        return list(dict.fromkeys(s.split for s in self.shards if s.split is not None))

    @property
    def formats(self) -> list[str]:
        return list(dict.fromkeys(s.format for s in self.shards))

    @property
    def refs(self) -> list[ShardRef]:
        return [s.ref for s in self.shards]

    def only_split(self, what: str = "open") -> Source:
        """This source, refused when it spans several splits (a layout root, a run folder):
        reading train and valid as one dataset is never what was meant."""
        if len(self.splits) > 1:
            names = [s for s in (self.blend or {}).get("splits", {})] or self.splits
            kind = "an output layout" if self.layout is not None else "a run folder"
            raise FormatError(f"{self.given}: {kind}: {what} one split (splits here: "
                              f"{', '.join(names)})")
        return self


def resolve_source(path: PathLike | Location | Sequence[PathLike | Location], *,
                   split: str | None = None, format: str | None = None,
                   filesystem: Any = None) -> Source:
    """Resolve ``path`` (see the module docstring) into a :class:`Source`; one clear error
    (naming the path) for anything that is not a dataset or not whole."""
    if isinstance(path, list | tuple):
        if not path:
            raise PacklabError("no shards: an empty list of paths")
        if split is not None:
            raise PacklabError(f"split {split!r} needs one output (a layout root or a run "
                               "folder), not a list of paths")
        parts = [resolve_source(p, format=format, filesystem=filesystem) for p in path]
        return Source(", ".join(p.given for p in parts), "list",
                      [s for p in parts for s in p.shards])
    if is_remote(path) or filesystem is not None:
        return _resolve_remote(resolve(path, filesystem), os.fspath(path) if not isinstance(
            path, Location) else path.uri, split, format)
    return _resolve_local(os.fspath(path), split, format)


# -- local -------------------------------------------------------------------------------------
def _resolve_local(text: str, split: str | None, format: str | None) -> Source:
    p = Path(text)
    if not p.exists() and not p.is_symlink() and globlib.has_magic(text):
        _no_split(text, split, "a glob")
        return Source(text, "glob", [_shard(r) for r in find_shards(text, format=format)])
    if not p.exists():
        raise FormatError(f"{p}: no such file or directory")
    if p.is_dir() and is_layout(p) and not _holds_shards(p):
        return _local_layout(p, split, format)
    if p.is_dir() and p.parent.name == SPLITS_DIR and is_layout(p.parent.parent):
        return _local_split_folder(p, split, format)
    try:
        refs = find_shards(p, format=format)
    except FormatError:
        below = dataset_directories(p) if p.is_dir() else []
        if not below or below == [p]:
            raise
        return _run_folder(p, below, split, format, find_shards, _read_local)
    kind = "shard" if len(refs) == 1 and Path(refs[0][0]) == p else "directory"
    _no_split(text, split, "a shard" if kind == "shard" else "a directory of shards")
    return Source(text, kind, [_shard(r) for r in refs])


def _holds_shards(p: Path) -> bool:
    """A folder that is a layout root and also holds shards directly is read as shards."""
    return any(c.name.startswith("shard_") for c in p.iterdir())


def _local_layout(root: Path, split: str | None, format: str | None) -> Source:
    blend = read_blend(root)  # a layout still being written is refused here

    def split_shards_here(name: str) -> list[tuple[Any, str]]:  # links, named as they are
        return [(r, Path(r[0]).name) for r in find_shards(split_source(root, name),
                                                          format=format)]

    names = [split] if split is not None else known_splits(root)
    return _layout(str(root), root, blend, names, split, split_shards_here)


def _layout(given: str, root: Any, blend: dict[str, Any] | None, names: list[str],
            split: str | None, shards_of: Any) -> Source:
    """A layout's splits (``names``), each split's shards from ``shards_of(name)`` as
    ``(ref, link name)``; splits no sequence fell into are noted, not read."""
    shards: list[Shard] = []
    empty: list[str] = []
    for name in names:
        if split is None and _empty_in_blend(blend, name):
            empty.append(name)
            continue
        shards.extend(_shard(r, split=name, dataset=_dataset_of(link, blend), name=link)
                      for r, link in shards_of(name))
    if not shards:
        raise FormatError(f"{root}: the output layout holds no shards")
    return Source(given, "layout" if split is None else "split", shards, layout=root,
                  blend=blend, empty_splits=empty)


def _local_split_folder(folder: Path, split: str | None, format: str | None) -> Source:
    root = folder.parent.parent
    if split is not None and split != folder.name:
        raise FormatError(f"{folder}: split {folder.name!r}, not {split!r}")
    source = _local_layout(root, folder.name, format)
    return Source(str(folder), "split", source.shards, layout=root, blend=source.blend)


def _read_local(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


# -- remote ------------------------------------------------------------------------------------
def _resolve_remote(location: Location, given: str, split: str | None,
                    format: str | None) -> Source:
    if globlib.has_magic(location.path) and not location.exists():
        _no_split(given, split, "a glob")
        matches = glob_remote(given, location.filesystem)
        if not matches:
            raise FormatError(f"{given}: the pattern matches nothing")
        return Source(given, "glob", [s for m in matches for s in _remote_shards(m, format)])
    if location.is_file():
        _no_split(given, split, "a shard")
        return Source(given, "shard", _remote_shards(location, format))
    blend = read_remote_blend(location)
    if blend is not None:
        return _remote_layout(location, blend, split, format, given)
    if location.parent.name == SPLITS_DIR and not location.exists():
        root = location.parent.parent
        blend = read_remote_blend(root)
        if blend is not None:
            if split is not None and split != location.name:
                raise FormatError(f"{location}: split {location.name!r}, not {split!r}")
            inner = _remote_layout(root, blend, location.name, format, given)
            return Source(given, "split", inner.shards, layout=root, blend=blend)
    try:
        shards = _remote_shards(location, format)
    except FormatError:
        below = remote_dataset_directories(location) if location.is_dir() else []
        if not below or below == [location]:
            raise
        return _run_folder(location, below, split, format, remote_find_shards, _read_remote)
    kind = "shard" if len(shards) == 1 and shards[0].path == location else "directory"
    _no_split(given, split, "a shard" if kind == "shard" else "a directory of shards")
    return Source(given, kind, shards)


def _remote_shards(location: Location, format: str | None) -> list[Shard]:
    found = [_shard(r) for r in remote_find_shards(location, format=format)]
    if len(found) == 1 and found[0].path == location and found[0].bins is None:
        return [_remote_placed(found[0])]
    return found


def _remote_placed(shard: Shard) -> Shard:
    """A remote shard named by itself: as locally, its prefix's dataset manifest (if any)
    must list it and be complete."""
    parent = shard.path.parent
    manifest = read_remote_dataset_manifest(parent)
    if manifest is None:
        return shard
    require_complete(parent, manifest)
    for entry in manifest["shards"]:
        if entry["name"] == shard.path.name:
            ref = ShardRef.listed(shard.path, shard.format, entry)
            return _shard(ref)
    raise FormatError(f"{shard.path}: not listed in {parent / MANIFEST_FILE}")


def _remote_layout(root: Location, blend: dict[str, Any], split: str | None,
                   format: str | None, given: str) -> Source:
    def split_shards_here(name: str) -> list[tuple[Any, str]]:  # named by the blend's links
        links = blend["splits"].get(name, {}).get("links", [])
        return [(ref, links[k] if k < len(links) else ref[0].name)
                for k, ref in enumerate(split_shards(root, name, format=format))]

    names = [split] if split is not None else list(blend["splits"])
    return _layout(given, root, blend, names, split, split_shards_here)


def _read_remote(location: Location) -> bytes | None:
    return location.read_bytes() if location.is_file() else None


# -- shared ------------------------------------------------------------------------------------
def _shard(ref: Any, *, split: str | None = None, dataset: str | None = None,
           name: str | None = None) -> Shard:
    path = ref[0]
    return Shard(path, ref[1], getattr(ref, "bins", None), getattr(ref, "sha256", None),
                 split, dataset, name if name is not None else path.name)


def _no_split(given: str, split: str | None, what: str) -> None:
    if split is not None:
        raise FormatError(f"{given}: {what}, with no splits/ folder, so split {split!r} "
                          "cannot be resolved (no blend.json: splits belong to an output layout "
                          "or a run folder)")


def _empty_in_blend(blend: dict[str, Any] | None, split: str) -> bool:
    return blend is not None and blend["splits"].get(split, {}).get("num_bins") == 0


def _dataset_of(link: str, blend: dict[str, Any] | None) -> str | None:
    """The dataset a layout's link belongs to: its prefix, or the layout's only input."""
    if LINK_SEPARATOR in link:
        return link.split(LINK_SEPARATOR, 1)[0]
    inputs = (blend or {}).get("inputs", [])
    return inputs[0].get("name") if len(inputs) == 1 else None


def _run_folder(folder: Any, directories: list[Any], split: str | None, format: str | None,
                finder: Any, reader: Any) -> Source:
    """Every pack output under ``folder`` (labelled by its ``config.json``, when a layout
    wrote it), or those of ``split``."""
    if not directories:
        raise FormatError(f"{folder}: no shards here, and no pack output below (not a shard "
                          "directory, layout or run folder)")
    shards: list[Shard] = []
    seen: list[str] = []
    for directory in directories:
        config = _config(directory, reader)
        part_split = config.get("split")
        seen.append(str(part_split))
        if split is not None and part_split != split:
            continue
        dataset = config.get("dataset")
        shards.extend(_shard(r, split=part_split, dataset=dataset,
                             name=f"{dataset}{LINK_SEPARATOR}{r[0].name}" if dataset
                             else _relative(r[0], folder))
                      for r in finder(directory, format=format))
    if not shards:
        raise FormatError(f"{folder}: no output of split {split!r} here (splits: "
                          f"{', '.join(sorted(set(seen))) or 'none'})")
    return Source(str(folder), "run", shards)


def _config(directory: Any, reader: Any) -> dict[str, Any]:
    raw = reader(directory / CONFIG_FILE)
    if raw is None:
        return {}
    config = parse_json(raw, directory / CONFIG_FILE, unreadable="unreadable")
    return config if isinstance(config, dict) else {}


def _relative(path: Any, root: Any) -> str:
    if isinstance(path, Location):
        return path.relative_to(root)
    return Path(path).relative_to(root).as_posix()
