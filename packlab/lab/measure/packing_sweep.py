"""Packers as N grows and across length profiles: bins against the lower bound, fill, seconds
(notebook 02).

:func:`time_sweep` packs prefixes of one length array with every packer; :func:`by_profile`
packs each synthetic length profile with every packer at one N. Both time ``pack()`` (the
median of ``repeats`` runs, :func:`packlab.packing.compare_algorithms`) and keep only the
reports: assignments of 13M sequences are large.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packlab.packing import PackingReport, compare_algorithms
from packlab.spool.synth import synth_lengths


@dataclass
class Sweep:
    """Each packer at each N: seconds and bins over the lower bound, side by side."""

    sizes: list[int]
    seconds: dict[str, list[float]]
    over_bound: dict[str, list[float]]
    loglog_slope: dict[str, float]


def sweep_sizes(largest: int, points: int = 6) -> list[int]:
    """``points`` sizes from 1,000 to ``largest``, geometric, with 1M among them when reached
    (the targets speak of 1M sequences)."""
    sizes = np.geomspace(1000, largest, points).astype(int)
    if largest >= 1_000_000:
        sizes = np.append(sizes, 1_000_000)
    return np.unique(sizes).tolist()


def time_sweep(lengths: np.ndarray, pack_size: int, sizes: Sequence[int], *, seed: int = 0,
               repeats: int = 1, largest: dict[str, PackingReport] | None = None) -> Sweep:
    """Every packer on ``lengths[:n]`` for each ``n`` of ``sizes``; ``largest``: reports
    already measured at ``n = len(lengths)`` (not packed again)."""
    seconds: dict[str, list[float]] = {}
    over: dict[str, list[float]] = {}
    for n in sizes:
        if largest is not None and n == lengths.shape[0]:
            reports = largest
        else:
            reports = {a: r for a, (_, r) in compare_algorithms(
                lengths[:n], pack_size, seed=seed, repeats=repeats).items()}
        for a, report in reports.items():
            seconds.setdefault(a, []).append(report.seconds)
            over.setdefault(a, []).append(report.bins_over_lower_bound)
    logs = np.log(np.asarray(sizes, dtype=np.float64))
    slope = {a: float(np.polyfit(logs, np.log(s), 1)[0]) if len(sizes) > 1 else float("nan")
             for a, s in seconds.items()}
    return Sweep(list(sizes), seconds, over, slope)


def by_profile(profiles: Sequence[str], num_sequences: int, pack_size: int, *, seed: int = 0,
               repeats: int = 1, algorithms: list[str] | None = None
               ) -> dict[str, dict[str, PackingReport]]:
    """Every packer on ``num_sequences`` lengths of each synthetic profile."""
    return {profile: {a: r for a, (_, r) in compare_algorithms(
        synth_lengths(num_sequences, profile, seed), pack_size, algorithms=algorithms,
        seed=seed, repeats=repeats).items()} for profile in profiles}
