"""Packing: from sequence lengths alone, assign sequences to bins of at most ``pack_size`` tokens.

The result is a :class:`BinAssignment`, a CSR pair: bin ``b`` holds the sequences
``seq_indices[bin_offsets[b]:bin_offsets[b + 1]]``, in the order they are laid out in the bin.

Over-long sequences (longer than ``pack_size``) are either truncated to ``pack_size`` (each
then fills a bin alone) or dropped; both are counted in the :class:`PackingReport`, never silent.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np

from packlab.bins import cumulative_offsets
from packlab.errors import FormatError, PacklabError
from packlab.packing import mffd  # noqa: F401  (registers Modified First-Fit Decreasing)
from packlab.packing.algorithms import ALGORITHMS, bin_totals, sequences_by_bin

Overlong = Literal["truncate", "drop"]
DEFAULT_ALGORITHM = "first_fit_shuffle"


@dataclass(frozen=True)
class BinAssignment:
    """Sequences per bin, as CSR; ``pack_size`` and the over-long policy travel with it."""

    bin_offsets: np.ndarray  # int64[num_bins + 1]
    seq_indices: np.ndarray  # int64[num_assigned]
    pack_size: int
    overlong: Overlong = "truncate"

    @property
    def num_bins(self) -> int:
        return int(self.bin_offsets.shape[0] - 1)

    def bin_indices(self, bin_id: int) -> np.ndarray:
        """Spool indices of the sequences in bin ``bin_id``, in their order in the bin."""
        return self.seq_indices[self.bin_offsets[bin_id] : self.bin_offsets[bin_id + 1]]

    def seqs_per_bin(self) -> np.ndarray:
        return np.diff(self.bin_offsets)

    def select(self, start: int, stop: int) -> BinAssignment:
        """Bins ``start:stop`` as an assignment of their own (for shards)."""
        lo, hi = int(self.bin_offsets[start]), int(self.bin_offsets[stop])
        return BinAssignment(
            bin_offsets=self.bin_offsets[start : stop + 1] - lo,
            seq_indices=self.seq_indices[lo:hi],
            pack_size=self.pack_size,
            overlong=self.overlong,
        )

    def bin_lengths(self, lengths: np.ndarray) -> np.ndarray:
        """Packed length of every bin, given the spool's sequence lengths (truncation applied)."""
        kept = np.minimum(np.asarray(lengths, dtype=np.int64)[self.seq_indices], self.pack_size)
        sums = np.add.reduceat(kept, self.bin_offsets[:-1]) if kept.size else kept
        return sums.astype(np.int64)

    def digest(self) -> str:
        """SHA-256 of the assignment (bins, their sequences, pack size, over-long policy): what
        a job writing it is, whatever algorithm produced it."""
        h = hashlib.sha256(f"{self.pack_size}|{self.overlong}|".encode())
        h.update(np.ascontiguousarray(self.bin_offsets, dtype="<i8").tobytes())
        h.update(np.ascontiguousarray(self.seq_indices, dtype="<i8").tobytes())
        return h.hexdigest()

    def save(self, path: str | Path) -> None:
        np.savez(
            Path(path),
            bin_offsets=self.bin_offsets,
            seq_indices=self.seq_indices,
            pack_size=np.int64(self.pack_size),
            overlong=np.str_(self.overlong),
        )

    @classmethod
    def load(cls, path: str | Path) -> BinAssignment:
        try:
            with np.load(Path(path), allow_pickle=False) as z:
                return cls(
                    bin_offsets=z["bin_offsets"].astype(np.int64),
                    seq_indices=z["seq_indices"].astype(np.int64),
                    pack_size=int(z["pack_size"]),
                    overlong=str(z["overlong"]),  # type: ignore[arg-type]
                )
        except (OSError, KeyError, ValueError) as exc:
            raise FormatError(f"{path}: not a bin assignment ({exc})") from None


@dataclass(frozen=True)
class PackingReport:
    """What a packing did, for ``packlab plan --json`` and the notebooks.

    Token counts are what lands in bins (after truncation or dropping); ``spool_tokens`` is
    what the spool held, so ``spool_tokens = num_tokens + truncated_tokens + dropped_tokens``.
    """

    algorithm: str
    num_sequences: int  # in the spool, dropped ones included
    num_tokens: int  # packed
    pack_size: int
    num_bins: int
    lower_bound_bins: int  # ceil(num_tokens / pack_size)
    efficiency: float  # packed tokens / (num_bins * pack_size)
    bins_over_lower_bound: float  # num_bins / lower_bound_bins - 1
    mean_seqs_per_bin: float
    max_seqs_per_bin: int
    dropped: int
    truncated: int
    truncated_tokens: int
    seconds: float
    dropped_tokens: int = 0
    spool_tokens: int = 0
    num_packed_sequences: int = 0
    min_seqs_per_bin: int = 0
    overlong: str = "truncate"
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_pack_size(pack_size: int) -> int:
    if isinstance(pack_size, bool) or not isinstance(pack_size, int | np.integer) or pack_size <= 0:
        raise PacklabError(f"pack_size must be a positive integer, got {pack_size!r}")
    return int(pack_size)


def check_algorithm(algorithm: str) -> str:
    """The name of a registered algorithm, or a one-line error listing them."""
    if algorithm not in ALGORITHMS:
        raise PacklabError(
            f"unknown packing algorithm {algorithm!r}; choose from {', '.join(sorted(ALGORITHMS))}"
        )
    return algorithm


def pack(
    lengths: np.ndarray,
    pack_size: int,
    *,
    algorithm: str = DEFAULT_ALGORITHM,
    seed: int = 0,
    overlong: Overlong = "truncate",
) -> tuple[BinAssignment, PackingReport]:
    """Pack sequences of the given lengths; deterministic for a seed.

    Bins are numbered in the order the algorithm opened them; within a bin, sequences are laid
    out in ascending spool index. Memory: a few int64 arrays of the sequence count (13M
    sequences pack in well under 2 GB).
    """
    pack_size = check_pack_size(pack_size)
    check_algorithm(algorithm)
    if overlong not in ("truncate", "drop"):
        raise PacklabError(f"overlong must be 'truncate' or 'drop', got {overlong!r}")
    lengths = check_lengths(lengths)
    began = time.perf_counter()
    over = lengths > pack_size
    num_over = int(np.count_nonzero(over))
    over_tokens = int(lengths[over].sum()) - num_over * pack_size if num_over else 0
    kept_index: np.ndarray | None = None  # None: every sequence is kept (identity)
    if overlong == "drop" and num_over:
        kept_index = np.flatnonzero(~over)
        if kept_index.size == 0:
            raise PacklabError(f"every sequence is longer than pack_size {pack_size}")
        kept_len = lengths[kept_index]
    else:
        kept_len = np.minimum(lengths, pack_size) if num_over else lengths
    del over
    rng = np.random.default_rng(seed)
    bin_of = ALGORITHMS[algorithm](kept_len, pack_size, rng)
    assignment = assignment_from_bins(bin_of, kept_index, pack_size, overlong, kept_len)
    del bin_of
    seconds = time.perf_counter() - began
    total = int(kept_len.sum())
    num_bins = assignment.num_bins
    lower = -(-total // pack_size)
    per_bin = assignment.seqs_per_bin()
    dropped = num_over if overlong == "drop" else 0
    report = PackingReport(
        algorithm=algorithm,
        num_sequences=int(lengths.shape[0]),
        num_tokens=total,
        pack_size=pack_size,
        num_bins=num_bins,
        lower_bound_bins=lower,
        efficiency=total / (num_bins * pack_size),
        bins_over_lower_bound=num_bins / lower - 1.0,
        mean_seqs_per_bin=float(per_bin.mean()),
        max_seqs_per_bin=int(per_bin.max()),
        dropped=dropped,
        truncated=num_over - dropped,
        truncated_tokens=over_tokens if overlong == "truncate" else 0,
        seconds=seconds,
        dropped_tokens=over_tokens + dropped * pack_size if dropped else 0,
        spool_tokens=int(lengths.sum()),
        num_packed_sequences=int(kept_len.shape[0]),
        min_seqs_per_bin=int(per_bin.min()),
        overlong=overlong,
        seed=int(seed),
    )
    return assignment, report


def check_lengths(lengths: np.ndarray) -> np.ndarray:
    """Sequence lengths as int64, refused with a clear message when they cannot be packed."""
    raw = np.asarray(lengths)
    if raw.ndim != 1 or raw.size == 0:
        raise PacklabError("nothing to pack: no sequence lengths")
    if raw.dtype.kind not in "iu":
        raise PacklabError(f"sequence lengths must be integers, got {raw.dtype}")
    out = raw.astype(np.int64)
    low = int(out.min())
    if low <= 0:
        raise PacklabError(f"sequence {int(np.argmax(out <= 0))} has length {low}")
    return out


def assignment_from_bins(
    bin_of: np.ndarray,
    kept_index: np.ndarray | None,
    pack_size: int,
    overlong: Overlong,
    kept_len: np.ndarray | None = None,
) -> BinAssignment:
    """CSR from a per-sequence bin number (stable: ascending spool index within a bin).

    ``kept_index`` maps positions of ``bin_of`` to spool indices (None: the identity). With
    ``kept_len``, also proves no bin holds more than ``pack_size`` tokens: an algorithm bug
    must never reach a writer.
    """
    bin_of = np.asarray(bin_of)
    if bin_of.dtype.kind not in "iu":
        raise PacklabError("packing returned bin numbers that are not integers (algorithm bug)")
    if bin_of.ndim != 1 or (kept_len is not None and bin_of.shape != kept_len.shape):
        raise PacklabError("packing returned a bin per sequence of the wrong shape (algorithm bug)")
    if bin_of.size and int(bin_of.min()) < 0:
        raise PacklabError("packing returned a negative bin number (algorithm bug)")
    if kept_len is None:
        counts, load = np.bincount(bin_of), None
    else:
        counts, load = bin_totals(bin_of, kept_len)
    if (counts == 0).any():
        raise PacklabError("packing produced an empty bin (algorithm bug)")
    if load is not None:
        if int(load.max()) > pack_size:
            b = int(np.argmax(load))
            raise PacklabError(
                f"packing put {int(load[b])} tokens in bin {b}, more than pack_size {pack_size} "
                "(algorithm bug)"
            )
    order = sequences_by_bin(bin_of, counts)
    offsets = cumulative_offsets(counts)
    seq_indices = order if kept_index is None else kept_index[order]
    return BinAssignment(offsets, seq_indices.astype(np.int64, copy=False), pack_size, overlong)


def compare_algorithms(
    lengths: np.ndarray,
    pack_size: int,
    *,
    algorithms: list[str] | None = None,
    seed: int = 0,
    overlong: Overlong = "truncate",
    repeats: int = 1,
) -> dict[str, tuple[BinAssignment, PackingReport]]:
    """Every algorithm on the same lengths, side by side (notebook 02).

    ``seconds`` in each report is the median of ``repeats`` runs: the machines are shared and
    noisy, so one run is a sample, not a figure.
    """
    if repeats < 1:
        raise PacklabError(f"repeats must be >= 1, got {repeats}")
    out = {}
    for name in algorithms or sorted(ALGORITHMS):
        runs = [pack(lengths, pack_size, algorithm=name, seed=seed, overlong=overlong)
                for _ in range(repeats)]
        seconds = float(np.median([report.seconds for _, report in runs]))
        assignment, report = runs[-1]
        out[name] = (assignment, replace(report, seconds=seconds))
    return out
