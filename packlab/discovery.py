"""Finding local shards: a shard, a directory of shards, a glob, or a list of those.

Every shard is returned with its format, detected by the registry
(:func:`packlab.formats.detect_format`). In a directory, hidden temporaries, receipts and
manifests (``*.json``), notes and layout folders are skipped; anything else that no format
claims is an error, so a damaged shard is never silently left out.

A spool beside the shards, or a folder of spools, is no shard and is skipped too: Nemotron's
output directory holds ``shard_000000.parquet``... beside ``spool/shard_000000/``..., the
spools it packed them from (finished, empty or still being written).

Layouts (``splits/``, ``blend.json``) and object storage sit above this module
(:mod:`packlab.layout`, :mod:`packlab.cloud`); :func:`packlab.open_dataset` resolves them all.
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
from packlab.pipeline.manifest import MANIFEST_FILE, listed_shards, read_manifest, require_complete
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
    the dataset's bins it must hold (:class:`packlab.dataset.PackedDataset` checks it)."""

    bins: tuple[int, int] | None

    def __new__(cls, path: Path, format: str, bins: tuple[int, int] | None = None) -> ShardRef:
        ref = super().__new__(cls, (path, format))
        ref.bins = bins
        return ref

    def __getnewargs__(self) -> tuple[Any, ...]:
        return (self[0], self[1], self.bins)


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
    manifests: dict[Path, dict[str, Any] | None] = {}
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
        found.append(_placed(child, expect_format(child, name, format), manifests))
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


def _placed(child: Path, format: str, manifests: dict[Path, dict[str, Any] | None]
            ) -> tuple[Path, str]:
    """A shard reached through a link (a split of an output layout links the shards of its
    datasets' directories): placed where the dataset manifest of the directory it lives in
    puts it (or, written before manifests, its receipt), so a shard swapped or copied over
    another there is refused when the dataset opens it (:func:`packlab.dataset.check_place`).
    Its bytes are the reader's and validate's to judge: a damaged shard is found naming its bin."""
    if not child.is_symlink():
        return (child, format)
    real = child.resolve()
    home = real.parent
    if home not in manifests:
        manifests[home] = read_manifest(home)
    manifest = manifests[home]
    if manifest is None:  # written before dataset manifests: where its receipt puts it
        receipt = read_receipt(real)
        bins = None if receipt is None else receipt.get("bins")
        return (child, format) if bins is None else ShardRef(child, format, tuple(bins))
    require_complete(home, manifest)
    entry = next((s for s in manifest["shards"] if s["name"] == real.name), None)
    if entry is None:
        raise FormatError(f"{child}: links to {real}, a shard {MANIFEST_FILE} there does not "
                          "list (copied in from elsewhere?)")
    return ShardRef(child, format, (entry["bins"][0], entry["bins"][1]))


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
        for match in matches:
            m = Path(match)
            if _ignored(m):
                continue
            name = detect_format(m)
            if _is_main_entry(m, name):
                picked.append((m, expect_format(m, name, format)))
        if not picked:
            raise FormatError(f"{text}: the pattern matches no shard")
        return picked
    if not p.exists():
        raise FormatError(f"{p}: no such file or directory")
    if p.is_dir():
        own = _detect(p)
        if own is not None and _is_main_entry(p, own):
            return [(p, expect_format(p, own, format))]
        manifest = read_manifest(p)
        if manifest is not None:
            return [ShardRef(path, expect_format(path, manifest["format"], format),
                             (entry["bins"][0], entry["bins"][1]))
                    for path, entry in listed_shards(p, manifest, lambda c: not _ignored(c))]
        if holds_spools(p):
            what = "a spool (spool_v1)" if _is_spool(p) else "a folder of spools (spool_v1)"
            raise FormatError(f"{p}: {what}, not packed shards: pack it first "
                              "(`packlab pack`)")
        shards = shards_in_directory(p, format=format)
        if not shards:
            raise NoShardsError(f"{p}: no shards in this directory")
        return shards
    return [(p, format or detect_format(p))]
