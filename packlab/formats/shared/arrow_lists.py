"""Packed bins as Arrow list columns, shared by the ``parquet`` and ``arrow_ipc`` formats.

Both formats store the same three columns (Nemotron's schema: ``input_ids`` list<int32>,
``loss_mask`` list<uint8>, ``seq_start_id`` list<int32>), one row per bin. This module turns
bins into Arrow record batches without Python lists (flat numpy buffers + offsets, wrapped by
``pa.ListArray.from_arrays``) and Arrow columns back into numpy through their offsets and
values buffers (never ``as_py``/``to_pylist``), with the structural checks that keep a
corrupted offsets buffer from turning into silently wrong bins.
"""

from __future__ import annotations

import json
import weakref
import zlib
from array import array
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Any, Generic, NamedTuple, TypeVar

import numpy as np
import pyarrow as pa

from packlab.bins import PackedBin, bin_checksum, check_csr
from packlab.errors import FormatError, PacklabError, one_line
from packlab.formats.read.table import BinIndex, FileReads, Runs
from packlab.storage.files import parse_json

COLUMNS = ("input_ids", "loss_mask", "seq_start_id")
DTYPES = {"input_ids": np.dtype(np.int32), "loss_mask": np.dtype(np.uint8),
          "seq_start_id": np.dtype(np.int32)}
SCHEMA = pa.schema([(name, pa.list_(pa.from_numpy_dtype(dt))) for name, dt in DTYPES.items()])
METADATA_KEY = b"packlab"
# List offsets are int32: one row group / batch holds fewer tokens than this.
MAX_LIST_VALUES = 2**31 - 1
_INT32_MAX = 2**31 - 1


def from_numpy(values: np.ndarray) -> pa.Array:
    """A primitive Arrow array over a numpy array's memory (zero-copy).

    ``pa.array(ndarray)`` and ``Array.to_numpy()`` import pandas on first use (about 50 MB of
    RSS in every writer and DataLoader worker); building from buffers does not.
    """
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(pa.from_numpy_dtype(values.dtype), values.shape[0],
                                 [None, pa.py_buffer(values)])


def to_numpy(array: pa.Array, where: str = "Arrow array") -> np.ndarray:
    """A numpy view of a primitive integer array without nulls (keeps its buffer alive)."""
    kind = array.type
    dtype = np.dtype(f"<{'i' if pa.types.is_signed_integer(kind) else 'u'}{kind.bit_width // 8}")
    if len(array) == 0:
        return np.empty(0, dtype=dtype)
    data = array.buffers()[1]
    if data is None or data.size < (array.offset + len(array)) * dtype.itemsize:
        raise FormatError(f"{where}: data buffer shorter than its length (corrupted)")
    return np.frombuffer(data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize)


def schema_with_metadata(metadata: dict[bytes, bytes] | None = None) -> pa.Schema:
    return SCHEMA.with_metadata(metadata) if metadata else SCHEMA


def check_schema(schema: pa.Schema, source: str) -> None:
    """The three columns must be lists of integers (int8 masks, as Megatron-Bridge writes, pass)."""
    try:
        names = schema.names
    except ValueError:  # pyarrow decodes field names as UTF-8 here: damaged schema bytes
        raise FormatError(f"{source}: damaged schema (field names are not UTF-8)") from None
    for name in COLUMNS:
        index = schema.get_field_index(name)
        if index < 0:
            raise FormatError(f"{source}: no column {name!r} (columns: {', '.join(names)}); "
                              "not a packed SFT shard")
        kind = schema.field(index).type
        if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not pa.types.is_integer(
            kind.value_type
        ):
            raise FormatError(f"{source}: column {name!r} is {kind}, expected list<integer>")


class ListBuffer:
    """Flat, growable numpy buffers for one row group (or record batch) of bins.

    Bins are copied in (they may be views into a materializer's scratch buffers). ``capacity``
    (tokens): the buffers are allocated that large once (pages the row group never fills are
    never touched, so they cost no memory) and grow by doubling past it; reused across row
    groups, so memory is bounded by the largest row group, never by the shard.
    """

    def __init__(self, max_rows: int, *, source: str, capacity: int = 1 << 16) -> None:
        self.source = source
        self.max_rows = max_rows
        capacity = max(1, min(int(capacity), MAX_LIST_VALUES))
        self.ids = np.empty(capacity, dtype=np.int32)
        self.mask = np.empty(capacity, dtype=np.uint8)
        self.starts = np.empty(max(1 << 10, capacity // 64), dtype=np.int32)
        self.token_offsets = np.zeros(max_rows + 1, dtype=np.int32)
        self.seq_offsets = np.zeros(max_rows + 1, dtype=np.int32)
        self.rows = 0

    @property
    def tokens(self) -> int:
        return int(self.token_offsets[self.rows])

    @property
    def seqs(self) -> int:
        return int(self.seq_offsets[self.rows])

    def fits(self, packed: PackedBin) -> bool:
        """Whether one more bin fits (rows and int32 list offsets)."""
        return (self.rows < self.max_rows
                and self.tokens + packed.input_ids.shape[0] <= MAX_LIST_VALUES
                and self.seqs + packed.seq_start_id.shape[0] <= MAX_LIST_VALUES)

    def add(self, packed: PackedBin, bin_id: int) -> None:
        ids, mask, starts = packed
        if ids.dtype.itemsize > 4 or ids.dtype == np.uint32:
            if ids.size and int(ids.max()) > _INT32_MAX:
                raise PacklabError(f"{self.source}: bin {bin_id}: token id {int(ids.max())} "
                                   "does not fit the int32 input_ids column")
        n, k = ids.shape[0], starts.shape[0]
        t0, s0 = self.tokens, self.seqs
        self.ids = _grown(self.ids, t0 + n)
        self.mask = _grown(self.mask, t0 + n)
        self.starts = _grown(self.starts, s0 + k)
        self.ids[t0 : t0 + n] = ids
        self.mask[t0 : t0 + n] = mask
        self.starts[s0 : s0 + k] = starts
        self.rows += 1
        self.token_offsets[self.rows] = t0 + n
        self.seq_offsets[self.rows] = s0 + k

    def arrays(self) -> dict[str, np.ndarray]:
        """Views of the buffered values and offsets (valid until the next ``add``/``clear``)."""
        t, s, r = self.tokens, self.seqs, self.rows
        return {"input_ids": self.ids[:t], "loss_mask": self.mask[:t],
                "seq_start_id": self.starts[:s], "token_offsets": self.token_offsets[: r + 1],
                "seq_offsets": self.seq_offsets[: r + 1]}

    def record_batch(self, schema: pa.Schema = SCHEMA) -> pa.RecordBatch:
        """The buffered bins as one record batch over the buffers (no per-row Python objects)."""
        a = self.arrays()
        tok = from_numpy(a["token_offsets"])
        seq = from_numpy(a["seq_offsets"])
        columns = [
            pa.ListArray.from_arrays(tok, from_numpy(a["input_ids"])),
            pa.ListArray.from_arrays(tok, from_numpy(a["loss_mask"])),
            pa.ListArray.from_arrays(seq, from_numpy(a["seq_start_id"])),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def bin_checksums(self) -> np.ndarray:
        """Each buffered bin's :func:`~packlab.bins.bin_checksum` (uint64)."""
        a = self.arrays()
        ids, mask, starts = a["input_ids"], a["loss_mask"], a["seq_start_id"]
        tok, seq = a["token_offsets"].tolist(), a["seq_offsets"].tolist()
        return np.array([bin_checksum(ids[tok[b]:tok[b + 1]], mask[tok[b]:tok[b + 1]],
                                      starts[seq[b]:seq[b + 1]]) for b in range(self.rows)],
                        dtype=np.uint64)

    def crc32(self) -> int:
        a = self.arrays()
        return content_crc32(a["input_ids"], a["loss_mask"], a["seq_start_id"],
                             a["token_offsets"], a["seq_offsets"])

    def clear(self) -> None:
        self.rows = 0


def _grown(buffer: np.ndarray, needed: int) -> np.ndarray:
    if needed <= buffer.shape[0]:
        return buffer
    out = np.empty(max(needed, 2 * buffer.shape[0]), dtype=buffer.dtype)
    out[: buffer.shape[0]] = buffer
    return out


def content_crc32(ids: np.ndarray, mask: np.ndarray, starts: np.ndarray,
                  token_offsets: np.ndarray, seq_offsets: np.ndarray) -> int:
    """CRC-32 of a batch's logical content (values in storage dtypes, offsets from 0 as int32)."""
    crc = 0
    for part in (ids.astype("<i4", copy=False), mask.astype("|u1", copy=False),
                 starts.astype("<i4", copy=False), token_offsets.astype("<i4", copy=False),
                 seq_offsets.astype("<i4", copy=False)):
        crc = zlib.crc32(memoryview(np.ascontiguousarray(part)).cast("B"), crc)
    return crc


class BinColumns(NamedTuple):
    """One decoded row group / batch as CSR numpy arrays; offsets start at 0."""

    input_ids: np.ndarray
    loss_mask: np.ndarray
    seq_start_id: np.ndarray
    token_offsets: np.ndarray  # int64[rows + 1]
    seq_offsets: np.ndarray  # int64[rows + 1]

    @property
    def rows(self) -> int:
        return int(self.token_offsets.shape[0] - 1)

    def bin(self, j: int, *, copy: bool) -> PackedBin:
        t0, t1 = self.token_offsets[j], self.token_offsets[j + 1]
        s0, s1 = self.seq_offsets[j], self.seq_offsets[j + 1]
        ids, mask, starts = self.input_ids[t0:t1], self.loss_mask[t0:t1], self.seq_start_id[s0:s1]
        if copy:
            return PackedBin(ids.copy(), mask.copy(), starts.copy())
        return PackedBin(ids, mask, starts)

    def packed_lengths(self) -> np.ndarray:
        return np.diff(self.token_offsets)

    def check(self, *, pack_size: int, source: str, first_bin: int,
              convention: str = "packlab") -> None:
        """Every invariant of every bin (plus token ids >= 0), naming the first bad bin."""
        check_csr(self.token_offsets, self.seq_offsets, self.seq_start_id, self.loss_mask,
                  pack_size=pack_size, source=source, first_bin=first_bin,
                  convention=convention)
        if self.input_ids.size and int(self.input_ids.min()) < 0:
            pos = int(np.argmax(self.input_ids < 0))
            b = first_bin + int(np.searchsorted(self.token_offsets, pos, side="right") - 1)
            raise FormatError(f"{source}: bin {b}: negative token id {int(self.input_ids[pos])}")

    def crc32(self) -> int:
        return content_crc32(self.input_ids, self.loss_mask, self.seq_start_id,
                             self.token_offsets, self.seq_offsets)


def decode(data: pa.Table | pa.RecordBatch, *, source: str, first_bin: int) -> BinColumns:
    """Arrow list columns -> :class:`BinColumns`, through the offsets and values buffers.

    Checks the structure (no nulls, offsets within the values, the loss mask as long as the
    tokens), so a corrupted buffer gives a :class:`FormatError` naming ``source`` and the bin,
    never a wrong slice.
    """
    ids, ids_off = _list_column(data, "input_ids", source, first_bin)
    mask, mask_off = _list_column(data, "loss_mask", source, first_bin)
    starts, seq_off = _list_column(data, "seq_start_id", source, first_bin)
    if not np.array_equal(ids_off, mask_off):
        b = first_bin + int(np.argmax(ids_off != mask_off)) - 1
        raise FormatError(f"{source}: bin {max(b, first_bin)}: loss_mask and input_ids differ "
                          "in length")
    ids = _as_dtype(ids, DTYPES["input_ids"], "input_ids", source, first_bin)
    mask = _as_dtype(mask, DTYPES["loss_mask"], "loss_mask", source, first_bin)
    starts = _as_dtype(starts, DTYPES["seq_start_id"], "seq_start_id", source, first_bin)
    return BinColumns(ids, mask, starts, ids_off, seq_off)


def _list_column(data: pa.Table | pa.RecordBatch, name: str, source: str,
                 first_bin: int) -> tuple[np.ndarray, np.ndarray]:
    column = data.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    where = f"{source}: bins {first_bin}..{first_bin + len(column) - 1}"
    if column.null_count:
        raise FormatError(f"{where}: column {name!r} has {column.null_count} null rows")
    offsets = to_numpy(column.offsets, f"{where}: column {name!r}").astype(np.int64)
    values = column.values
    if values.null_count:
        raise FormatError(f"{where}: column {name!r} has null values")
    if offsets.size == 0 or offsets[0] < 0 or offsets[-1] > len(values) or (
        offsets.size > 1 and bool(np.any(offsets[1:] < offsets[:-1]))
    ):
        raise FormatError(f"{where}: column {name!r} has corrupted list offsets")
    flat = to_numpy(values, f"{where}: column {name!r}")[offsets[0] : offsets[-1]]
    if offsets[0]:
        offsets = offsets - offsets[0]
    return flat, offsets


def _as_dtype(values: np.ndarray, dtype: np.dtype, name: str, source: str,
              first_bin: int) -> np.ndarray:
    """Foreign integer types (int8 masks, int64 tokens) to the storage dtype, range-checked."""
    if values.dtype == dtype:
        return values
    info = np.iinfo(dtype)
    if values.size and (int(values.min()) < info.min or int(values.max()) > info.max):
        raise FormatError(f"{source}: bins from {first_bin}: column {name!r} has values outside "
                          f"{dtype} ({int(values.min())}..{int(values.max())})")
    return values.astype(dtype)


def dump_metadata(info: dict[str, Any]) -> str:
    """JSON for a footer/schema/batch metadata entry, with a CRC-32 of itself: the formats'
    footers carry no checksum, and a flipped digit in ``pack_size`` must not pass unseen."""
    body = json.dumps(info, sort_keys=True)
    return json.dumps({**info, "metadata_crc32": zlib.crc32(body.encode())}, sort_keys=True)


def load_metadata(raw: bytes, where: str) -> dict[str, Any]:
    """Parse and verify what :func:`dump_metadata` wrote; ``where`` names file and place."""
    info = parse_json(raw, where, unreadable="packlab metadata is not JSON (corrupted)")
    if not isinstance(info, dict):
        raise FormatError(f"{where}: packlab metadata is not a JSON object")
    crc = info.pop("metadata_crc32", None)
    if crc != zlib.crc32(json.dumps(info, sort_keys=True).encode()):
        raise FormatError(f"{where}: packlab metadata checksum mismatch (corrupted)")
    return info


def parse_error(exc: BaseException) -> str:
    """One line from an Arrow/Parquet error."""
    return one_line(exc) or type(exc).__name__


ARROW_ERRORS: tuple[type[BaseException], ...] = (pa.ArrowException, OSError, ValueError)

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRUCache(Generic[K, V]):
    """A few decoded row groups (or record batches); ``capacity=None`` keeps everything.

    Bounded caches share one budget per process besides their own, :data:`PROCESS_CAPACITY`
    entries in all: a dataset of many Parquet shards read at random keeps a few decoded row
    groups, not a few per shard (86 shards of four 20 MB row groups each held 6.9 GB)."""

    PROCESS_CAPACITY = 8
    _everyone: OrderedDict[tuple[int, Any], weakref.ref[LRUCache[Any, Any]]] = OrderedDict()

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 1:
            raise PacklabError(f"cache size must be at least 1, got {capacity}")
        self.capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: K, load: Callable[[K], V]) -> V:
        item = self._items.get(key)
        if item is not None:
            self.hits += 1
            if self.capacity is not None:
                self._items.move_to_end(key)
                self._everyone.move_to_end((id(self), key))
            return item
        self.misses += 1
        item = load(key)
        self._items[key] = item
        if self.capacity is not None:
            if len(self._items) > self.capacity:
                self._forget(next(iter(self._items)))
            self._everyone[(id(self), key)] = weakref.ref(self)
            while len(self._everyone) > self.PROCESS_CAPACITY:
                (_, oldest), owner = self._everyone.popitem(last=False)
                cache = owner()
                if cache is not None:
                    cache._items.pop(oldest, None)
        return item

    def _forget(self, key: K) -> None:
        self._items.pop(key, None)
        self._everyone.pop((id(self), key), None)

    def __del__(self) -> None:
        for key in list(self._items):
            self._everyone.pop((id(self), key), None)

    def peek(self, key: K) -> V | None:
        return self._items.get(key)

    def __len__(self) -> int:
        return len(self._items)

    def stats(self) -> dict[str, Any]:
        return {"capacity": self.capacity, "size": len(self._items), "hits": self.hits,
                "misses": self.misses}


def list_buffers(column: pa.Array, dtype: np.dtype, base: int, size: int
             ) -> tuple[int, int, int] | None:
    """Where a list column's offsets and values are in the mapped file: ``(offsets byte,
    first offset index, values byte)``; None when they cannot be read as views (another value
    type, nulls, a buffer outside the file)."""
    if (column.type != pa.list_(pa.from_numpy_dtype(dtype)) or column.null_count
            or column.values.null_count or column.values.offset):
        return None
    offsets, values = column.buffers()[1], column.values.buffers()[1]
    if offsets is None or values is None:
        return None
    at = (offsets.address - base, values.address - base)
    if not all(0 <= a < size for a in at) or at[0] % 4 or at[1] % dtype.itemsize:
        return None
    return at[0], column.offset, at[1] // dtype.itemsize


class ListIndex(BinIndex):
    """An Arrow IPC file's record batches read in place (``arrow_ipc``'s zero-copy reads).

    Bin ``b`` of batch ``k`` (row ``r``) is ``values[offsets[r]:offsets[r + 1]]`` of each
    column, where a batch's offsets and values buffers lie in the file. The offsets are read
    where they are, through one int32 view of the whole mapped file; per batch only six
    positions are kept (a tuple of ints, about 300 bytes a batch of a thousand bins)."""

    __slots__ = ("num_bins", "firsts", "path", "_whole", "batches")

    def __init__(self, reads: FileReads, path: Path, batches: list[Any], num_bins: int) -> None:
        file = reads.file(path)
        self.num_bins, self.path = num_bins, path
        self._whole = file.column(np.dtype("<i4"), 0, file.size // 4)
        self.firsts = array("q", (first for first, _, _ in batches))
        # per batch: where each column's offsets start (an int32 index into the file) and
        # where its values start (an index into that column's view of the file)
        self.batches = [tuple(x for at, first, base in spans for x in (at // 4 + first, base))
                        for _, _, spans in batches]

    def runs(self, lo: int, hi: int) -> Runs:
        """Bins ``lo..hi-1``, batch by batch; the mask of each as long as its tokens."""
        parts: list[list[np.ndarray]] = [[], [], [], [], []]
        k = bisect_right(self.firsts, lo) - 1
        while lo < hi:
            first = self.firsts[k]
            stop = self.firsts[k + 1] if k + 1 < len(self.firsts) else self.num_bins
            end = min(hi, stop)
            ta, tb, ma, mb, sa, sb = self.batches[k]
            t, m, s = (self._whole[at + lo - first:at + end - first + 1].astype(np.int64)
                       for at in (ta, ma, sa))
            if not np.array_equal(np.diff(t), np.diff(m)):
                b = lo + int(np.argmax(np.diff(t) != np.diff(m)))
                raise FormatError(f"{self.path}: bin {b}: loss_mask and input_ids differ in "
                                  "length (corrupted)")
            for part, values in zip(parts, (t[:-1] + tb, np.diff(t), m[:-1] + mb, s[:-1] + sb,
                                            np.diff(s)), strict=True):
                part.append(values)
            lo, k = end, k + 1
        return Runs(*(np.concatenate(part) for part in parts))
