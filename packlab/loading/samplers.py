"""Samplers: which bin each training step reads, seeded and epoch-aware, torch-compatible.

Both are plain iterables of ``int`` with ``__len__`` and ``set_epoch`` (what
``torch.utils.data.DataLoader(sampler=...)`` needs); torch is not required.

- :class:`ShuffleSampler`: a uniform permutation per epoch. Ideal for formats with cheap random
  access (memmap, binidx, Arrow IPC).
- :class:`BlockShuffleSampler`: shuffles *blocks* of consecutive bins (for Parquet: row
  groups), then shuffles bins within a window of a few blocks. Any ``window`` consecutive
  blocks' worth of steps touch at most ``window`` blocks, so a reader that caches a few decoded
  row groups decodes each one about once per epoch instead of once per bin.

:func:`recommended_sampler` picks between them for a dataset, from its readers: a block
shuffle over the shards' own blocks where a reader has them (its reads decode a whole block:
Parquet's row groups), a uniform shuffle where any bin costs what any other does.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from packlab.errors import PacklabError


def _epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(epoch)])


class ShuffleSampler:
    """Every index once per epoch, in a permutation fixed by ``(seed, epoch)``."""

    def __init__(self, num_items: int | Sequence[object], *, seed: int = 0, shuffle: bool = True
                 ) -> None:
        self.num_items = num_items if isinstance(num_items, int) else len(num_items)
        if self.num_items < 0:
            raise PacklabError(f"num_items must be >= 0, got {self.num_items}")
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_items, dtype=np.int64)
        return _epoch_rng(self.seed, self.epoch).permutation(self.num_items)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_items


def fixed_blocks(num_items: int, block_size: int) -> np.ndarray:
    """Block boundaries ``[0, b, 2b, ..., num_items]`` for blocks of ``block_size`` items."""
    if block_size <= 0:
        raise PacklabError(f"block_size must be positive, got {block_size}")
    bounds = np.arange(0, num_items, block_size, dtype=np.int64)
    return np.append(bounds, np.int64(num_items))


class BlockShuffleSampler:
    """Shuffle blocks of consecutive items, then items within windows of ``window`` blocks.

    ``boundaries`` (``int[num_blocks + 1]``, from 0 to ``num_items``) gives the blocks, or
    ``block_size`` equal ones; with neither, a :class:`~packlab.loading.dataset.PackedDataset` gives
    its own (:func:`dataset_blocks`: its shards' row groups, others cut into blocks of 1024).
    """

    def __init__(
        self,
        num_items: int | Sequence[object],
        *,
        block_size: int | None = None,
        boundaries: Sequence[int] | np.ndarray | None = None,
        window: int = 4,
        seed: int = 0,
    ) -> None:
        n = num_items if isinstance(num_items, int) else len(num_items)
        if block_size is not None and boundaries is not None:
            raise PacklabError("give one of block_size= or boundaries=, not both")
        if block_size is None and boundaries is None:
            if isinstance(num_items, int):
                raise PacklabError("a count of items has no blocks of its own: give "
                                   "block_size= or boundaries= (a dataset gives its own)")
            boundaries = dataset_blocks(num_items)
        if boundaries is None:
            assert block_size is not None
            bounds = fixed_blocks(n, block_size)
        else:
            bounds = np.asarray(boundaries, dtype=np.int64)
            if bounds.ndim != 1 or bounds.size < 1 or bounds[0] != 0 or bounds[-1] != n:
                raise PacklabError(f"block boundaries must run from 0 to {n}")
            if (np.diff(bounds) <= 0).any():
                raise PacklabError("block boundaries must be strictly increasing")
        if window <= 0:
            raise PacklabError(f"window must be positive, got {window}")
        self.num_items = n
        self.boundaries = bounds
        self.window = int(window)
        self.seed = seed
        self.epoch = 0

    @property
    def num_blocks(self) -> int:
        return int(self.boundaries.shape[0] - 1)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def block_order(self) -> np.ndarray:
        """The shuffled order of blocks this epoch."""
        return _epoch_rng(self.seed, self.epoch).permutation(self.num_blocks)

    def indices(self) -> np.ndarray:
        rng = _epoch_rng(self.seed, self.epoch)
        order = rng.permutation(self.num_blocks)
        starts = self.boundaries[:-1][order]
        sizes = np.diff(self.boundaries)[order]
        # all items, laid out block after block in the shuffled block order (vectorized ranges)
        total = int(sizes.sum())
        block_start_in_out = np.zeros(order.shape[0], dtype=np.int64)
        np.cumsum(sizes[:-1], out=block_start_in_out[1:])
        items = np.arange(total, dtype=np.int64) - np.repeat(block_start_in_out - starts, sizes)
        # then shuffle within each window of `window` consecutive blocks
        window_of = np.repeat(np.arange(order.shape[0], dtype=np.int64) // self.window, sizes)
        keys = rng.random(total)
        return items[np.lexsort((keys, window_of))]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_items


def recommended_sampler(dataset: Sequence[object], *, seed: int = 0, shuffle: bool = True
                        ) -> ShuffleSampler | BlockShuffleSampler:
    """The sampler packlab recommends for ``dataset``: a :class:`BlockShuffleSampler` over
    its shards' own blocks where a reader has them (its reads decode whole blocks, as
    Parquet's row groups: a uniform shuffle would decode one for almost every bin), a uniform
    :class:`ShuffleSampler` otherwise. ``shuffle=False``: every bin in order, which reads each
    block once whatever the format. Call ``set_epoch(epoch)`` each epoch."""
    if shuffle and has_own_blocks(dataset):
        return BlockShuffleSampler(dataset, seed=seed)
    return ShuffleSampler(dataset, seed=seed, shuffle=shuffle)


def has_own_blocks(source: object) -> bool:
    """Whether a dataset (any of its shard readers) or a reader reads in blocks of its own
    (:func:`reader_blocks`)."""
    readers = getattr(source, "readers", None)
    return any(reader_blocks(r) is not None
               for r in (readers() if callable(readers) else [source]))


def dataset_blocks(dataset: object, *, default_block_size: int = 1024) -> np.ndarray:
    """Global block boundaries of a :class:`~packlab.loading.dataset.PackedDataset`.

    A shard reader that knows its row groups gives them as ``block_boundaries()`` or a
    ``row_group_offsets`` array (local, from 0 to its ``num_bins``; the Parquet reader has
    one); other shards are cut into blocks of ``default_block_size``. Blocks never span shards.
    """
    from packlab.loading.dataset import PackedDataset

    if not isinstance(dataset, PackedDataset):
        raise PacklabError("dataset_blocks needs a PackedDataset")
    parts = [np.zeros(1, dtype=np.int64)]
    for shard, reader in enumerate(dataset.readers()):
        local = reader_blocks(reader)
        if local is None:
            local = fixed_blocks(reader.num_bins, default_block_size)
        parts.append(local[1:] + dataset.cumulative[shard])
    return np.concatenate(parts)


def reader_blocks(reader: object) -> np.ndarray | None:
    """A shard reader's own block boundaries (row groups), if it has any."""
    hook = getattr(reader, "block_boundaries", None)
    if callable(hook):
        return np.asarray(hook(), dtype=np.int64)
    offsets = getattr(reader, "row_group_offsets", None)
    return None if offsets is None else np.asarray(offsets, dtype=np.int64)
