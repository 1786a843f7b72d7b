"""Notebook 05's summary: one random bin, warm and cold, against its floors; scans; Parquet."""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median
from typing import Any

from packlab.formats import formats_where
from packlab.lab.records.random_access import RandomAccess
from packlab.lab.tables import times


def bullets(n: RandomAccess, p: Mapping[str, Any]) -> list[str]:
    formats = n.formats
    warm = {f: formats[f].warm for f in n.measured("warm")}
    cold = {f: formats[f].cold for f in n.measured("cold")}
    zero_copy = [f for f in formats_where("RAW_RUNS") if f in warm]
    out = [
        f"**Warm**, one random bin of ≤{p['pack_size']} tokens, delivered: "
        + ", ".join(f"{f} {warm[f].p50_us:.1f} µs ("
                    + (f"{warm[f].ratio_to_raw_csr:.2f}x raw CSR numpy over the same files, "
                       if warm[f].ratio_to_raw_csr else "")
                    + f"{warm[f].ratio_to_python_floor:.2f}x the Python floor)"
                    for f in zero_copy)
        + f"; the Python floor itself "
        f"{median(r.python_floor_p50_us for r in warm.values()):.1f} µs, a memcpy of the "
        f"same bytes {median(r.memcpy_p50_us for r in warm.values()):.1f} µs.",
        "**Cold** (pages evicted, `mincore`-checked), p50 against a raw `pread` of the same "
        "bytes: " + ", ".join(f"{f} {r.p50_us:,.0f} µs ({r.ratio_to_pread:.2f}x)"
                              for f, r in cold.items()) + ".",
    ]
    if n.mmap is not None:
        m = n.mmap
        out.append(
            f"A memory map read cold with the default advice took {m.p50_us['mmap']:,.0f} µs "
            f"({m.mmap_pages:,.0f} pages for {m.nbytes:,} bytes; device read-ahead "
            f"{m.read_ahead_kb} KB); advised `MADV_RANDOM` + `MADV_WILLNEED` "
            f"{m.p50_us['mmap_random_willneed']:,.0f} µs; a `pread` {m.p50_us['pread']:,.0f} µs.")
    batched = {f: a.batched for f, a in formats.items() if a.batched is not None}
    against_raw = [f for f in zero_copy if f in batched and batched[f].gain_vs_raw]
    out.append("**Batched** `__getitems__` against single reads, per bin: "
               + ", ".join(f"{f} {b.gain:.2f}x" for f, b in batched.items())
               + " (above 1: batching is cheaper)"
               + ("; against the raw CSR single read: " + ", ".join(
                   f"{f} {batched[f].gain_vs_raw:.2f}x" for f in against_raw)
                  if against_raw else "") + ".")
    if n.integrity_rule is not None:
        rule = n.integrity_rule
        verify = [f for f in zero_copy if formats[f].integrity is not None
                  and formats[f].integrity.verify_ratio]
        out.append(
            "**Integrity on read**: `verify=True` (each bin's xxh3 checksum) adds "
            + ", ".join(f"{f} {formats[f].integrity.verify_ratio - 1:+.0%}" for f in verify)
            + " to a warm read; every invariant on every read (`check_bin`) would add "
            + ", ".join(f"{f} {formats[f].integrity.check_bin_ratio:+.0%}" for f in verify)
            + f". Rule: a check runs on every read by default when it adds at most "
            f"{rule.budget:.0%}, so verify is "
            f"**{'on' if rule.verify_default else 'off'}** by default and the "
            "bins' structure is checked once per process when a reader builds its index.")
    scans = {"warm": [a.scan_warm for a in formats.values()],
             "cold": [a.scan_cold for a in formats.values()]}
    slower = {c: [1 / s.ratio_to_floor for s in found if s is not None and s.ratio_to_floor]
              for c, found in scans.items()}
    if any(slower.values()):
        out.append("**Sequential scans**, every bin delivered, took "
                   + "; ".join(f"{times(min(v))} to {times(max(v))} the time of a raw read of "
                               f"the same files, {c}" for c, v in slower.items() if v)
                   + " (a scan that beat the raw read would not be reading its bytes: "
                   "`tests/test_scan_floor.py`).")
    if n.shuffled_epoch_speedup is not None:
        decodes = n.row_group_decodes
        out.append(
            f"**Shuffled Parquet epoch**: {n.epoch_seconds['today']:,.2f} s with the "
            f"one-row-group cache and a uniform shuffle, {n.epoch_seconds['packlab']:.2f} "
            "s with packlab's reader and the block-shuffle sampler: "
            f"{times(n.shuffled_epoch_speedup)} faster"
            + (f" ({decodes['today']:,} against {decodes['packlab']:,} row-group decodes)"
               if decodes else "") + ".")
    if n.row_groups:
        out.append("**Parquet by bins per row group**: a random read that decodes its group "
                   + ", ".join(f"{r.row_group_size:,}: {r.miss_p50_us / 1e3:,.1f} ms"
                               for r in n.row_groups)
                   + "; in block-shuffled training order "
                   + ", ".join(f"{r.row_group_size:,}: {r.block_epoch_per_bin_us:,.0f} µs"
                               for r in n.row_groups) + " per bin.")
    return out
