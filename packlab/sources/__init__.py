"""What a path names, local or remote, and the entry points that open it.

``packlab.open_dataset``, ``packlab.open_shard`` and ``packlab.open_writer`` live here, above
every layer they dispatch to. Every path goes through one resolver
(:func:`~packlab.sources.resolve.resolve_source`): a shard, a directory of shards, a glob, a
list, an output layout (with a split), ``ROOT/splits/<split>``, a run folder, a Nemotron output
directory, each local or as a URI (``s3://bucket/out``, or a ``Location``). Every ``packlab``
command that reads a dataset resolves it the same way.

- :mod:`.resolve`: what a dataset path names;
- :mod:`.outputs`: where a command writes (a local path, or a URI: staged locally and uploaded),
  and what ``--overwrite`` may replace;
- :mod:`.validate`: ``packlab validate`` over any resolved dataset, local or remote;
- :mod:`.describe`: ``packlab inspect``'s summary of any resolved dataset.
- :mod:`.bridge_provider`: a Megatron-Bridge recipe's dataset provider over any of them
  (imports Megatron-Bridge; nothing else here imports it).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.cloud import is_remote_source, remote_shard, remote_writer
from packlab.cloud.datasets import RemoteDataset
from packlab.errors import PacklabError
from packlab.formats import detect_format as shard_format
from packlab.formats import get_format
from packlab.loading.dataset import PackedDataset
from packlab.loading.discovery import PathLike
from packlab.sources.resolve import Shard, Source, resolve_source

__all__ = ["Shard", "Source", "detect_format", "local_shards", "open_dataset", "open_shard",
           "open_writer", "resolve_source"]


def local_shards(path: PathLike | Sequence[PathLike], *, split: str | None = None,
                 format: str | None = None) -> list[tuple[Path, str]]:
    """The local shards ``path`` names, each with its format (see :mod:`.resolve`)."""
    source = resolve_source(path, split=split, format=format).only_split()
    if source.remote:
        raise PacklabError(f"{source.given}: on object storage, not local")
    return source.refs


def open_dataset(
    path: PathLike | Sequence[PathLike] | Any,
    *,
    split: str | None = None,
    format: str | None = None,
    **reader_options: Any,
) -> PackedDataset:
    """Open packed shards as one map-style dataset.

    ``path``: anything :mod:`packlab.sources.resolve` names (a shard, a directory of shards, a
    glob, a list, an output layout, a run folder; local or a URI such as ``s3://bucket/out``).
    ``split`` picks one split of an output layout or a run folder (required when it has
    several). ``format`` skips detection. ``reader_options`` go to each reader; for URIs also
    ``filesystem=`` and ``cache_dir=`` (where downloaded shards are kept, verified).

    An output still being written (or interrupted) is refused until the job that writes it
    finishes; a shard missing, added, swapped or resized since is refused, naming it.
    """
    filesystem = reader_options.pop("filesystem", None)
    cache_dir = reader_options.pop("cache_dir", None)
    source = resolve_source(path, split=split, format=format, filesystem=filesystem)
    source.only_split()
    if source.remote:
        if not all(s.remote for s in source.shards):
            raise PacklabError(f"{source.given}: local paths and URIs in one dataset; open "
                               "them apart")
        return RemoteDataset(source.refs, cache_dir=cache_dir, reader_options=reader_options)
    return PackedDataset(source.refs, reader_options=reader_options)


def open_shard(path: str | os.PathLike[str] | Any, format: str | None = None,
               **options: Any) -> Any:
    """A reader for one shard, local or remote (format detected unless given)."""
    if is_remote_source(path) or "filesystem" in options:
        return remote_shard(path, format, **options)
    return get_format(format or shard_format(path)).Reader(path, **options)


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
    """The format of the shard (or of every shard of the dataset) at ``path``, local or
    remote; formats joined by ``+`` when a dataset mixes them."""
    return "+".join(resolve_source(path).formats)
