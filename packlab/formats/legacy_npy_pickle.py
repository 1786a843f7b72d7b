"""Format ``legacy_npy_pickle``: today's default, ``np.save`` of a list of dicts (a pickle).

On disk, one ``.npy`` file holding an object array of dicts, as Nemotron writes and
Megatron-Bridge's ``GPTSFTPackedDataset`` reads with ``np.load(path, allow_pickle=True)``::

    [{"input_ids": [101, 2054, ...], "loss_mask": [0, 1, ...], "seq_start_id": [0, 45, ...]},
     ...]

The writer is faithful on purpose: it accumulates Python lists of every bin and pickles them
at :meth:`~ShardWriter.finalize` (temporary name, atomic rename). That accumulation, O(dataset)
memory, is what the lab measures against the streaming formats.

The reader never runs pickle code (:mod:`packlab.codecs.safe_pickle`). It loads the whole file on
first access (that is the format) and returns numpy arrays: int32 ``input_ids``, uint8
``loss_mask``, int32 ``seq_start_id``. The format has no record, no checksum and no
``pack_size``: pass ``pack_size=`` to the reader, else it is the longest bin, and for a file
Megatron-Bridge's packer wrote, ``convention="megatron_bridge"`` (its pack size counts
``packed_len - num_seqs``: :data:`packlab.bins.CONVENTIONS`). There is no place for a
checksum (Megatron-Bridge unpickles the file as it is), so ``validate`` and ``verify=True``
can only catch damage that breaks the pickle or an invariant: every bin read is checked
against every invariant (:func:`~packlab.bins.check_bin`, a few percent of a read that
converts Python lists), whatever ``verify`` says; a flipped token digit passes unseen (one more
reason to move off this format).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from packlab.bins import PackedBin, check_bin, check_convention
from packlab.codecs.safe_pickle import load_pickled_npy, npy_is_pickled, read_npy_header
from packlab.errors import FormatError
from packlab.formats.shared import stacks
from packlab.formats.shared.base import FormatFacts, ShardReader, ShardWriter
from packlab.storage.files import fsync_file
from packlab.storage.location import Location

FORMAT = "legacy_npy_pickle"
SUFFIX = ".npy"
KEYS = ("input_ids", "loss_mask", "seq_start_id")
DTYPES = {"input_ids": np.dtype(np.int32), "loss_mask": np.dtype(np.uint8),
          "seq_start_id": np.dtype(np.int32)}


def detect(location: Location) -> bool:
    """A file named ``*.npy`` (its reader then explains what is wrong), or any pickled .npy."""
    return location.suffix == SUFFIX or npy_is_pickled(location)


class LegacyFacts(FormatFacts):
    """What ``legacy_npy_pickle`` is: today's pickled .npy (loaded whole)."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    READ_BY = ("Megatron-Bridge",)
    STACK_INPUTS = (stacks.PACKED_NPY,)
    IN_RAM = True
    KEEPS_RECORD = False  # a pickled list of dicts: never packlab's to replace
    detect = staticmethod(detect)


class Writer(LegacyFacts, ShardWriter):
    """Accumulates every bin as Python lists, pickles them all at finalize (as Nemotron does)."""

    def _open(self) -> None:
        self.packed_data: list[dict[str, list[int]]] = []

    def _write(self, packed: PackedBin) -> None:
        self.packed_data.append({
            "input_ids": packed.input_ids.tolist(),
            "loss_mask": packed.loss_mask.tolist(),
            "seq_start_id": packed.seq_start_id.tolist(),
        })

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        # np.save given a file name would append ".npy" to the temporary name: pass a handle.
        with open(self.tmp_path, "wb") as f:
            np.save(f, self.packed_data, allow_pickle=True)
        fsync_file(self.tmp_path)
        self.packed_data = []
        return record  # the format has no place for it; returned to the caller only

    def _discard(self) -> None:
        self.packed_data = []


def _as_array(value: Any, key: str, where: str) -> np.ndarray:
    """One dict value (list or array) as a 1-D array of the key's dtype; never a silent wrap."""
    dtype = DTYPES[key]
    arr = np.asarray(value)
    if arr.ndim != 1:
        raise FormatError(f"{where}: {key} is not a flat list (shape {arr.shape})")
    if arr.size == 0:
        return np.empty(0, dtype=dtype)
    if arr.dtype.kind not in "iub":
        raise FormatError(f"{where}: {key} holds {arr.dtype} values, not integers")
    if arr.dtype != dtype:
        info = np.iinfo(dtype)
        lo, hi = int(arr.min()), int(arr.max())
        if lo < info.min or hi > info.max:
            raise FormatError(f"{where}: {key} value {lo if lo < info.min else hi} "
                              f"does not fit {dtype}")
    return arr.astype(dtype)  # always a copy: the caller may write into it, the cache stays


class Reader(LegacyFacts, ShardReader):
    """Loads the whole pickled file on first access, safely; bins come back as numpy arrays."""

    def __init__(self, path: str | os.PathLike[str], *, pack_size: int | None = None,
                 convention: str = "packlab", verify: bool = False) -> None:
        super().__init__(path)
        self.verify = bool(verify)  # nothing more to verify than the invariants, always checked
        self.convention = check_convention(convention)
        if not self.path.is_file():
            raise FormatError(f"{self.path}: not a file (a legacy packed shard is one .npy file)")
        with open(self.path, "rb") as fp:
            header = read_npy_header(fp, source=str(self.path))
        if header.dtype != np.dtype(object) or len(header.shape) != 1:
            raise FormatError(f"{self.path}: a {header.dtype} array of shape {header.shape}, "
                              "not a legacy packed file (np.save of a list of dicts)")
        self.num_bins = int(header.shape[0])
        self._pack_size_given = pack_size
        self._data: np.ndarray | None = None
        self._lengths: np.ndarray | None = None

    # pack_size and num_tokens are not stored in the format: they need the whole file.
    @property  # type: ignore[override]
    def pack_size(self) -> int:
        if self._pack_size_given is None:  # the longest bin, found once
            lengths = self.packed_lengths()
            self._pack_size_given = int(lengths.max()) if lengths.size else 0
        return int(self._pack_size_given)

    @pack_size.setter
    def pack_size(self, value: int) -> None:  # the base class sets a placeholder
        pass

    @property  # type: ignore[override]
    def num_tokens(self) -> int:
        return int(self.packed_lengths().sum())

    @num_tokens.setter
    def num_tokens(self, value: int) -> None:
        pass

    def _handles(self) -> tuple[str, ...]:
        return ("_data", "_lengths")

    def _load(self) -> np.ndarray:
        if self._data is None:
            self._data = load_pickled_npy(self.path)
        return self._data

    def _entry(self, data: np.ndarray, index: int) -> dict[str, Any]:
        entry = data[index]
        where = f"{self.path}: bin {index}"
        if not isinstance(entry, dict):
            raise FormatError(f"{where}: a {type(entry).__name__}, not a dict")
        missing = [k for k in KEYS if k not in entry]
        if missing:
            raise FormatError(f"{where}: missing {', '.join(missing)}")
        return entry

    def read_bin(self, index: int) -> PackedBin:
        """Bin ``index``, checked against every invariant (the format has no checksum)."""
        index = self.check_index(index)
        packed = self._bin(index)
        check_bin(*packed, pack_size=self.pack_size, source=str(self.path), bin_id=index,
                  convention=self.convention)
        return packed

    def _bin(self, index: int) -> PackedBin:
        entry = self._entry(self._load(), index)
        where = f"{self.path}: bin {index}"
        return PackedBin(*(_as_array(entry[k], k, where) for k in KEYS))

    def packed_lengths(self) -> np.ndarray:
        if self._lengths is None:
            data = self._load()
            out = np.empty(self.num_bins, dtype=np.int64)
            for i in range(self.num_bins):
                value = self._entry(data, i)["input_ids"]
                if isinstance(value, np.ndarray) and value.ndim == 1 or isinstance(value, list):
                    out[i] = len(value)
                else:
                    raise FormatError(f"{self.path}: bin {i}: input_ids is not a flat list")
            self._lengths = out
        return self._lengths.copy()

    def validate(self) -> dict[str, Any]:
        """Every invariant of every bin; the pickle loaded with the restricted unpickler."""
        self._load()
        if self.num_bins == 0:
            raise FormatError(f"{self.path}: no bins (empty shard)")
        pack_size = self.pack_size
        num_tokens = num_seqs = 0
        for i in range(self.num_bins):
            ids, mask, starts = self._bin(i)
            check_bin(ids, mask, starts, pack_size=pack_size, source=str(self.path), bin_id=i,
                      convention=self.convention)
            num_tokens += ids.shape[0]
            num_seqs += starts.shape[0]
        return {"format": FORMAT, "path": str(self.path), "num_bins": self.num_bins,
                "num_tokens": num_tokens, "num_seqs": num_seqs, "pack_size": pack_size,
                "convention": self.convention, "checksums": False}
