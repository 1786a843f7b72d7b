"""The map-style dataset over packed shards: one shard, a directory, a glob, a list, a split.

``open_dataset(path)`` finds the shards (detecting each one's format), counts their bins, and
serves bin ``i`` of the concatenation as what Megatron-Bridge's packed datasets return::

    {"input_ids": int[packed_len], "loss_mask": uint8[packed_len],
     "seq_boundaries": int32[num_seqs + 1]}   # seq_start_id + [packed_len]

It is picklable and lazy: pickling keeps paths and counts only, and each process (DataLoader
worker, forked or spawned) opens its own readers on first access, so no file handle or memory
map is ever shared between processes.
"""

from __future__ import annotations

import glob as globlib
import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import PackedBin
from packlab.errors import FormatError, PacklabError
from packlab.files import is_temporary
from packlab.formats import detect_format, get_format, open_shard
from packlab.mapping import FORKS as _FORKS
from packlab.spool import read_spool_manifest

PathLike = str | os.PathLike[str]
# Entries of a shard directory that are never shards: layout folders, receipts, notes.
IGNORED_NAMES = {"splits", "runs", "receipts", "README", "README.md", "_SUCCESS"}
IGNORED_SUFFIXES = (".json", ".txt", ".md", ".log")


def item_from_bin(packed: PackedBin) -> dict[str, np.ndarray]:
    """The dict a Megatron-Bridge packed dataset returns for one bin."""
    return {
        "input_ids": packed.input_ids,
        "loss_mask": packed.loss_mask,
        "seq_boundaries": packed.seq_boundaries(),
    }


class PackedDataset:
    """Bins of many shards as one map-style dataset (``len``, ``[i]``, ``__getitems__``)."""

    def __init__(
        self,
        shards: Sequence[tuple[Path, str]],
        *,
        reader_options: dict[str, Any] | None = None,
    ) -> None:
        if not shards:
            raise PacklabError("no shards to open")
        self.shards: list[Path] = [Path(p) for p, _ in shards]
        self.formats: list[str] = [name for _, name in shards]
        self.reader_options = dict(reader_options or {})
        self._readers: list[Any] | None = None
        self._pid = os.getpid()
        self._fork = _FORKS[0]
        readers = self._open_readers()
        counts = np.array([r.num_bins for r in readers], dtype=np.int64)
        self.num_bins_per_shard = counts
        self.cumulative = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=self.cumulative[1:])
        self._starts = self.cumulative[:-1].tolist()  # for bisect: Python ints, no numpy call
        self._length = int(self.cumulative[-1])
        self.pack_size = max(int(r.pack_size) for r in readers)
        self.num_tokens = sum(int(r.num_tokens) for r in readers)

    # -- lazy, per-process readers ---------------------------------------------------------
    def _open_readers(self) -> list[Any]:
        """This process's readers, opened on first use (and again after a fork)."""
        if self._readers is None or self._fork != _FORKS[0]:
            self._readers = [
                open_shard(path, format=name, **self.reader_options)
                for path, name in zip(self.shards, self.formats, strict=True)
            ]
            self._pid = os.getpid()
            self._fork = _FORKS[0]
        return self._readers

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_readers"] = None
        return state

    def close(self) -> None:
        if self._readers is not None:
            for reader in self._readers:
                reader.close()
        self._readers = None

    # -- map-style access -------------------------------------------------------------------
    def __len__(self) -> int:
        return self._length

    def locate(self, index: int) -> tuple[int, int]:
        """(shard number, bin within that shard) of global bin ``index``."""
        if type(index) is int and 0 <= index < self._length:  # the hot path: one bisect
            shard = bisect_right(self._starts, index) - 1
            return shard, index - self._starts[shard]
        n = self._length
        if isinstance(index, bool) or not isinstance(index, int | np.integer):
            raise TypeError(f"bin index must be an integer, got {type(index).__name__}")
        if not -n <= index < n:
            raise IndexError(f"bin {index} out of range [0, {n})")
        index = int(index) % n
        shard = int(np.searchsorted(self.cumulative, index, side="right")) - 1
        return shard, index - int(self.cumulative[shard])

    def read_bin(self, index: int) -> PackedBin:
        shard, local = self.locate(index)
        return self._open_readers()[shard].read_bin(local)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return item_from_bin(self.read_bin(index))

    def read_bins(self, indices: Sequence[int] | np.ndarray) -> list[PackedBin]:
        """Many bins, in the order asked, read with one ``read_bins`` call per shard (grouped
        with one stable sort; the bins put back in order by one C-level gather)."""
        readers = self._open_readers()
        if len(readers) == 1:  # its reader checks the range (and counts from the end)
            return list(readers[0].read_bins(indices))
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        n = self._length
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = int(idx[(idx < -n) | (idx >= n)][0])
            raise IndexError(f"bin {bad} out of range [0, {n})")
        idx = idx % n
        if idx.size == 0:
            return []
        shard_of = np.searchsorted(self.cumulative, idx, side="right") - 1
        order = np.argsort(shard_of, kind="stable")
        ordered = shard_of[order]
        got: list[PackedBin] = []
        for run in np.split(order, np.flatnonzero(ordered[1:] != ordered[:-1]) + 1):
            shard = int(shard_of[run[0]])
            got.extend(readers[shard].read_bins(idx[run] - self.cumulative[shard]))
        back = np.empty_like(order)
        back[order] = np.arange(order.shape[0])
        return [got[0]] if len(got) == 1 else list(itemgetter(*back.tolist())(got))

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, np.ndarray]]:
        """Batch access (what ``torch.utils.data.DataLoader`` calls when it exists)."""
        return [item_from_bin(b) for b in self.read_bins(indices)]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for reader in self._open_readers():
            for packed in reader.iter_bins():
                yield item_from_bin(packed)

    # -- what it spans ----------------------------------------------------------------------
    def shard_of(self, index: int) -> int:
        return self.locate(index)[0]

    def readers(self) -> list[Any]:
        """This process's shard readers (opened if needed)."""
        return self._open_readers()

    def packed_lengths(self) -> np.ndarray:
        return np.concatenate([r.packed_lengths() for r in self._open_readers()])

    def __repr__(self) -> str:
        kinds = sorted(set(self.formats))
        return (f"PackedDataset({len(self)} bins, {len(self.shards)} shards, "
                f"formats={kinds}, pack_size={self.pack_size})")


# -- finding the shards -----------------------------------------------------------------------
def _ignored(path: Path) -> bool:
    name = path.name
    return (
        name.startswith(".")
        or is_temporary(path)
        or name in IGNORED_NAMES
        or name.endswith(IGNORED_SUFFIXES)
    )


def _detect(path: Path) -> str | None:
    try:
        return detect_format(path)
    except FormatError:
        return None


def _is_main_entry(path: Path, name: str) -> bool:
    """Whether ``path`` is the shard itself, not a companion file its format also claims."""
    suffix = get_format(name).SUFFIX
    return path.name.endswith(suffix) if suffix else path.is_dir()


def _expect(path: Path, detected: str, wanted: str | None) -> str:
    """The detected format, refusing a shard of another format than the one asked for."""
    if wanted is not None and wanted != detected:
        get_format(wanted)  # an unknown name is its own error
        raise FormatError(f"{path}: a {detected} shard, not {wanted}")
    return detected


def _is_spool(path: Path) -> bool:
    try:
        read_spool_manifest(path)
    except FormatError:
        return False
    return True


def _stem(name: str) -> str:
    return name.split(".", 1)[0]


def shards_in_directory(directory: Path, *, format: str | None = None) -> list[tuple[Path, str]]:
    """The shards directly inside ``directory``, sorted by name, each with its format.

    Hidden temporaries, receipts/manifests (``*.json``) and layout folders are skipped. A file
    that is no shard but shares its stem with one (``x.idx`` beside ``x.bin``) is a companion;
    anything else unrecognised is an error, so a damaged shard is never silently left out.
    """
    found: list[tuple[Path, str]] = []
    unknown: list[Path] = []
    for child in sorted(directory.iterdir()):
        if _ignored(child):
            continue
        if child.is_symlink() and not child.exists():
            raise FormatError(f"{child}: broken link to {os.readlink(child)} (its shard is "
                              "missing; rerun `packlab pack` to rewrite it)")
        name = _detect(child)
        if name is None:
            unknown.append(child)
            continue
        if not _is_main_entry(child, name):
            continue  # a companion file the format also recognises (e.g. the .idx of a .bin)
        found.append((child, _expect(child, name, format)))
    stems = {_stem(p.name) for p, _ in found}
    strays = [p for p in unknown if _stem(p.name) not in stems]
    if strays:
        raise FormatError(f"{strays[0]}: not a shard of any known format (in a shard directory)")
    return found


def find_shards(path: PathLike | Sequence[PathLike], *, format: str | None = None
                ) -> list[tuple[Path, str]]:
    """Resolve a shard, a directory of shards, a glob, or a list of those into (path, format)."""
    if isinstance(path, list | tuple):
        out: list[tuple[Path, str]] = []
        for item in path:
            out.extend(find_shards(item, format=format))
        return out
    text = os.fspath(path)
    p = Path(text)
    if not p.exists() and globlib.has_magic(text):
        matches = sorted(globlib.glob(text))
        if not matches:
            raise FormatError(f"{text}: the pattern matches nothing")
        picked: list[tuple[Path, str]] = []
        for match in matches:
            m = Path(match)
            if _ignored(m):
                continue
            name = detect_format(m)
            if _is_main_entry(m, name):
                picked.append((m, _expect(m, name, format)))
        if not picked:
            raise FormatError(f"{text}: the pattern matches no shard")
        return picked
    if not p.exists():
        raise FormatError(f"{p}: no such file or directory")
    if p.is_dir():
        own = _detect(p)
        if own is not None and _is_main_entry(p, own):
            return [(p, _expect(p, own, format))]
        if _is_spool(p):
            raise FormatError(f"{p}: a spool (spool_v1), not packed shards: pack it first "
                              "(`packlab pack`)")
        shards = shards_in_directory(p, format=format)
        if not shards:
            from packlab.layout.blend import is_layout, known_splits

            if is_layout(p):
                raise FormatError(f"{p}: an output layout: open one split (split=...; splits "
                                  f"here: {', '.join(known_splits(p)) or 'none'})")
            raise FormatError(f"{p}: no shards in this directory")
        return shards
    return [(p, format or detect_format(p))]


def resolve_split(path: PathLike, split: str) -> Path | list[Path]:
    """``PATH/splits/<split>/`` (the Nemotron output layout, as ``nano3_packed_sft_dir``
    resolves it); without ``splits/``, the split's shards listed in ``PATH/blend.json`` (a copy
    without symlinks, e.g. on object storage). An unknown split lists the known ones."""
    from packlab.layout.blend import split_source

    return split_source(path, split)


def open_dataset(
    path: PathLike | Sequence[PathLike],
    *,
    split: str | None = None,
    format: str | None = None,
    **reader_options: Any,
) -> PackedDataset:
    """Open packed shards as one map-style dataset.

    ``path``: a shard, a directory of shards, a glob, or a list of those. ``split`` picks
    ``PATH/splits/<split>/`` of an output layout (or the split's shards in ``PATH/blend.json``
    when the links are absent). ``format`` skips detection. ``reader_options`` go to each reader.
    URIs (``s3://bucket/out``) are opened by :func:`packlab.cloud.open_dataset` (``split`` then
    through the remote ``blend.json``; ``filesystem=``, ``cache_dir=`` accepted there).
    """
    from packlab.formats import is_remote_path

    if any(is_remote_path(p) for p in (path if isinstance(path, list | tuple) else [path])):
        from packlab.cloud import open_dataset as open_remote_dataset

        return open_remote_dataset(path, split=split, format=format, **reader_options)
    if split is not None:
        if isinstance(path, list | tuple):
            raise PacklabError("split= needs one output directory, not a list of paths")
        path = resolve_split(path, split)
    return PackedDataset(find_shards(path, format=format), reader_options=reader_options)
