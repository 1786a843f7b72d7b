"""The map-style dataset over packed shards.

:class:`PackedDataset` takes the shards (as :func:`packlab.open_dataset` resolves them), counts
their bins, and serves bin ``i`` of the concatenation as what Megatron-Bridge's packed datasets
return::

    {"input_ids": int[packed_len], "loss_mask": uint8[packed_len],
     "seq_boundaries": int32[num_seqs + 1]}   # seq_start_id + [packed_len]

One read path, whatever the formats: a global index is located in a shard (one bisect over
the shards' first bins, as MosaicML streaming's spanner does), then the shard's read of that
bin is called (:meth:`~packlab.formats.shared.base.ShardReader.item_read`: the table of a format
whose bins are runs of its files' values, :mod:`packlab.formats.read.table`; any other format's
reader). A batch (``__getitems__``,
what a DataLoader calls) is the same read per bin.

It is picklable and lazy: pickling keeps paths and counts only, and each process (DataLoader
worker, forked or spawned) opens its own readers on first access, so no file handle or memory
map is shared between processes.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from packlab.bins import PackedBin, bin_digest, cumulative_offsets
from packlab.errors import FormatError, PacklabError
from packlab.formats import get_format
from packlab.formats.shared.base import index_list
from packlab.loading.discovery import find_shards
from packlab.storage.reads import forget_after_fork

Item = dict[str, np.ndarray]


def check_place(path: Any, reader: Any, bins: tuple[int, int]) -> None:
    """A shard a dataset record lists holds its bins: as many, and (where its format records
    them) the very ones; else it is another shard in its place, or a damaged one."""
    if reader.num_bins != bins[1] - bins[0]:
        raise FormatError(f"{path}: {reader.num_bins} bins, its dataset record puts bins "
                          f"{bins[0]}..{bins[1] - 1} here (replaced by another shard?)")
    recorded = reader.metadata.get("bins")
    if recorded is not None and recorded != list(bins):
        if not (isinstance(recorded, list) and len(recorded) == 2
                and all(type(b) is int for b in recorded)):
            raise FormatError(f"{path}: its metadata records bins {recorded!r:.80}, not a "
                              "[start, stop] pair (corrupted)")
        raise FormatError(f"{path}: holds bins {recorded[0]}..{recorded[1] - 1}, its dataset "
                          f"record puts bins {bins[0]}..{bins[1] - 1} here (shards swapped or "
                          "duplicated)")


class PackedDataset:
    """Bins of many shards as one map-style dataset (``len``, ``[i]``, ``__getitems__``)."""

    def __init__(
        self,
        shards: Sequence[tuple[Any, str]],
        *,
        reader_options: dict[str, Any] | None = None,
    ) -> None:
        """``shards``: ``(path, format)`` pairs, as the resolver gives them; where a dataset
        record lists a shard (its pair carries ``bins``), the shard must hold exactly those
        bins."""
        if not shards:
            raise PacklabError("no shards to open")
        self.shards: list[Any] = [p for p, _ in shards]
        self.formats: list[str] = [name for _, name in shards]
        self.reader_options = dict(reader_options or {})
        self._readers: list[Any] | None = None
        self._reads: list[Callable[[int], Item]] | None = None
        readers = self.readers()
        for shard, reader in zip(shards, readers, strict=True):
            expected = getattr(shard, "bins", None)
            if expected is not None:
                check_place(shard[0], reader, expected)
        counts = np.array([r.num_bins for r in readers], dtype=np.int64)
        self.num_bins_per_shard = counts
        self.cumulative = cumulative_offsets(counts)
        self._starts = self.cumulative[:-1].tolist()  # for bisect: Python ints, no numpy call
        self._length = int(self.cumulative[-1])
        self.pack_size = max(int(r.pack_size) for r in readers)
        self.num_tokens = sum(int(r.num_tokens) for r in readers)

    # -- this process's readers ---------------------------------------------------------------
    def open_reader(self, shard: int) -> Any:
        """A reader of shard ``shard`` (a dataset over object storage opens it there)."""
        return get_format(self.formats[shard]).Reader(self.shards[shard], **self.reader_options)

    def readers(self) -> list[Any]:
        """This process's shard readers, opened on first use (and again in a forked child)."""
        if self._readers is None:
            self._readers = [self.open_reader(k) for k in range(len(self.shards))]
            forget_after_fork(self)
        return self._readers

    def _per_process_reads(self) -> list[Callable[[int], Item]]:
        """Each shard's read of one bin in this process (its reader's ``item_read``)."""
        if self._reads is None:
            self._reads = [reader.item_read() for reader in self.readers()]
        return self._reads

    def forget_maps(self) -> None:
        """In a forked child (and when closed): the next read opens this process's own readers."""
        self._readers = None
        self._reads = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_readers": None, "_reads": None}

    def close(self) -> None:
        for reader in self._readers or ():
            reader.close()
        self.forget_maps()

    # -- map-style access -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    def locate(self, index: Any) -> tuple[int, int]:
        """(shard number, bin within that shard) of global bin ``index`` (negative counts
        from the end; numpy integers are integers)."""
        if type(index) is not int:
            if isinstance(index, bool) or not isinstance(index, int | np.integer):
                raise TypeError(f"bin index must be an integer, got {type(index).__name__}")
            index = int(index)
        if not 0 <= index < self._length:
            if not -self._length <= index < 0:
                raise IndexError(f"bin {index} out of range [0, {self._length})")
            index += self._length
        shard = bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def __getitem__(self, index: Any) -> Item:
        if type(index) is int and 0 <= index < self._length:  # locate's common case, inline
            shard = bisect_right(self._starts, index) - 1
            index -= self._starts[shard]
        else:
            shard, index = self.locate(index)
        return (self._reads or self._per_process_reads())[shard](index)

    def __getitems__(self, indices: Sequence[int]) -> list[Item]:
        """A batch (what ``torch.utils.data.DataLoader`` calls when it exists): a list of
        ints as it is, anything else (numpy, tensors, tuples) as int64 first."""
        if type(indices) is not list or not all(type(i) is int for i in indices):
            indices = np.asarray(indices, dtype=np.int64).reshape(-1).tolist()
        return [self[i] for i in indices]

    def read_bin(self, index: int) -> PackedBin:
        shard, local = self.locate(index)
        return self.readers()[shard].read_bin(local)

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        return [self.read_bin(i) for i in index_list(indices)]

    def __iter__(self) -> Iterator[Item]:
        for reader in self.readers():
            for packed in reader.iter_bins():
                yield packed.item()

    # -- what it spans ----------------------------------------------------------------------
    def shard_of(self, index: int) -> int:
        return self.locate(index)[0]

    def packed_lengths(self) -> np.ndarray:
        return np.concatenate([r.packed_lengths() for r in self.readers()])

    def __repr__(self) -> str:
        kinds = sorted(set(self.formats))
        return (f"PackedDataset({len(self)} bins, {len(self.shards)} shards, "
                f"formats={kinds}, pack_size={self.pack_size})")


def bin_digests(source: PackedDataset | Any) -> list[str]:
    """Content hash of every bin, in order, of a dataset (or of the local shards a path names:
    a shard, a directory of shards). Hashes ignore storage dtypes
    (:func:`packlab.bins.bin_digest`): formats storing uint16 or int32 tokens compare equal
    when their bins do, which is how conversions and formats are compared."""
    dataset = source if isinstance(source, PackedDataset) else PackedDataset(find_shards(source))
    return [bin_digest(*packed) for reader in dataset.readers() for packed in reader.iter_bins()]
