"""Notebook 11's summary: packlab beside the systems training stacks use, on the same bins."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.measure.peers import summary
from packlab.lab.records.peers import Peers


def bullets(n: Peers, p: Mapping[str, Any]) -> list[str]:
    rows = summary.systems(n.rows)
    floors = summary.floors(n.rows)
    by_name = {r["name"]: r for r in rows}
    fastest, best = rows[0], by_name[n.best_packlab]
    peer = by_name.get(n.fastest_full_peer or "")
    library = by_name.get(n.fastest_library or "")
    small = by_name[n.smallest_within]
    raw = by_name.get("raw_csr")
    tokens_only = [r for r in rows if r["columns"] == "tokens only"]
    out = [
        f"**Fastest system**: {fastest['system']}, {fastest['p50_us']:.1f} µs p50 "
        f"({fastest['x_floor']:.2f}x the in-RAM Python floor of "
        f"{floors['python_floor']['p50_us']:.1f} µs; memcpy of the same bytes "
        f"{floors['memcpy']['p50_us']:.1f} µs).",
        f"**packlab's best format**: {best['system']}, {best['p50_us']:.1f} µs "
        f"({best['x_floor']:.2f}x the floor)" + (
            f"; the fastest peer returning all three columns is {peer['system']}, "
            f"{peer['p50_us']:.1f} µs ({peer['x_floor']:.2f}x): packlab is "
            f"{n.best_packlab_vs_fastest_full_peer:.3f}x it" if peer else "") + (
            f"; raw CSR numpy over the same bins (the bytes through numpy slices) reads in "
            f"{raw['p50_us']:.1f} µs: packlab is {best['x_floor'] / raw['x_floor']:.3f}x it."
            if raw else "."),
        "**Against the libraries** (each project's own reader, all three columns; raw CSR and "
        "Arrow numpy views are reads of the bytes written by hand): " + (
            f"the fastest is {library['system']}, {library['p50_us']:.1f} µs; packlab's best is "
            f"{n.best_packlab_vs_fastest_library:.2f}x it." if library else "none measured."),
        "**Tokens only**: " + (", ".join(f"{r['system']} {r['p50_us']:.1f} µs "
                                         f"({r['x_floor']:.2f}x)" for r in tokens_only)
                               or "none measured")
        + " (they deliver about 4 of the 9 bytes per token the others deliver).",
        f"**Size**: within {n.within:g}x of the fastest, the smallest is {small['system']} at "
        f"{n.smallest_within_bytes_per_token:.2f} B/token" + (
            f"; packlab's Parquet stores {n.parquet_bytes_per_token:.2f} B/token at "
            f"{n.parquet_x_floor:.2f}x the floor." if n.parquet_bytes_per_token else "."),
    ]
    if n.skipped:
        out.append("**Skipped**: " + "; ".join(f"{s['system']} ({s['reason']})"
                                               for s in n.skipped))
    return out
