"""Finding local shards: a shard, a directory of shards, a glob, or a list of those.

Every shard is returned with its format, detected by the registry
(:func:`packlab.formats.detect_format`). In a directory, hidden temporaries, receipts and
manifests (``*.json``), notes and layout folders are skipped; anything else that no format
claims is an error, so a damaged shard is never silently left out.

A spool beside the shards, or a folder of spools, is no shard and is skipped too: Nemotron's
output directory holds ``shard_000000.parquet``... beside ``spool/shard_000000/``..., the
spools it packed them from (finished, empty or still being written).

A directory with a dataset manifest (``dataset.json``, :mod:`packlab.pipeline.manifest`) is
its shards as listed there, refused while the job that writes it has not finished; a shard named
by itself (a path, a glob match, a layout's link) must be listed in its folder's manifest, when
the folder has one (:func:`placed`). :func:`dataset_directories` finds the outputs under a run
folder.

Layouts (``splits/``, ``blend.json``), run folders and object storage sit above this module
(:mod:`packlab.layout`, :mod:`packlab.cloud`); :mod:`packlab.sources.resolve` resolves them all.
"""

from __future__ import annotations

import glob as globlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.errors import FormatError
from packlab.files import is_temporary
from packlab.formats import detect_format, get_format
from packlab.pipeline.manifest import (
    MANIFEST_FILE,
    listed_shards,
    read_manifest,
    require_complete,
)
from packlab.pipeline.receipts import read_receipt, receipt_places
from packlab.spool import FILES as SPOOL_FILES

PathLike = str | os.PathLike[str]
# Entries of a shard directory that are never shards: layout folders, receipts, notes.
IGNORED_NAMES = {"splits", "runs", "receipts", "README", "README.md", "_SUCCESS"}
IGNORED_SUFFIXES = (".json", ".txt", ".md", ".log")


class NoShardsError(FormatError):
    """A directory that holds no shard at all (a layout root, say: its caller may know more)."""


class ShardRef(tuple):
    """``(path, format)``, and where a dataset manifest lists the shard, ``bins``: the range of
    the dataset's bins it must hold (:class:`packlab.dataset.PackedDataset` checks it), and
    ``sha256``: its identity there (``packlab validate`` compares it)."""

    bins: tuple[int, int] | None
    sha256: str | None

    def __new__(cls, path: Any, format: str, bins: tuple[int, int] | None = None,
                sha256: str | None = None) -> ShardRef:
        ref = super().__new__(cls, (path, format))
        ref.bins = bins
        ref.sha256 = sha256
        return ref

    @classmethod
    def listed(cls, path: Any, format: str, entry: dict[str, Any]) -> ShardRef:
        """A shard as its dataset manifest's ``entry`` places it."""
        return cls(path, format, (int(entry["bins"][0]), int(entry["bins"][1])),
                   entry.get("sha256"))

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self[0], self[1], self.bins, self.sha256)


def is_ignored_name(name: str) -> bool:
    """A name in a shard directory (or under a remote prefix) that is never a shard."""
    return name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def expect_format(where: object, detected: str, wanted: str | None) -> str:
    """The detected format, refusing a shard of another format than the one asked for."""
    if wanted is not None and wanted != detected:
        get_format(wanted)  # an unknown name is its own error
        raise FormatError(f"{where}: a {detected} shard, not {wanted}")
    return detected


def _ignored(path: Path) -> bool:
    return is_ignored_name(path.name) or is_temporary(path)


def _detect(path: Path) -> str | None:
    try:
        return detect_format(path)
    except FormatError:
        return None


def _is_main_entry(path: Path, name: str) -> bool:
    """Whether ``path`` is the shard itself, not a companion file its format also claims."""
    suffix = get_format(name).Reader.SUFFIX
    return path.name.endswith(suffix) if suffix else path.is_dir()


def _is_spool(path: Path) -> bool:
    """A spool directory, finished or not (Nemotron writes ``tokens.bin.tmp`` first): it holds
    a spool data file. (No shard format keeps files of those names.)"""
    names = [*SPOOL_FILES.values()]
    return path.is_dir() and any((path / n).exists() or (path / f"{n}.tmp").exists()
                                 for n in names)


def holds_spools(path: Path) -> bool:
    """A spool, or a folder of nothing but spools (Nemotron's ``spool/``): never a shard."""
    if _is_spool(path):
        return True
    if not path.is_dir() or path.is_symlink():
        return False
    entries = [c for c in path.iterdir() if not c.name.startswith(".")]
    return bool(entries) and all(_is_spool(c) for c in entries)


def _stem(name: str) -> str:
    return name.split(".", 1)[0]


def shards_in_directory(directory: Path, *, format: str | None = None) -> list[tuple[Path, str]]:
    """The shards directly inside ``directory``, sorted by name, each with its format.

    Hidden temporaries, receipts/manifests (``*.json``) and layout folders are skipped. A file
    that is no shard but shares its stem with one (``x.idx`` beside ``x.bin``) is a companion;
    anything else unrecognised is an error, so a damaged shard is never silently left out.

    A directory without a dataset manifest (written before them) is checked as its receipts
    allow: a receipt must name its shard, and their bins must follow one another (a gap is a
    missing shard, an overlap a duplicated one); each shard then carries the bins its receipt
    gives it (:class:`ShardRef`), as a link into a dataset directory carries its manifest's.
    """
    found: list[tuple[Path, str]] = []
    unknown: list[Path] = []
    manifests: Placements = {}
    for child in sorted(directory.iterdir()):
        if _ignored(child) or holds_spools(child):
            continue
        if child.is_symlink() and not child.exists():
            raise FormatError(f"{child}: broken link to {os.readlink(child)} (its shard is "
                              "missing; rerun `packlab pack` to rewrite it)")
        name = _detect(child)
        if name is None:
            unknown.append(child)
            continue
        if not _is_main_entry(child, name):
            continue  # a companion file the format also recognises (e.g. the .idx of a .bin)
        name = expect_format(child, name, format)
        found.append(placed(child, name, manifests) if child.is_symlink()
                     else ShardRef(child, name))
    stems = {_stem(p.name) for p, _ in found}
    strays = [p for p in unknown if _stem(p.name) not in stems]
    if strays:
        raise FormatError(f"{strays[0]}: not a shard of any known format (in a shard directory)")
    targets: dict[Path, Path] = {}
    for link in (p for p, _ in found if p.is_symlink()):
        first = targets.setdefault(link.resolve(), link)
        if first != link:
            raise FormatError(f"{link}: links to the same shard as {first.name} ({link.resolve()})"
                              ": its bins would be served twice")
    places = receipt_places([p for p, _ in found if not p.is_symlink()])
    return [ShardRef(p, name, places[p]) if p in places else ref
            for ref in found for p, name in [ref]]



def find_shards(path: PathLike | Sequence[PathLike], *, format: str | None = None
                ) -> list[tuple[Path, str]]:
    """Resolve a shard, a directory of shards, a glob, or a list of those into (path, format)."""
    if isinstance(path, list | tuple):
        out: list[tuple[Path, str]] = []
        for item in path:
            out.extend(find_shards(item, format=format))
        return out
    text = os.fspath(path)
    p = Path(text)
    if not p.exists() and globlib.has_magic(text):
        matches = sorted(globlib.glob(text))
        if not matches:
            raise FormatError(f"{text}: the pattern matches nothing")
        picked: list[tuple[Path, str]] = []
        manifests: Placements = {}
        for match in matches:
            m = Path(match)
            if _ignored(m):
                continue
            name = detect_format(m)
            if _is_main_entry(m, name):
                picked.append(placed(m, expect_format(m, name, format), manifests))
        if not picked:
            raise FormatError(f"{text}: the pattern matches no shard")
        return picked
    if not p.exists():
        raise FormatError(f"{p}: no such file or directory")
    if p.is_dir():
        own = _detect(p)
        if own is not None and _is_main_entry(p, own):
            return [placed(p, expect_format(p, own, format))]
        manifest = read_manifest(p)
        if manifest is not None:
            return [ShardRef.listed(path, expect_format(path, manifest["format"], format), entry)
                    for path, entry in listed_shards(p, manifest, is_shard_like)]
        if holds_spools(p):
            what = "a spool (spool_v1)" if _is_spool(p) else "a folder of spools (spool_v1)"
            raise FormatError(f"{p}: {what}, not packed shards: pack it first "
                              "(`packlab pack`)")
        shards = shards_in_directory(p, format=format)
        if not shards:
            raise NoShardsError(f"{p}: no shards in this directory")
        return shards
    return [placed(p, format or detect_format(p))]


def is_shard_like(path: Path) -> bool:
    """An entry of a shard directory that could be a shard (what a dataset manifest must
    list): anything but hidden names, temporaries, receipts, notes, layout and spool folders."""
    return not _ignored(path) and not holds_spools(path)


#: dataset manifests already read while placing shards, per directory: the manifest's entries
#: by shard name (None: a directory without one), so placing N shards reads each manifest once
Placements = dict[Path, "dict[str, dict[str, Any]] | None"]


def placed(path: Path, format: str, manifests: Placements | None = None) -> ShardRef:
    """One shard named by itself (a path, a glob match, a layout's link): where the directory
    it lives in has a dataset manifest, the shard must be listed there and the dataset
    complete (a shard of an interrupted job is refused like the whole directory); where it has
    none (written before them), the shard is where its receipt puts it, if it has one.
    ``manifests`` keeps the manifests read across the calls of one walk."""
    real = path.resolve() if path.is_symlink() else path
    directory = real.parent
    if manifests is not None and directory in manifests:
        entries = manifests[directory]
    else:
        entries = _manifest_entries(directory)
        if manifests is not None:
            manifests[directory] = entries
    if entries is None:  # written before dataset manifests: where its receipt puts it
        receipt = read_receipt(real)
        bins = None if receipt is None else receipt.get("bins")
        return ShardRef(path, format, None if bins is None else (bins[0], bins[1]))
    entry = entries.get(real.name)
    if entry is None:
        raise FormatError(f"{real}: not listed in {directory / MANIFEST_FILE} (copied in from "
                          "elsewhere?)")
    return ShardRef.listed(path, format, entry)


def _manifest_entries(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The complete dataset manifest of ``directory``, its entries by shard name (the first
    of a name), or None where there is none."""
    manifest = read_manifest(directory)
    if manifest is None:
        return None
    require_complete(directory, manifest)
    entries: dict[str, dict[str, Any]] = {}
    for entry in manifest["shards"]:
        entries.setdefault(entry["name"], entry)
    return entries


def dataset_directories(path: Path) -> list[Path]:
    """The directories under ``path`` (itself included) that hold a dataset manifest, in path
    order, not looking inside them: a run folder (``OUT/runs/<run_hash>``), ``OUT/runs``, or
    any folder of pack outputs. Spool folders and links are not followed."""
    if (path / MANIFEST_FILE).is_file():
        return [path]
    found: list[Path] = []
    for child in sorted(path.iterdir()):
        if child.is_dir() and not child.is_symlink() and not _ignored(child) \
                and not holds_spools(child):
            found.extend(dataset_directories(child))
    return found
