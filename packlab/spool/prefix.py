"""A spool as a Megatron-core ``.bin/.idx`` prefix: what Megatron-LM's ``SFTDataset`` reads.

Megatron-LM's pull request #5017 (``megatron/core/datasets/sft_dataset.py``, as of commit
``97b2c55e4c373a072c36e79104bcdac1d77c022f``) reads pre-tokenized conversations from an
ordinary ``IndexedDataset`` prefix, one sequence per conversation (it packs them itself and
derives their loss masks from the chat template's role markers: :mod:`packlab.spool.masks`).
:func:`packlab.spool.export.export_spool` writes a spool that way; :class:`packlab.spool.SpoolReader`
reads any such prefix back as a spool, through the spool's one read path (this module says
where a prefix's columns are). Files, for ``PREFIX`` (a path without suffix)::

    PREFIX.bin        the tokens, concatenated (int32; uint16 when the vocabulary fits, as
                      Megatron-core's DType.optimal_dtype decides), no header
    PREFIX.idx        Megatron-core MMIDIDX version 1 (packlab.codecs.mmidx): n sequences,
                      one document each
    PREFIX.masks.bin  packlab's sidecar: the spool's masks, uint8 per token, unshifted (a
                      spool's masks.bin byte for byte); Megatron-core never opens it
    PREFIX.spool.json packlab's record, published first: counts, vocabulary, every file's bytes
                      and sha256, where the spool came from

A literal record::

    {"version": "megatron_prefix_v1", "prefix": "conversations", "num_sequences": 3,
     "num_tokens": 17, "total_tokens": 17, "vocab_size": 100279, "tokens_dtype": "int32",
     "masks": "conversations.masks.bin",
     "files": {"conversations.bin": {"bytes": 68, "sha256": "..."},
               "conversations.idx": {"bytes": 114, "sha256": "..."},
               "conversations.masks.bin": {"bytes": 17, "sha256": "..."}},
     "source": {"encoding": "cl100k_base", ...},
     "exported_from": {"spool": "/data/chat_spool", "kind": "spool_v1", "masks": "spool"},
     "follows": "Megatron-LM pull request #5017 (SFTDataset) at 97b2c55e4c"}

A prefix with no record (written by Megatron's own tools) is read from its ``.idx`` and ``.bin``
alone, checked against each other; its masks come from chat markers. A prefix names files, not a
folder: Megatron-LM itself creates a folder ``PREFIX/`` beside them for its index cache, so a
folder there is not a spool unless it holds a spool's files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from packlab.codecs import mmidx
from packlab.errors import FormatError
from packlab.storage.files import DIRECTORY_RECORD, parse_versioned_json, read_bytes

PREFIX_VERSION = "megatron_prefix_v1"
SUFFIXES = {"bin": ".bin", "idx": ".idx", "masks": ".masks.bin", "record": ".spool.json"}
FOLLOWS = "Megatron-LM pull request #5017 (SFTDataset) at 97b2c55e4c"
# the keys of a prefix's record beyond a spool's (what ``packlab inspect`` does not list as extra)
RECORD_KEYS = frozenset({"prefix", "tokens_dtype", "masks", "exported_from", "follows"})


# the token dtypes a prefix may hold: megatron-core's integer DTypes
TOKEN_CODES = {code: dt for code, dt in mmidx.DTYPES.items() if dt.kind in "iu"}


class IndexHeader(NamedTuple):
    """What a prefix's ``.idx`` header says, and where its arrays start (:mod:`packlab.codecs.mmidx`)."""

    dtype: np.dtype
    num_sequences: int
    num_documents: int  # document indices in the file (documents + 1)

    @property
    def lengths_offset(self) -> int:
        return mmidx.HEADER_SIZE

    @property
    def pointers_offset(self) -> int:
        return mmidx.pointers_at(self.num_sequences)

    @property
    def documents_offset(self) -> int:
        return mmidx.documents_at(self.num_sequences)

    @property
    def size(self) -> int:
        """The bytes the whole index takes."""
        return self.documents_offset + 8 * self.num_documents


def read_index_header(path: Path) -> IndexHeader:
    """The header of the ``.idx`` at ``path``; a FormatError naming it when it is not a token
    index (missing, short, bad magic or version, a float dtype)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(mmidx.HEADER_SIZE)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    code, sequences, documents = mmidx.parse_header(raw, path)
    if code not in TOKEN_CODES:
        raise FormatError(f"{path}: dtype code {code} is not an integer token dtype "
                          f"(megatron-core's codes {', '.join(map(str, sorted(TOKEN_CODES)))})")
    return IndexHeader(TOKEN_CODES[code], sequences, documents)


def prefix_files(prefix: Path) -> dict[str, Path]:
    """``{"bin", "idx", "masks", "record"}`` -> the files of ``prefix``."""
    return {key: prefix.parent / f"{prefix.name}{suffix}" for key, suffix in SUFFIXES.items()}


def prefix_of(path: str | Path) -> Path | None:
    """The Megatron prefix ``path`` names (itself, or with ``.bin``/``.idx`` dropped) when its
    ``.idx`` is a file, and ``path`` is not a spool folder; else None. A file is never a
    prefix: ``chat.jsonl`` is a JSONL, and the ``chat.jsonl.idx`` beside it its line index."""
    path = Path(path)
    if path.is_dir() and ((path / DIRECTORY_RECORD).is_file() or (path / "tokens.bin").exists()):
        return None
    if path.suffix in (".bin", ".idx") and not path.name.endswith(SUFFIXES["masks"]):
        path = path.with_suffix("")
    return path if prefix_files(path)["idx"].is_file() and not path.is_file() else None


def is_prefix_folder(names: set[str]) -> bool:
    """Whether a folder holding the files ``names`` holds one prefix and nothing else (its
    ``.bin`` and ``.idx``, and any of packlab's sidecar and record): a spool, never a shard
    (a ``packed_index`` output on object storage takes its prefix along in such a folder)."""
    stems = {n[:-len(".idx")] for n in names if n.endswith(".idx")}
    if len(stems) != 1:
        return False
    files = {f.name for f in prefix_files(Path(stems.pop())).values()}
    return names <= files and len(names & files) >= 2 and any(n.endswith(".bin") for n in names)


class Prefix(NamedTuple):
    """A prefix opened: its index header, counts and record (checked against each other)."""

    path: Path
    header: IndexHeader
    num_tokens: int
    record: dict[str, Any]
    has_record: bool
    has_masks: bool

    @property
    def files(self) -> dict[str, Path]:
        return prefix_files(self.path)

    @property
    def data_files(self) -> dict[str, Path]:
        """The files its spool is made of (the sidecar when there is one), by file name."""
        keys = ("bin", "idx", "masks") if self.has_masks else ("bin", "idx")
        return {self.files[k].name: self.files[k] for k in keys}


def open_prefix(prefix: Path) -> Prefix:
    """Read and check ``prefix``'s index header, sizes and record; errors name the file."""
    files = prefix_files(prefix)
    header = read_index_header(files["idx"])
    idx_size = files["idx"].stat().st_size
    if idx_size != header.size:
        raise FormatError(f"{files['idx']}: {idx_size} bytes, its header implies {header.size} "
                          f"({header.num_sequences} sequences, {header.num_documents} document "
                          "indices; truncated or corrupted)")
    n = header.num_sequences
    if n == 0:
        raise FormatError(f"{files['idx']}: no sequences (an empty prefix: nothing to read)")
    width = header.dtype.itemsize
    with open(files["idx"], "rb") as f:
        f.seek(header.pointers_offset - 4)
        last_length = int(np.frombuffer(f.read(4), "<i4")[0])
        f.seek(header.documents_offset - 8)
        last_pointer = int(np.frombuffer(f.read(8), "<i8")[0])
    if last_length <= 0 or last_pointer < 0 or last_pointer % width:
        raise FormatError(f"{files['idx']}: sequence {n - 1}: length {last_length}, pointer "
                          f"{last_pointer} (corrupted)")
    num_tokens = last_pointer // width + last_length
    if not files["bin"].is_file():
        raise FormatError(f"{files['bin']}: missing (its .idx is there)")
    have = files["bin"].stat().st_size
    if have != num_tokens * width:
        raise FormatError(f"{files['bin']}: {have} bytes, its .idx says {num_tokens} tokens of "
                          f"{header.dtype.name} ({num_tokens * width} bytes; truncated, or an "
                          "index of another .bin)")
    has_record = files["record"].is_file()
    record = (read_prefix_record(files["record"], prefix, header, num_tokens) if has_record
              else {"num_sequences": n, "num_tokens": num_tokens, "vocab_size": None,
                    "files": {}, "source": {"megatron_prefix": prefix.name}})
    has_masks = files["masks"].is_file()
    if has_masks and files["masks"].stat().st_size != num_tokens:
        raise FormatError(f"{files['masks']}: {files['masks'].stat().st_size} bytes, one per "
                          f"token is {num_tokens} (truncated, or the masks of another prefix)")
    if has_record and record.get("masks") is not None and not has_masks:
        raise FormatError(f"{files['masks']}: missing (its record lists it)")
    return Prefix(prefix, header, num_tokens, record, has_record, has_masks)


def read_prefix_record(file: Path, prefix: Path, header: IndexHeader,
                       num_tokens: int) -> dict[str, Any]:
    """``PREFIX.spool.json``, checked against the index it describes."""
    record = parse_versioned_json(read_bytes(file, unreadable="unreadable record"), file,
                                  version=PREFIX_VERSION, kind="record")
    counts = (record.get("num_sequences"), record.get("num_tokens"))
    if counts != (header.num_sequences, num_tokens):
        raise FormatError(f"{file}: records {counts[0]} sequences / {counts[1]} tokens, the "
                          f"index holds {header.num_sequences} / {num_tokens} (another "
                          "export's record, or a changed .idx)")
    files = record.get("files")
    names = {f.name for key, f in prefix_files(prefix).items() if key != "record"}
    if not isinstance(files, dict) or not set(files) <= names or not all(
            isinstance(e, dict) and isinstance(e.get("bytes"), int)
            and isinstance(e.get("sha256"), str) for e in files.values()):
        raise FormatError(f"{file}: 'files' must map {', '.join(sorted(names))} to bytes and "
                          "sha256")
    vocab = record.get("vocab_size")
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int) or vocab < 1):
        raise FormatError(f"{file}: 'vocab_size' must be a positive integer, not "
                          f"{json.dumps(vocab)[:40]}")
    return record


def check_documents(prefix: Path, num_sequences: int) -> None:
    """The document indices of ``prefix``'s index: from 0 to ``num_sequences``, never
    decreasing (a document of several sequences is still read one sequence per conversation,
    as Megatron-LM's ``SFTDataset`` reads it)."""
    file = prefix_files(prefix)["idx"]
    header = read_index_header(file)
    documents = np.memmap(file, "<i8", "r", header.documents_offset, (header.num_documents,))
    if header.num_documents < 1 or documents[0] != 0 or documents[-1] != num_sequences or (
            np.diff(documents) < 0).any():
        raise FormatError(f"{file}: document indices must rise from 0 to {num_sequences} "
                          "(corrupted)")


def write_record(file: Path, record: dict[str, Any]) -> None:
    """The record as JSON (the caller publishes it, last)."""
    file.write_text(json.dumps(record, indent=2) + "\n")
