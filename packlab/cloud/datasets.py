"""Reading shards that live on object storage: find them, open them, one dataset over them.

``open_dataset("s3://bucket/out", split="train")`` returns a :class:`RemoteDataset`, the same
map-style, picklable :class:`~packlab.dataset.PackedDataset` as for local shards. Per shard:

- ``parquet``: read in place with ranged requests (:class:`packlab.cloud.parquet.Reader`);
- every other format: downloaded once into the local cache, verified (manifest checksums, or
  the format's own checks), then opened with its usual reader (:mod:`packlab.cloud.transfer`).

What a URI may name: one shard (an object, or a prefix holding a directory shard's
``manifest.json``), a prefix of shards (hidden names, ``*.json``/``*.txt``, ``splits/``,
``runs/`` skipped, as locally), or a layout root with ``blend.json`` (then ``split=`` is
required: object storage has no ``splits/`` symlinks, the split's shard list is the blend's).

Formats are known without downloading: a file by its suffix (``.parquet``, ``.arrow``,
``.pbin``, ``.npy``), a directory shard by its manifest's ``format``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.cloud.transfer import MANIFEST, download_shard, parse_manifest, remote_manifest
from packlab.dataset import IGNORED_NAMES, IGNORED_SUFFIXES, PackedDataset
from packlab.errors import FormatError, PacklabError
from packlab.formats import format_names, get_format
from packlab.storage import Location, is_remote, resolve

# what a directory shard's manifest says -> the format name
MANIFEST_FORMATS = {"memmap_padded_v1": "memmap_v1", "binidx": "binidx",
                    "packed_index": "packed_index"}


def suffix_formats() -> dict[str, str]:
    """File suffix -> format, for the one-file formats."""
    return {get_format(n).SUFFIX: n for n in format_names() if get_format(n).SUFFIX}


def directory_format(location: Location, manifest: dict[str, Any]) -> str:
    kind = manifest.get("format")
    if kind in MANIFEST_FORMATS:
        return MANIFEST_FORMATS[kind]
    if manifest.get("version") == "spool_v1":
        raise FormatError(f"{location}: a spool (spool_v1), not packed shards: pack it first")
    raise FormatError(f"{location / MANIFEST}: names format {kind!r}, not a packed shard")


def directory_shard_files() -> set[str]:
    """Names of the files inside directory shards and spools (never shards themselves)."""
    from packlab import spool
    from packlab.formats import binidx, memmap_v1, packed_index

    return {*memmap_v1.FILES.values(), binidx.DATA, binidx.INDEX, binidx.LOSS, binidx.SEQS,
            packed_index.OFFSETS, packed_index.INDICES, *spool.FILES.values()}


def object_format(location: Location) -> str | None:
    return suffix_formats().get(location.suffix)


def _ignored(name: str) -> bool:
    return name.startswith(".") or name in IGNORED_NAMES or name.endswith(IGNORED_SUFFIXES)


def find_shards(uri: str | Location, *, filesystem: Any = None, format: str | None = None
                ) -> list[tuple[Location, str]]:
    """The shards ``uri`` names (see the module docstring), each with its format, in order."""
    location = resolve(uri, filesystem)
    if location.is_file():
        name = format or object_format(location)
        if name is None:
            raise FormatError(f"{location}: not a shard of any known format "
                              f"(suffixes: {', '.join(suffix_formats())})")
        return [(location, _expect(location, name, format))]
    found = remote_manifest(location)
    if found is not None:
        return [(location, _expect(location, directory_format(location, found[1]), format))]
    if (location / "blend.json").is_file():
        raise PacklabError(f"{location}: an output layout: pass split= (see its blend.json)")
    children = [c for c in location.iterdir() if not _ignored(c.name)]
    parts = sorted({c.name for c in children} & directory_shard_files())
    if parts:
        raise FormatError(f"{location}: holds {', '.join(parts)} but no {MANIFEST}: a directory "
                          "shard whose upload did not finish (or not a shard); refused")
    shards: list[tuple[Location, str]] = []
    for child in children:
        shards.extend(_child_shard(child, format))
    if not shards:
        if not location.exists():
            raise FormatError(f"{location}: no such file or directory")
        raise FormatError(f"{location}: no shards under this prefix")
    return shards


def _child_shard(child: Location, format: str | None) -> list[tuple[Location, str]]:
    name = object_format(child)
    if name is not None:
        return [(child, _expect(child, name, format))]
    manifest = child / MANIFEST
    if manifest.is_file():
        parsed = parse_manifest(manifest.read_bytes(), str(manifest))
        return [(child, _expect(child, directory_format(child, parsed), format))]
    if child.is_dir():
        raise FormatError(f"{child}: no {MANIFEST} (an unfinished upload, or not a shard)")
    raise FormatError(f"{child}: not a shard of any known format (under a shard prefix)")


def _expect(location: Location, detected: str, wanted: str | None) -> str:
    if wanted is not None and wanted != detected:
        get_format(wanted)
        raise FormatError(f"{location}: a {detected} shard, not {wanted}")
    return detected


def open_shard(uri: str | Location, format: str | None = None, *, filesystem: Any = None,
               cache_dir: str | os.PathLike[str] | None = None, direct: bool = True,
               **options: Any) -> Any:
    """A reader for the remote shard at ``uri``: Parquet in place (unless ``direct=False``),
    anything else from the verified local cache."""
    location = resolve(uri, filesystem)
    name = format or find_shards(location)[0][1]
    if name == "parquet" and direct:
        from packlab.cloud.parquet import Reader

        return Reader(location, **options)
    local = download_shard(location, cache_dir=cache_dir, format=name)
    if name == "packed_index" and "spool" not in options:
        options["spool"] = fetch_spool(location, local, cache_dir=cache_dir)
    return get_format(name).Reader(local, **options)


def fetch_spool(location: Location, local_shard: Path, *,
                cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The spool of a remote ``packed_index`` shard: where its relative path points on the
    store, downloaded and checked against its own manifest (the reader then checks it against
    what the shard recorded)."""
    from packlab.formats.packed_index import read_manifest

    relative = read_manifest(local_shard)["spool"]["relative"]
    spool = location / relative
    if spool.path.split("/")[0] != location.path.split("/")[0]:
        raise FormatError(f"{location}: its spool path {relative!r} leaves the bucket")
    if remote_manifest(spool) is None:
        raise FormatError(f"{location}: its spool is not at {spool} (upload the spool beside "
                          "the shard, at the relative path the shard records)")
    return download_shard(spool, cache_dir=cache_dir)


class RemoteDataset(PackedDataset):
    """:class:`~packlab.dataset.PackedDataset` over remote shards (picklable; each process
    opens its own readers; downloaded shards are fetched once, by the first process)."""

    def __init__(self, shards: Sequence[tuple[Location, str]], *,
                 cache_dir: str | os.PathLike[str] | None = None,
                 reader_options: dict[str, Any] | None = None) -> None:
        self.locations = [loc for loc, _ in shards]
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        super().__init__([(loc.uri, name) for loc, name in shards], reader_options=reader_options)
        self.shards = list(self.locations)  # type: ignore[arg-type]  # URIs, not mangled Paths

    def _open_readers(self) -> list[Any]:
        if self._readers is None or self._pid != os.getpid():
            self._readers = [
                open_shard(loc, format=name, cache_dir=self.cache_dir, **self.reader_options)
                for loc, name in zip(self.locations, self.formats, strict=True)
            ]
            self._pid = os.getpid()
        return self._readers


def open_dataset(uri: str | Location | Sequence[str | Location], *, split: str | None = None,
                 format: str | None = None, filesystem: Any = None,
                 cache_dir: str | os.PathLike[str] | None = None,
                 **reader_options: Any) -> RemoteDataset:
    """Remote shards as one dataset; ``split`` resolves through the layout's ``blend.json``."""
    from packlab.cloud.layout import split_shards

    if isinstance(uri, list | tuple):
        if split is not None:
            raise PacklabError("split= needs one output prefix, not a list")
        shards = [s for u in uri for s in find_shards(u, filesystem=filesystem, format=format)]
    elif split is not None:
        shards = split_shards(resolve(uri, filesystem), split, format=format)
    else:
        shards = find_shards(uri, filesystem=filesystem, format=format)
    return RemoteDataset(shards, cache_dir=cache_dir, reader_options=reader_options)


def is_remote_source(path: Any) -> bool:
    """Whether ``path`` (or any item of a list) names object storage."""
    if isinstance(path, list | tuple):
        return any(is_remote(p) for p in path)
    return is_remote(path)
