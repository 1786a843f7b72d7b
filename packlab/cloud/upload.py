"""The output layout (``runs/``, ``splits/``, ``blend.json``) on object storage.

Object storage has no symlinks, so ``splits/`` does not travel: the split listing is the
blend's (``splits.<name>.shards``, paths relative to the root), and
:func:`packlab.open_dataset` resolves ``split=`` through it.

:func:`upload_layout` uploads what the blend references, each shard whole (directory shards
record last, files through a temporary key), the receipts and configs beside them, and then
``blend.json`` **last**: it is the layout's commit point, so a reader that finds it finds
every shard it lists. Shards of a format that ``NEEDS_SPOOL`` take their spool along, to the
place their recorded relative path points (which must stay inside the bucket).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packlab.cloud.transfer import DIRECTORY_RECORD, remote_record, upload_shard
from packlab.errors import FormatError, PacklabError
from packlab.formats import get_format, is_companion, shard_entry, shard_size
from packlab.pipeline.dataset_record import (
    DATASET_RECORD,
    as_writing,
    parse_dataset_record,
    read_dataset_record,
    require_complete,
)
from packlab.pipeline.layout.blend import (
    BLEND_FILE,
    SPLITS_DIR,
    blend_format,
    read_blend,
    writing_blend,
)
from packlab.pipeline.receipts import (
    RECEIPT_SUFFIX,
    parse_receipt,
    receipt_path,
    shard_bytes,
)
from packlab.pipeline.shards import SHARD_NAME
from packlab.storage.files import is_temporary
from packlab.storage.location import Location, resolve
from packlab.storage.objects import put_object


def upload_tree(local: str | os.PathLike[str], uri: str | Location, *, filesystem: Any = None,
                overwrite: bool = False, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """Upload a local folder: every directory shard (a folder with a ``manifest.json`` that
    lists files) whole, every other file through a temporary key; symlinks, hidden entries and
    top-level names in ``skip`` are left out. A pack output (``dataset.json``) goes where
    there is none, or where the same job is (an interrupted upload, finished sending only what
    is missing); another job's is replaced only with ``overwrite``. Returns ``{"shards",
    "files", "bytes"}`` (and ``kept``: shards already there)."""
    root = Path(local)
    target = resolve(uri, filesystem)
    if not root.is_dir():
        raise FormatError(f"{root}: no such folder to upload")
    totals = {"shards": 0, "files": 0, "bytes": 0}
    _upload_into(root, target, totals, overwrite=overwrite, skip=skip)
    return {"uri": target.uri, **totals}


def _upload_into(folder: Path, target: Location, totals: dict[str, int], *, overwrite: bool,
                 skip: tuple[str, ...]) -> None:
    children = [c for c in sorted(folder.iterdir())
                if not (c.is_symlink() or c.name.startswith(".") or is_temporary(c)
                        or c.name in skip)]
    dataset = read_dataset_record(folder)  # a pack output: incomplete on the store until the end
    if dataset is not None:
        require_complete(folder, dataset)
        if not overwrite:
            _refuse_another_job(dataset, target)
        children = [c for c in children if c.name != DATASET_RECORD]
        put_object(json.dumps(as_writing(dataset), indent=2).encode(), target / DATASET_RECORD)
    for child in children:
        if is_companion(child.name):
            continue  # uploaded with its shard, before it
        if child.is_dir() and not (child / DIRECTORY_RECORD).is_file():
            _upload_into(child, target / child.name, totals, overwrite=overwrite, skip=())
            continue
        if dataset is not None and _already_there(child, target / child.name):
            totals["kept"] = totals.get("kept", 0) + 1
            continue
        done = upload_shard(child, target / child.name, overwrite=overwrite or dataset is not None)
        totals["shards"] += int(child.is_dir() or child.suffix != ".json")
        totals["files"] += done["files"]
        totals["bytes"] += done["bytes"]
    if dataset is not None:
        _drop_stale(target, {s["name"] for s in dataset["shards"]})
        put_object((folder / DATASET_RECORD).read_bytes(), target / DATASET_RECORD)  # last


def _refuse_another_job(dataset: dict[str, Any], target: Location) -> None:
    """Without ``overwrite``, a pack output goes only where nothing is, or where the very
    same job is (an interrupted upload to finish), as a local pack output does."""
    there = target / DATASET_RECORD
    if there.is_file() and parse_dataset_record(there.read_bytes(), there).get("job_hash") != \
            dataset.get("job_hash"):
        raise PacklabError(f"{target}: already holds another output ({DATASET_RECORD}, ...); "
                           "pass overwrite=True to replace it")


def _already_there(local: Path, remote: Location) -> bool:
    """A shard an earlier, interrupted upload already put there whole: the receipt on the
    store vouches for the same shard as the local one (format, bins, size, checksum) and the
    size there matches, so a resumed upload sends only what is missing."""
    receipt = receipt_path(local)
    there = remote.parent / receipt.name
    if local.name.endswith(".json") or not receipt.is_file() or not there.is_file():
        return False
    try:
        mine = parse_receipt(receipt.read_bytes(), receipt)
        theirs = parse_receipt(there.read_bytes(), there)
    except FormatError:
        return False
    same = all(mine.get(k) == theirs.get(k) for k in ("format", "bins", "bytes", "sha256"))
    return same and remote.exists() and shard_size(remote) == shard_bytes(local)


def _drop_stale(target: Location, keep: set[str]) -> None:
    """Shards of an earlier, larger output at ``target`` (and their receipts) not in ``keep``."""
    for child in target.iterdir():
        name = child.name[: -len(RECEIPT_SUFFIX)] if child.name.endswith(RECEIPT_SUFFIX) \
            else shard_entry(child).name
        if SHARD_NAME.match(name) and name not in keep:
            child.delete()


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
    # the old layout (if any) reads as incomplete until the new blend lands, last
    put_object(json.dumps(writing_blend(blend), indent=2).encode(), target / BLEND_FILE)
    totals = upload_tree(root, target, overwrite=True, skip=(SPLITS_DIR, BLEND_FILE))
    spools = _upload_spools(root, target, referenced, blend)
    put_object((root / BLEND_FILE).read_bytes(), target / BLEND_FILE)
    return {**totals, "spools": spools, "blend": (target / BLEND_FILE).uri}


def _upload_spools(root: Path, target: Location, referenced: list[str],
                   blend: dict[str, Any]) -> int:
    """The spools of shards whose format ``NEEDS_SPOOL``, where each shard's relative path
    points."""
    fmt = blend_format(blend)
    if fmt is None or not get_format(fmt).Reader.NEEDS_SPOOL:
        return 0
    reader = get_format(fmt).Reader
    done: set[str] = set()
    for shard in referenced:
        recorded = reader.spool_reference(root / shard)
        relative = recorded["relative"]
        remote = (target / shard) / relative
        if remote.path.split("/")[0] != target.path.split("/")[0]:
            raise PacklabError(f"{root / shard}: its spool ({relative}) would land "
                               "outside the bucket; keep the spool inside the layout")
        if remote.uri in done:
            continue
        local = Path(os.path.normpath((root / shard).absolute() / relative))
        if not (local / DIRECTORY_RECORD).is_file():
            local = Path(recorded["path"])
        there = remote_record(remote)
        if there is None or there[0] != (local / DIRECTORY_RECORD).read_bytes():  # not uploaded yet
            upload_shard(local, remote, overwrite=True)
        done.add(remote.uri)
    return len(done)
