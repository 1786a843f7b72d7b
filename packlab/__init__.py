"""packlab: a laboratory for packed SFT data.

The entry points are :func:`open_dataset`, :func:`open_shard` and :func:`open_writer` (local
paths and URIs alike, from :mod:`packlab.sources`); everything else lives in small modules,
layered as ARCHITECTURE.md draws them. They are loaded on first use, so ``import packlab``
(and any module below the facade) stays cheap.
"""

from __future__ import annotations

from typing import Any

from packlab.version import __version__

__all__ = ["__version__", "detect_format", "open_dataset", "open_shard", "open_writer"]


def __getattr__(name: str) -> Any:
    if name in ("detect_format", "open_dataset", "open_shard", "open_writer"):
        from packlab import sources

        return getattr(sources, name)
    raise AttributeError(f"module 'packlab' has no attribute {name!r}")
