"""Where a command writes, and what it may replace: the one output discipline of every
command that writes (pack, convert, tokenize, synth, corpus, raw-index, pbin, and the next one).

A new command adopts it in one block::

    with output(args.out, kind="dataset", overwrite=args.overwrite) as local:
        ...write ``local`` (a local path even when OUT is a URI)...

**Local or remote.** Every command that writes takes a local path or a URI. A URI never becomes
a local folder (``s3://lab/x`` is not ``./s3:/lab/x``): the work is written into a local
staging folder (``$PACKLAB_STAGING_DIR``, default ``~/.cache/packlab/staging/<hash of the
URI>``) and uploaded when it is whole, as :mod:`packlab.cloud` does for the Python API: a
spool or a directory shard record last, a file through a temporary key, a pack output with
its ``dataset.json`` put as ``"writing"`` first and finished last, a layout with its
``blend.json`` likewise. The staging folder of a resumable job outlives an interruption, so
the same command finishes the job (and the upload) instead of starting again.

**Kinds, each recognised by its own record.** ``--overwrite`` replaces only packlab's own
output of the same kind at that path; anything else is refused, overwrite or not:

===========  ==================================================================================
kind         recognised by
===========  ==================================================================================
spool        ``manifest.json`` of version ``spool_v1`` (synth, tokenize); refused while a
             ``packed_index`` output still reads it (:mod:`packlab.pipeline.references`)
dataset      ``dataset.json`` (pack, convert into a folder), or a folder of nothing but pipeline
             shards and their receipts (written before dataset records existed)
layout       ``blend.json`` or a ``runs/`` folder (pack with ``--split`` or several spools)
file         a file whose writer keeps its own record beside it (export: a Megatron prefix's
             ``.spool.json``), recognised by the caller's ``recognise(path)``, named by ``what``
shard        a shard of the same format carrying packlab's own record (convert into one shard);
             a one-file shard's companions (a pair's ``.bin``, a sidecar) go with it, and one
             found without its shard is refused
jsonl, ...   a one-file output's record beside it, naming it with its size and checksum
             (corpus, raw-index, pbin: :mod:`packlab.sources.file_records`)
===========  ==================================================================================

Never inside another output: a path under a pack output, a layout, a spool or a directory shard
is refused, whatever the flag (a file written there would be a stray in someone else's record).
A path the command line cannot name in UTF-8 is refused up front (records and SQL name paths
in UTF-8). An empty folder may always be written into; what a killed run left (hidden
temporaries whose writer no longer runs) is swept first.

**Staged, published atomically, resumed.** A spool and every shard are built under a temporary
name and renamed into place by their writers; a one-file output is built under a temporary
name here, and its record is written first (``"writing"``) and finished last; a folder of
shards (pack, convert) carries ``dataset.json``, written first and finished last. Without
``--overwrite`` an existing output is refused, except the job's own unfinished one: the same
command (``resume=True``: pack and convert, whose pipelines check it is the very same job; a
one-file output whose record says ``"writing"``) finishes it. A run that fails (or is refused)
leaves what was there as it was.
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
    download_prefix,
    download_shard,
    upload_shard,
)
from packlab.cloud.upload import upload_layout, upload_tree
from packlab.errors import FormatError, PacklabError
from packlab.formats import detect_format, get_format, shard_entry
from packlab.pipeline.dataset_record import DATASET_RECORD
from packlab.pipeline.layout.blend import BLEND_FILE, RUNS_DIR, is_layout
from packlab.pipeline.references import spool_users
from packlab.pipeline.shards import OWN_FILES, SHARD_NAME, sweep_own_temporaries
from packlab.sources.file_records import (
    FILE_KINDS,
    identity,
    new_file_record,
    read_file_record,
    recognised,
    record_path,
    write_file_record,
)
from packlab.sources.resolve import Source
from packlab.spool import FILES as SPOOL_FILES
from packlab.spool import SpoolReader, is_spool_record
from packlab.spool.prefix import prefix_files, prefix_of
from packlab.storage.files import (
    TMP_MARKER,
    check_path_name,
    is_temporary,
    left_by_a_dead_writer,
    parse_json,
    publish,
    remove,
    short_hash,
    temporary_sibling,
)
from packlab.storage.location import Location, is_remote, resolve
from packlab.storage.objects import cache_root

FOLDER_KINDS = ("spool", "dataset", "layout")
KINDS = (*FOLDER_KINDS, "shard", *FILE_KINDS, "file")
_FOLDERS = {"spool": "a spool", "dataset": "a pack output", "layout": "an output layout"}
REFUSAL = ("--overwrite replaces only packlab's own output of the same kind: remove it yourself "
           "or choose another path")


def staging_root() -> Path:
    env = os.environ.get("PACKLAB_STAGING_DIR")
    return Path(env) if env else cache_root().parent / "staging"


# -- what may be replaced ----------------------------------------------------------------------
def check_output(target: str, *, kind: str, overwrite: bool, resume: bool = False,
                 format: str | None = None, recognise: Callable[[Path], bool] | None = None,
                 what: str = "") -> None:
    """Refuse to write ``target`` when that could lose something (see the module docstring);
    every message names the path and the flag that would change the answer."""
    if kind not in KINDS:
        raise PacklabError(f"output kind must be one of {', '.join(KINDS)}, got {kind!r}")
    check_path_name(target)
    if is_remote(target):
        _check_remote(resolve(target), kind, overwrite, resume, format)
        return
    path = Path(target)
    enclosing = enclosing_output(path)
    if enclosing is not None:
        where, what = enclosing
        raise PacklabError(f"{path}: inside {where}, {what}: packlab writes nothing inside "
                           "another output (choose a path outside it)")
    if kind == "shard":
        path = _shard_named(path)  # a pair named by its prefix: its .idx, and companions
        _check_companions(path, format)
    if not (path.exists() or path.is_symlink()):
        return
    if kind in FOLDER_KINDS and not path.is_dir():
        raise PacklabError(f"{path}: exists and is not a folder ({_FOLDERS[kind]} is one): "
                           "choose another path")
    if path.is_dir() and not path.is_symlink() and not any(path.iterdir()):
        return  # an empty folder: nothing to lose
    if not (_recognised(path, kind, format) if kind != "file" else
            path.is_file() and (recognise is None or recognise(path))):
        if kind == "shard" and not _keeps_record(format):
            raise PacklabError(f"{path}: already exists, and a {format} shard keeps no record "
                               "that says packlab wrote it: remove it yourself or choose "
                               "another path")
        raise PacklabError(f"{path}: exists and is not {what or _kind_name(kind, format)}; "
                           f"{REFUSAL}")
    if kind == "spool" and overwrite:
        users = spool_users(path)
        if users:
            raise PacklabError(f"{path}: {len(users)} packed_index output(s) still read this "
                               f"spool ({users[0]}); replacing it would break them (remove or "
                               "repack them first)")
    if kind in FILE_KINDS and _unfinished_file(path):
        return  # the same command, interrupted: it finishes the job
    if not overwrite and not resume:
        raise PacklabError(f"{path}: already exists (pass --overwrite to replace it)")


def _shard_named(path: Path) -> Path:
    """The shard a target names by another of its names (``out.sft``, the prefix a Megatron
    pair's files share, is ``out.sft.idx``): what is judged, and whose companions."""
    return path.with_name(shard_entry(resolve(str(path))).name)


def _check_companions(path: Path, format: str | None) -> None:
    """A one-file shard's other files (a Megatron pair's ``.bin``, packlab's sidecar) are
    written with it: where the shard is not there, one of them that is would be a person's
    file (or what is left of another shard), refused."""
    if format is None or path.exists():
        return  # an existing shard is judged whole, by its record
    for companion in get_format(format).Reader.companions(path):
        if companion.exists() or companion.is_symlink():
            raise PacklabError(f"{companion}: exists, and writing the {format} shard {path.name} "
                               f"would replace it; {REFUSAL}")


def enclosing_output(path: Path) -> tuple[Path, str] | None:
    """The packlab output that ``path`` would be inside (a pack output, a layout, a spool, a
    directory shard), and what it is; None when no folder above ``path`` is one."""
    for folder in Path(os.path.abspath(path)).parents:
        what = folder_kind(folder)
        if what is not None:
            return folder, what
    return None


def folder_kind(folder: Path) -> str | None:
    """What packlab output ``folder`` is, by its record, in words; None for any other folder."""
    if (folder / DATASET_RECORD).is_file():
        return "a packlab output (dataset.json)"
    if (folder / BLEND_FILE).is_file():
        return "an output layout (blend.json)"
    record = folder / DIRECTORY_RECORD
    if not record.is_file():
        return None
    try:
        raw = record.read_bytes()
    except OSError:
        return None
    if is_spool_record(raw):
        return "a spool"
    try:
        return f"a {detect_format(folder)} shard"
    except FormatError:
        return None


def _kind_name(kind: str, format: str | None) -> str:
    if kind in FILE_KINDS:
        return f"{FILE_KINDS[kind][0]} packlab wrote (no record of it beside it, or its bytes " \
               "changed since)"
    return {"spool": "a spool (spool_v1)", "dataset": "a packlab output (it has no "
            "dataset.json)", "layout": "a packlab output layout (it has no blend.json or runs/)",
            "shard": f"a {format} shard packlab wrote",
            "file": "a file of that kind packlab wrote"}[kind]


def _recognised(path: Path, kind: str, format: str | None) -> bool:
    if kind == "spool":
        return (path / DIRECTORY_RECORD).is_file() and is_spool_record((path / DIRECTORY_RECORD).read_bytes())
    if kind == "dataset":
        return (path / DATASET_RECORD).is_file() or _only_pipeline_shards(path)
    if kind == "layout":
        return is_layout(path) or (path / RUNS_DIR).is_dir()
    if kind == "shard":
        return own_shard(path, format)
    return recognised(path, kind)


def own_shard(path: Any, format: str | None) -> bool:
    """A shard of ``format`` that carries packlab's own record (a directory shard's record file, a
    one-file shard's packlab footer, metadata or trailer): a Parquet file from elsewhere is
    not packlab's to replace."""
    try:
        if format is None or detect_format(path) != format:
            return False
        with get_format(format).Reader(path) as reader:
            return bool(reader.own_record)
    except Exception:  # noqa: BLE001 - whatever a damaged or foreign file raises: not ours
        return False


def _keeps_record(format: str | None) -> bool:
    """Whether shards of ``format`` carry a record of their writer (the legacy pickle has no
    room for one)."""
    return format is None or get_format(format).Reader.KEEPS_RECORD


def _unfinished_file(path: Path) -> bool:
    try:
        record = read_file_record(path)
    except FormatError:
        return False
    return record is not None and record["state"] == "writing"


def _only_pipeline_shards(path: Path) -> bool:
    """A folder of nothing but ``shard_NNNNNN...`` entries, their receipts and the job's own
    files (an output written before dataset records existed)."""
    names = [c.name for c in path.iterdir() if not c.name.startswith(".")]
    return bool(names) and all(SHARD_NAME.match(n) or n in OWN_FILES for n in names)


def _check_remote(location: Location, kind: str, overwrite: bool, resume: bool,
                  format: str | None) -> None:
    if not location.exists():
        return
    unfinished = False
    if location.is_file():
        if kind == "shard":
            suffix = _suffix(format)
            own = bool(suffix) and location.name.endswith(suffix)
        elif kind == "file":
            own = True  # its own record, beside it, is the writer's to check
        elif kind in FILE_KINDS:
            own = recognised(location, kind)
            record = read_file_record(location) if own else None
            unfinished = record is not None and record["state"] == "writing"
        else:
            own = False
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
        raise PacklabError(f"{location}: exists and is not {_kind_name(kind, format)}; "
                           f"{REFUSAL}")
    if not overwrite and not resume and not unfinished:
        raise PacklabError(f"{location}: already exists (pass --overwrite to replace it)")


def _suffix(format: str | None) -> str | None:
    return get_format(format).Writer.SUFFIX if format else None


# -- writing locally or to a URI ---------------------------------------------------------------
@contextmanager
def output(target: str, *, kind: str, overwrite: bool, resume: bool = False,
           format: str | None = None, recognise: Callable[[Path], bool] | None = None,
           what: str = "") -> Iterator[Path]:
    """``with output(OUT, kind=...) as local:`` write ``local`` (see the module docstring).
    The checks of :func:`check_output` run first, before any work. For a folder kind or a
    shard ``local`` is where the command's writer builds (and publishes) its output; for a
    one-file kind it is a temporary name this block publishes with the file's record; for a
    URI it is a staging folder's entry, uploaded when the block ends normally."""
    if not is_remote(target):
        sweep_leftovers(Path(target))
    check_output(target, kind=kind, overwrite=overwrite, resume=resume, format=format,
                 recognise=recognise, what=what)
    if not is_remote(target):
        if kind in FILE_KINDS:
            with _file_output(Path(target), kind) as local:
                yield local
            return
        path = Path(target)
        new = not path.exists() or (path.is_dir() and not any(path.iterdir()))
        try:
            yield path
        except PacklabError:
            if new and kind in FOLDER_KINDS:  # refused (bad input found on the way): what
                remove(path)  # this run began is gone; an interrupted run keeps it to finish
            raise
        return
    location = resolve(target)
    staging = staging_root() / short_hash(location.uri)
    if not resume:
        remove(staging)
    staging.mkdir(parents=True, exist_ok=True)
    local = staging / (location.name or "out")
    if resume and not overwrite and kind == "dataset":
        _stage_dataset_record(location, local)
    try:
        yield local
        if kind in FILE_KINDS:
            _upload_file(local, location, kind)
        else:
            upload(local, location, kind)
    except BaseException as exc:
        if not resume:  # a resumable job keeps its staged work for the same command
            remove(staging)
        if isinstance(exc, PacklabError):  # about the staged copy: said of the user's URI
            raise type(exc)(str(exc).replace(str(local), location.uri)) from None
        raise
    remove(staging)


def sweep_leftovers(path: Path) -> list[Path]:
    """Remove what a killed run of a command writing ``path`` left: its hidden temporaries
    beside it (the output's, its record's: ``.NAME.tmp-PID-...``), and in a folder that holds
    nothing else, the temporaries inside it, each only when its writer no longer runs (as
    ``packlab gc`` decides). So the same command finishes, and nothing of a run is left."""
    gone: list[Path] = []
    if not path.parent.is_dir():
        return gone
    prefixes = (f".{path.name}{TMP_MARKER}", f".{record_path(path).name}{TMP_MARKER}",
                f".{path.stem}.")  # and its companions' (a prefix's .bin beside its .idx)
    beside = [p for p in path.parent.iterdir()
              if p.name.startswith(prefixes) and is_temporary(p)]
    inside = list(path.iterdir()) if path.is_dir() and not path.is_symlink() else []
    if not all(is_temporary(p) for p in inside):
        inside = []  # a folder with content: its own writer sweeps it, under its lock
    for leftover in (*beside, *inside):
        if left_by_a_dead_writer(leftover):
            remove(leftover)
            gone.append(leftover)
    return gone


@contextmanager
def _file_output(final: Path, kind: str) -> Iterator[Path]:
    """A one-file output built under a temporary name beside ``final``: its record says
    ``"writing"`` first (what it replaces, then what comes), the file is renamed into place,
    the record finished last. Any failure puts back the record that was there (the old file
    never moved)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    where = record_path(final)
    before = where.read_bytes() if where.is_file() else None
    previous = identity(final) if final.is_file() else None
    write_file_record(final, new_file_record(final, kind=kind, state="writing",
                                             previous=previous, next=None))
    hidden = temporary_sibling(final)
    tmp = hidden.with_name(hidden.name + final.suffix)  # writers that read the suffix see it
    try:
        yield tmp
        if not tmp.is_file():
            raise PacklabError(f"{final}: the command wrote nothing (a bug)")
        made = identity(tmp)
        write_file_record(final, new_file_record(final, kind=kind, state="writing",
                                                 previous=previous, next=made))
        publish(tmp, final, overwrite=True)
        write_file_record(final, new_file_record(final, kind=kind, state="complete", **made))
    except BaseException as exc:
        remove(tmp)
        if not (final.is_file() and identity(final) != previous):  # else the new file is in
            if before is None:  # place, and its "writing" record recognises it
                remove(where)
            else:
                where.write_bytes(before)
        if isinstance(exc, PacklabError):  # about the temporary: said of the user's path
            raise type(exc)(str(exc).replace(str(tmp), str(final))) from None
        raise


def _upload_file(local: Path, location: Location, kind: str) -> None:
    """A one-file output sent to the store: its record put as ``"writing"`` first, the file
    through a temporary key, the record finished last."""
    from packlab.storage.objects import upload_file

    made = identity(local)
    write_file_record(location, new_file_record(location, kind=kind, state="writing",
                                                previous=None, next=made))
    upload_file(local, location, overwrite=True)
    write_file_record(location, new_file_record(location, kind=kind, state="complete", **made))


def _stage_dataset_record(location: Location, local: Path) -> None:
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
    """A local path for an input that may be a URI: a spool, a Megatron prefix (or a file) on
    object storage is downloaded once into the verified cache; a local path is returned as it
    is."""
    if not is_remote(path):
        return Path(path)
    location = resolve(path)
    prefix = _prefix_at(path) if what == "spool" else None
    if prefix is not None:  # a Megatron .bin/.idx prefix reads as a spool
        return prefix
    if what == "spool" and not (location / DIRECTORY_RECORD).is_file():
        if not location.exists():
            raise FormatError(f"{location}: no such spool")
        raise FormatError(f"{location}: no {DIRECTORY_RECORD} (not a spool, or its upload did not "
                          "finish)")
    try:
        return download_shard(location, validate=False)
    except NoFileList:
        raise FormatError(f"{location}: the spool records no file checksums (a Nemotron "
                          "spool?): a spool is read from object storage only when its "
                          "record lists them; download it first") from None


def spool_at(path: str) -> SpoolReader | None:
    """A reader of the spool at ``path`` (local, or on object storage: fetched into the
    verified cache first), or None when ``path`` is no spool: a folder whose record says
    ``spool_v1``, or that holds spool files without a readable record (its reader then says
    what is wrong), or a Megatron ``.bin/.idx`` prefix (:mod:`packlab.spool.prefix`)."""
    prefix = _prefix_at(path)
    if prefix is not None:
        return SpoolReader(prefix)
    location = resolve(path)
    record = location / DIRECTORY_RECORD
    if record.is_file():
        raw = record.read_bytes()
        try:
            declared = parse_json(raw, record)
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
    named = idx.is_file() and not resolve(uri).is_file()  # a file's .idx is its own (a JSONL's)
    return download_prefix(uri) if named and not _a_shard(idx) else None


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
