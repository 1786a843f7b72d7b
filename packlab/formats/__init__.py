"""The shard formats: one module each, a writer and a reader, registered here.

Each module under ``packlab/formats/`` defines ``FORMAT`` (its name), ``Writer`` (a
:class:`~packlab.formats.base.ShardWriter`), ``Reader`` (a
:class:`~packlab.formats.base.ShardReader`), ``SUFFIX`` (what a shard's name ends with: a
file extension, or ``""`` for a directory shard) and ``detect(path) -> bool``.

Registering a format is one line in ``_MODULES``. Modules are imported on first use, so
``import packlab`` stays cheap.
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any

from packlab.errors import FormatError, PacklabError

# Detection order matters: the most specific formats first.
_MODULES: dict[str, str] = {
    "memmap_v1": "packlab.formats.memmap_v1",
    "binidx": "packlab.formats.binidx",
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
        raise PacklabError(f"unknown format {name!r}; choose from {format_names()}") from None
    except ModuleNotFoundError as exc:
        if exc.name == _MODULES[name] and not required:
            return None
        raise


def get_format(name: str) -> ModuleType:
    """The module of format ``name`` (``FORMAT``, ``Writer``, ``Reader``, ``SUFFIX``, ``detect``)."""
    module = _load(name)
    assert module is not None
    return module


def is_remote_path(path: Any) -> bool:
    """A URI other than file:// (or a packlab.storage.Location): handled by packlab.cloud."""
    if getattr(path, "is_remote", False):
        return True
    return isinstance(path, str) and "://" in path and not path.startswith("file://")


def detect_format(path: str | os.PathLike[str]) -> str:
    """The name of the format of the shard at ``path``; a clear error if none claims it."""
    if is_remote_path(path):
        from packlab.cloud import find_shards

        return find_shards(path)[0][1]
    p = Path(path)
    if not p.exists():
        raise FormatError(f"{p}: no such file or directory")
    for name in format_names():
        if get_format(name).detect(p):
            return name
    raise FormatError(f"{p}: not a shard of any known format ({', '.join(format_names())})")


def open_shard(path: str | os.PathLike[str], format: str | None = None, **options: Any) -> Any:
    """A reader for the shard at ``path`` (format detected unless given); a URI
    (``s3://...``) goes through :func:`packlab.cloud.open_shard`."""
    if is_remote_path(path):
        from packlab.cloud import open_shard as open_remote_shard

        return open_remote_shard(path, format, **options)
    name = format or detect_format(path)
    return get_format(name).Reader(path, **options)


def open_writer(format: str, path: str | os.PathLike[str], **options: Any) -> Any:
    """A writer of format ``format`` at ``path`` (keyword options as the format takes them);
    a URI (``s3://...``) goes through :func:`packlab.cloud.open_writer`."""
    if is_remote_path(path):
        from packlab.cloud import open_writer as open_remote_writer

        return open_remote_writer(format, path, **options)
    return get_format(format).Writer(path, **options)
