"""Spools: tokenized sequences written once, streaming, read through memory maps.

Version ``spool_v1`` (compatible with Nemotron's spool), one directory::

    tokens.bin     int32    all tokens, concatenated
    masks.bin      uint8    1 = a token the model must learn to produce (unshifted)
    offsets.bin    uint64   token offset of each sequence
    lengths.bin    uint32   length of each sequence
    manifest.json  written last

A literal record (``manifest.json``), as :class:`SpoolWriter` writes it::

    {"version": "spool_v1", "num_sequences": 3, "num_tokens": 17, "total_tokens": 17,
     "tokens_dtype": "int32", "mask_dtype": "uint8", "offsets_dtype": "uint64",
     "lengths_dtype": "uint32",
     "dtypes": {"tokens": "<i4", "masks": "|u1", "offsets": "<u8", "lengths": "<u4"},
     "vocab_size": 131072,
     "files": {"tokens.bin": {"bytes": 68, "sha256": "..."}, ...},
     "ranges": {"sequences": 8192, "checksum": "xxh3_64",
                "tokens.bin": [1234567890123456789], "masks.bin": [987654321098765432]},
     "source": {"generator": "synth", "profile": "chat", "seed": 0}}

``ranges`` is the spool's checksum per range of ``sequences`` consecutive sequences (the last
range may be shorter), for its two large files: what ``pack`` verifies as it reads, range by
range, so a corrupted spool is refused naming the file and the sequences, never packed into
fresh checksums (:meth:`SpoolReader.verify_sequences`). ``lengths.bin`` and ``offsets.bin``
are verified whole against ``files`` before a plan is trusted (:meth:`SpoolReader.verify_index`).

Nemotron's ``SequenceSpoolWriter.finalize`` writes the same directory with a record of its
own: ``version``, ``num_sequences``, ``total_tokens`` (not ``num_tokens``), the four
``*_dtype`` keys above, whatever ``extra_manifest`` its caller passes (its chat SFT stage:
``shard_id``, ``input_files``, ``chat_template``, ``seed``, ``tokenization_stats``...) and no
checksums. Both are read (:func:`read_spool_record`): either count key, either spelling of
the dtypes, unknown keys kept (:func:`record_extra`; ``packlab inspect`` shows them). A
packlab spool record carries Nemotron's keys too, so a packlab spool is a Nemotron spool. Where a
spool records no checksums, :meth:`SpoolReader.file_checksums` computes them (once) for those
who must notice a change later (``packed_index``).

The writer builds the directory under a temporary name and renames it once, after the
record: a crash never leaves a half spool under the final name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from xxhash import xxh3_64

from packlab.errors import FormatError, PacklabError
from packlab.spool.custody import RANGED, SpoolCustody
from packlab.spool.custody import is_count as _is_count
from packlab.spool.masks import MarkerTokens, derive_masks
from packlab.spool.prefix import (
    PREFIX_VERSION,
    RECORD_KEYS,
    check_documents,
    open_prefix,
    prefix_of,
)
from packlab.storage.files import (
    DIRECTORY_RECORD,
    HashedFile,
    Staging,
    file_entry,
    parse_versioned_json,
    read_versioned_json,
    sha256_file,
)
from packlab.storage.reads import file_identity, in_pieces, mapped

SPOOL_VERSION = "spool_v1"
DTYPES = {
    "tokens": np.dtype("<i4"),
    "masks": np.dtype("|u1"),
    "offsets": np.dtype("<u8"),
    "lengths": np.dtype("<u4"),
}
FILES = {name: f"{name}.bin" for name in DTYPES}
SPOOL_RECORD = DIRECTORY_RECORD  # a spool's record (spool_v1, Nemotron's name for it too)
# Nemotron's names for the dtypes (its SequenceSpoolWriter.finalize), written as numpy names.
NEMOTRON_DTYPE_KEYS = {"tokens": "tokens_dtype", "masks": "mask_dtype",
                       "offsets": "offsets_dtype", "lengths": "lengths_dtype"}
COUNT_KEYS = ("num_tokens", "total_tokens")  # packlab's, Nemotron's: either, equal when both
KNOWN_KEYS = frozenset({"version", "num_sequences", *COUNT_KEYS, "dtypes",
                        *NEMOTRON_DTYPE_KEYS.values(), "vocab_size", "files", "ranges", "source"})
_FLUSH_TOKENS = 1 << 20
RANGE_SEQUENCES = 8192  # sequences per range checksum (13M sequences: 1,600 ranges)


#: spools verified in this process, by what their verification depends on (``_identity``)
_VERIFIED: set[tuple[Any, ...]] = set()

class SpoolWriter:
    """Streaming spool writer; keyword-only, a context manager.

    Memory is bounded by one flush buffer (about 1M tokens), never by the spool.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        vocab_size: int | None = None,
        source: dict[str, Any] | None = None,
        overwrite: bool = False,
    ) -> None:
        self.path = Path(path)
        self.vocab_size = vocab_size
        self.source = dict(source or {})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._staging = Staging(self.path, overwrite=overwrite, directory=True)
        self._files = {name: HashedFile(self._staging.path / FILES[name], aligned=False)
                       for name in DTYPES}  # its own flushes size the writes
        self._pending_tokens: list[np.ndarray] = []
        self._pending_masks: list[np.ndarray] = []
        self._pending_lengths: list[np.ndarray] = []
        self._pending_count = 0
        self.num_sequences = 0
        self.num_tokens = 0
        self._closed = False
        self._range_hash = {name: xxh3_64() for name in RANGED}
        self._range_fill = 0  # sequences in the range being hashed
        self._ranges: dict[str, list[int]] = {name: [] for name in RANGED}

    def __enter__(self) -> SpoolWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()

    def append(self, tokens: np.ndarray, mask: np.ndarray) -> None:
        """Append one sequence: its token ids and its 0/1 learn mask (same length, > 0)."""
        tokens = np.asarray(tokens)
        mask = np.asarray(mask)
        self.append_many(tokens, mask, np.array([tokens.shape[0]], dtype=np.int64))

    def append_many(self, tokens: np.ndarray, masks: np.ndarray, lengths: np.ndarray) -> None:
        """Append many sequences given flat tokens, flat masks and per-sequence lengths."""
        if self._closed:
            raise PacklabError(f"{self.path}: writer already finalized")
        tokens = np.asarray(tokens)
        masks = np.asarray(masks)
        lengths = np.asarray(lengths, dtype=np.int64)
        if tokens.ndim != 1 or masks.ndim != 1 or lengths.ndim != 1:
            raise PacklabError(f"{self.path}: tokens, masks and lengths must be 1-D")
        if tokens.shape != masks.shape:
            raise PacklabError(
                f"{self.path}: sequence {self.num_sequences}: {tokens.shape[0]} tokens "
                f"but {masks.shape[0]} mask values"
            )
        if lengths.size and int(lengths.min()) <= 0:
            bad = self.num_sequences + int(np.argmax(lengths <= 0))
            raise PacklabError(f"{self.path}: sequence {bad}: empty sequences cannot be spooled")
        if int(lengths.sum()) != tokens.shape[0]:
            raise PacklabError(f"{self.path}: lengths sum to {int(lengths.sum())}, "
                               f"but {tokens.shape[0]} tokens were given")
        if tokens.size:
            if not np.issubdtype(tokens.dtype, np.integer):
                raise PacklabError(f"{self.path}: token ids must be integers, got {tokens.dtype}")
            lo, hi = int(tokens.min()), int(tokens.max())
            limit = self.vocab_size if self.vocab_size is not None else 2**31
            if lo < 0 or hi >= limit:
                raise PacklabError(f"{self.path}: token id out of range [0, {limit}): {lo}..{hi}")
            if masks.dtype != np.bool_ and (
                not np.issubdtype(masks.dtype, np.integer)
                or int(masks.min()) < 0
                or int(masks.max()) > 1
            ):
                raise PacklabError(f"{self.path}: mask values must be 0 or 1 (integers or bool)")
        self._pending_tokens.append(tokens.astype(DTYPES["tokens"], copy=False))
        self._pending_masks.append(masks.astype(DTYPES["masks"], copy=False))
        self._pending_lengths.append(lengths)
        self._pending_count += tokens.shape[0]
        if self._pending_count >= _FLUSH_TOKENS:
            self._flush()

    def _flush(self) -> None:
        if not self._pending_lengths:
            return
        lengths = np.concatenate(self._pending_lengths)
        offsets = self.num_tokens + np.concatenate(([0], np.cumsum(lengths)[:-1]))
        tokens = np.concatenate(self._pending_tokens)
        masks = np.concatenate(self._pending_masks)
        self._hash_ranges({"tokens": tokens, "masks": masks}, lengths)
        self._files["tokens"].write(tokens)
        self._files["masks"].write(masks)
        self._files["offsets"].write(offsets.astype(DTYPES["offsets"]))
        self._files["lengths"].write(lengths.astype(DTYPES["lengths"]))
        self.num_sequences += lengths.shape[0]
        self.num_tokens += int(lengths.sum())
        self._pending_tokens.clear()
        self._pending_masks.clear()
        self._pending_lengths.clear()
        self._pending_count = 0

    def _hash_ranges(self, data: dict[str, np.ndarray], lengths: np.ndarray) -> None:
        """Feed each range's hash its sequences' bytes, closing a range every
        :data:`RANGE_SEQUENCES` sequences."""
        ends = np.concatenate(([0], np.cumsum(lengths)))
        i, n = 0, lengths.shape[0]
        while i < n:
            take = min(RANGE_SEQUENCES - self._range_fill, n - i)
            lo, hi = int(ends[i]), int(ends[i + take])
            for name in RANGED:
                self._range_hash[name].update(memoryview(data[name][lo:hi]).cast("B"))
            self._range_fill += take
            i += take
            if self._range_fill == RANGE_SEQUENCES:
                self._close_range()

    def _close_range(self) -> None:
        for name in RANGED:
            self._ranges[name].append(self._range_hash[name].intdigest())
            self._range_hash[name].reset()
        self._range_fill = 0

    def finalize(self) -> dict[str, Any]:
        """Flush, write the record last and publish the directory atomically."""
        if self._closed:
            raise PacklabError(f"{self.path}: writer already finalized")
        self._flush()
        if self.num_sequences == 0:
            self.abort()
            raise PacklabError(f"{self.path}: no sequences were written (empty spool)")
        files = {FILES[name]: f.close() for name, f in self._files.items()}
        if self._range_fill:
            self._close_range()
        record = {
            "version": SPOOL_VERSION,
            "num_sequences": self.num_sequences,
            "num_tokens": self.num_tokens,
            "total_tokens": self.num_tokens,
            **{key: DTYPES[name].name for name, key in NEMOTRON_DTYPE_KEYS.items()},
            "dtypes": {name: dt.str for name, dt in DTYPES.items()},
            "vocab_size": self.vocab_size,
            "files": files,
            "ranges": {"sequences": RANGE_SEQUENCES, "checksum": "xxh3_64",
                       **{FILES[name]: self._ranges[name] for name in RANGED}},
            "source": self.source,
        }
        (self._staging.path / SPOOL_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        try:
            self._staging.publish()
        except BaseException:  # e.g. a file where the spool goes: no temporary left behind
            self.abort()
            raise
        self._closed = True
        return record

    def abort(self) -> None:
        """Drop everything written so far; nothing appears under the final name."""
        for f in self._files.values():
            f.discard()
        self._staging.discard()
        self._closed = True


class Column(NamedTuple):
    """Where one of a spool's arrays is: its file, dtype and the byte offset of its first value."""

    path: Path
    dtype: np.dtype
    offset: int = 0


class SpoolReader(SpoolCustody):
    """Memory-mapped spool reader: opening costs the record; sequences are views.

    ``path`` is a spool folder (``spool_v1``) or a Megatron-core ``.bin/.idx`` prefix
    (:mod:`packlab.spool.prefix`): the same reads over either, only where the columns are
    differs. A prefix's masks are its sidecar ``PREFIX.masks.bin``; with ``markers`` (or for a
    prefix without a sidecar) they are derived from the tokens' chat role markers as
    Megatron-LM derives them (:mod:`packlab.spool.masks`), once per reader, in memory (one byte
    a token; ``packlab export`` writes them as a sidecar once for all).
    """

    FILES = FILES  # what the chain of custody checks (packlab.spool.custody)
    RECORD_NAME = SPOOL_RECORD

    def __init__(self, path: str | os.PathLike[str], *,
                 markers: MarkerTokens | None = None) -> None:
        self.path = Path(path)
        self.markers = markers
        prefix = prefix_of(self.path)
        if prefix is None:
            self.record = read_spool_record(self.path)
            self.root, self.record_path, self.kind = self.path, self.path / SPOOL_RECORD, SPOOL_VERSION
            self.columns = {name: Column(self.path / FILES[name], DTYPES[name]) for name in DTYPES}
            self.data_files = {FILES[name]: self.path / FILES[name] for name in DTYPES}
            self._pointer_width = 1  # offsets.bin counts tokens
        else:
            opened = open_prefix(prefix)
            files, header = opened.files, opened.header
            self.path, self.root, self.record, self.kind = prefix, prefix.parent, opened.record, \
                PREFIX_VERSION
            self.record_path = files["record"] if opened.has_record else files["idx"]
            self.columns = {"tokens": Column(files["bin"], header.dtype),
                            "lengths": Column(files["idx"], np.dtype("<i4"),
                                              header.lengths_offset),
                            "offsets": Column(files["idx"], np.dtype("<i8"),
                                              header.pointers_offset)}
            if opened.has_masks:
                self.columns["masks"] = Column(files["masks"], DTYPES["masks"])
            self.data_files = opened.data_files
            self._pointer_width = header.dtype.itemsize  # its pointers count bytes
        self.num_sequences: int = int(self.record["num_sequences"])
        self.num_tokens: int = int(self.record["num_tokens"])
        self.vocab_size: int | None = self.record.get("vocab_size")
        if markers is not None:
            self.columns.pop("masks", None)  # derived from the tokens instead
        if prefix is None:
            self._check_sizes()
        self._maps: dict[str, np.ndarray] | None = None
        self._derived: np.ndarray | None = None
        self._checksums: dict[str, dict[str, Any]] | None = None

    @property
    def token_dtype(self) -> np.dtype:
        return self.columns["tokens"].dtype

    @property
    def has_masks(self) -> bool:
        """Whether masks can be read: from a file, or derived from the markers given."""
        return "masks" in self.columns or self.markers is not None

    def file_checksums(self) -> dict[str, dict[str, Any]]:
        """``{file: {"bytes", "sha256"}}`` of the data files (names in :attr:`root`): the
        record's when it lists them all (packlab's), else computed once per reader (Nemotron's
        spools and Megatron's own prefixes record none)."""
        recorded = self.record.get("files")
        if isinstance(recorded, dict) and all(
            isinstance(recorded.get(name), dict) and "sha256" in recorded[name]
            for name in self.data_files
        ):
            return {name: dict(recorded[name]) for name in self.data_files}
        if self._checksums is None:
            self._checksums = {name: file_entry(file) for name, file in self.data_files.items()}
        return {name: dict(entry) for name, entry in self._checksums.items()}

    def _check_sizes(self) -> None:
        expected = {
            "tokens": self.num_tokens,
            "masks": self.num_tokens,
            "offsets": self.num_sequences,
            "lengths": self.num_sequences,
        }
        for name, count in expected.items():
            file = self.path / FILES[name]
            if not file.is_file():
                raise FormatError(f"{file}: missing spool file")
            want = count * DTYPES[name].itemsize
            have = file.stat().st_size
            if have != want:
                raise FormatError(
                    f"{file}: {have} bytes, the record says {want} "
                    f"({count:,} {DTYPES[name].name} values): truncated or corrupted spool"
                )

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_maps"] = None
        state["_derived"] = None  # derived again in the process that reads
        return state

    def _map(self) -> dict[str, np.ndarray]:
        if self._maps is None:
            counts = {"tokens": self.num_tokens, "masks": self.num_tokens,
                      "offsets": self.num_sequences, "lengths": self.num_sequences}
            maps = {name: _mapped(c, counts[name]) for name, c in self.columns.items()}
            if self._pointer_width > 1:  # byte pointers: token offsets, as offsets.bin holds
                maps["offsets"] = (maps["offsets"] // self._pointer_width).astype(np.uint64)
            self._maps = maps
        return self._maps

    @property
    def tokens(self) -> np.ndarray:
        return self._map()["tokens"]

    @property
    def masks(self) -> np.ndarray:
        maps = self._map()
        if "masks" in maps:
            return maps["masks"]
        if self._derived is None:
            self._derived = derive_masks(maps["tokens"], maps["offsets"], maps["lengths"],
                                         self._markers_or_refuse())
        return self._derived

    def _markers_or_refuse(self) -> MarkerTokens:
        if self.markers is None:
            raise FormatError(f"{self.path}: no mask sidecar ({self.path.name}.masks.bin): pass "
                              "chat markers to derive the masks from the tokens (--chat-markers "
                              "TOKENIZER), or export the prefix with them once")
        return self.markers

    def masks_of(self, lo: int, hi: int) -> np.ndarray:
        """The masks of sequences ``lo..hi-1``, concatenated: read from the mask file, or
        derived for those sequences only (a pass over billions of tokens in bounded memory)."""
        maps = self._map()
        if "masks" not in maps and self._derived is None:
            return derive_masks(maps["tokens"], maps["offsets"][lo:hi], maps["lengths"][lo:hi],
                                self._markers_or_refuse())
        return self._runs(self.masks, lo, hi)

    def tokens_of(self, lo: int, hi: int) -> np.ndarray:
        """The tokens of sequences ``lo..hi-1``, concatenated (in the file's dtype)."""
        return self._runs(self.tokens, lo, hi)

    def _runs(self, values: np.ndarray, lo: int, hi: int) -> np.ndarray:
        """``values`` of sequences ``lo..hi-1``: one slice when they lie in file order, one
        after another (every spool packlab writes), else gathered sequence by sequence."""
        offsets, lengths = self.offsets[lo:hi], self.lengths[lo:hi].astype(np.int64)
        first, total = int(offsets[0]), int(lengths.sum())
        if int(offsets[-1]) + int(lengths[-1]) - first == total and (
                offsets[1:].astype(np.int64) == offsets[:-1] + lengths[:-1]).all():
            return np.asarray(values[first:first + total])
        return np.concatenate([values[int(o):int(o) + int(n)] for o, n in zip(
            offsets.tolist(), lengths.tolist(), strict=True)])

    @property
    def offsets(self) -> np.ndarray:
        return self._map()["offsets"]

    @property
    def lengths(self) -> np.ndarray:
        return self._map()["lengths"]

    def __len__(self) -> int:
        return self.num_sequences

    def read_sequence(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """Tokens and learn mask of one sequence, as read-only views into the memory map."""
        if not 0 <= index < self.num_sequences:
            raise IndexError(f"{self.path}: sequence {index} out of range [0, {self.num_sequences})")
        maps = self._map()
        start = int(maps["offsets"][index])
        stop = start + int(maps["lengths"][index])
        if stop > self.num_tokens:
            raise FormatError(f"{self.path}: sequence {index}: offsets point past the tokens")
        return maps["tokens"][start:stop], self.masks[start:stop]

    def iter_sequences(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(self.num_sequences):
            yield self.read_sequence(i)

    def verify(self) -> None:
        """Full check: checksums, offsets consistent with lengths, masks 0/1, tokens in range
        (and a prefix's document indices); a prefix without masks is checked without them.

        Once a process while the spool's files are unchanged (device, inode, size, modification
        time of each): the shards of one output that share a spool each ask for it, and at 13M
        sequences each check is a pass over 14 GB."""
        key = self._identity()
        if key is not None and key in _VERIFIED:
            return
        self._verify()
        if key is not None:
            _VERIFIED.add(key)

    def _identity(self) -> tuple[Any, ...] | None:
        """What the spool's verification depends on: its record's files, as they are now
        (``None`` for a spool whose record lists none, such as a Megatron prefix)."""
        names = sorted(self.record.get("files", {}))
        if not names:
            return None
        return (str(self.root.resolve()), json.dumps(self.record, sort_keys=True, default=str),
                *(file_identity(self.root / name) for name in names))

    def _verify(self) -> None:
        for name, entry in self.record.get("files", {}).items():
            digest = sha256_file(self.root / name)
            if digest != entry.get("sha256"):
                raise FormatError(f"{self.root / name}: checksum mismatch (corrupted spool)")
        lengths = self.lengths.astype(np.int64)
        starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        offsets = self.offsets.astype(np.int64)
        follows = (starts == offsets) & (lengths > 0)
        if self._pointer_width > 1:  # a byte pointer must fall on a token
            c = self.columns["offsets"]
            pointers = np.memmap(c.path, c.dtype, "r", c.offset, (self.num_sequences,))
            follows &= np.asarray(pointers) == starts * self._pointer_width
        if not follows.all():
            bad = int(np.argmax(~follows))
            raise FormatError(f"{self.columns['offsets'].path}: sequence {bad}: offset does "
                              "not follow lengths")
        if int(lengths.sum()) != self.num_tokens:
            raise FormatError(f"{self.columns['lengths'].path}: lengths sum to "
                              f"{int(lengths.sum())}, the record says {self.num_tokens} tokens")
        if self.kind == PREFIX_VERSION:
            check_documents(self.path, self.num_sequences)
        if self.num_tokens and self.has_masks and max(
                int(piece.max()) for piece in in_pieces(self.masks)) > 1:
            raise FormatError(f"{self.columns['masks'].path}: mask values must be 0 or 1")
        if self.num_tokens:
            lo = min(int(piece.min()) for piece in in_pieces(self.tokens))
            hi = max(int(piece.max()) for piece in in_pieces(self.tokens))
            limit = self.vocab_size if self.vocab_size is not None else 2**31
            if lo < 0 or hi >= limit:
                raise FormatError(f"{self.columns['tokens'].path}: token ids {lo}..{hi} "
                                  f"outside [0, {limit})")


def _mapped(column: Column, count: int) -> np.ndarray:
    """A spool column's ``count`` values, a read-only view of the process's one map of its
    file (:func:`packlab.storage.reads.mapped`)."""
    if count == 0:
        return np.empty(0, dtype=column.dtype)
    return mapped(column.path).view(column.dtype, column.offset, count)


def is_spool_record(raw: bytes) -> bool:
    """Whether the bytes of a ``manifest.json`` are a spool's (a JSON object whose version is
    :data:`SPOOL_VERSION`, packlab's or Nemotron's); damage or another document: False."""
    try:
        parse_versioned_json(raw, SPOOL_RECORD, version=SPOOL_VERSION, kind="record")
    except FormatError:
        return False
    return True


def read_spool_record(path: Path) -> dict[str, Any]:
    """Read and check a spool record, packlab's or Nemotron's; errors name the file.

    Returns the record as written, plus ``num_tokens`` where only Nemotron's
    ``total_tokens`` is there (so every reader asks one key).
    """
    if not path.exists():
        raise FormatError(f"{path}: no such spool")
    if path.is_file():
        raise FormatError(f"{path}: a file, not a spool (a folder: `packlab tokenize CHAT.jsonl "
                          "SPOOL` or `packlab synth SPOOL` writes one)")
    record_path = path / SPOOL_RECORD
    record = read_versioned_json(record_path, version=SPOOL_VERSION, kind="record",
                                 unreadable="unreadable record")
    if record is None:
        raise FormatError(f"{record_path}: missing (not a spool, or an unfinished one)")
    if not _is_count(record.get("num_sequences")):
        raise FormatError(f"{record_path}: bad or missing 'num_sequences'")
    counts = {key: record[key] for key in COUNT_KEYS if key in record}
    if not counts or not all(_is_count(v) for v in counts.values()):
        raise FormatError(f"{record_path}: bad or missing 'num_tokens' (or Nemotron's "
                          f"'total_tokens'): {counts or 'neither is there'}")
    if len(set(counts.values())) > 1:
        raise FormatError(f"{record_path}: num_tokens {counts['num_tokens']} but "
                          f"total_tokens {counts['total_tokens']}")
    record = {**record, "num_tokens": next(iter(counts.values()))}
    if record["num_sequences"] == 0:
        raise FormatError(f"{path}: empty spool (0 sequences, {record['num_tokens']} tokens): "
                          "nothing to read or pack")
    vocab_size = record.get("vocab_size")
    if vocab_size is not None and not (_is_count(vocab_size) and vocab_size > 0):
        raise FormatError(f"{record_path}: bad 'vocab_size' {vocab_size!r:.40} (a positive "
                          "integer, or null when unknown)")
    _check_dtypes(record, record_path)
    if not isinstance(record.get("files", {}), dict):
        raise FormatError(f"{record_path}: 'files' must map file names to sizes and checksums")
    return record


def record_extra(record: dict[str, Any]) -> dict[str, Any]:
    """The record's keys that no spool reader needs (Nemotron's ``shard_id``,
    ``input_files``, ``chat_template``, ...): kept, and shown by ``packlab inspect``."""
    return {k: v for k, v in record.items() if k not in KNOWN_KEYS | RECORD_KEYS}


def _check_dtypes(record: dict[str, Any], where: Path) -> None:
    """The dtypes a record states (packlab's ``dtypes`` or Nemotron's ``*_dtype`` keys) must
    be the spool format's: the files are read as exactly those."""
    dtypes = record.get("dtypes", {})
    if not isinstance(dtypes, dict):
        raise FormatError(f"{where}: 'dtypes' must map tokens/masks/offsets/lengths to dtypes")
    for name, expected in DTYPES.items():
        stated = [(f"dtypes.{name}", dtypes[name])] if name in dtypes else []
        if NEMOTRON_DTYPE_KEYS[name] in record:
            stated.append((NEMOTRON_DTYPE_KEYS[name], record[NEMOTRON_DTYPE_KEYS[name]]))
        for key, value in stated:
            try:
                same = isinstance(value, str) and np.dtype(value) == expected
            except TypeError:
                same = False
            if not same:
                raise FormatError(f"{where}: {name} dtype {value} ({key}), expected "
                                  f"{expected.str} ({expected.name})")


def spool_record_at(path: Path) -> tuple[dict[str, Any], Path] | None:
    """The record of the spool at ``path`` (a spool folder, or a Megatron prefix) and the
    folder its data files are in; None when nothing is there (a damaged record raises)."""
    prefix = prefix_of(path)
    if prefix is not None:
        return open_prefix(prefix).record, prefix.parent
    if not (path / SPOOL_RECORD).is_file():
        return None
    return read_spool_record(path), path
