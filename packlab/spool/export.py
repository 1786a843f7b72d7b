"""A spool written as a Megatron-core ``.bin/.idx`` prefix (one document per sequence), with
packlab's mask sidecar and record beside it. That is what Megatron-LM's ``SFTDataset`` reads
(:mod:`packlab.spool.prefix` says the files and the commit of Megatron-LM they follow).

Streamed: sequences are copied a chunk at a time (memory: one chunk of tokens, whatever the
spool's size); every file is written under a hidden temporary name and renamed into place, the
record first (so whatever of the prefix a killed export published is known for its own), then
the ``.bin`` and the mask sidecar, and the ``.idx`` last (megatron-core opens the ``.idx``
first: a prefix without its ``.idx`` is nothing, never half a prefix).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packlab.codecs import mmidx
from packlab.errors import PacklabError
from packlab.spool import SpoolReader
from packlab.spool.masks import MarkerTokens
from packlab.spool.prefix import FOLLOWS, PREFIX_VERSION, prefix_files, write_record
from packlab.storage.files import HashedFile, publish, refuse_existing, remove, temporary_sibling
from packlab.storage.reads import RESIDENT, in_pieces

_CHUNK_TOKENS = 1 << 22  # tokens copied per step


def token_dtype(vocab_size: int | None) -> np.dtype:
    """megatron-core's ``DType.optimal_dtype``: uint16 below 65500 ids, else int32."""
    return np.dtype("<u2") if vocab_size is not None and vocab_size < 65500 else np.dtype("<i4")


class _Lengths:
    """The spool's lengths, a chunk at a time (what :func:`packlab.codecs.mmidx.write_index` reads)."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def chunks(self) -> Iterator[np.ndarray]:
        for lo in range(0, self.lengths.shape[0], 1 << 17):
            yield np.asarray(self.lengths[lo:lo + (1 << 17)], dtype="<i4")


def sequence_chunks(reader: SpoolReader) -> Iterator[tuple[int, int]]:
    """``(lo, hi)`` ranges of sequences holding about ``_CHUNK_TOKENS`` tokens each (one
    sequence when it is longer): what the export holds in memory at a time."""
    ends = np.cumsum(reader.lengths, dtype=np.int64)
    lo = 0
    while lo < reader.num_sequences:
        base = int(ends[lo - 1]) if lo else 0
        hi = max(lo + 1, int(np.searchsorted(ends, base + _CHUNK_TOKENS, side="right")))
        yield lo, min(hi, reader.num_sequences)
        lo = hi


def export_spool(spool: str | os.PathLike[str] | SpoolReader, prefix: str | os.PathLike[str],
                 *, markers: MarkerTokens | None = None, overwrite: bool = False
                 ) -> dict[str, Any]:
    """Write ``spool`` (a spool folder, or a Megatron prefix read as one) as the prefix
    ``prefix`` (a local path without suffix); its record. ``markers``: the sidecar holds masks
    derived from the chat role markers instead of the spool's own (a Megatron-written prefix
    has none to copy)."""
    reader = spool if isinstance(spool, SpoolReader) else SpoolReader(spool, markers=markers)
    if markers is not None and reader.markers != markers:
        reader = SpoolReader(reader.path, markers=markers)
    prefix = Path(prefix)
    files = prefix_files(prefix)
    if not prefix.parent.is_dir():
        raise PacklabError(f"{prefix.parent}: no such folder to export {prefix.name} into")
    for file in files.values():
        refuse_existing(file, overwrite=overwrite)
    dtype = token_dtype(reader.vocab_size)
    largest = max((int(piece.max()) for piece in in_pieces(reader.tokens)), default=0)
    if largest > np.iinfo(dtype).max:
        raise PacklabError(f"{reader.path}: token id {largest} does not fit "
                           f"{dtype.name} (the vocabulary the spool records is too small)")
    temporary = {key: temporary_sibling(file) for key, file in files.items()}
    remove(files["idx"])  # an old prefix (overwrite) stops being one first
    try:
        data = HashedFile(temporary["bin"])
        masks = HashedFile(temporary["masks"])
        for lo, hi in sequence_chunks(reader):
            data.write(reader.tokens_of(lo, hi).astype(dtype, copy=False))
            masks.write(reader.masks_of(lo, hi))
            RESIDENT.check()  # the spool's pages this chunk touched, released past the budget
        entries = {files["bin"].name: data.close(), files["masks"].name: masks.close(),
                   files["idx"].name: mmidx.write_index(temporary["idx"], _Lengths(reader.lengths),
                                                        reader.num_sequences, dtype)}
        record = {
            "version": PREFIX_VERSION, "prefix": prefix.name,
            "num_sequences": reader.num_sequences, "num_tokens": reader.num_tokens,
            "total_tokens": reader.num_tokens, "vocab_size": reader.vocab_size,
            "tokens_dtype": dtype.name, "masks": files["masks"].name, "files": entries,
            "source": reader.record.get("source", {}),
            "exported_from": {"spool": str(reader.path), "kind": reader.kind,
                              "masks": "chat markers" if markers is not None else "spool",
                              **({"markers": markers.to_dict()} if markers is not None else {})},
            "follows": FOLLOWS,
        }
        write_record(temporary["record"], record)
        for key in ("record", "bin", "masks", "idx"):  # the .idx last: the prefix's commit point
            publish(temporary[key], files[key], overwrite=overwrite)
    finally:
        for file in temporary.values():
            remove(file)
    return record
