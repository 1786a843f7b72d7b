"""Format ``megatron_sft``: the packed ``.sft`` pair Megatron-Bridge proposed, byte for byte.

Follows Megatron-Bridge's ``src/megatron/bridge/data/packing/indexed.py`` at commit
``c91ec672d971adb9b155e31e2e224c036f34994e`` (pull request #5226, closed without being merged:
no Bridge release or main branch reads the pair; Bridge reads packed Parquet,
:data:`packlab.formats.shared.stacks.SFT_PAIR`). A measured candidate. A shard is a Megatron-core
IndexedDataset pair, named by its index, and packlab's sidecar beside it::

    train.sft.idx      megatron-core's MMIDIDX index (packlab.codecs.mmidx): dtype code 4
                       (int32), one sequence and one document per bin. What a path names, and
                       the shard's commit point: published last
    train.sft.bin      the items, int32 words, end to end; bin b is item b:
                           [0x53465442 ("SFTB"), 1 (version), n, seq_start_id[0..n), words...]
                       a token word is ``uint32(id) | uint32(loss_mask) << 31`` seen as int32:
                       the id in bits 0-30, the target-aligned loss-mask bit on top (a token
                       trained on has a negative word)
    train.sft.packlab  packlab's sidecar (Bridge never opens it; Bridge's bytes stay Bridge's):
                           magic 8s b"PLKSFTB\\x00", <Q version 1, <Q num_bins,
                           8s b"xxh3_64\\x00", <u8[num_bins] each bin's checksum
                           (packlab.bins.bin_checksum of the bin as read: ids int32, mask
                           uint8, starts int32), the shard's record (JSON), <Q its length,
                           the magic again

The record, for example::

    {"format": "megatron_sft", "packlab_version": "0.1.0", "pack_size": 4096,
     "num_bins": 3, "num_tokens": 12011, "num_seqs": 17, "metadata": {},
     "bin_checksum": "xxh3_64", "bridge_commit": "c91ec672d971adb9b155e31e2e224c036f34994e",
     "pair": {"bin": {"bytes": 48164, "sha256": "..."}, "idx": {"bytes": 102, "sha256": "..."}},
     "fingerprints": {"bin": "5d1e...", "idx": "a07c..."}}

**The files know their shard.** The pair stays Bridge's bytes, so the sidecar records its
sizes (checked at open) and fingerprints (:mod:`packlab.formats.shared.fingerprints`: the ``.idx``
whole, the ``.bin``'s first and last 4 KiB, checked on the first read): a ``.bin``, ``.idx``
or sidecar exchanged with another shard's is refused before a bin is served (a sidecar written
before fingerprints: sizes only).

For the same bins, ``.sft.bin`` and ``.sft.idx`` are what Bridge's
``write_packed_indexed_dataset`` writes (``tests/test_format_megatron_sft.py``: megatron-core's
own ``IndexedDatasetBuilder`` writes the same bytes from the same rows, and its
``IndexedDataset`` reads packlab's pairs). The writer works in a hidden temporary folder and
publishes the ``.bin``, the sidecar, then the ``.idx`` (Bridge publishes its data file first
too): until the index appears there is no shard; an old shard's index is removed first.

Reading: a pair Bridge wrote (no sidecar) reads as well: its token and sequence counts and,
unless ``pack_size=`` is given, its pack size (its longest bin) come from one pass over its
items' headers, made when first asked; it records no per-bin checksums (``verify=True``
refuses it; ``validate`` decodes every item). Each item is checked as it is read, refused as
Bridge refuses (bad magic or version, a boundary count <= 0 or past the item, starts not
from 0, not increasing or out of range), with a FormatError naming the ``.bin`` and the bin.
On object storage the index and the sidecar are fetched once into a local cache and each read
is one ranged GET of exactly its item (:mod:`packlab.formats.read.ranged`).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np

from packlab.bins import CHECKSUM, PackedBin, budget_used, check_convention, stored_checksum
from packlab.codecs import mmidx
from packlab.errors import FormatError, PacklabError
from packlab.formats.read.item_table import ItemIndex, ItemPlacement, ItemTable
from packlab.formats.read.shard_reads import reads_for
from packlab.formats.read.table import Column, FileReads, TableReads, refuse_unverifiable
from packlab.formats.shared import stacks
from packlab.formats.shared.base import (
    MAX_PACK_SIZE,
    FormatFacts,
    ShardReader,
    ShardWriter,
    count_field,
    head,
    starts_with,
)
from packlab.formats.shared.fingerprints import check_fingerprints, fingerprint
from packlab.formats.shared.scratch import ScratchArray
from packlab.storage.files import HashedFile, fsync_directory, parse_json, remove, sha256_file
from packlab.storage.location import Location, as_location
from packlab.storage.objects import cache_entry, cache_root, fetch_files

FORMAT = "megatron_sft"
SUFFIX = ".sft.idx"
BIN = ".sft.bin"
SIDECAR = ".sft.packlab"
BRIDGE_COMMIT = stacks.SFT_PAIR.commit
ROW_MAGIC = 0x53465442  # "SFTB"
ROW_VERSION = 1
HEADER_WORDS = 3  # magic, version, number of sequences
MIN_WORDS = HEADER_WORDS + 2  # Bridge refuses an item of fewer words
MAX_ID = 0x7FFFFFFF  # ids keep 31 bits; the top bit is the loss mask
WORDS = np.dtype("<i4")
WORDS_CODE = 4  # megatron-core's DType code of int32


class _Sidecar:
    """``.sft.packlab``: a 32-byte head, the checksums, the record, a 16-byte tail."""

    MAGIC = b"PLKSFTB\x00"
    VERSION = 1
    HEAD = struct.Struct("<8sQQ8s")  # magic, version, num_bins, algorithm
    TAIL = struct.Struct("<Q8s")  # record length, magic


def detect(location: Location) -> bool:
    """A file named ``*.sft.idx`` that starts with megatron-core's MMIDIDX magic."""
    return location.name.endswith(SUFFIX) and starts_with(location, mmidx.MAGIC)


class SftFacts(FormatFacts):
    """What ``megatron_sft`` is: Bridge's pair, packlab's sidecar beside it."""

    FORMAT = FORMAT
    SUFFIX = SUFFIX
    COMPANIONS = (BIN, SIDECAR)
    COMPANION_RECORD = SIDECAR
    DATA_FILES = (BIN,)
    READS_IN_PLACE = True
    READ_BY = ("Megatron-core",)
    ITEMS_READ_BY = ("Megatron-core",)  # IndexedDataset returns the words: header, mask bit
    STACK_INPUTS = (stacks.SFT_PAIR,)
    detect = staticmethod(detect)


def entry_of(path: Any) -> Location:
    """The index a path names, by Bridge's rules for one pair: the ``.idx`` itself, its
    ``.bin``, the prefix both share (``train.sft``), or a local folder holding one pair (the
    writer's temporary); any other name is a prefix the ``.sft`` suffixes are added to
    (``out/c`` names ``out/c.sft.idx``, so discovery and detection know the pair)."""
    location = as_location(path)
    name = location.name
    if name.endswith(".idx"):
        return location
    if name.endswith(".bin"):
        return location.parent / f"{name[:-4]}.idx"
    if location.is_local and location.is_dir():
        found = [c for c in location.iterdir() if c.name.endswith(SUFFIX)]
        if len(found) != 1:
            raise FormatError(f"{location}: holds {len(found)} {SUFFIX} pairs, not one (a "
                              "folder of pairs is a dataset: open it with open_dataset)")
        return found[0]
    if name.endswith(SUFFIX[:-4]):
        return location.parent / f"{name}.idx"
    return location.parent / f"{name}{SUFFIX}"


def sibling(entry: Any, suffix: str) -> Any:
    """The file beside the index ``X.idx`` named ``X`` + ``suffix`` minus ``.sft``: its
    ``.bin`` (``.sft.bin``) or its sidecar (``.sft.packlab``)."""
    return entry.parent / f"{entry.name[:-4]}{suffix[4:]}"


def encode(packed: PackedBin, where: object, b: int) -> np.ndarray:
    """Bin ``b`` as Bridge's item of int32 words; a token id over 2**31-1 (it would reach the
    mask bit) is refused, naming the bin."""
    ids, mask, starts = packed
    n, length = int(starts.shape[0]), int(ids.shape[0])
    if ids.dtype.itemsize >= 4 and int(ids.max()) > MAX_ID:
        raise PacklabError(f"{where}: bin {b}: token id {int(ids.max())} over 2**31-1 (Bridge "
                           "keeps an id in 31 bits of its word, the loss mask in the top bit)")
    words = np.empty(HEADER_WORDS + n + length, dtype=WORDS)
    words[:HEADER_WORDS] = (ROW_MAGIC, ROW_VERSION, n)
    words[HEADER_WORDS:HEADER_WORDS + n] = starts
    body = words[HEADER_WORDS + n:].view("<u4")
    body[:] = mask
    body <<= 31
    np.bitwise_or(body, ids, out=body, casting="unsafe")
    return words


class Writer(SftFacts, ShardWriter):
    """Streams items to the ``.bin`` and checksums to the sidecar; the index, the sidecar's
    record and the publishing (``.bin``, sidecar, ``.idx`` last) at finalize. ``path``: the
    ``.idx``, the ``.bin`` or the prefix (``out/train.sft``)."""

    def __init__(self, path: str | os.PathLike[str] | Location, **options: Any) -> None:
        super().__init__(entry_of(path), **options)

    def _names(self) -> tuple[str, str, str]:
        entry = Path(self.target.path)
        return entry.name, sibling(entry, BIN).name, sibling(entry, SIDECAR).name

    def _open(self) -> None:
        idx, data, sidecar = self._names()
        self.tmp_path.mkdir()
        self._bin = HashedFile(self.tmp_path / data)
        self._sidecar = open(self.tmp_path / sidecar, "wb")  # noqa: SIM115 - closed in _close
        self._sidecar.write(bytes(_Sidecar.HEAD.size))  # the head is written last
        self._lengths = ScratchArray(self.tmp_path / ".lengths.scratch", "<i4")

    def _write(self, packed: PackedBin) -> None:
        words = encode(packed, self.path, self.bins_written)
        self._bin.write(words)
        self._sidecar.write(stored_checksum(*packed, "<i4").to_bytes(8, "little"))
        self._lengths.append(np.array([words.shape[0]]))

    def _close(self, record: dict[str, Any]) -> dict[str, Any]:
        idx, data, _ = self._names()
        self._lengths.finish()
        pair = {"bin": self._bin.close(),
                "idx": mmidx.write_index(self.tmp_path / idx, self._lengths, self.bins_written,
                                         WORDS)}
        self._lengths.discard()
        record.update(bin_checksum=CHECKSUM, bridge_commit=BRIDGE_COMMIT, pair=pair,
                      fingerprints={"bin": fingerprint(self.tmp_path / data, whole=False),
                                    "idx": fingerprint(self.tmp_path / idx, whole=True)})
        raw = json.dumps(record, indent=2).encode()
        sidecar = self._sidecar
        sidecar.write(raw)
        sidecar.write(_Sidecar.TAIL.pack(len(raw), _Sidecar.MAGIC))
        sidecar.seek(0)
        sidecar.write(_Sidecar.HEAD.pack(_Sidecar.MAGIC, _Sidecar.VERSION, self.bins_written,
                                         CHECKSUM.encode()))
        sidecar.flush()
        os.fsync(sidecar.fileno())
        sidecar.close()
        return record

    def _publish(self) -> None:
        """The ``.bin``, the sidecar, then the ``.idx``: the index makes the shard, so a crash
        before it leaves none (an old shard's index goes first: it disappears whole)."""
        folder = Path(self.target.path).parent
        idx, data, sidecar = self._names()
        if (folder / idx).exists() or (folder / idx).is_symlink():
            if not self.overwrite:
                raise PacklabError(f"{self.path}: already exists (pass overwrite=True to "
                                   "replace it)")
            os.unlink(folder / idx)
            fsync_directory(folder)
        for name in (data, sidecar, idx):
            os.replace(self.tmp_path / name, folder / name)
        fsync_directory(folder)
        remove(self.tmp_path)

    def _discard(self) -> None:
        for name in ("_bin", "_lengths"):
            handle = getattr(self, name, None)
            if handle is not None:
                handle.discard()
        sidecar = getattr(self, "_sidecar", None)
        if sidecar is not None and not sidecar.closed:
            sidecar.close()


class Reader(SftFacts, TableReads, ShardReader):
    """A pair read as Bridge reads it, item by item (:mod:`packlab.formats.read.item_table`).

    ``path``: the ``.idx``, the ``.bin`` or their prefix, local or on object storage.
    ``verify=True``: each bin checked against its sidecar checksum. ``pack_size``: the pack
    size of a pair without a sidecar (default: its longest bin); ``convention``: what that
    pack size counts (:data:`packlab.bins.CONVENTIONS`). ``cache_dir``: where an index on
    object storage is kept once fetched (default: :func:`packlab.storage.objects.cache_root`).
    """

    def __init__(self, path: str | os.PathLike[str] | Location, *, verify: bool = False,
                 pack_size: int | None = None, convention: str = "packlab",
                 cache_dir: str | os.PathLike[str] | None = None) -> None:
        super().__init__(entry_of(path))
        self.bin = sibling(self.path, BIN)
        self.verify = bool(verify)
        self.convention = check_convention(convention)
        self.cache_dir = None if cache_dir is None else str(cache_dir)
        self._idx, self._side = self._local_index()
        code, count, documents = mmidx.parse_header(head(self._idx, mmidx.HEADER_SIZE), self.path)
        if code != WORDS_CODE:
            name = mmidx.DTYPES[code].name if code in mmidx.DTYPES else "unknown"
            raise FormatError(f"{self.path}: dtype code {code} ({name}); a packed SFT pair "
                              f"holds int32 words (code {WORDS_CODE})")
        if count == 0:
            raise FormatError(f"{self.path}: holds no items (an empty packed SFT shard)")
        self.num_bins, self.num_documents = count, documents
        want = mmidx.HEADER_SIZE + 12 * count + 8 * documents
        if self._idx.stat().st_size != want:
            raise FormatError(f"{self.path}: {self._idx.stat().st_size} bytes, its header implies "
                              f"{want} (truncated or corrupted)")
        self.bin_bytes = _size(self.bin)
        if self.bin_bytes % WORDS.itemsize:
            raise FormatError(f"{self.bin}: {self.bin_bytes} bytes, not whole int32 words "
                              "(truncated or corrupted)")
        self.record = self._read_sidecar()
        self.has_checksums = self.record is not None
        refuse_unverifiable(self.path, self.verify, self.has_checksums)
        recorded = self.record or {}
        self._pack_size = pack_size if pack_size is not None else recorded.get("pack_size")
        self._num_tokens = recorded.get("num_tokens")
        self._num_seqs = recorded.get("num_seqs")
        self._table = None

    # -- what the sidecar records, or one pass over the items' headers -----------------------
    @property
    def pack_size(self) -> int:  # type: ignore[override]
        if self._pack_size is None:
            self._count()
        return int(self._pack_size)

    @pack_size.setter
    def pack_size(self, value: int) -> None:
        self._pack_size = value or None

    @property
    def num_tokens(self) -> int:  # type: ignore[override]
        if self._num_tokens is None:
            self._count()
        return int(self._num_tokens)

    @num_tokens.setter
    def num_tokens(self, value: int) -> None:
        self._num_tokens = value or None

    @property
    def num_seqs(self) -> int:
        if self._num_seqs is None:
            self._count()
        return int(self._num_seqs)

    def _count(self) -> None:
        """Tokens, sequences and the longest bin, from every item's header (one pass)."""
        lengths, seqs = self._table_now().summary()
        self._num_tokens, self._num_seqs = int(lengths.sum()), int(seqs.sum())
        if self._pack_size is None:
            self._pack_size = int(budget_used(lengths, seqs, self.convention).max())

    def _table_now(self) -> ItemTable:
        table = self.table()
        assert table is not None
        return table

    RECORD_ATTRIBUTE = "record"  # packlab's record, None in a file another program wrote

    def _handles(self) -> tuple[str, ...]:
        return ("_table",)

    # -- opening ------------------------------------------------------------------------------
    def _local_index(self) -> tuple[Path, Path | None]:
        """The index and the sidecar as local files: themselves, or (on object storage) their
        copies, fetched once into the cache (the index checked against the sidecar's record)."""
        entry, sidecar = self.path, sibling(self.path, SIDECAR)
        if self.location.is_local:
            return entry, sidecar if sidecar.is_file() else None
        raw = sidecar.read_bytes() if sidecar.is_file() else None
        expect = None
        if raw is not None:
            expect = _record_of(raw, sidecar).get("pair", {}).get("idx")
            version = f"sidecar:{_digest(raw)}"
        else:
            info = entry.info()
            version = f"{info.size}:{info.mtime_ns}"
        final = cache_entry(cache_root(self.cache_dir) / "index", entry, version)
        fetch_files(entry.parent, {entry.name: expect}, final,
                    last={sidecar.name: raw} if raw is not None else None)
        return final / entry.name, (final / sidecar.name) if raw is not None else None

    def _read_sidecar(self) -> dict[str, Any] | None:
        """The sidecar's record, checked against the pair it sits beside; None without one."""
        if self._side is None:
            return None
        where = sibling(self.path, SIDECAR)
        raw = self._side.read_bytes()
        record = _record_of(raw, where, checksums=self.num_bins)
        if record.get("format") != FORMAT or record.get("num_bins") != self.num_bins:
            raise FormatError(f"{where}: records {record.get('num_bins')!r} bins of "
                              f"{record.get('format')!r}, {self.path} holds {self.num_bins}")
        for key in ("pack_size", "num_tokens", "num_seqs"):
            count_field(record, key, where, minimum=1)
        pair = record.get("pair") if isinstance(record.get("pair"), dict) else {}
        files = {"idx": (self.path, self._idx.stat().st_size), "bin": (self.bin, self.bin_bytes)}
        for role, (file, have) in files.items():
            entry = pair.get(role)
            recorded = entry.get("bytes") if isinstance(entry, dict) else None
            if recorded != have:
                raise FormatError(f"{file}: {have} bytes, its sidecar {where.name} records "
                                  f"{recorded!r:.40} (truncated, or rewritten without its "
                                  "sidecar: remove the sidecar to read it unchecked)")
        return record

    def _placement(self, reads: FileReads) -> ItemPlacement:
        n, idx = self.num_bins, self._idx
        if self.record is not None:  # the pair is the one its sidecar was written with
            files = {"idx": (idx, True)}  # on object storage each read is one ranged GET:
            if not reads.in_place:  # there the per-bin checksums stand
                files["bin"] = (self.bin, False)
            check_fingerprints(self.record.get("fingerprints"), files,
                               f"its sidecar {sibling(self.path, SIDECAR).name}")
        index = _Index(reads.values(idx, "<i4", mmidx.HEADER_SIZE, n),
                       reads.values(idx, "<i8", mmidx.pointers_at(n), n), str(self.path))
        checksum = None
        if self.has_checksums:
            assert self._side is not None
            checksum = reads.lookups(self._side, "<u8", _Sidecar.HEAD.size, n)
        return ItemPlacement(Column(self.bin, WORDS, 0, self.bin_bytes // WORDS.itemsize), index,
                          self._decode, self._summarize,
                          self._pack_size or MAX_PACK_SIZE, str(self.bin), checksum)

    def placement(self) -> None:  # type: ignore[override]
        """None: its bins are decoded from items, not slices of columns (no raw CSR floor)."""
        return None

    # -- one item -----------------------------------------------------------------------------
    def _decode(self, b: int, item: np.ndarray) -> PackedBin:
        """Bin ``b`` from its item, checked as Bridge checks a row it decodes."""
        count = item.shape[0]
        magic, version, n = item[:HEADER_WORDS].tolist()
        if magic != ROW_MAGIC or version != ROW_VERSION or not 0 < n < count - HEADER_WORDS:
            raise self._bad_item(b, magic, version, n, count)
        starts = item[HEADER_WORDS:HEADER_WORDS + n]
        words = item[HEADER_WORDS + n:]
        length = count - HEADER_WORDS - n
        if n == 1:
            if starts[0] != 0:
                raise FormatError(f"{self.bin}: bin {b}: sequence starts {starts.tolist()} do not "
                                  "start at 0")
        elif starts[0] != 0 or starts[-1] >= length or not (starts[1:] > starts[:-1]).all():
            raise FormatError(f"{self.bin}: bin {b}: sequence starts {starts.tolist()[:8]} not "
                              f"0, increasing, below the item's {length} tokens (corrupted)")
        limit = self._pack_size
        if limit is not None and budget_used(length, n, self.convention) > limit:
            raise FormatError(f"{self.bin}: bin {b}: {length} tokens in {n} sequences, over "
                              f"pack_size {limit} ({self.convention} convention; corrupted)")
        # the starts copied: a view would keep the whole item (4 bytes a token) alive
        return PackedBin(words & MAX_ID, (words < 0).view(np.uint8), starts.copy())

    def _bad_item(self, b: int, magic: int, version: int, n: int, count: int) -> FormatError:
        if magic != ROW_MAGIC:
            what = f"bad magic {magic & 0xFFFFFFFF:#x} (not a Megatron-Bridge packed SFT item)"
        elif version != ROW_VERSION:
            what = f"item version {version}, this reader knows {ROW_VERSION}"
        else:
            what = f"boundary count {n} outside 1..{count - HEADER_WORDS - 1} (item of {count} words)"
        return FormatError(f"{self.bin}: bin {b}: {what}")

    def _summarize(self, lo: int, values: np.ndarray, firsts: np.ndarray,
                   counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Packed lengths and sequence counts of bins ``lo...`` from their headers alone."""
        magic, version, n = (values[firsts + k].astype(np.int64) for k in range(HEADER_WORDS))
        bad = (magic != ROW_MAGIC) | (version != ROW_VERSION) | (n <= 0) \
            | (n >= counts - HEADER_WORDS)
        if bad.any():
            k = int(np.argmax(bad))
            raise self._bad_item(lo + k, int(magic[k]), int(version[k]), int(n[k]),
                                 int(counts[k]))
        return counts - HEADER_WORDS - n, n

    # -- what inspect and validate say ----------------------------------------------------------
    def bytes_on_disk(self) -> int:
        side = self._side.stat().st_size if self._side is not None else 0
        return self._idx.stat().st_size + self.bin_bytes + side

    def info(self) -> dict[str, Any]:
        return {**super().info(), "num_seqs": self.num_seqs, "sidecar": self.has_checksums,
                "bridge_commit": (self.record or {}).get("bridge_commit")}

    def validate(self) -> dict[str, Any]:
        """The pair against the sidecar's sizes and checksums, the index, every item decoded
        and every invariant of every bin, each bin against its checksum."""
        if self.record is not None and self.location.is_local:
            pair = self.record["pair"]
            for role, file in (("idx", self._idx), ("bin", self.bin)):
                if sha256_file(file) != pair[role].get("sha256"):
                    raise FormatError(f"{file}: checksum differs from its sidecar's record "
                                      "(corrupted or replaced)")
        documents = np.fromfile(self._idx, dtype="<i8", count=self.num_documents,
                                offset=mmidx.HEADER_SIZE + 12 * self.num_bins)
        if documents[0] != 0 or documents[-1] != self.num_bins or (np.diff(documents) < 0).any():
            raise FormatError(f"{self.path}: document indices do not run from 0 to "
                              f"{self.num_bins} (corrupted)")
        pack_size = self.pack_size  # a pair without a sidecar: its headers read first
        reads = reads_for(self.location)
        placement = self._placement(reads)._replace(pack_size=pack_size)
        table = ItemTable(placement, reads)
        table.check_contents(token_limit=MAX_ID + 1, convention=self.convention)
        if placement.checksum is not None:
            table.check_checksums(placement.checksum)
        return {"format": FORMAT, "num_bins": self.num_bins, "num_tokens": self.num_tokens,
                "num_seqs": self.num_seqs, "pack_size": pack_size,
                "bytes_on_disk": self.bytes_on_disk(), "bin_checksums": self.has_checksums,
                "sidecar": self.has_checksums}


class _Index(ItemIndex):
    """The ``.idx``'s lengths and byte pointers, read as sliced: bin ``b`` is ``length[b]``
    words from word ``pointer[b] / 4`` of the ``.bin``."""

    __slots__ = ("num_bins", "_lengths", "_pointers", "source")

    def __init__(self, lengths: np.ndarray, pointers: np.ndarray, source: str) -> None:
        self.num_bins = int(lengths.shape[0])
        self._lengths, self._pointers = lengths, pointers
        self.source = source

    def runs(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        return (self._pointers[lo:hi].astype(np.int64) >> 2,
                self._lengths[lo:hi].astype(np.int64))

    def check(self, lo: int, hi: int, num_values: int) -> None:
        pointers = self._pointers[lo:hi].astype(np.int64)
        lengths = self._lengths[lo:hi].astype(np.int64)
        outside = mmidx.entries_outside(pointers, lengths, WORDS.itemsize,
                                        num_values * WORDS.itemsize, MIN_WORDS)
        if outside.any():
            b = int(np.argmax(outside))
            raise FormatError(f"{self.source}: bin {lo + b}: index entry (pointer "
                              f"{int(pointers[b])}, {int(lengths[b])} words) outside the .bin's "
                              f"{num_values} words or under {MIN_WORDS} words (corrupted)")
        previous = mmidx.end_before(self._pointers, self._lengths, lo, WORDS.itemsize)
        end = num_values * WORDS.itemsize if hi == self.num_bins else None
        b = mmidx.first_stray(pointers, lengths, WORDS.itemsize, previous, end)
        if b >= 0:
            raise FormatError(f"{self.source}: bin {lo + b}: byte pointer {int(pointers[b])} "
                              "does not follow the lengths (corrupted)")


def _record_of(raw: bytes, where: object, *, checksums: int | None = None) -> dict[str, Any]:
    """The record in a sidecar's bytes (its head and tail checked; with ``checksums``, that it
    holds that many); a FormatError naming ``where``."""
    head, tail = _Sidecar.HEAD.size, _Sidecar.TAIL.size
    if len(raw) < head + tail:
        raise FormatError(f"{where}: {len(raw)} bytes, too short for a packlab sidecar "
                          "(truncated)")
    magic, version, num_bins, algorithm = _Sidecar.HEAD.unpack(raw[:head])
    length, end = _Sidecar.TAIL.unpack(raw[-tail:])
    if magic != _Sidecar.MAGIC or end != _Sidecar.MAGIC or version != _Sidecar.VERSION \
            or algorithm.rstrip(b"\x00") != CHECKSUM.encode():
        raise FormatError(f"{where}: not a packlab sidecar of version {_Sidecar.VERSION} "
                          f"({magic!r}, {end!r}, version {version}; truncated or corrupted)")
    if head + 8 * num_bins + length + tail != len(raw):
        raise FormatError(f"{where}: {len(raw)} bytes for {num_bins} checksums and a "
                          f"{length}-byte record (truncated or corrupted)")
    if checksums is not None and num_bins != checksums:
        raise FormatError(f"{where}: records {num_bins} bins, its pair holds {checksums} "
                          "(rewritten without its sidecar: remove the sidecar to read it "
                          "unchecked)")
    record = parse_json(raw[head + 8 * num_bins:len(raw) - tail], where,
                        unreadable="unreadable record")
    if not isinstance(record, dict):
        raise FormatError(f"{where}: its record is not an object")
    return record


def _size(file: Any) -> int:
    """Bytes of a local file or an object; missing is a FormatError naming it."""
    location = as_location(file)
    if not location.is_file():
        raise FormatError(f"{file}: missing (a packed SFT pair needs its .bin beside its .idx)")
    return location.size()


def _digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()
