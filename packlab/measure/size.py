"""Size on disk: all bytes, per token, padding, and against the raw unpadded data.

Raw unpadded = what the bins hold, with nothing added: 4 bytes per token (int32 ids), 1 byte
per token (the loss mask) and 4 bytes per sequence start. The order-0 entropy of the tokens
is the bound a compressor without context cannot beat; both come from one pass over the bins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from packlab.formats import detect_format, open_shard
from packlab.measure.pagecache import shard_files

RAW_BYTES_PER_TOKEN = 4 + 1
RAW_BYTES_PER_SEQ = 4


def order0_entropy_bits(counts: np.ndarray) -> float:
    """Shannon entropy, in bits per symbol, of a histogram."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0
    p = counts[counts > 0] / total
    return float(-(p * np.log2(p)).sum())


def _references(reader: Any, on_disk: int, raw: int) -> dict[str, Any]:
    """A shard that stores no tokens (``packed_index``) needs the files it references: their
    bytes count too, or the comparison would flatter it."""
    spool = getattr(reader, "spool_path", None)
    if spool is None:
        return {}
    referenced = sum(f.stat().st_size for f in shard_files(spool))
    return {"referenced_path": str(spool), "referenced_bytes": referenced,
            "ratio_to_raw_with_references": (on_disk + referenced) / raw if raw else None}


def size_report(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Bytes on disk (every file), bytes per token, padding waste, ratio to raw and entropy."""
    root = Path(path)
    files = shard_files(root)
    on_disk = sum(f.stat().st_size for f in files)
    reader = open_shard(path)
    counts = np.zeros(0, dtype=np.int64)
    bins = tokens = seqs = 0
    for packed in reader.iter_bins():
        ids = np.asarray(packed.input_ids, dtype=np.int64)
        here = np.bincount(ids)
        if here.shape[0] > counts.shape[0]:
            counts = np.concatenate((counts, np.zeros(here.shape[0] - counts.shape[0], np.int64)))
        counts[: here.shape[0]] += here
        bins += 1
        tokens += ids.shape[0]
        seqs += packed.num_seqs
    pack_size = int(reader.pack_size)
    capacity = bins * pack_size
    raw = tokens * RAW_BYTES_PER_TOKEN + seqs * RAW_BYTES_PER_SEQ
    entropy_bits = order0_entropy_bits(counts)
    entropy_bytes = entropy_bits * tokens / 8
    return {
        "path": str(path),
        "format": detect_format(path),
        "files": {str(f.relative_to(root)) if root.is_dir() else f.name: f.stat().st_size
                  for f in files},
        "bytes_on_disk": on_disk,
        "num_bins": bins,
        "num_tokens": tokens,
        "num_seqs": seqs,
        "pack_size": pack_size,
        "bytes_per_token": on_disk / tokens if tokens else None,
        "padding_tokens": capacity - tokens,
        "padding_fraction": (capacity - tokens) / capacity if capacity else None,
        "raw_unpadded_bytes": raw,
        "ratio_to_raw": on_disk / raw if raw else None,
        **_references(reader, on_disk, raw),
        "token_entropy_bits": entropy_bits,
        "token_entropy_bytes": entropy_bytes,
        "ratio_to_token_entropy": on_disk / entropy_bytes if entropy_bytes else None,
    }
