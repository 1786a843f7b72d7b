"""The output layout (``runs/``, ``splits/``, ``blend.json``) on object storage.

Object storage has no symlinks, so ``splits/`` does not travel: the split listing is the
blend's (``splits.<name>.shards``, paths relative to the root), and
:func:`packlab.cloud.open_dataset` resolves ``split=`` through it.

:func:`upload_layout` uploads what the blend references, each shard whole (directory shards
manifest last, files through a temporary key), the receipts and configs beside them, and then
``blend.json`` **last**: it is the layout's commit point, so a reader that finds it finds
every shard it lists. ``packed_index`` shards take their spool along, to the place their
recorded relative path points (which must stay inside the bucket).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from packlab.cloud.transfer import MANIFEST, remote_manifest, upload_shard
from packlab.errors import FormatError, PacklabError
from packlab.files import is_temporary
from packlab.layout.blend import BLEND_FILE, SPLITS_DIR, parse_blend, read_blend
from packlab.storage import Location, put_object, resolve


def upload_tree(local: str | os.PathLike[str], uri: str | Location, *, filesystem: Any = None,
                overwrite: bool = False, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Upload a local folder: every directory shard (a folder with a ``manifest.json`` that
    lists files) whole, every other file through a temporary key; symlinks, hidden entries and
    top-level names in ``skip`` are left out. Returns ``{"shards", "files", "bytes"}``."""
    root = Path(local)
    target = resolve(uri, filesystem)
    if not root.is_dir():
        raise FormatError(f"{root}: no such folder to upload")
    totals = {"shards": 0, "files": 0, "bytes": 0}
    _upload_into(root, target, totals, overwrite=overwrite, skip=skip)
    return {"uri": target.uri, **totals}


def _upload_into(folder: Path, target: Location, totals: dict[str, int], *, overwrite: bool,
                 skip: tuple[str, ...]) -> None:
    for child in sorted(folder.iterdir()):
        if child.is_symlink() or child.name.startswith(".") or is_temporary(child) or \
                child.name in skip:
            continue
        if child.is_dir() and not (child / MANIFEST).is_file():
            _upload_into(child, target / child.name, totals, overwrite=overwrite, skip=())
            continue
        done = upload_shard(child, target / child.name, overwrite=overwrite)
        totals["shards"] += int(child.is_dir() or child.suffix != ".json")
        totals["files"] += done["files"]
        totals["bytes"] += done["bytes"]


def upload_layout(local_root: str | os.PathLike[str], uri: str | Location, *,
                  filesystem: Any = None, overwrite: bool = False) -> dict[str, Any]:
    """Upload an output layout; ``blend.json`` goes last (see the module docstring)."""
    root = Path(local_root)
    blend = read_blend(root)
    if blend is None:
        raise FormatError(f"{root}: no {BLEND_FILE} (not an output layout)")
    target = resolve(uri, filesystem)
    referenced = [s for entry in blend["splits"].values() for s in entry.get("shards", [])]
    missing = [s for s in referenced if not (root / s).exists()]
    if missing:
        raise FormatError(f"{root / missing[0]}: listed in {BLEND_FILE} but missing")
    if not overwrite and (target / BLEND_FILE).exists():
        raise PacklabError(f"{target / BLEND_FILE}: already exists (pass overwrite=True)")
    (target / BLEND_FILE).delete()  # when overwriting: the old layout is gone first
    totals = upload_tree(root, target, overwrite=True, skip=(SPLITS_DIR, BLEND_FILE))
    spools = _upload_spools(root, target, referenced, blend)
    put_object((root / BLEND_FILE).read_bytes(), target / BLEND_FILE)
    return {**totals, "spools": spools, "blend": (target / BLEND_FILE).uri}


def _upload_spools(root: Path, target: Location, referenced: list[str],
                   blend: dict[str, Any]) -> int:
    """The spools of ``packed_index`` shards, where each shard's relative path points."""
    fmt = blend.get("format") or blend.get("packing", {}).get("format")
    if fmt != "packed_index":
        return 0
    from packlab.formats.packed_index import read_manifest

    done: set[str] = set()
    for shard in referenced:
        recorded = read_manifest(root / shard)["spool"]
        remote = (target / shard) / recorded["relative"]
        if remote.path.split("/")[0] != target.path.split("/")[0]:
            raise PacklabError(f"{root / shard}: its spool ({recorded['relative']}) would land "
                               "outside the bucket; keep the spool inside the layout")
        if remote.uri in done:
            continue
        local = Path(os.path.normpath((root / shard).absolute() / recorded["relative"]))
        if not (local / MANIFEST).is_file():
            local = Path(recorded["path"])
        there = remote_manifest(remote)
        if there is None or there[0] != (local / MANIFEST).read_bytes():  # not uploaded yet
            upload_shard(local, remote, overwrite=True)
        done.add(remote.uri)
    return len(done)


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
    kind = blend.get("format") or blend.get("packing", {}).get("format")
    if format is not None and kind is not None and format != kind:
        raise FormatError(f"{root}: a {kind} layout, not {format}")
    shards = [root / p for p in paths]
    if kind is None:
        from packlab.cloud.datasets import find_shards

        return [s for loc in shards for s in find_shards(loc)]
    return [(loc, kind) for loc in shards]
