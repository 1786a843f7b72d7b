"""Peak memory per format as the dataset grows: write, load and read, each in a fresh process.

One synthetic spool (:mod:`packlab.lab.measure.workload`) and one packing serve every size; for
each size and format a shard is written bin by bin by packlab's writer, then opened and read
back, each job in a process of its own (:mod:`packlab.lab.measure.footprint`). The result is a
tidy table, one row per (format, bins, phase); a format that fails is a row with its error,
never silently missing.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.formats import format_names, get_format
from packlab.lab.measure.footprint import load_memory, write_memory
from packlab.lab.measure.pagecache import shard_files
from packlab.lab.measure.workload import make_workload
from packlab.storage.files import remove

METRICS = ("peak_rss_growth_bytes", "peak_anon_growth_bytes", "peak_file_growth_bytes",
           "arrow_pool_peak_bytes", "python_heap_peak_bytes", "seconds", "modules_imported")
PHASES = ("write", "load", "read")


def memory_sweep(
    directory: str | os.PathLike[str],
    sizes: Sequence[int],
    *,
    formats: Sequence[str] | None = None,
    pack_size: int = 2048,
    via: str = "reader",
    tracemalloc: bool = True,
    seed: int = 0,
    keep_shards: bool = False,
    max_bins: dict[str, int] | None = None,
    trace_max_bins: int | None = None,
) -> list[dict[str, Any]]:
    """Rows ``{format, bins, phase, <metric>: bytes, ..., bytes_on_disk, error}``.

    ``max_bins`` caps a format (the legacy writer needs ~80 KB of RAM per bin of 2048): larger
    sizes are rows that say they were skipped, not silently missing. ``trace_max_bins`` caps
    the tracemalloc runs (tracing 50k legacy bins takes ~13 GB and minutes): above it the
    Python heap is ``None``, and claims about it are extrapolated, saying so.
    """
    if not sizes or min(sizes) <= 0:
        raise PacklabError(f"sizes must be positive bin counts, got {list(sizes)}")
    root = Path(directory)
    work = make_workload(root, max(sizes), pack_size=pack_size, seed=seed)
    rows: list[dict[str, Any]] = []
    for bins in sorted(sizes):
        plan = work.prefix(bins)
        for fmt in formats or format_names():
            cap = (max_bins or {}).get(fmt)
            if cap is not None and bins > cap:
                rows.extend({"format": fmt, "bins": bins, "phase": phase,
                             "error": f"skipped: above max_bins {cap} for this format"}
                            for phase in PHASES)
                continue
            out = shard_path(root, fmt, bins)
            traced = tracemalloc and (trace_max_bins is None or bins <= trace_max_bins)
            rows.extend(_measure(fmt, bins, work.spool, plan, out, via, traced))
            if not keep_shards:
                remove(out)
    return rows


def shard_path(directory: str | os.PathLike[str], fmt: str, bins: int) -> Path:
    """Where :func:`memory_sweep` writes the shard of ``fmt`` with ``bins`` bins."""
    return Path(directory) / "shards" / f"{fmt}_{bins}{get_format(fmt).SUFFIX}"


def _measure(fmt: str, bins: int, spool: Path, plan: Path, out: Path, via: str,
             tracemalloc: bool) -> list[dict[str, Any]]:
    try:
        wrote = write_memory(fmt, spool, plan, out, tracemalloc=tracemalloc)
        loaded = load_memory(out, via=via, tracemalloc=tracemalloc)
    except PacklabError as exc:
        return [{"format": fmt, "bins": bins, "phase": phase, "error": str(exc)}
                for phase in PHASES]
    on_disk = sum(f.stat().st_size for f in shard_files(out))
    rows = []
    for phase, source in (("write", wrote), ("load", loaded), ("read", loaded)):
        row: dict[str, Any] = {"format": fmt, "bins": bins, "phase": phase,
                               "bytes_on_disk": on_disk, "error": None}
        row.update({m: source.get(f"{phase}_{m}") for m in METRICS})
        rows.append(row)
    return rows


def series(rows: Sequence[dict[str, Any]], phase: str,
           metric: str = "peak_rss_growth_bytes") -> dict[str, tuple[list[int], list[float]]]:
    """``{format: (bins, values)}`` of one phase and metric, sizes ascending, failures left out."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for row in sorted(rows, key=lambda r: (r["format"], r["bins"])):
        if row["phase"] == phase and not row.get("error") and row.get(metric) is not None:
            xs, ys = out.setdefault(row["format"], ([], []))
            xs.append(int(row["bins"]))
            ys.append(float(row[metric]))
    return out


def claim_series(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """What :func:`packlab.lab.measure.claims.claim_rows` takes: RSS and heap by (format, phase)."""
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for phase in ("write", "load"):
        rss = series(rows, phase, "peak_rss_growth_bytes")
        heap = series(rows, phase, "python_heap_peak_bytes")
        anon = series(rows, phase, "peak_anon_growth_bytes")
        for fmt, (xs, ys) in rss.items():
            if fmt in heap:
                out[(fmt, phase)] = {"bins": xs, "rss": ys, "heap_bins": heap[fmt][0],
                                     "python_heap": heap[fmt][1]}
                if fmt in anon and anon[fmt][0] == xs:
                    out[(fmt, phase)]["anon"] = anon[fmt][1]
    return out


def failures(rows: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``{format: first error}`` of the formats that could not be measured."""
    out: dict[str, str] = {}
    for row in rows:
        if row.get("error"):
            out.setdefault(row["format"], row["error"])
    return out


def largest(rows: Sequence[dict[str, Any]], metric: str | None = None) -> int:
    """The largest size at which some format was measured (and has ``metric``, if given)."""
    sizes = [int(r["bins"]) for r in rows
             if not r.get("error") and (metric is None or r.get(metric) is not None)]
    if not sizes:
        raise PacklabError("no format could be measured at any size")
    return max(sizes)


def heap_vs_rss(rows: Sequence[dict[str, Any]], bins: int) -> list[dict[str, Any]]:
    """At ``bins``: RSS, anon, file-backed, Arrow pool and tracemalloc side by side, with the
    share of the RSS growth tracemalloc saw (what it misses is memory all the same)."""
    out = []
    for row in rows:
        if row["bins"] != bins or row.get("error"):
            continue
        rss = row["peak_rss_growth_bytes"]
        heap = row.get("python_heap_peak_bytes")
        share = heap / rss if heap is not None and rss and rss > 0 else None
        out.append({**row, "tracemalloc_share": share})
    return out


def misleading(rows: Sequence[dict[str, Any]], *, below: float = 0.5,
               min_bytes: int = 4 << 20) -> list[dict[str, Any]]:
    """Rows of :func:`heap_vs_rss` where tracemalloc saw less than ``below`` of a real RSS
    growth (at least ``min_bytes``): where a tracemalloc-only test would pass wrongly."""
    return [r for r in rows if r["tracemalloc_share"] is not None
            and r["peak_rss_growth_bytes"] >= min_bytes and r["tracemalloc_share"] < below]


def slopes(rows: Sequence[dict[str, Any]], phase: str,
           metric: str = "peak_rss_growth_bytes", floor: float = 1 << 20) -> dict[str, float]:
    """Log-log slope of ``metric`` against bins per format: ~0 flat, ~1 grows with the data.

    Values below ``floor`` (1 MiB: the noise of a process's RSS) count as ``floor``, so a
    writer going from 100 KB to 400 KB is flat, as it is for any purpose.
    """
    from packlab.lab.measure.claims import loglog_slope

    return {fmt: loglog_slope(xs, ys, floor) for fmt, (xs, ys) in
            series(rows, phase, metric).items() if len(xs) >= 2}
