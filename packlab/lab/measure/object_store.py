"""What object storage costs, counted by the server (notebook 09): per random Parquet access,
to open a dataset, and to write a shard directly or locally then uploaded.

Counts (requests, bytes) come from :meth:`packlab.lab.s3server.S3Server.measure`, so they are
what crossed the wire. Times are wall seconds against a server on this machine: no network
latency, so they rank paths but do not predict S3. :func:`modelled_seconds` turns counts into
a stated model (a first-byte latency per request plus bytes over a bandwidth) for that.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from packlab.formats import get_format
from packlab.formats.parquet import TAIL_BYTES
from packlab.packing import BinAssignment
from packlab.packing.materialize import iter_bins
from packlab.sources import open_dataset, open_shard, open_writer
from packlab.spool import SpoolReader

# A model of one S3 stream in-region, for turning counts into time (not a measurement):
FIRST_BYTE_S = 0.030  # per request
BYTES_PER_S = 100e6


def modelled_seconds(requests: float, nbytes: float, *, first_byte_s: float = FIRST_BYTE_S,
                     bytes_per_s: float = BYTES_PER_S) -> float:
    """Requests times a first-byte latency, plus bytes over a bandwidth."""
    return requests * first_byte_s + nbytes / bytes_per_s


def write_shards(server: Any, spool: SpoolReader, assignment: BinAssignment, prefix: str, *,
                 format: str, num_shards: int = 1, direct: bool | None = None,
                 **options: Any) -> dict[str, Any]:
    """Write the assignment's bins as ``num_shards`` shards under ``prefix`` (a URI); returns
    the URIs and what the server saw (``seconds``, ``requests``, ``bytes_in``)."""
    bounds = np.linspace(0, assignment.num_bins, num_shards + 1).astype(int)
    suffix = get_format(format).SUFFIX
    uris = [f"{prefix}/shard_{k:06d}{suffix}" for k in range(num_shards)]
    with server.measure() as cost:
        for uri, start, stop in zip(uris, bounds[:-1], bounds[1:], strict=True):
            with open_writer(format, uri, direct=direct, pack_size=assignment.pack_size,
                             num_bins=int(stop - start), overwrite=True, **options) as writer:
                for packed in iter_bins(spool, assignment, start=int(start), stop=int(stop)):
                    writer.write(packed)
    return {"uris": uris, **cost}


def access_costs(server: Any, uri: str, *, accesses: int, seed: int = 0,
                 tail_bytes: int = TAIL_BYTES) -> dict[str, Any]:
    """Open a remote Parquet shard, then read ``accesses`` seeded random bins with one cached
    row group: the open's and each access's requests and bytes, against the bound (the
    accessed row group's column chunks; the footer for the open)."""
    with server.measure() as opened:
        reader = open_shard(uri, cache_row_groups=1, tail_bytes=tail_bytes)
    rng = np.random.default_rng(seed)
    rows = []
    for index in rng.integers(0, reader.num_bins, accesses).tolist():
        group = int(reader.row_group_of(index))
        with server.measure() as cost:
            reader.read_bin(index)
        rows.append((cost["requests"], cost["bytes_out"], reader.row_group_bytes(group),
                     cost["seconds"]))
    per = np.array(rows, dtype=np.float64)
    fetched = per[per[:, 0] > 0]  # accesses that missed the one cached row group
    result = {
        "row_group_size": int(np.diff(reader.row_group_offsets).max()),
        "num_row_groups": reader.num_row_groups, "file_bytes": reader.size,
        "footer_bytes": reader.footer_bytes, "open_requests": int(opened["requests"]),
        "open_bytes": int(opened["bytes_out"]), "open_seconds": opened["seconds"],
        "accesses": accesses, "fetching_accesses": int(fetched.shape[0]),
        "requests_per_access": round(float(per[:, 0].mean()), 3),
        "bytes_per_access": round(float(per[:, 1].mean())),
        "max_requests_per_fetch": int(fetched[:, 0].max()) if fetched.size else 0,
        "bytes_per_fetch": round(float(fetched[:, 1].mean())) if fetched.size else 0,
        "row_group_bytes_mean": round(float(fetched[:, 2].mean())) if fetched.size else 0,
        "max_bytes_over_bound": float((fetched[:, 1] / fetched[:, 2]).max())
        if fetched.size else 0.0,
        "p50_ms": round(float(np.median(per[:, 3]) * 1e3), 2),
    }
    result["modelled_s3_ms_per_access"] = round(1e3 * modelled_seconds(
        result["requests_per_access"], result["bytes_per_access"]), 1)
    reader.close()
    return result


def open_costs(server: Any, uri: str, *, cache_dir: str | os.PathLike[str] | None = None,
               reads: int = 1) -> dict[str, Any]:
    """Open a remote dataset and read its first ``reads`` bins: seconds, requests, bytes."""
    with server.measure() as cost:
        ds = open_dataset(uri, cache_dir=cache_dir)
        ds.read_bins(np.arange(min(reads, len(ds))))
    ds.close()
    return {"num_bins": len(ds), "shards": len(ds.shards), "formats": sorted(set(ds.formats)),
            **cost}


def open_comparison(server: Any, uris: dict[str, str], *, reads: int = 1) -> list[dict[str, Any]]:
    """Every dataset opened cold (an empty cache) then warm (the cache the cold open filled)."""
    rows = []
    for label, uri in uris.items():
        cache = Path(tempfile.mkdtemp(prefix="packlab-cache-"))
        try:
            for state in ("cold", "warm"):
                rows.append({"dataset": label, "cache": state,
                             **open_costs(server, uri, cache_dir=cache, reads=reads)})
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return rows


def write_comparison(server: Any, spool: SpoolReader, assignment: BinAssignment, prefix: str,
                     *, row_group_size: int, repeats: int = 1) -> list[dict[str, Any]]:
    """Parquet streamed directly, Parquet written locally then uploaded, memmap written
    locally then uploaded: median seconds of ``repeats``, requests, bytes sent, and the local
    disk the write needs (none when streamed; the whole shard when staged)."""
    ways = {"parquet direct": ("parquet", True, {"row_group_size": row_group_size}),
            "parquet local+upload": ("parquet", False, {"row_group_size": row_group_size}),
            "memmap_v1 local+upload": ("memmap_v1", None, {})}
    rows = []
    for label, (fmt, direct, options) in ways.items():
        runs = [write_shards(server, spool, assignment, f"{prefix}/{fmt}-{direct}", format=fmt,
                             direct=direct, **options) for _ in range(repeats)]
        sent = runs[-1]["bytes_in"]  # a staged shard is uploaded whole: its size is what is sent
        rows.append({"way": label, "seconds": float(np.median([r["seconds"] for r in runs])),
                     "requests": runs[-1]["requests"], "bytes_sent": sent,
                     "local_disk_bytes": 0 if direct else sent})
    return rows

