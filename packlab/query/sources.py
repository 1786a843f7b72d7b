"""Which Parquet shards a query reads, and what each one is (split, dataset, shard name).

``data`` is any dataset path (:mod:`packlab.sources.resolve`): an output layout (every split,
or the one named), ``ROOT/splits/NAME``, a run folder, a Parquet shard, a directory of shards,
a glob, a list of those (split and dataset are then NULL); local or ``s3://``. Only the footers
are read here (pack size, bins, tokens), never a row group. A shard of a format SQL does not
read is transcoded (:func:`sql_readable`) into a private temporary folder first, once per
process: a copy is kept (until the process exits) for as long as its source's files are
unchanged, so the second query over a binidx output costs what one over Parquet costs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from packlab.formats import files_of_shard, formats_where, get_format
from packlab.progress import progress_bar
from packlab.sources import open_shard, resolve_source
from packlab.sources.convert import convert_reader
from packlab.storage.location import as_location

PathLike = str | os.PathLike[str]


@dataclass(frozen=True)
class Shard:
    split: str | None
    dataset: str | None
    shard: str  # the name a query shows: the link name in a layout, else the file name
    path: str
    pack_size: int
    num_bins: int
    num_tokens: int
    format: str = ""
    file: str | None = None  # what DuckDB reads, when not ``path`` (a transcoded copy)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_sources(data: PathLike | Sequence[PathLike], *, split: str | None = None
                    ) -> list[Shard]:
    """The Parquet shards ``data`` names (any dataset path, :mod:`packlab.sources.resolve`;
    local or on object storage), in the order :func:`packlab.open_dataset` reads them, each
    with its split, dataset and counts (from its footer)."""
    source = resolve_source(data, split=split)
    return [_shard(s) for s in source.shards]


def _shard(shard: Any) -> Shard:
    with open_shard(shard.path, format=shard.format) as reader:
        return Shard(shard.split, shard.dataset, shard.name, str(shard.path),
                     int(reader.pack_size), int(reader.num_bins), int(reader.num_tokens),
                     shard.format)


TRANSCODED_PREFIX = "packlab-transcoded-"
_COPIES: dict[tuple[Any, ...], str] = {}  # a shard's identity -> its SQL-readable copy
_FOLDER: list[Path] = []  # this process's folder of copies, made at first use


def sql_readable(shards: Sequence[Shard], *, note: Callable[[str], None] | None = None
                 ) -> list[Shard]:
    """The shards, each readable by SQL: a format SQL reads is left as it is; any other is
    transcoded bin by bin (:func:`packlab.sources.convert.convert_reader`) as the first format
    that is, into this process's temporary folder (removed at exit), and read from there.
    A copy serves every later call while its source's files keep their sizes and times
    (:func:`shard_identity`). ``note(message)`` is told before a transcoding starts: it takes
    seconds to minutes, and a user should know why and how to avoid it."""
    target = formats_where("SQL_READABLE")[0]
    keys = {k: shard_identity(s) for k, s in enumerate(shards)
            if not get_format(s.format).Reader.SQL_READABLE}
    todo = {k: key for k, key in keys.items() if key not in _COPIES}
    if todo:
        formats = sorted({shards[k].format for k in todo})
        bins = sum(shards[k].num_bins for k in todo)
        if note is not None:
            note(f"transcoding {len(todo)} {' and '.join(formats)} shard"
                 f"{'s' if len(todo) != 1 else ''} ({bins:,} bins) into {target} for SQL, "
                 f"once in this process (packlab convert PATH OUT --format {target} keeps a "
                 "copy that needs none)")
        suffix = get_format(target).Writer.SUFFIX
        with progress_bar(total=bins, desc=f"transcode to {target}", unit="bin") as bar:
            for k, key in todo.items():
                file = _folder() / f"{len(_COPIES):06d}{suffix}"
                with open_shard(shards[k].path, format=shards[k].format) as reader:
                    convert_reader(reader, file, format=target, before=0, overwrite=True,
                                   on_bin=lambda: bar.update(1))
                _COPIES[key] = str(file)
    return [replace(s, file=_COPIES[keys[k]]) if k in keys else s for k, s in enumerate(shards)]


def shard_identity(shard: Shard) -> tuple[Any, ...]:
    """What says a shard is unchanged since it was transcoded: its place, format, and every
    file's name, size and modification time (a listing, no byte read; local or remote)."""
    location = as_location(shard.path)
    infos = (f.info() for f in files_of_shard(location))
    return (location.uri, shard.format, tuple(sorted((i.path, i.size, i.mtime_ns) for i in infos)))


def _folder() -> Path:
    if not _FOLDER:
        folder = Path(tempfile.mkdtemp(prefix=f"{TRANSCODED_PREFIX}{os.getpid()}-"))
        atexit.register(shutil.rmtree, folder, True)
        _FOLDER.append(folder)
    return _FOLDER[0]
