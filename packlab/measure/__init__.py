"""Honest measurement: peak memory, latency, throughput and size (DESIGN.md, "How we measure").

One concept per module:

- :mod:`~packlab.measure.memory`: this process's RSS (``/proc/self/status``), sampled, per phase;
- :mod:`~packlab.measure.harness`: a job in a fresh process; tracemalloc in a separate run;
- :mod:`~packlab.measure.jobs`: the importable jobs the harness runs;
- :mod:`~packlab.measure.footprint`: load/read and write memory of a shard, flattened;
- :mod:`~packlab.measure.pagecache`: ``mincore`` residency and cache eviction (cold runs);
- :mod:`~packlab.measure.latency`: random-access latency with memcpy and pread floors;
- :mod:`~packlab.measure.throughput`: sequential scan and DataLoader rates;
- :mod:`~packlab.measure.size`: bytes on disk against raw data and token entropy;
- :mod:`~packlab.measure.workload`: a synthetic spool and packing for the benchmarks;
- :mod:`~packlab.measure.claims`: the RFC's memory table against what was measured.
"""

from __future__ import annotations

from packlab.measure.footprint import load_memory, write_memory
from packlab.measure.harness import profile, run_job
from packlab.measure.latency import latency
from packlab.measure.pagecache import drop_cache, drop_shard, resident_pages
from packlab.measure.size import size_report
from packlab.measure.throughput import dataloader, scan

__all__ = [
    "dataloader", "drop_cache", "drop_shard", "latency", "load_memory", "profile",
    "resident_pages", "run_job", "scan", "size_report", "write_memory",
]
