"""Which Parquet shards a query reads, and what each one is (split, dataset, shard name).

``data`` is any dataset path (:mod:`packlab.sources.resolve`): an output layout (every split,
or the one named), ``ROOT/splits/NAME``, a run folder, a Parquet shard, a directory of shards,
a glob, a list of those (split and dataset are then NULL); local or ``s3://``. Only the footers
are read here (pack size, bins, tokens), never a row group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from packlab.errors import FormatError
from packlab.formats import formats_where, get_format
from packlab.sources import open_shard, resolve_source

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
    reader_class = get_format(shard.format).Reader
    if not reader_class.SQL_READABLE:
        raise FormatError(f"{shard.path}: a {shard.format} shard; SQL reads Parquet shards "
                          f"(convert first: packlab convert SRC DST --format "
                          f"{formats_where('SQL_READABLE')[0]})")
    with open_shard(shard.path, format=shard.format) as reader:
        return Shard(shard.split, shard.dataset, shard.name, str(shard.path),
                     int(reader.pack_size), int(reader.num_bins), int(reader.num_tokens))
