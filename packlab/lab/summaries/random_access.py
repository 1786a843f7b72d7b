"""Notebook 05's summary: one random bin, warm and cold, against its floors; scans; Parquet."""

from __future__ import annotations

from collections.abc import Mapping
from statistics import median
from typing import Any

from packlab.formats import formats_where
from packlab.lab.tables import times


def bullets(n: Mapping[str, Any], p: Mapping[str, Any]) -> list[str]:
    names = p["formats"]
    warm = [f for f in names if f"{f}_warm_p50_us" in n]
    cold = [f for f in names if f"{f}_cold_p50_us" in n]
    zero_copy = [f for f in formats_where("ZERO_COPY") if f in warm]
    out = [
        f"**Warm**, one random bin of ≤{p['pack_size']} tokens, delivered: "
        + ", ".join(f"{f} {n[f'{f}_warm_p50_us']:.1f} µs ("
                    + (f"{n[k]:.2f}x raw CSR numpy over the same files, "
                       if n.get(k := f"{f}_warm_ratio_to_raw_csr") else "")
                    + f"{n[f'{f}_warm_ratio_to_python_floor']:.2f}x the Python floor)"
                    for f in zero_copy)
        + f"; the Python floor itself "
        f"{median(n[f'{f}_warm_python_floor_p50_us'] for f in warm):.1f} µs, a memcpy of the "
        f"same bytes {median(n[f'{f}_warm_memcpy_p50_us'] for f in warm):.1f} µs.",
        "**Cold** (pages evicted, `mincore`-checked), p50 against a raw `pread` of the same "
        "bytes: " + ", ".join(f"{f} {n[f'{f}_cold_p50_us']:,.0f} µs "
                              f"({n[f'{f}_cold_ratio_to_pread']:.2f}x)" for f in cold) + ".",
    ]
    if "cold_mmap_p50_us" in n:
        out.append(
            f"A memory map read cold with the default advice took {n['cold_mmap_p50_us']:,.0f} µs "
            f"({n['mmap_pages']:,.0f} pages for {n['mmap_nbytes']:,} bytes; device read-ahead "
            f"{n['read_ahead_kb']} KB); advised `MADV_RANDOM` + `MADV_WILLNEED` "
            f"{n['cold_mmap_random_willneed_p50_us']:,.0f} µs; a `pread` "
            f"{n['cold_pread_p50_us']:,.0f} µs.")
    out.append("**Batched** `__getitems__` against single reads, per bin: "
               + ", ".join(f"{f} {n[f'{f}_batch_gain']:.2f}x" for f in names
                           if f"{f}_batch_gain" in n) + " (above 1: batching is cheaper)"
               + ("; against the raw CSR single read: " + ", ".join(
                   f"{f} {n[k]:.2f}x" for f in zero_copy if n.get(k := f"{f}_batch_gain_vs_raw"))
                  if any(n.get(f"{f}_batch_gain_vs_raw") for f in zero_copy) else "") + ".")
    if "integrity_rule_budget" in n:
        verify = [f for f in zero_copy if n.get(f"{f}_integrity_verify_ratio")]
        out.append(
            "**Integrity on read**: `verify=True` (each bin's xxh3 checksum) adds "
            + ", ".join(f"{f} {n[f'{f}_integrity_verify_ratio'] - 1:+.0%}" for f in verify)
            + " to a warm read; every invariant on every read (`check_bin`) would add "
            + ", ".join(f"{f} {n[f'{f}_integrity_check_bin_ratio']:+.0%}" for f in verify)
            + f". Rule: a check runs on every read by default when it adds at most "
            f"{n['integrity_rule_budget']:.0%}, so verify is "
            f"**{'on' if n['integrity_rule_verify_default'] else 'off'}** by default and the "
            "bins' structure is checked once per process when a reader builds its index.")
    slower = {c: [1 / n[k] for f in names if n.get(k := f"{f}_scan_{c}_ratio_to_floor")]
              for c in ("warm", "cold")}
    if any(slower.values()):
        out.append("**Sequential scans**, every bin delivered, took "
                   + "; ".join(f"{times(min(v))} to {times(max(v))} the time of a raw read of "
                               f"the same files, {c}" for c, v in slower.items() if v)
                   + " (a scan that beat the raw read would not be reading its bytes: "
                   "`tests/test_scan_floor.py`).")
    if "parquet_shuffled_epoch_speedup" in n:
        decodes = n.get("row_group_decodes", {})
        out.append(
            f"**Shuffled Parquet epoch**: {n['parquet_epoch_today_seconds']:,.2f} s with the "
            f"one-row-group cache and a uniform shuffle, {n['parquet_epoch_packlab_seconds']:.2f} "
            "s with packlab's reader and the block-shuffle sampler: "
            f"{times(n['parquet_shuffled_epoch_speedup'])} faster"
            + (f" ({decodes['today']:,} against {decodes['packlab']:,} row-group decodes)"
               if decodes else "") + ".")
    sizes = p.get("row_group_sizes", [])
    if sizes and f"parquet_rg{sizes[0]}_miss_p50_us" in n:
        out.append("**Parquet by bins per row group**: a random read that decodes its group "
                   + ", ".join(f"{s:,}: {n[f'parquet_rg{s}_miss_p50_us'] / 1e3:,.1f} ms"
                               for s in sizes)
                   + "; in block-shuffled training order "
                   + ", ".join(f"{s:,}: {n[f'parquet_rg{s}_block_epoch_per_bin_us']:,.0f} µs"
                               for s in sizes) + " per bin.")
    return out
