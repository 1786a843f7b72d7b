"""The memory footprint of a shard: loading and reading it, and writing it, each in a fresh
process (:mod:`packlab.lab.measure.harness`), flattened into the keys the CLI and notebooks use.

Keys (docs/design.md): ``load_peak_rss_growth_bytes``, ``load_peak_anon_growth_bytes``,
``read_peak_rss_growth_bytes``; beside them the file-backed peak, the Arrow pool's peak and the
Python heap (tracemalloc, a separate run). Writing: ``write_peak_rss_growth_bytes`` and
friends, measured over the write phase alone (the spool and assignment are opened before it).
"""

from __future__ import annotations

import os
from typing import Any

from packlab.lab.measure.harness import profile
from packlab.lab.measure.jobs import format_imports, resolve_via, shard_imports

_KEYS = {
    "peak_rss_growth_bytes": "peak_rss_growth_bytes",
    "peak_anon_growth_bytes": "peak_anon_growth_bytes",
    "peak_file_growth_bytes": "peak_file_growth_bytes",
    "arrow_pool_peak_bytes": "arrow_pool_peak_bytes",
    "python_heap_peak_bytes": "python_heap_peak_bytes",
    "seconds": "seconds",
    "modules_imported": "modules_imported",
}


def _flatten(prefix: str, record: dict[str, Any], *, phase_growth: bool = False) -> dict[str, Any]:
    out = {f"{prefix}_{name}": record.get(key) for name, key in _KEYS.items()}
    if phase_growth:
        out[f"{prefix}_peak_rss_growth_bytes"] = record["peak_rss_phase_growth_bytes"]
        out[f"{prefix}_peak_anon_growth_bytes"] = record["peak_anon_phase_growth_bytes"]
    return out


def load_memory(
    path: str | os.PathLike[str], *, via: str = "auto", tracemalloc: bool = True,
    timeout: float = 3600.0,
) -> dict[str, Any]:
    """Open the shard (and read its first bin), then read every bin once, in a fresh process."""
    via = resolve_via(via)
    report = profile("packlab.lab.measure.jobs:open_and_read", str(path), via,
                     imports=shard_imports(path, via), tracemalloc=tracemalloc, timeout=timeout)
    phases = report["phases"]
    out: dict[str, Any] = {"path": str(path), "via": via, **report["result"]}
    out.update(_flatten("load", phases["load"]))
    out.update(_flatten("read", phases["read"]))
    out["baseline_rss_bytes"] = report["baseline"]["VmRSS"]
    out["hwm_reset"] = report["hwm_reset"]
    return out


def write_memory(
    format: str, spool: str | os.PathLike[str], assignment: str | os.PathLike[str],
    out_path: str | os.PathLike[str], *, options: dict[str, Any] | None = None,
    tracemalloc: bool = True, timeout: float = 3600.0,
) -> dict[str, Any]:
    """Write a shard of ``format`` bin by bin from a spool and an assignment, in a fresh process.

    The figure is the write phase's own growth (its peak over the memory at its start).
    """
    report = profile("packlab.lab.measure.jobs:write_shard", format, str(spool), str(assignment),
                     str(out_path), options or {}, imports=[*format_imports(format), "packlab.packing.materialize"],
                     tracemalloc=tracemalloc, timeout=timeout)
    out: dict[str, Any] = {"format": format, "path": str(out_path), **report["result"]}
    out.update(_flatten("write", report["phases"]["write"], phase_growth=True))
    out["baseline_rss_bytes"] = report["baseline"]["VmRSS"]
    out["hwm_reset"] = report["hwm_reset"]
    return out
