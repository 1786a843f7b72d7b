"""What "a dataset" is, wherever it lives: the one resolver every command and
:func:`packlab.open_dataset` use.

A dataset path is any of (``s3://`` or another URI works for every one):

============================  ==================================================================
what                          resolves to
============================  ==================================================================
a shard                       itself (a file, or a shard directory); where the folder it is in
                              has a dataset record, the shard must be listed there and the
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
:class:`~packlab.storage.location.Location`, format, place in its dataset, split and dataset
names) and remembers the layout it came from, so ``validate`` can check counts against
``blend.json``. Nothing here reads a bin.
"""

from __future__ import annotations

import glob as globlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from packlab.errors import FormatError, PacklabError
from packlab.loading.discovery import PathLike, ShardRef, dataset_directories, find_shards
from packlab.pipeline.layout.blend import (
    LINK_SEPARATOR,
    SPLITS_DIR,
    is_layout,
    known_splits,
    layout_shards,
    read_blend,
)
from packlab.pipeline.layout.build import CONFIG_FILE
from packlab.storage.files import parse_json
from packlab.storage.location import Location, as_location, is_remote, resolve


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
        """``(path, format)`` with ``bins``, as :class:`~packlab.loading.dataset.PackedDataset` takes."""
        return ShardRef(self.path, self.format, self.bins, self.sha256)

    @property
    def remote(self) -> bool:
        return is_remote(self.path)


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
    (naming the path) for anything that is not a dataset or not whole. A local path and a URI
    go the same way, through their :class:`~packlab.storage.location.Location`."""
    if isinstance(path, list | tuple):
        if not path:
            raise PacklabError("no shards: an empty list of paths")
        if split is not None:
            raise PacklabError(f"split {split!r} needs one output (a layout root or a run "
                               "folder), not a list of paths")
        parts = [resolve_source(p, format=format, filesystem=filesystem) for p in path]
        return Source(", ".join(p.given for p in parts), "list",
                      [s for p in parts for s in p.shards])
    location = resolve(path, filesystem)
    given = str(path)  # as given: a Location prints as its URI on object storage
    if not location.exists() and not location.is_link() and globlib.has_magic(location.path):
        _no_split(given, split, "a glob")
        return Source(given, "glob", [_shard(r) for r in find_shards(location, format=format)])
    if location.is_dir() and is_layout(location) and not _holds_shards(location):
        return _layout(given, location, split, format)
    folder = location.parent
    if folder.name == SPLITS_DIR and is_layout(folder.parent):  # ROOT/splits/<split>
        if split is not None and split != location.name:
            raise FormatError(f"{location}: split {location.name!r}, not {split!r}")
        inner = _layout(given, folder.parent, location.name, format)
        return Source(given, "split", inner.shards, layout=folder.parent, blend=inner.blend)
    try:
        refs = find_shards(location, format=format)
    except FormatError:
        below = dataset_directories(location) if location.is_dir() else []
        if not below or below == [_as_given(location)]:
            raise
        return _run_folder(location, below, split, format)
    # one shard named by itself, or by another name that is no folder (a pair's prefix or file)
    kind = "shard" if len(refs) == 1 and (str(refs[0][0]) == str(_as_given(location))
                                          or not location.is_dir()) else "directory"
    _no_split(given, split, "a shard" if kind == "shard" else "a directory of shards")
    return Source(given, kind, [_shard(r) for r in refs])


def _as_given(location: Location) -> Any:
    """A location as discovery returns shards: a local one as a ``Path``."""
    return location.local_path or location


def _holds_shards(location: Location) -> bool:
    """A folder that is a layout root and also holds shards directly is read as shards."""
    return any(c.name.startswith("shard_") for c in location.iterdir())


def _layout(given: str, root: Location, split: str | None, format: str | None) -> Source:
    """A layout's splits (``split``: only that one; ``ROOT/splits/<split>`` names one too),
    from its links or its ``blend.json``; splits no sequence fell into are noted, not read."""
    blend = read_blend(root)  # a layout still being written is refused here
    known = known_splits(root)
    if split is not None and split not in known:
        raise FormatError(f"{root}: no split {split!r}; splits here: "
                          f"{', '.join(known) or 'none'}")
    names = [split] if split is not None else known
    shards: list[Shard] = []
    empty: list[str] = []
    for name, found in layout_shards(root, format=format, splits=names).items():
        if not found:
            if split is not None:
                raise FormatError(f"{root}: split {split!r} is empty (no sequence fell into "
                                  "it)")
            empty.append(name)
            continue
        shards.extend(_shard(r, split=name, dataset=_dataset_of(link, blend), name=link)
                      for link, r in found)
    if not shards:
        raise FormatError(f"{root}: the output layout holds no shards")
    return Source(given, "layout" if split is None else "split", shards,
                  layout=_as_given(root), blend=blend, empty_splits=empty)


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


def _run_folder(folder: Location, directories: list[Any], split: str | None,
                format: str | None) -> Source:
    """Every pack output under ``folder`` (labelled by its ``config.json``, when a layout
    wrote it), or those of ``split``."""
    if not directories:
        raise FormatError(f"{folder}: no shards here, and no pack output below (not a shard "
                          "directory, layout or run folder)")
    shards: list[Shard] = []
    seen: list[str] = []
    for directory in directories:
        config = _config(as_location(directory))
        part_split = config.get("split")
        seen.append(str(part_split))
        if split is not None and part_split != split:
            continue
        dataset = config.get("dataset")
        shards.extend(_shard(r, split=part_split, dataset=dataset,
                             name=f"{dataset}{LINK_SEPARATOR}{r[0].name}" if dataset
                             else _relative(r[0], folder))
                      for r in find_shards(directory, format=format))
    if not shards:
        raise FormatError(f"{folder}: no output of split {split!r} here (splits: "
                          f"{', '.join(sorted(set(seen))) or 'none'})")
    return Source(str(_as_given(folder)), "run", shards)


def _config(directory: Location) -> dict[str, Any]:
    file = directory / CONFIG_FILE
    if not file.is_file():
        return {}
    config = parse_json(file.read_bytes(), file, unreadable="unreadable")
    return config if isinstance(config, dict) else {}


def _relative(path: Any, root: Location) -> str:
    return as_location(path).relative_to(root)
