"""What a URI names on object storage: shards (each with its format), or a layout's split.

A URI may name one shard (an object, or a prefix holding a directory shard's manifest), a
prefix of shards (hidden names, ``*.json``/``*.txt``, ``splits/``, ``runs/`` skipped, as
locally), or a layout root with ``blend.json`` (then a split is required: object storage has
no ``splits/`` symlinks, the split's shard list is the blend's).

Formats are known without downloading, from the format contract
(:class:`~packlab.formats.base.FormatFacts`): a one-file shard by its ``SUFFIX``, a directory
shard by its manifest's ``format`` (``MANIFEST_FORMAT``).
"""

from __future__ import annotations

from typing import Any

from packlab.cloud.storage import Location, resolve
from packlab.cloud.transfer import MANIFEST, parse_manifest, remote_manifest
from packlab.discovery import expect_format, is_ignored_name
from packlab.errors import FormatError, PacklabError
from packlab.formats import directory_shard_files, manifest_formats, suffix_formats
from packlab.layout.blend import BLEND_FILE, blend_format, parse_blend
from packlab.spool import FILES as SPOOL_FILES
from packlab.spool import SPOOL_VERSION


def object_format(location: Location) -> str | None:
    """The format of a one-file shard, from its name."""
    return suffix_formats().get(location.suffix)


def directory_format(location: Location, manifest: dict[str, Any]) -> str:
    """The format a directory shard's manifest names."""
    kind = manifest.get("format")
    known = manifest_formats()
    if kind in known:
        return known[kind]
    if manifest.get("version") == SPOOL_VERSION:
        raise FormatError(f"{location}: a spool ({SPOOL_VERSION}), not packed shards: pack it first")
    raise FormatError(f"{location / MANIFEST}: names format {kind!r}, not a packed shard")


def find_shards(uri: str | Location, *, filesystem: Any = None, format: str | None = None
                ) -> list[tuple[Location, str]]:
    """The shards ``uri`` names (see the module docstring), each with its format, in order."""
    location = resolve(uri, filesystem)
    if location.is_file():
        name = format or object_format(location)
        if name is None:
            raise FormatError(f"{location}: not a shard of any known format "
                              f"(suffixes: {', '.join(suffix_formats())})")
        return [(location, expect_format(location, name, format))]
    found = remote_manifest(location)
    if found is not None:
        return [(location, expect_format(location, directory_format(location, found[1]), format))]
    if (location / BLEND_FILE).is_file():
        raise PacklabError(f"{location}: an output layout: pass split= (see its blend.json)")
    children = [c for c in location.iterdir() if not is_ignored_name(c.name)]
    parts = sorted({c.name for c in children}
                   & (directory_shard_files() | set(SPOOL_FILES.values())))
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
        return [(child, expect_format(child, name, format))]
    manifest = child / MANIFEST
    if manifest.is_file():
        parsed = parse_manifest(manifest.read_bytes(), str(manifest))
        return [(child, expect_format(child, directory_format(child, parsed), format))]
    if child.is_dir():
        raise FormatError(f"{child}: no {MANIFEST} (an unfinished upload, or not a shard)")
    raise FormatError(f"{child}: not a shard of any known format (under a shard prefix)")


def read_remote_blend(root: Location) -> dict[str, Any] | None:
    """``root/blend.json`` on the store, checked; None when absent."""
    target = root / BLEND_FILE
    if not target.is_file():
        return None
    return parse_blend(target.read_bytes(), target)


def split_shards(root: Location, split: str, *, format: str | None = None
                 ) -> list[tuple[Location, str]]:
    """The shards of ``split`` as the remote ``blend.json`` lists them, with their format."""
    blend = read_remote_blend(root)
    if blend is None:
        raise FormatError(f"{root}: no {BLEND_FILE}, so split {split!r} cannot be resolved "
                          "(object storage has no splits/ links)")
    if split not in blend["splits"]:
        raise FormatError(f"{root}: no split {split!r}; splits here: "
                          f"{', '.join(blend['splits']) or 'none'}")
    paths = blend["splits"][split].get("shards", [])
    if not paths:
        raise FormatError(f"{root / BLEND_FILE}: split {split!r} is empty (no sequence fell "
                          "into it)")
    kind = blend_format(blend)
    if format is not None and kind is not None and format != kind:
        raise FormatError(f"{root}: a {kind} layout, not {format}")
    shards = [root / p for p in paths]
    if kind is None:
        return [s for loc in shards for s in find_shards(loc)]
    return [(loc, kind) for loc in shards]
