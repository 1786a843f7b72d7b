"""What a spool holds, in numbers: counts, lengths, mask fraction, token statistics, bytes.

Used by ``packlab inspect`` and notebook 01. Every pass over tokens or masks is chunked, so a
spool of billions of tokens is described in bounded memory (the memory map's pages are file
backed and reclaimable).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from packlab.spool import SpoolReader, record_extra
from packlab.storage.reads import in_pieces

_SCAN = 1 << 26  # elements per chunk of a pass over tokens or masks


def count_nonzero_chunked(values: np.ndarray) -> int:
    """``np.count_nonzero`` over a memory map, in chunks (no full-size temporary)."""
    return sum(int(np.count_nonzero(piece)) for piece in in_pieces(values, _SCAN * values.itemsize))


def spool_bytes(reader: SpoolReader) -> dict[str, int]:
    """Bytes on disk of every file of the spool, its record included (a Megatron prefix: its
    ``.bin``, ``.idx`` and packlab's sidecar and record where they are)."""
    files = {**reader.data_files, reader.record_path.name: reader.record_path}
    return {name: path.stat().st_size for name, path in files.items()}


def length_summary(lengths: np.ndarray, over: tuple[int, ...] = ()) -> dict[str, float]:
    """Min, mean, p50, p90, p99, max of sequence lengths, and the fraction longer than each
    of ``over`` (``over_4096``: what a pack size of 4096 would truncate or drop)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    summary = {
        "length_min": int(lengths.min()),
        "length_mean": float(lengths.mean()),
        "length_p50": float(p50),
        "length_p90": float(p90),
        "length_p99": float(p99),
        "length_max": int(lengths.max()),
    }
    summary.update({f"over_{n}": float(np.mean(lengths > n)) for n in over})
    return summary


def describe_spool(reader: SpoolReader) -> dict[str, Any]:
    """Counts, length statistics, mask fraction and bytes on disk of a spool (for ``inspect``)."""
    files = spool_bytes(reader)
    total = sum(files.values())
    return {
        "path": str(reader.path),
        "format": reader.kind,
        "num_sequences": reader.num_sequences,
        "num_tokens": reader.num_tokens,
        "vocab_size": reader.vocab_size,
        **length_summary(reader.lengths),
        "mask_fraction": (count_nonzero_chunked(reader.masks) / max(reader.num_tokens, 1)
                          if reader.has_masks else None),  # None: a prefix without its sidecar
        "bytes_on_disk": total,
        "bytes_per_token": total / max(reader.num_tokens, 1),
        "files": files,
        "source": reader.record.get("source", {}),
        "extra": record_extra(reader.record),  # keys packlab does not read (Nemotron's)
    }


def token_counts(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """How often each token id occurs (int64[vocab_size]), counted in chunks."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for i in range(0, tokens.size, _SCAN):
        counts += np.bincount(tokens[i : i + _SCAN], minlength=vocab_size)[:vocab_size]
    return counts


def rank_frequency(counts: np.ndarray) -> np.ndarray:
    """Relative frequencies sorted from the most frequent token down, zeros dropped."""
    nonzero = np.sort(counts[counts > 0])[::-1].astype(np.float64)
    return nonzero / nonzero.sum()


def order0_entropy_bits(counts: np.ndarray) -> float:
    """Order-0 (unigram) entropy in bits per token: the floor for coding tokens independently."""
    p = rank_frequency(counts)
    return float(-(p * np.log2(p)).sum())


def ks_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs
    (0 = same distribution, 1 = disjoint). Scale free, so it compares length distributions."""
    a, b = np.sort(np.asarray(a)), np.sort(np.asarray(b))
    points = np.concatenate((a, b))
    cdf_a = np.searchsorted(a, points, side="right") / a.size
    cdf_b = np.searchsorted(b, points, side="right") / b.size
    return float(np.abs(cdf_a - cdf_b).max())
