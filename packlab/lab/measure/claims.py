"""The RFC's memory claims (its "Memory Impact") against what was measured.

The RFC's table is back-of-envelope, at 50k bins of 2048 tokens. A claim about the legacy
format is an estimate, a claim about a new format is a bound; both are judged by the one rule
of :mod:`packlab.lab.measure.verdicts`.
Where the run did not reach 50k bins the value is extrapolated along the measured power law
and says so: a verdict never hides its scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from packlab.formats import formats_where
from packlab.lab.measure.verdicts import at_least, claim_verdict, deviation
from packlab.lab.tables import GB, KB, MB, human_bytes, times

RFC_BINS = 50_000
RFC_PACK_SIZE = 2048


@dataclass(frozen=True)
class Claim:
    format: str
    phase: str  # "write" or "load"
    claimed_bytes: float
    text: str
    metric: str  # the metric the RFC names: "python_heap" or "rss"
    kind: str  # "estimate" or "bound"


CLAIMS: tuple[Claim, ...] = (
    Claim("legacy_npy_pickle", "write", 4 * GB, "~4 GB", "python_heap", "estimate"),
    Claim("parquet", "write", 20 * MB, "~20 MB", "python_heap", "bound"),
    Claim("memmap_v1", "write", 16 * KB, "~16 KB", "python_heap", "bound"),
    Claim("legacy_npy_pickle", "load", 4 * GB, "~4 GB", "rss", "estimate"),
    Claim("parquet", "load", 3 * MB, "~few MB (metadata)", "rss", "bound"),
    Claim("memmap_v1", "load", 3 * KB, "~few KB (metadata)", "rss", "bound"),
)
RATIO_CLAIMS = {"write": 200.0, "load": 500.0}
METRIC_NAMES = {"python_heap": "Python heap", "rss": "RSS"}


def loglog_slope(bins: Sequence[float], values: Sequence[float], floor: float = 4096.0) -> float:
    """Least-squares slope of log(value) against log(bins): 0 is flat, 1 is linear growth."""
    x = np.log(np.asarray(bins, dtype=np.float64))
    y = np.log(np.maximum(np.asarray(values, dtype=np.float64), floor))
    if x.shape[0] < 2 or np.ptp(x) == 0:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def value_at(bins: Sequence[int], values: Sequence[float], target: int = RFC_BINS,
             floor: float = 4096.0) -> tuple[float, str]:
    """The value at ``target`` bins: measured when the run has it, else extrapolated along the
    power law through the two largest sizes (linear in bins when there is only one)."""
    pairs = sorted(zip(bins, values, strict=True))
    for b, v in pairs:
        if b == target:
            return float(v), f"measured at {target:,} bins"
    if len(pairs) == 1:
        b, v = pairs[0]
        return float(v) * target / b, f"scaled linearly from {b:,} bins"
    (b0, v0), (b1, v1) = pairs[-2], pairs[-1]
    slope = loglog_slope([b0, b1], [v0, v1], floor)
    estimate = max(v1, floor) * (target / b1) ** slope
    return float(estimate), f"extrapolated from {b0:,}-{b1:,} bins (slope {slope:.2f})"


def claim_rows(
    series: dict[tuple[str, str], dict[str, Sequence[float]]], target: int = RFC_BINS,
) -> list[dict[str, str | float]]:
    """One row per RFC claim whose format was measured.

    ``series[(format, phase)]`` holds ``bins`` and ``rss`` (and ``anon``) lists, and
    ``heap_bins`` and ``python_heap`` (the traced runs may cover fewer sizes), in bytes.
    The verdict judges the metric the claim names; the other metric stands beside it.
    """
    rows: list[dict[str, str | float]] = []
    for claim in CLAIMS:
        data = series.get((claim.format, claim.phase))
        if not data:
            continue
        rss, how = value_at(data["bins"], data["rss"], target)
        heap, heap_how = value_at(data["heap_bins"], data["python_heap"], target)
        anon = value_at(data["bins"], data["anon"], target)[0] if "anon" in data else None
        judged = heap if claim.metric == "python_heap" else rss
        rows.append({
            "format": claim.format, "phase": claim.phase, "claim": claim.text,
            "metric": claim.metric, "rss_bytes": rss, "python_heap_bytes": heap,
            "anon_bytes": anon,
            "measured": f"RSS {human_bytes(rss)}"
                        + (f" (anonymous {human_bytes(anon)})" if anon is not None else "")
                        + (f", Python heap {human_bytes(heap)} ({how})" if heap_how == how else
                           f" ({how}); Python heap {human_bytes(heap)} ({heap_how})")
                        + f"; {METRIC_NAMES[claim.metric]} "
                        + deviation(max(judged, 1.0), claim.claimed_bytes),
            "verdict": claim_verdict(judged, claim.claimed_bytes, claim.kind),
            "rss_verdict": claim_verdict(rss, claim.claimed_bytes, claim.kind),
        })
    return rows


def ratio_rows(rows: Sequence[dict[str, str | float]]) -> list[dict[str, str | float]]:
    """The RFC's "200x less write memory, 500x less load memory" against legacy, by RSS.

    Legacy is the format that loads every bin when it opens (``IN_RAM``): today's pickle.
    """
    in_ram = set(formats_where("IN_RAM"))
    out: list[dict[str, str | float]] = []
    for phase, claimed in RATIO_CLAIMS.items():
        legacy = [r for r in rows if r["phase"] == phase and r["format"] in in_ram]
        others = [r for r in rows if r["phase"] == phase and r["format"] not in in_ram]
        if not legacy or not others:
            continue
        base = float(legacy[0]["rss_bytes"])
        for row in others:
            ratio = base / max(float(row["rss_bytes"]), 1.0)
            out.append({
                "claim": f"{row['format']}: ~{claimed:.0f}x less {phase} memory than legacy",
                "measured": f"{times(ratio)} (RSS)",
                "verdict": at_least(ratio, claimed),
                "ratio": ratio,
            })
    return out
