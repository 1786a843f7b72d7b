"""One large shard on object storage read in place, format by format (notebook 09): what a
random bin costs in requests and bytes, and how long the first bin takes from a cold cache.

A format that ``READS_IN_PLACE`` fetches what it needs to find a bin once (Parquet: the
footer; ``megatron_sft`` and ``binidx``: megatron-core's ``.idx`` and the small sidecars, into
the local cache), then reads each bin by ranged GETs (Parquet: its row group; the Megatron
pairs: exactly the bin's bytes, one request per data file). Any other format downloads the
whole shard, verified, before its first bin. Counts come from the server
(:meth:`packlab.lab.s3server.S3Server.measure`); seconds are against a server on this
machine, so :func:`~packlab.lab.measure.object_store.modelled_seconds` turns the counts into a
stated S3 model beside them.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from packlab.formats import format_names, get_format, shard_size
from packlab.lab.measure.object_store import modelled_seconds, write_shards
from packlab.packing import BinAssignment
from packlab.sources import open_shard
from packlab.spool import SpoolReader


def in_place_comparison(server: Any, spool: SpoolReader, assignment: BinAssignment,
                        prefix: str, *, accesses: int, seed: int = 0,
                        format_options: dict[str, dict[str, Any]] | None = None
                        ) -> list[dict[str, Any]]:
    """Every registered format that a shard can be made in from bins alone, the assignment's
    bins as one shard under ``prefix`` (each format's writer given its ``format_options``,
    e.g. Parquet's row-group size), measured by :func:`in_place_costs`: in-place readers
    first."""
    names = [n for n in format_names() if not get_format(n).Writer.NEEDS_SPOOL]
    names.sort(key=lambda n: not get_format(n).Reader.READS_IN_PLACE)
    rows = []
    for name in names:
        options = (format_options or {}).get(name, {})
        written = write_shards(server, spool, assignment, f"{prefix}/{name}", format=name,
                               metadata={"vocab_size": spool.vocab_size}, **options)
        rows.append(in_place_costs(server, written["uris"][0], name, accesses=accesses,
                                   seed=seed))
    return rows


def in_place_costs(server: Any, uri: str, format: str, *, accesses: int, seed: int = 0
                   ) -> dict[str, Any]:
    """The shard at ``uri`` opened from an empty cache and its first bin read (requests,
    bytes, seconds), then ``accesses`` seeded random bins read one by one (each counted)."""
    cache = Path(tempfile.mkdtemp(prefix="packlab-cache-"))
    try:
        with server.measure() as first:
            reader = open_shard(uri, format=format, cache_dir=cache)
            reader.read_bin(0)
        rng = np.random.default_rng(seed)
        picks = rng.choice(reader.num_bins, min(accesses, reader.num_bins), replace=False)
        rows = []
        for b in picks.tolist():
            with server.measure() as cost:
                packed = reader.read_bin(b)
            rows.append((cost["requests"], cost["bytes_out"], packed.packed_len,
                         cost["seconds"]))
        reader.close()
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    per = np.array(rows, dtype=np.float64)
    result = {
        "format": format, "reads_in_place": get_format(format).Reader.READS_IN_PLACE,
        "num_bins": int(reader.num_bins), "shard_bytes": shard_size(uri),
        "first_bin_requests": int(first["requests"]), "first_bin_bytes": int(first["bytes_out"]),
        "first_bin_seconds": round(float(first["seconds"]), 4), "accesses": len(rows),
        "requests_per_bin": round(float(per[:, 0].mean()), 3),
        "max_requests_per_bin": int(per[:, 0].max()),
        "bytes_per_bin": round(float(per[:, 1].mean())),
        "bytes_per_token_read": round(float(per[:, 1].sum() / per[:, 2].sum()), 3),
        "p50_ms": round(float(np.median(per[:, 3]) * 1e3), 2),
    }
    result["modelled_s3_ms_per_bin"] = round(1e3 * modelled_seconds(
        result["requests_per_bin"], result["bytes_per_bin"]), 1)
    result["modelled_s3_first_bin_ms"] = round(1e3 * modelled_seconds(
        result["first_bin_requests"], result["first_bin_bytes"]), 1)
    return result
