"""Where a command writes, and what it may replace.

**Local or remote.** Every command that writes takes a local path or a URI. A URI never becomes
a local folder (``s3://lab/x`` is not ``./s3:/lab/x``): the work is written into a local
staging folder (``$PACKLAB_STAGING_DIR``, default ``~/.cache/packlab/staging/<hash of the
URI>``) and uploaded when it is whole, as :mod:`packlab.cloud` does for the Python API: a
spool or a directory shard manifest last, a file through a temporary key, a pack output with
its ``dataset.json`` put as ``"writing"`` first and finished last, a layout with its
``blend.json`` likewise. The staging folder of a ``pack`` outlives an interruption, so the
same command finishes the job (and the upload) instead of starting again.

**What ``--overwrite`` may replace**: only what packlab recognises as its own output of the
same kind, by its manifest; anything else is refused, overwrite or not:

=========  ====================================================================================
kind       recognised by
=========  ====================================================================================
spool      ``manifest.json`` of version ``spool_v1`` (synth, tokenize); refused while a
           ``packed_index`` output still reads it (:mod:`packlab.pipeline.references`)
dataset    ``dataset.json`` (pack, convert into a folder), or a folder of nothing but pipeline
           shards and their receipts (written before dataset records existed)
layout     ``blend.json`` or a ``runs/`` folder (pack with ``--split`` or several spools)
shard      a shard of the same format (convert into one shard)
file       the check the command gives (a JSONL, an index, a ``.pbin``)
=========  ====================================================================================

An empty folder may always be written into. Without ``--overwrite`` an existing output is
refused, except where the command resumes its own job (``pack``: the pipeline then checks it is
the very same job; for a URI, against the ``dataset.json`` on the store).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packlab.cloud.datasets import fetch_spool
from packlab.cloud.transfer import (
    DIRECTORY_RECORD,
    NoFileList,
    default_cache_dir,
    download_prefix,
    download_shard,
    upload_shard,
)
from packlab.cloud.upload import upload_layout, upload_tree
from packlab.errors import FormatError, PacklabError
from packlab.files import parse_json, remove, short_hash
from packlab.formats import detect_format, get_format
from packlab.layout.blend import BLEND_FILE, RUNS_DIR, is_layout
from packlab.pipeline.dataset_record import DATASET_RECORD
from packlab.pipeline.references import spool_users
from packlab.pipeline.shards import OWN_FILES, SHARD_NAME, sweep_own_temporaries
from packlab.sources.resolve import Source
from packlab.spool import FILES as SPOOL_FILES
from packlab.spool import SpoolReader, is_spool_record
from packlab.spool_prefix import prefix_files, prefix_of
from packlab.storage import Location, is_remote, resolve

KINDS = ("spool", "dataset", "layout", "shard", "file")
_FOLDERS = {"spool": "a spool", "dataset": "a pack output", "layout": "an output layout"}
REFUSAL = ("--overwrite replaces only packlab's own output of the same kind: remove it yourself "
           "or choose another path")


def staging_root() -> Path:
    env = os.environ.get("PACKLAB_STAGING_DIR")
    return Path(env) if env else default_cache_dir().parent / "staging"


# -- what may be replaced ----------------------------------------------------------------------
def check_output(target: str, *, kind: str, overwrite: bool, resume: bool = False,
                 format: str | None = None, recognise: Callable[[Path], bool] | None = None,
                 what: str = "") -> None:
    """Refuse to write ``target`` when that could lose something (see the module docstring);
    every message names the path and the flag that would change the answer."""
    if kind not in KINDS:
        raise PacklabError(f"output kind must be one of {KINDS}, got {kind!r}")
    if is_remote(target):
        _check_remote(resolve(target), kind, overwrite, resume, format)
        return
    path = Path(target)
    if not (path.exists() or path.is_symlink()):
        return
    if kind in ("spool", "dataset", "layout") and not path.is_dir():
        raise PacklabError(f"{path}: exists and is not a folder ({_FOLDERS[kind]} is one): "
                           "choose another path")
    if path.is_dir() and not any(path.iterdir()):
        return  # an empty folder: nothing to lose
    own = _recognised(path, kind, format, recognise)
    if not own:
        raise PacklabError(f"{path}: exists and is not {_kind_name(kind, format, what)}; "
                           f"{REFUSAL}")
    if kind == "spool" and overwrite:
        users = spool_users(path)
        if users:
            raise PacklabError(f"{path}: {len(users)} packed_index output(s) still read this "
                               f"spool ({users[0]}); replacing it would break them (remove or "
                               "repack them first)")
    if not overwrite and not resume:
        raise PacklabError(f"{path}: already exists (pass --overwrite to replace it)")


def _kind_name(kind: str, format: str | None, what: str) -> str:
    if what:
        return what
    return {"spool": "a spool (spool_v1)", "dataset": "a packlab output (it has no "
            "dataset.json)", "layout": "a packlab output layout (it has no blend.json or runs/)",
            "shard": f"a {format} shard", "file": "a file of that kind"}[kind]


def _recognised(path: Path, kind: str, format: str | None,
                recognise: Callable[[Path], bool] | None) -> bool:
    if kind == "spool":
        return (path / DIRECTORY_RECORD).is_file() and is_spool_record((path / DIRECTORY_RECORD).read_bytes())
    if kind == "dataset":
        return (path / DATASET_RECORD).is_file() or _only_pipeline_shards(path)
    if kind == "layout":
        return is_layout(path) or (path / RUNS_DIR).is_dir()
    if kind == "shard":
        try:
            return detect_format(path) == format
        except FormatError:
            return False
    return path.is_file() and (recognise is None or recognise(path))


def _only_pipeline_shards(path: Path) -> bool:
    """A folder of nothing but ``shard_NNNNNN...`` entries, their receipts and the job's own
    files (an output written before dataset records existed)."""
    names = [c.name for c in path.iterdir() if not c.name.startswith(".")]
    return bool(names) and all(SHARD_NAME.match(n) or n in OWN_FILES for n in names)


def _check_remote(location: Location, kind: str, overwrite: bool, resume: bool,
                  format: str | None) -> None:
    if not location.exists():
        return
    if location.is_file():
        suffix = _suffix(format)
        own = kind in ("shard", "file") and (kind == "file" or
                                             bool(suffix) and location.name.endswith(suffix))
    elif kind == "spool":
        own = (location / DIRECTORY_RECORD).is_file() and is_spool_record(
            (location / DIRECTORY_RECORD).read_bytes())
    elif kind == "dataset":
        own = (location / DATASET_RECORD).is_file()
    elif kind == "layout":
        own = (location / BLEND_FILE).is_file() or (location / RUNS_DIR).is_dir()
    elif kind == "shard":
        own = (location / DIRECTORY_RECORD).is_file()
    else:
        own = False
    if not own:
        raise PacklabError(f"{location}: exists and is not {_kind_name(kind, format, '')}; "
                           f"{REFUSAL}")
    if not overwrite and not resume:
        raise PacklabError(f"{location}: already exists (pass --overwrite to replace it)")


def _suffix(format: str | None) -> str | None:
    return get_format(format).Writer.SUFFIX if format else None


# -- writing locally or to a URI ---------------------------------------------------------------
@contextmanager
def output(target: str, *, kind: str, overwrite: bool, resume: bool = False,
           format: str | None = None, recognise: Callable[[Path], bool] | None = None,
           what: str = "") -> Iterator[Path]:
    """``with output(OUT, kind=...) as local:`` write ``local``; for a URI it is a staging
    folder's entry, uploaded when the block ends normally (see the module docstring). The
    checks of :func:`check_output` run first, before any work."""
    check_output(target, kind=kind, overwrite=overwrite, resume=resume, format=format,
                 recognise=recognise, what=what)
    if not is_remote(target):
        yield Path(target)
        return
    location = resolve(target)
    staging = staging_root() / short_hash(location.uri)
    if not resume:
        remove(staging)
    staging.mkdir(parents=True, exist_ok=True)
    local = staging / (location.name or "out")
    if resume and not overwrite and kind == "dataset":
        _stage_manifest(location, local)
    try:
        yield local
        upload(local, location, kind)
    except BaseException as exc:
        if not resume:  # a resumable job keeps its staged work for the same command
            remove(staging)
        if isinstance(exc, PacklabError):  # about the staged copy: said of the user's URI
            raise type(exc)(str(exc).replace(str(local), location.uri)) from None
        raise
    remove(staging)


def _stage_manifest(location: Location, local: Path) -> None:
    """The store's ``dataset.json`` in an empty staging folder, so the pipeline decides
    "the very same job, finish it" or "another output, refuse" against what is on the store,
    as it does for a local folder (an empty staging would replace any output silently)."""
    there = location / DATASET_RECORD
    if (local / DATASET_RECORD).exists() or not there.is_file():
        return
    local.mkdir(parents=True, exist_ok=True)
    (local / DATASET_RECORD).write_bytes(there.read_bytes())


def upload(local: Path, location: Location, kind: str) -> dict[str, Any]:
    """Send a finished local output to ``location`` (replacing what the checks allowed)."""
    if kind == "layout":
        return upload_layout(local, location, overwrite=True)
    if kind == "dataset":
        sweep_own_temporaries(local)
        return upload_tree(local, location, overwrite=True)
    return upload_shard(local, location, overwrite=True)


def stage_spools(spools: list[Path], local_out: Path) -> list[Path]:
    """Copies of ``spools`` inside ``local_out/spool/<name>/`` (hard links where the
    filesystem allows): a format that ``NEEDS_SPOOL`` records its spool by a relative path,
    which must hold on the store too, so the spool travels inside the output (as Nemotron's
    output directory keeps ``spool/`` beside its shards)."""
    staged = []
    for spool in spools:
        prefix = prefix_of(spool)
        if prefix is not None:  # a Megatron prefix: its files, in a folder of their own
            staged.append(_stage_prefix(prefix, local_out / "spool" / prefix.name))
            continue
        target = local_out / "spool" / Path(spool).resolve().name
        if not (target / DIRECTORY_RECORD).is_file():
            remove(target)
            target.mkdir(parents=True)
            for entry in sorted(Path(spool).iterdir()):
                if entry.is_file() and not entry.name.startswith("."):
                    _link_or_copy(entry, target / entry.name)
        staged.append(target)
    return staged


def _stage_prefix(prefix: Path, folder: Path) -> Path:
    """Copies of a Megatron prefix's files (those it has) in ``folder``; the staged prefix."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in prefix_files(prefix).values():
        if file.is_file() and not (folder / file.name).is_file():
            _link_or_copy(file, folder / file.name)
    return folder / prefix.name


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


# -- reading inputs that live on object storage ------------------------------------------------
def local_input(path: str, *, what: str = "spool") -> Path:
    """A local path for an input that may be a URI: a spool (or a file) on object storage is
    downloaded once into the verified cache; a local path is returned as it is."""
    if not is_remote(path):
        return Path(path)
    location = resolve(path)
    if what == "spool" and not (location / DIRECTORY_RECORD).is_file():
        if not location.exists():
            raise FormatError(f"{location}: no such spool")
        raise FormatError(f"{location}: no {DIRECTORY_RECORD} (not a spool, or its upload did not "
                          "finish)")
    try:
        return download_shard(location, validate=False)
    except NoFileList:
        raise FormatError(f"{location}: its manifest records no file checksums (a Nemotron "
                          "spool?): a spool is read from object storage only when its "
                          "manifest lists them; download it first") from None


def spool_at(path: str) -> SpoolReader | None:
    """A reader of the spool at ``path`` (local, or on object storage: fetched into the
    verified cache first), or None when ``path`` is no spool: a folder whose manifest says
    ``spool_v1``, or that holds spool files without a readable manifest (its reader then says
    what is wrong), or a Megatron ``.bin/.idx`` prefix (:mod:`packlab.spool_prefix`)."""
    prefix = _prefix_at(path)
    if prefix is not None:
        return SpoolReader(prefix)
    location = resolve(path)
    manifest = location / DIRECTORY_RECORD
    if manifest.is_file():
        raw = manifest.read_bytes()
        try:
            declared = parse_json(raw, manifest)
        except FormatError:
            declared = None
        if isinstance(declared, dict) and ("version" in declared or "format" in declared):
            return SpoolReader(local_input(path)) if is_spool_record(raw) else None
    if not any((location / name).exists() for name in SPOOL_FILES.values()):
        return None
    return SpoolReader(local_input(path))


def _prefix_at(path: str) -> Path | None:
    """The local prefix ``path`` names (by itself, its ``.bin`` or its ``.idx``; on object
    storage fetched once into the verified cache), or None when it names none (or a shard's
    pair of files, which a format reads)."""
    if not is_remote(path):
        prefix = prefix_of(path)
        return None if prefix is None or _a_shard(prefix_files(prefix)["idx"]) else prefix
    uri = path[:-4] if path.endswith((".bin", ".idx")) else path
    idx = resolve(f"{uri}.idx")
    return download_prefix(uri) if idx.is_file() and not _a_shard(idx) else None


def _a_shard(idx: Path | Location) -> bool:
    """Whether a registered format claims the ``.idx`` (a Bridge ``.sft`` pair): a shard,
    not a prefix of conversations."""
    try:
        detect_format(idx)
    except FormatError:
        return False
    return True


def local_copy(source: Source, folder: Path) -> Path:
    """``folder`` made a directory of shards that reads as ``source``: links to each remote
    shard's verified copy in the download cache (and, for a format that ``NEEDS_SPOOL``, to
    its spool where the shard's relative path points), named as the source names them. For
    measurements that must read local files (page-cache states, ``pread`` floors)."""
    folder.mkdir(parents=True, exist_ok=True)
    for shard in source.shards:
        link = folder / shard.name.replace("/", "__")
        if not shard.remote:
            link.symlink_to(Path(shard.path).absolute())
            continue
        local = download_shard(shard.path, format=shard.format)
        link.symlink_to(local)
        reader = get_format(shard.format).Reader
        if reader.NEEDS_SPOOL:
            spool = fetch_spool(shard.path, local, reader)
            at = Path(os.path.normpath(link / reader.spool_reference(local)["relative"]))
            if not at.exists():
                at.parent.mkdir(parents=True, exist_ok=True)
                at.symlink_to(spool)
    return folder
