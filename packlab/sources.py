"""What a path names, local or remote, and the entry points that open it.

``packlab.open_dataset``, ``packlab.open_shard`` and ``packlab.open_writer`` live here, above
every layer they dispatch to: a local shard, directory, glob or list goes to
:mod:`packlab.discovery` and :class:`~packlab.dataset.PackedDataset`; an output layout's split
to :mod:`packlab.layout`; a URI (``s3://bucket/out``, or a ``Location``) to
:mod:`packlab.cloud`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.cloud import is_remote_source, remote_dataset, remote_shard, remote_writer
from packlab.cloud.discovery import find_shards as find_remote_shards
from packlab.dataset import PackedDataset
from packlab.discovery import NoShardsError, PathLike, find_shards
from packlab.errors import FormatError, PacklabError
from packlab.formats import detect_format as detect_local_format
from packlab.formats import get_format
from packlab.layout.blend import is_layout, known_splits, split_source


def local_shards(path: PathLike | Sequence[PathLike], *, split: str | None = None,
                 format: str | None = None) -> list[tuple[Path, str]]:
    """The local shards ``path`` names, each with its format: a shard, a directory of shards,
    a glob, a list of those, or (with ``split``) one split of an output layout."""
    if split is not None:
        if isinstance(path, list | tuple):
            raise PacklabError("split= needs one output directory, not a list of paths")
        path = split_source(path, split)
    try:
        return find_shards(path, format=format)
    except NoShardsError:
        if not isinstance(path, list | tuple) and is_layout(path):
            raise FormatError(f"{path}: an output layout: open one split (split=...; splits "
                              f"here: {', '.join(known_splits(path)) or 'none'})") from None
        raise


def open_dataset(
    path: PathLike | Sequence[PathLike] | Any,
    *,
    split: str | None = None,
    format: str | None = None,
    **reader_options: Any,
) -> PackedDataset:
    """Open packed shards as one map-style dataset.

    ``path``: a shard, a directory of shards, a glob, a list of those, or a URI
    (``s3://bucket/out``). ``split`` picks ``PATH/splits/<split>/`` of an output layout (or the
    split's shards in ``PATH/blend.json``: always so on object storage). ``format`` skips
    detection. ``reader_options`` go to each reader; for URIs also ``filesystem=`` and
    ``cache_dir=`` (where downloaded shards are kept, verified).
    """
    if is_remote_source(path):
        return remote_dataset(path, split=split, format=format, **reader_options)
    return PackedDataset(local_shards(path, split=split, format=format),
                         reader_options=reader_options)


def open_shard(path: str | os.PathLike[str] | Any, format: str | None = None,
               **options: Any) -> Any:
    """A reader for one shard, local or remote (format detected unless given)."""
    if is_remote_source(path) or "filesystem" in options:
        return remote_shard(path, format, **options)
    return get_format(format or detect_local_format(path)).Reader(path, **options)


def open_writer(format: str, path: str | os.PathLike[str] | Any, **options: Any) -> Any:
    """A writer of ``format`` at ``path``: a local path, or a URI (streamed there directly when
    the format ``STREAMS``, else written locally and uploaded; ``direct=``, ``filesystem=``,
    ``staging_dir=`` apply to URIs)."""
    if is_remote_source(path) or options.get("filesystem") is not None:
        return remote_writer(format, path, **options)
    if options.pop("direct", None):
        raise PacklabError(f"{path}: direct= applies to object storage only")
    options.pop("filesystem", None)
    return get_format(format).Writer(path, **options)


def detect_format(path: str | os.PathLike[str] | Any) -> str:
    """The format of the shard at ``path``, local or remote."""
    if is_remote_source(path):
        return find_remote_shards(path)[0][1]
    return detect_local_format(path)
