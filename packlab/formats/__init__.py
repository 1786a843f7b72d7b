"""The shard formats: one module each, a writer and a reader, registered here.

Each module under ``packlab/formats/`` defines ``FORMAT`` (its name), ``Writer`` (a
:class:`~packlab.formats.shared.base.ShardWriter`) and ``Reader`` (a
:class:`~packlab.formats.shared.base.ShardReader`). What the format *is* lives on those two classes,
as the attributes of :class:`~packlab.formats.shared.base.FormatFacts` they share (``SUFFIX``,
``RECORD``, ``RECORD_FORMAT``, ``FILES``, ``NEEDS_SPOOL``, ``IN_RAM``, ``RAW_RUNS``,
``STREAMS``, ``READS_IN_PLACE``, ``SQL_READABLE``, ``BUFFERED_BINS``, ``detect``);
everything else in packlab reads them
through this registry and never tests a format's name.

Adding a format (the whole checklist):

1. ``packlab/formats/<name>.py``: a docstring that shows its files on disk field by field with
   a literal example (record or footer); a magic/version in the header or record; a
   ``<Name>Facts(FormatFacts)`` class with ``FORMAT``, ``SUFFIX``, ``detect`` and whichever
   facts hold; ``Writer(<Name>Facts, ShardWriter)`` implementing ``_open``, ``_write``,
   ``_close`` (record or footer last; the base class checks invariants and order, works
   under a temporary name and publishes with one rename); ``Reader(<Name>Facts,
   ShardReader)`` implementing ``read_bin`` and ``validate`` (every error a
   :class:`~packlab.errors.FormatError` naming the file and bin), lazy and picklable.
2. One line in ``_MODULES`` below.
3. Nothing else: ``tests/test_format_contract.py`` runs the contract over every registered
   format (round trip, killed writer, flat writer memory, order refusal, forked worker, lazy
   pickling, arrays valid after close, truncation caught), and ``packlab pack``, ``convert``,
   ``validate``, object storage, the benchmarks and the notebooks pick the format up from here.

Modules are imported on first use, so ``import packlab`` stays cheap. Opening a shard or a
writer anywhere (a local path, a URI) is :func:`packlab.open_shard` / :func:`packlab.open_writer`
(:mod:`packlab.sources`); code that knows the format asks the registry for its class:
``get_format(name).Reader(path, **options)``.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pyarrow.fs as pafs

from packlab.errors import FormatError, PacklabError
from packlab.storage.location import Location, as_location

# Detection order matters: the most specific formats first.
_MODULES: dict[str, str] = {
    "memmap_v1": "packlab.formats.memmap_v1",
    "binidx": "packlab.formats.binidx",
    "megatron_sft": "packlab.formats.megatron_sft",
    "packed_index": "packlab.formats.packed_index",
    "parquet": "packlab.formats.parquet",
    "arrow_ipc": "packlab.formats.arrow_ipc",
    "pbin": "packlab.formats.pbin",
    "legacy_npy_pickle": "packlab.formats.legacy_npy_pickle",
}


def format_names() -> list[str]:
    """Names of the formats whose module is present."""
    return [name for name in _MODULES if _load(name, required=False) is not None]


def _load(name: str, *, required: bool = True) -> ModuleType | None:
    try:
        return importlib.import_module(_MODULES[name])
    except KeyError:
        import difflib

        close = difflib.get_close_matches(str(name).lower(), format_names(), n=1, cutoff=0.6)
        raise PacklabError(f"unknown format {name!r}; choose from {', '.join(format_names())}"
                           + (f" (did you mean {close[0]!r}?)" if close else "")) from None
    except ModuleNotFoundError as exc:
        if exc.name == _MODULES[name] and not required:
            return None
        raise


def get_format(name: str) -> ModuleType:
    """The module of format ``name`` (``FORMAT``, ``Writer``, ``Reader``, ``SUFFIX``)."""
    module = _load(name)
    assert module is not None
    return module


def formats_where(fact: str) -> list[str]:
    """The formats for which a :class:`~packlab.formats.shared.base.FormatFacts` attribute is true."""
    return [n for n in format_names() if getattr(get_format(n).Reader, fact)]


def suffix_formats() -> dict[str, str]:
    """File suffix -> format, for the one-file formats (how an object is known by its name)."""
    return {get_format(n).Reader.SUFFIX: n for n in format_names() if get_format(n).Reader.SUFFIX}


def record_formats() -> dict[str, str]:
    """A directory shard record's ``format`` value -> format name."""
    return {get_format(n).Reader.RECORD_FORMAT: n for n in format_names()
            if get_format(n).Reader.RECORD_FORMAT}


def directory_shard_files() -> set[str]:
    """Names of the files inside directory shards (never shards themselves)."""
    return {f for n in format_names() for f in get_format(n).Reader.shard_files()}


def detect_format(path: str | os.PathLike[str] | Location) -> str:
    """The name of the format of the shard at ``path`` (a local path or a
    :class:`~packlab.storage.location.Location`); a clear error if none claims it. Only the formats of
    its kind are asked (a file: one-file formats; a folder: directory formats), each reading a
    few bytes at most (one ranged request on object storage). A pair named by another of its
    names (its ``.bin``, its prefix) is the pair's format."""
    location = as_location(path)
    named = shard_entry(location)
    if named != location and named.exists():
        location = named
    kind = location.info().type
    if kind == pafs.FileType.NotFound:
        raise FormatError(f"{path}: no such file or directory")
    for name in format_names():
        reader = get_format(name).Reader
        if reader.is_directory() == (kind == pafs.FileType.Directory) and reader.detect(location):
            return name
    raise FormatError(f"{path}: not a shard of any known format ({', '.join(format_names())})")


# -- one-file shards of several files (a Megatron pair and its sidecar) ---------------------------
def _paired() -> list[type]:
    """The Readers of the formats whose one-file shards have companions."""
    return [get_format(n).Reader for n in format_names() if get_format(n).Reader.COMPANIONS]


def shard_entry(location: Location) -> Location:
    """The shard a path names by another of its names, as Megatron's tools name a pair: one of
    its companions (``train.sft.bin`` -> ``train.sft.idx``) or the prefix they share
    (``train.sft``); any other path is itself. A glob pattern maps the same way."""
    name = location.name
    for reader in _paired():
        for suffix in reader.COMPANIONS:
            if name.endswith(suffix):
                return location.parent / f"{name[: -len(suffix)]}{reader.SUFFIX}"
        prefix, extension = reader.SUFFIX.rsplit(".", 1)
        if name.endswith(prefix):
            return location.parent / f"{name}.{extension}"
    return location


def prefixed_entries(location: Location) -> list[Location]:
    """The one-file shards a bare prefix may name (``out/c`` -> ``out/c.sft.idx``): where a
    format whose shard is several files writes when given that name."""
    return [location.parent / f"{location.name}{reader.SUFFIX}" for reader in _paired()]


def is_companion(name: str) -> bool:
    """A file name that is a companion of a one-file shard (never a shard itself)."""
    return any(name.endswith(suffix) for reader in _paired() for suffix in reader.COMPANIONS)


def files_of_shard(location: Location) -> list[Location]:
    """Every file of the shard at ``location`` that is there: a directory shard's files, or a
    one-file shard's companions and then the file itself (the order it is published in)."""
    if location.is_dir():
        return [Location(location.filesystem, i.path, location.scheme)
                for i in location.walk_files()]
    files = []
    for reader in _paired():
        if location.name.endswith(reader.SUFFIX):
            files = [c for c in reader.companions(location) if c.is_file()]
            break
    return [*files, location]


def shard_size(path: str | os.PathLike[str] | Location) -> int:
    """All bytes of a shard: a file's and its companions', or every file's of a directory."""
    location = as_location(path)
    if location.is_dir():
        return location.tree_size()
    return sum(f.size() for f in files_of_shard(location))


def record_companion(location: Location) -> Location | None:
    """The companion holding packlab's record of the one-file shard at ``location`` (its
    checksum stands for the shard's), when its format has one and it is there."""
    for reader in _paired():
        if reader.COMPANION_RECORD and location.name.endswith(reader.SUFFIX):
            stem = location.name[: -len(reader.SUFFIX)]
            found = location.parent / f"{stem}{reader.COMPANION_RECORD}"
            return found if found.is_file() else None
    return None


def delete_shard(path: str | os.PathLike[str] | Location) -> None:
    """Remove a shard whole: a directory, or a file and then its companions (the file first:
    it is the commit point, so what remains for a moment is no shard at all)."""
    location = as_location(path)
    companions = [c for reader in _paired() if location.name.endswith(reader.SUFFIX)
                  for c in reader.companions(location)]
    for part in (location, *companions):
        part.delete()
