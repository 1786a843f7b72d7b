"""What a benchmark reads through: a dataset or one shard's reader, and how it is prepared.

``via="dataset"`` reads ``open_dataset(path)[i]`` (the items training gets, ``__getitems__``
for a batch, ``iter(dataset)`` for a scan); ``via="reader"`` reads the format alone
(``read_bin``, ``read_bins``, ``iter_bins``). Both are a *source* here, and the helpers below
treat them alike: which files a read can touch (:func:`data_files`), the source's blocks (row
groups), a warm-up pass (:func:`warm`) and making the source forget a bin before a cold read
(:func:`forget`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from packlab.lab.measure.delivery import Sink
from packlab.lab.measure.jobs import open_items, resolve_via
from packlab.lab.measure.pagecache import read_all, shard_files
from packlab.loading.dataset import PackedDataset
from packlab.loading.samplers import dataset_blocks, fixed_blocks, reader_blocks

CACHES = ("warm", "cold")


def open_source(path: str | os.PathLike[str], via: str = "dataset",
                reader_options: Mapping[str, Any] | None = None) -> Any:
    """A dataset (``via="dataset"``) or a shard reader (``"reader"``; ``"auto"``: the dataset)."""
    return open_items(path, resolve_via(via), **dict(reader_options or {}))


def is_dataset(source: Any) -> bool:
    return isinstance(source, PackedDataset)


def reads(source: Any) -> tuple[Callable[[int], Any], Callable[[list[int]], list[Any]]]:
    """``(one, many)``: how the source reads one bin and a batch (items of a dataset, bins of
    a reader)."""
    if is_dataset(source):
        return source.__getitem__, source.__getitems__
    return source.read_bin, source.read_bins


def stream(source: Any) -> Iterator[Any]:
    """Every bin in order, through the source's streaming path."""
    return iter(source) if is_dataset(source) else source.iter_bins()


def format_of(source: Any) -> str:
    """The source's format name(s), ``+``-joined when a dataset mixes them."""
    return "+".join(sorted(set(source.formats))) if is_dataset(source) else source.FORMAT


def readers_of(source: Any) -> list[Any]:
    return source.readers() if is_dataset(source) else [source]


def data_files(source: Any) -> list[Path]:
    """Every file a read of ``source`` can touch: its shards' files, and the spool a shard
    that stores no tokens gathers its bins from (else a "cold" read would find it warm)."""
    files: list[Path] = []
    for reader in readers_of(source):
        files.extend(shard_files(reader.path))
        spool = getattr(reader, "spool_path", None)
        if spool is not None:
            files.extend(shard_files(spool))
    return sorted(set(files))


def source_blocks(source: Any, *, default_block_size: int = 1024) -> np.ndarray:
    """Block boundaries (row groups, else blocks of ``default_block_size`` bins) of a source."""
    if is_dataset(source):
        return dataset_blocks(source, default_block_size=default_block_size)
    own = reader_blocks(source)
    return own if own is not None else fixed_blocks(source.num_bins, default_block_size)


def warm(source: Any, files: Sequence[Path], sink: Sink) -> None:
    """A full pass in order, every bin delivered (maps opened and their pages touched, caches
    filled), then every file read once."""
    one, _ = reads(source)
    for i in range(len(source)):
        sink.take(one(i))
    for f in files:
        read_all(f)


def forget(source: Any, blocks: np.ndarray, index: int, sink: Sink) -> None:
    """Make the source hold nothing of bin ``index``: close it (decoded row groups and maps
    go), then reopen it by reading a bin of another block (row group; ``blocks`` of one bin
    where a format has none) half the shard away, so the timed read pays the data, not the
    opening, and no readahead around that bin still in flight can bring in this one. With a
    single block (a Parquet file of one row group) the timed read also reopens the source."""
    source.close()
    count = blocks.shape[0] - 1
    if count > 1:
        block = int(np.searchsorted(blocks, index, side="right")) - 1
        sink.take(reads(source)[0](int(blocks[(block + count // 2) % count])))
