"""Notebook 04's summary: write and load peak memory per format as the data grows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.peak_memory import PeakMemory
from packlab.lab.tables import human_bytes


def bullets(n: PeakMemory, p: Mapping[str, Any]) -> list[str]:
    flat, growing = n.flat_writers, n.growing_writers
    missed = n.tracemalloc_misleading
    out = [f"Measured at {', '.join(f'{s:,}' for s in sorted(p['sizes']))} bins of "
           f"{p['pack_size']} tokens, {n.num_formats} formats, every job in a fresh process."]
    out += [f"Legacy {phase} at 50k bins: {text}." for phase, text in n.legacy_at_50k.items()]
    out.append("Writers whose peak RSS stays flat as the data grows (log-log slope at most "
               f"{n.flat_slope:g}): {', '.join(f'`{f}`' for f in flat) or 'none'}; growing: "
               + (", ".join(f"`{f}` ({s:.2f})" for f, s in growing.items()) or "none") + ".")
    out.append(f"tracemalloc saw less than half of a real RSS growth in {len(missed)} of "
               f"{n.traced_measurements} measurements at {n.largest_traced_bins:,} bins"
               + (": " + ", ".join(f"{m['format']} {m['phase']} ({m['share']:.0%} of "
                                   f"{human_bytes(m['rss'])})" for m in missed) if missed else "")
               + ".")
    if n.readers:
        out.append(f"A reader of a memory-mapped format (opened, its first bin read, bins of "
                   f"{n.reader_pack_size} tokens): anonymous memory "
                   + "; ".join(f"`{f}` {human_bytes(r.anon_growth_bytes[min(r.anon_growth_bytes)])}"
                               f" at {min(r.anon_growth_bytes):,} bins, "
                               f"{human_bytes(r.anon_growth_bytes[max(r.anon_growth_bytes)])} at "
                               f"{max(r.anon_growth_bytes):,}" for f, r in n.readers.items())
                   + ". After a cold open, bins with a page in memory: "
                   + ", ".join(f"`{f}` {r.bins_touched_at_open} of {r.bins_sampled}"
                               for f, r in n.readers.items()) + ".")
    return out
