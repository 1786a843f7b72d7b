"""Which Parquet shards a query reads, and what each one is (split, dataset, shard name).

``data`` is an output layout (``splits/`` or ``blend.json``: every split, or the one named),
a Parquet shard, a directory of shards, a glob, or a list of those (split and dataset are then
NULL). Only the footers are read here (pack size, bins, tokens), never a row group.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packlab.discovery import find_shards
from packlab.errors import FormatError
from packlab.formats import detect_format, formats_where, get_format
from packlab.layout.blend import (
    LINK_SEPARATOR,
    is_layout,
    layout_shards,
    read_blend,
    split_source,
)

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
    """The Parquet shards under ``data``, in the order :func:`packlab.open_dataset` reads them."""
    if not isinstance(data, list | tuple) and is_layout(data):
        return _layout_sources(Path(data), split)
    if split is not None:
        split_source(data if not isinstance(data, list | tuple) else data[0], split)  # raises
    found = find_shards(data)
    return [_shard(None, None, p.name, p, name) for p, name in found]


def _layout_sources(root: Path, split: str | None) -> list[Shard]:
    if split is not None:
        split_source(root, split)  # an unknown or empty split is a clear error
    blend = read_blend(root) or {}
    inputs = [i.get("name") for i in blend.get("inputs", [])]
    only = inputs[0] if len(inputs) == 1 else None
    out: list[Shard] = []
    for name, entries in layout_shards(root).items():
        if split is not None and name != split:
            continue
        for link, path in entries:
            dataset = link.split(LINK_SEPARATOR, 1)[0] if LINK_SEPARATOR in link else only
            out.append(_shard(name, dataset, link, path, None))
    if not out:
        raise FormatError(f"{root}: the layout holds no shards")
    return out


def _shard(split: str | None, dataset: str | None, name: str, path: Path, fmt: str | None
           ) -> Shard:
    fmt = fmt or detect_format(path)
    reader_class = get_format(fmt).Reader
    if not reader_class.SQL_READABLE:
        raise FormatError(f"{path}: a {fmt} shard; SQL reads Parquet shards (convert first: "
                          f"packlab convert SRC DST --format {formats_where('SQL_READABLE')[0]})")
    reader = reader_class(path)
    try:
        return Shard(split, dataset, name, str(path), int(reader.pack_size),
                     int(reader.num_bins), int(reader.num_tokens))
    finally:
        reader.close()
