"""Memory of the running process, read from ``/proc/self/status``, per phase of a job.

What counts (docs/design.md, "How we measure"): peak RSS (``VmHWM``, exact: the kernel keeps it),
peak anonymous and file-backed RSS (``RssAnon``/``RssFile``, sampled by a background thread:
the kernel keeps no peak of those), the Arrow memory pool's peak, all as growth over the
baseline taken after imports. ``VmHWM`` is reset at every phase boundary (``clear_refs`` 5),
so each phase has a peak of its own. tracemalloc belongs in a separate run
(:mod:`packlab.lab.measure.harness`): it slows allocation and cannot see memory maps or Arrow.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

_FIELDS = ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem")


def read_status() -> dict[str, int]:
    """``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``, ``RssShmem`` of this process, in bytes."""
    out: dict[str, int] = {}
    with open("/proc/self/status", "rb") as f:
        for line in f:
            key, _, rest = line.partition(b":")
            name = key.decode()
            if name in _FIELDS:
                out[name] = int(rest.split()[0]) * 1024
    return out


_MADV_POPULATE_READ = 22  # Linux >= 5.14


def populate_file_mappings() -> int:
    """Fault in every page of this process's file-backed mappings (libraries, code).

    A process forked from a server, or one meeting a library function for the first time,
    maps code pages lazily: without this, a job's figure would include the code it touched.
    After it, code is in the baseline and the growth is the job's data. Returns the bytes
    populated (0 where the kernel lacks ``MADV_POPULATE_READ``).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    with open("/proc/self/maps") as maps:
        lines = maps.readlines()
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].startswith("/dev/"):
            continue
        if "r" not in parts[1]:
            continue
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if libc.madvise(lo, hi - lo, _MADV_POPULATE_READ) == 0:
            done += hi - lo
    return done


def reset_peak() -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def arrow_pool() -> Any | None:
    """pyarrow's default memory pool, when pyarrow is already imported (never imports it)."""
    import sys

    pa = sys.modules.get("pyarrow")
    return pa.default_memory_pool() if pa is not None else None


class RssPoller(threading.Thread):
    """Samples ``RssAnon`` and ``RssFile`` every ``interval`` seconds, keeping the maxima."""

    def __init__(self, interval: float = 0.002) -> None:
        super().__init__(name="packlab-rss-poller", daemon=True)
        self.interval = interval
        self._stop_event = threading.Event()
        self._lock = threading.Lock()
        self.samples = 0
        self.max_anon = 0
        self.max_file = 0

    def sample(self) -> None:
        status = read_status()
        with self._lock:
            self.samples += 1
            self.max_anon = max(self.max_anon, status.get("RssAnon", 0))
            self.max_file = max(self.max_file, status.get("RssFile", 0))

    def take(self) -> tuple[int, int, int]:
        """``(max_anon, max_file, samples)`` since the last take (a final sample included)."""
        self.sample()
        with self._lock:
            out = (self.max_anon, self.max_file, self.samples)
            self.max_anon = self.max_file = self.samples = 0
        return out

    def run(self) -> None:
        while not self._stop_event.wait(self.interval):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


@dataclass
class PhaseRecorder:
    """Closes phases of one job in this process and records each phase's peaks."""

    poller: RssPoller
    trace: bool = False
    phases: dict[str, dict[str, Any]] = field(default_factory=dict)
    hwm_reset: bool = True

    def __post_init__(self) -> None:
        import gc

        # What the process holds already (its imports; a fork's inheritance) is frozen, then
        # only the rest collected: a collection walks every tracked object, and in a fork that
        # writes, so copies, every page of objects inherited from the server (0.1-0.3 s a job),
        # for objects that are in the baseline either way.
        gc.freeze()
        gc.collect()
        self.populated = populate_file_mappings()
        self.baseline = read_status()
        pool = arrow_pool()
        self.pool_baseline = pool.bytes_allocated() if pool is not None else 0
        self.hwm_reset = reset_peak()
        self.poller.take()
        self._phase_start = read_status()
        self._modules = len(sys.modules)
        self._began = time.perf_counter()
        if self.trace:
            import tracemalloc

            tracemalloc.start()

    def close(self, name: str) -> dict[str, Any]:
        """End the current phase: its peaks, over the baseline and over the phase's start."""
        seconds = time.perf_counter() - self._began
        status = read_status()
        max_anon, max_file, samples = self.poller.take()
        base = self.baseline
        record: dict[str, Any] = {
            "seconds": seconds,
            "peak_rss_growth_bytes": status["VmHWM"] - base["VmRSS"],
            "peak_rss_phase_growth_bytes": status["VmHWM"] - self._phase_start["VmRSS"],
            "peak_anon_growth_bytes": max_anon - base["RssAnon"],
            "peak_anon_phase_growth_bytes": max_anon - self._phase_start["RssAnon"],
            "peak_file_growth_bytes": max_file - base["RssFile"],
            "end_rss_growth_bytes": status["VmRSS"] - base["VmRSS"],
            "rss_samples": samples,
            # code imported during the phase is counted in it: the number says how much
            "modules_imported": len(sys.modules) - self._modules,
        }
        pool = arrow_pool()
        if pool is not None:
            record["arrow_pool_peak_bytes"] = max(0, pool.max_memory() - self.pool_baseline)
            record["arrow_allocated_bytes"] = pool.bytes_allocated() - self.pool_baseline
            record["arrow_backend"] = pool.backend_name
        if self.trace:
            import tracemalloc

            current, peak = tracemalloc.get_traced_memory()
            record["python_heap_peak_bytes"] = peak
            record["python_heap_end_bytes"] = current
            tracemalloc.reset_peak()
        if name in self.phases:
            name = f"{name}_{len(self.phases)}"
        self.phases[name] = record
        self.hwm_reset = reset_peak() and self.hwm_reset
        self._phase_start = read_status()
        self._modules = len(sys.modules)
        self._began = time.perf_counter()
        return record

    def finish(self) -> None:
        if self.trace:
            import tracemalloc

            tracemalloc.stop()

