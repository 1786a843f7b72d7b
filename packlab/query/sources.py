"""Which Parquet shards a query reads, and what each one is (split, dataset, shard name).

``data`` is any dataset path (:mod:`packlab.sources.resolve`): an output layout (every split,
or the one named), ``ROOT/splits/NAME``, a run folder, a Parquet shard, a directory of shards,
a glob, a list of those (split and dataset are then NULL); local or ``s3://``. Only the footers
are read here (pack size, bins, tokens), never a row group. A shard of a format SQL does not
read is transcoded (:func:`sql_readable`) into a private temporary folder first.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from packlab.formats import formats_where, get_format
from packlab.progress import progress_bar
from packlab.sources import open_shard, resolve_source
from packlab.sources.convert import convert_reader

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


def sql_readable(shards: Sequence[Shard], folder: Path) -> list[Shard]:
    """The shards, each readable by SQL: a format SQL reads is left as it is; any other is
    transcoded bin by bin into ``folder`` (a private temporary folder) as the first format
    that is (:func:`packlab.sources.convert.convert_reader`), and read from there."""
    target = formats_where("SQL_READABLE")[0]
    todo = [s for s in shards if not get_format(s.format).Reader.SQL_READABLE]
    if not todo:
        return list(shards)
    folder.mkdir(parents=True, exist_ok=True)
    out = list(shards)
    with progress_bar(total=sum(s.num_bins for s in todo), desc=f"transcode to {target}",
                      unit="bin") as bar:
        for k, shard in enumerate(shards):
            if shard in todo:
                file = folder / f"{k:06d}{get_format(target).Writer.SUFFIX}"
                with open_shard(shard.path, format=shard.format) as reader:
                    convert_reader(reader, file, format=target, before=0,
                                   on_bin=lambda: bar.update(1))
                out[k] = replace(shard, file=str(file))
    return out
