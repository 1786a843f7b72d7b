"""Notebook 09's summary: what a packed shard costs on object storage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.cloud_storage import CloudStorage


def bullets(n: CloudStorage, p: Mapping[str, Any]) -> list[str]:
    sweep = n.access
    small, large = sweep[0], sweep[-1]
    cold = {r["dataset"]: r for r in n.open if r["cache"] == "cold"}
    warm = {r["dataset"]: r for r in n.open if r["cache"] == "warm"}
    way = {r["way"]: r for r in n.write}
    ms_small, ms_large = small["modelled_s3_ms_per_access"], large["modelled_s3_ms_per_access"]
    advice = ("random access over S3 wants small row groups (sequential scans want large ones)"
              if ms_small < 0.8 * ms_large else "the row-group size barely matters at this scale")
    return [
        f"**Random Parquet access** costs one ranged GET of one row group: at most "
        f"{n.max_requests_per_access} request and {n.max_bytes_over_row_group:.2f}x the row "
        "group's compressed bytes per access that misses the cached group; once per open, a HEAD "
        f"and one tail read ({max(r['open_bytes'] for r in sweep) / 1e3:.0f} kB here: 64 KiB or "
        f"the footer, whichever is larger; footers of {large['footer_bytes'] / 1e3:.1f}-"
        f"{small['footer_bytes'] / 1e3:.1f} kB).",
        f"**The row group sets the bytes, not the request count**: "
        f"{small['bytes_per_fetch'] / 1e3:.0f} kB per fetching access at "
        f"{small['row_group_size']} bins per group, {large['bytes_per_fetch'] / 1e3:.0f} kB at "
        f"{large['row_group_size']}. Modelled on S3 (30 ms to first byte, 100 MB/s): "
        f"{ms_small:.0f} ms against {ms_large:.0f} ms per access, so {advice}.",
        f"**Opening** {p['num_shards']} shards cold: Parquet in place fetched "
        f"{cold['parquet']['bytes_out'] / 1e6:.2f} MB in {cold['parquet']['requests']} requests "
        f"({cold['parquet']['seconds']:.2f} s); memmap downloaded "
        f"{cold['memmap_v1']['bytes_out'] / 1e6:.2f} MB in {cold['memmap_v1']['requests']} "
        f"requests ({cold['memmap_v1']['seconds']:.2f} s) before its first bin, then "
        f"{warm['memmap_v1']['bytes_out'] / 1e3:.0f} kB (the records) when warm. Formats that "
        "download first suit jobs that copy the data to local disk once; Parquet and the "
        "Megatron pairs suit reading straight from the store.",
        *_in_place(n.in_place),
        f"**Writing** Parquet straight to the store took {way['parquet direct']['seconds']:.2f} s "
        "and no local disk; locally then uploaded, "
        f"{way['parquet local+upload']['seconds']:.2f} s and "
        f"{way['parquet local+upload']['local_disk_bytes'] / 1e6:.2f} MB of local disk; memmap "
        f"staged sent {way['memmap_v1 local+upload']['bytes_sent'] / 1e6:.2f} MB (padded rows). "
        "Every way publishes atomically: a failed or killed writer leaves nothing under the "
        "final key.",
        f"**SQL**: DuckDB counted {n.duckdb_num_bins:,} bins over s3:// in "
        f"{n.duckdb_requests} requests ({n.duckdb_bytes / 1e6:.2f} MB), with no network "
        "extension.",
    ]


def _in_place(rows: list[dict[str, Any]]) -> list[str]:
    """The bullet of the in-place table (none for a run recorded before it)."""
    if not rows:
        return []
    ranged = [r for r in rows if r["reads_in_place"]]
    fetched = [r for r in rows if not r["reads_in_place"]]
    each = "; ".join(f"{r['format']} {r['requests_per_bin']:g} GET, "
                     f"{r['bytes_per_bin'] / 1e3:.1f} kB ({r['bytes_per_token_read']:.2f} B per "
                     f"token read), first bin {r['first_bin_bytes'] / 1e3:.0f} kB in "
                     f"{r['first_bin_seconds']:.2f} s" for r in ranged)
    largest = max(fetched, key=lambda r: r["first_bin_bytes"]) if fetched else None
    rest = (f" The formats that download first ({', '.join(r['format'] for r in fetched)}) "
            f"fetch the whole shard before their first bin (up to "
            f"{largest['first_bin_bytes'] / 1e6:.2f} MB, {largest['first_bin_seconds']:.2f} s, "
            f"{largest['format']}), then nothing." if largest else "")
    return [f"**In place by ranged GETs**, one large shard of {rows[0]['num_bins']:,} bins, a "
            f"random bin after the first: {each}. The Megatron pairs fetch megatron-core's .idx "
            "once into the cache, then exactly the bin's bytes per data file (megatron_sft one "
            "request, its mask in the token words; binidx two, its mask in loss_mask.bin); "
            f"Parquet its row group.{rest}"]
