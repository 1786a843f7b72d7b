"""What integrity on read costs: per bin, warm, measured side by side.

One loop over the same seeded bins (the timing loop of :mod:`packlab.lab.measure.timing`),
each step timing, on the bin it reads (delivered, as :mod:`packlab.lab.measure.latency`
delivers):

- ``read``: ``dataset[i]`` as opened by default (``verify=False``);
- ``verified``: ``dataset[i]`` opened with ``verify=True`` (the per-bin checksum for the
  memory-mapped formats, each sequence's for ``packed_index``; page CRCs for Parquet);
- ``check_bin``: :func:`packlab.bins.check_bin` on the bin just read: what checking every
  invariant on every read would add;
- ``xxh3`` and ``crc32``: the bin's bytes (tokens, mask, boundaries) hashed by each, the
  cost of the checksum alone.

Beside them, once: ``structure_ns_per_bin``, what checking every bin's structure costs when a
reader builds its table (:mod:`packlab.formats.read.table`: once per process, before any bin
is returned; None for formats without a table). :func:`defaults_rule` turns the figures into
the defaults: a check is on by default when it costs at most ``budget`` (10%) of a read.
"""

from __future__ import annotations

import os
import time
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from xxhash import xxh3_64_intdigest

from packlab.bins import check_bin
from packlab.errors import PacklabError
from packlab.lab.measure.delivery import Sink
from packlab.lab.measure.reading import data_files, format_of, open_source, readers_of, warm
from packlab.lab.measure.timing import Lane, interleaved, seeded_indices

COSTS = ("read", "verified", "check_bin", "xxh3", "crc32")


def _timed(call: Any, *args: Any, **kwargs: Any) -> int:
    began = time.perf_counter_ns()
    call(*args, **kwargs)
    return time.perf_counter_ns() - began


def _hashes(item: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """Nanoseconds of xxh3_64 and of zlib.crc32 over the item's three arrays."""
    arrays = [np.ascontiguousarray(item[k]) for k in ("input_ids", "loss_mask", "seq_boundaries")]

    def xxh3() -> int:
        h = 0
        for a in arrays:
            h = xxh3_64_intdigest(a, h)
        return h

    def crc() -> int:
        c = 0
        for a in arrays:
            c = zlib.crc32(a, c)
        return c

    return _timed(xxh3), _timed(crc)


def structure_cost(path: str | os.PathLike[str]) -> float | None:
    """Nanoseconds per bin of building a fresh reader's table (index read, every bin's
    structure checked, boundaries built), the best of three; None without a table."""
    best = None
    for _ in range(3):
        source = open_source(path, "reader")
        if getattr(source, "placement", None) is None or source.placement() is None:
            return None
        began = time.perf_counter_ns()
        source.table()
        elapsed = time.perf_counter_ns() - began
        best = elapsed if best is None else min(best, elapsed)
        source.close()
    return None if best is None else best / len(source)


def integrity_costs(path: str | os.PathLike[str], *, samples: int = 500, seed: int = 0,
                    max_seconds: float | None = None) -> dict[str, Any]:
    """Per-bin costs of integrity on read at ``path`` (see the module); keys ``<cost>_p50_us``
    (and p90/p99/mean) for :data:`COSTS`, ``verify_ratio`` and ``check_bin_ratio`` (over the
    plain read's p50), ``xxh3_ratio``, ``crc32_ratio``, ``structure_ns_per_bin``,
    ``verify_available`` (False: the shards record no checksums, ``verify=True`` refused)."""
    if samples <= 0:
        raise PacklabError(f"samples must be positive, got {samples}")
    plain = open_source(path, "dataset")
    try:
        checked = open_source(path, "dataset", {"verify": True})
        checked[0]
    except PacklabError:
        checked = None
    sink = Sink(plain.pack_size)
    files = data_files(plain)
    warm(plain, files, sink)
    if checked is not None:
        warm(checked, [], sink)
    pack_size = max(int(r.pack_size) for r in readers_of(plain))

    def check(i: int) -> int:
        item = plain[i]
        return _timed(check_bin, item["input_ids"], item["loss_mask"],
                      item["seq_boundaries"][:-1], pack_size=pack_size, source=str(path),
                      bin_id=i)

    lanes = [Lane("read", lambda i: sink.timed(plain.__getitem__, i)[0]),
             Lane("check_bin", check, floor=True),
             Lane("xxh3", lambda i: _hashes(plain[i])[0], floor=True),
             Lane("crc32", lambda i: _hashes(plain[i])[1], floor=True)]
    if checked is not None:  # the verified read: another bin
        lanes.insert(1, Lane("verified", lambda i: sink.timed(checked.__getitem__, i)[0],
                             shift=samples // 2))
    timings = interleaved(lanes, seeded_indices(len(plain), samples, seed),
                          max_seconds=max_seconds)
    plain.close()
    taken = timings.samples("read")
    out: dict[str, Any] = {"path": str(path), "format": format_of(plain), "samples": taken,
                           "seed": seed, "verify_available": checked is not None,
                           "structure_ns_per_bin": structure_cost(path)}
    for name in COSTS:
        if name == "verified" and checked is None:
            out.update({f"verified_{p}_us": None for p in ("p50", "p90", "p99", "mean")})
            continue
        out.update(timings.percentiles(name, f"{name}_"))
    base = out["read_p50_us"]
    out["verify_ratio"] = out["verified_p50_us"] / base if checked is not None else None
    for name in ("check_bin", "xxh3", "crc32"):
        out[f"{name}_ratio"] = out[f"{name}_p50_us"] / base
    return out


def defaults_rule(rows: Mapping[str, Mapping[str, Any]], *, budget: float = 0.10
                  ) -> dict[str, Any]:
    """The defaults the figures choose: a check runs on every read by default when it adds at
    most ``budget`` of the read it checks (the median over formats, so one noisy format does
    not decide). ``verify_default``: whether ``verify=True`` should be the default;
    ``check_bin_default``: whether every invariant should be checked on every read; with the
    median added costs they were judged on."""
    added_verify = [r["verify_ratio"] - 1 for r in rows.values() if r.get("verify_ratio")]
    added_check = [r["check_bin_ratio"] for r in rows.values()]
    verify = float(np.median(added_verify)) if added_verify else None
    check = float(np.median(added_check)) if added_check else None
    return {"budget": budget, "verify_added": verify, "check_bin_added": check,
            "verify_default": verify is not None and verify <= budget,
            "check_bin_default": check is not None and check <= budget}
