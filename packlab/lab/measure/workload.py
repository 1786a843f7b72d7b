"""A synthetic workload for the memory benchmarks: one spool, one packing, prefixes of it.

The notebooks measure how memory grows with the number of bins, so one spool is written for
the largest size and every smaller size is the first ``n`` bins of the same packing: the
sizes differ in nothing but their length. Spools are cached by their parameters.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from packlab.errors import PacklabError
from packlab.packing import BinAssignment, pack
from packlab.spool import SpoolReader, SpoolWriter

_CHUNK_SEQUENCES = 4096


@dataclass(frozen=True)
class Workload:
    """A spool and a packing of it into at least ``num_bins`` bins of ``pack_size``."""

    directory: Path
    spool: Path
    assignment: Path
    num_bins: int
    pack_size: int

    def prefix(self, num_bins: int) -> Path:
        """An assignment file holding the first ``num_bins`` bins (written once)."""
        if not 0 < num_bins <= self.num_bins:
            raise PacklabError(f"{self.directory}: {num_bins} bins asked, workload has {self.num_bins}")
        path = self.directory / f"assignment_{num_bins}.npz"
        if not path.is_file():
            BinAssignment.load(self.assignment).select(0, num_bins).save(path)
        return path


def make_workload(
    directory: str | os.PathLike[str],
    num_bins: int,
    *,
    pack_size: int = 2048,
    mean_length: int = 512,
    vocab_size: int = 32_000,
    seed: int = 0,
) -> Workload:
    """Write (or reuse) a spool whose packing gives at least ``num_bins`` bins.

    Lengths are log-normal around ``mean_length`` (clipped to ``[8, pack_size]``), tokens
    uniform below ``vocab_size``, learn masks on the second half of each sequence (the
    "assistant turn"). Packed with next-fit, deterministic for a seed.
    """
    if num_bins <= 0:
        raise PacklabError(f"num_bins must be positive, got {num_bins}")
    root = Path(directory) / f"workload_p{pack_size}_m{mean_length}_v{vocab_size}_s{seed}_{num_bins}"
    spool_path = root / "spool"
    plan_path = root / "assignment.npz"
    if plan_path.is_file() and spool_path.is_dir():
        plan = BinAssignment.load(plan_path)
        return Workload(root, spool_path, plan_path, plan.num_bins, pack_size)
    root.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    # next-fit fills bins to roughly 75-85 %: ask for enough tokens, keep the first num_bins.
    target_tokens = int(num_bins * pack_size * 1.35) + pack_size
    written = 0
    with SpoolWriter(spool_path, vocab_size=vocab_size, overwrite=True,
                     source={"generator": "packlab.lab.measure.workload", "seed": seed}) as writer:
        while written < target_tokens:
            lengths = _lengths(rng, _CHUNK_SEQUENCES, mean_length, pack_size)
            total = int(lengths.sum())
            tokens = rng.integers(0, vocab_size, size=total, dtype=np.int32)
            writer.append_many(tokens, _assistant_masks(lengths), lengths)
            written += total
    spool = SpoolReader(spool_path)
    full, _ = pack(np.asarray(spool.lengths), pack_size, algorithm="next_fit", seed=seed)
    if full.num_bins < num_bins:
        raise PacklabError(f"{root}: packing gave {full.num_bins} bins, fewer than {num_bins}")
    plan = full.select(0, num_bins)
    plan.save(plan_path)
    return Workload(root, spool_path, plan_path, num_bins, pack_size)


def _lengths(rng: np.random.Generator, n: int, mean: int, pack_size: int) -> np.ndarray:
    sigma = 0.8
    raw = rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, size=n)
    return np.clip(raw.astype(np.int64), 8, pack_size)


def _assistant_masks(lengths: np.ndarray) -> np.ndarray:
    """1 on the second half of every sequence, vectorized."""
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    position = np.arange(int(lengths.sum()), dtype=np.int64) - np.repeat(starts, lengths)
    return (position >= np.repeat(lengths // 2, lengths)).astype(np.uint8)
