"""packlab: a laboratory for packed SFT data.

The reading entry point is :func:`open_dataset`; everything else lives in small modules
(``spool``, ``packing``, ``materialize``, ``formats``, ``dataset``, ``measure``, ``query``).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "open_dataset"]


def open_dataset(*args: Any, **kwargs: Any) -> Any:
    """Open packed shards (a shard, directory, glob, list or layout) as a map-style dataset."""
    from packlab.dataset import open_dataset as _open_dataset

    return _open_dataset(*args, **kwargs)
