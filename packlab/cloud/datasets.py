"""Reading shards that live on object storage: open one, or one dataset over many.

:func:`packlab.open_dataset` returns a :class:`RemoteDataset` for URIs, the same map-style, picklable
:class:`~packlab.loading.dataset.PackedDataset` as for local shards. Per shard, by the format contract
(:class:`~packlab.formats.shared.base.FormatFacts`):

- a format whose reader ``READS_IN_PLACE`` (Parquet; ``binidx`` and ``megatron_sft``, whose
  index is fetched once into the cache) is read where it is, with ranged requests;
- every other format is downloaded once into the local cache, verified (record checksums,
  or the format's own checks), then opened with its usual reader (:mod:`.transfer`); a format
  that ``NEEDS_SPOOL`` brings its spool down too, from where the shard says it is.

:func:`packlab.open_dataset` sends URIs here; use that.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.cloud.transfer import download_prefix, download_shard, remote_record
from packlab.errors import FormatError
from packlab.formats import detect_format, get_format, suffix_formats
from packlab.formats.read.table import TableReads
from packlab.loading.dataset import PackedDataset
from packlab.loading.discovery import ShardRef
from packlab.storage.location import Location, is_remote, resolve


def remote_shard(uri: str | Location, format: str | None = None, *, filesystem: Any = None,
                 cache_dir: str | os.PathLike[str] | None = None, direct: bool = True,
                 **options: Any) -> Any:
    """A reader for the remote shard at ``uri``: in place when its format ``READS_IN_PLACE``
    (unless ``direct=False``), else from the verified local cache."""
    location = resolve(uri, filesystem)
    # on object storage a one-file shard is known by its name (no request); else its bytes
    name = format or _by_name(location) or detect_format(location)
    reader = get_format(name).Reader
    if reader.READS_IN_PLACE and direct:
        if issubclass(reader, TableReads):  # its index fetched once, into the cache
            options.setdefault("cache_dir", cache_dir)
        return reader(location, **options)
    local = download_shard(location, cache_dir=cache_dir, format=name)
    if reader.NEEDS_SPOOL and "spool" not in options:
        options["spool"] = fetch_spool(location, local, reader, cache_dir=cache_dir)
    return reader(local, **options)


def _by_name(location: Location) -> str | None:
    """The one-file format whose suffix ``location``'s name ends with (no request)."""
    return next((name for suffix, name in suffix_formats().items()
                 if location.name.endswith(suffix)), None)


def fetch_spool(location: Location, local_shard: Path, reader: Any, *,
                cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The spool of a remote shard that ``NEEDS_SPOOL``: where its recorded relative path
    points on the store, downloaded and checked against its own record (the reader then
    checks it against what the shard recorded)."""
    relative = reader.spool_reference(local_shard)["relative"]
    spool = location / relative
    if spool.path.split("/")[0] != location.path.split("/")[0]:
        raise FormatError(f"{location}: its spool path {relative!r} leaves the bucket")
    if remote_record(spool) is None and (spool.parent / f"{spool.name}.idx").is_file():
        return download_prefix(spool, cache_dir=cache_dir)  # a Megatron prefix
    if remote_record(spool) is None:
        raise FormatError(f"{location}: its spool is not at {spool} (upload the spool beside "
                          "the shard, at the relative path the shard records)")
    return download_shard(spool, cache_dir=cache_dir)


class RemoteDataset(PackedDataset):
    """:class:`~packlab.loading.dataset.PackedDataset` over remote shards (picklable; each process
    opens its own readers; downloaded shards are fetched once, by the first process)."""

    def __init__(self, shards: Sequence[tuple[Location, str]], *,
                 cache_dir: str | os.PathLike[str] | None = None,
                 reader_options: dict[str, Any] | None = None) -> None:
        self.locations = [loc for loc, _ in shards]
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        # where a dataset record placed a shard (ShardRef.bins), PackedDataset checks it
        super().__init__([ShardRef(s[0].uri, s[1], getattr(s, "bins", None)) for s in shards],
                         reader_options=reader_options)
        self.shards = list(self.locations)  # type: ignore[arg-type]  # URIs, not mangled Paths

    def open_reader(self, shard: int) -> Any:
        return remote_shard(self.locations[shard], format=self.formats[shard],
                            cache_dir=self.cache_dir, **self.reader_options)


def is_remote_source(path: Any) -> bool:
    """Whether ``path`` (or any item of a list) names object storage."""
    if isinstance(path, list | tuple):
        return any(is_remote(p) for p in path)
    return is_remote(path)
