"""Notebook 05's report: docs/design.md's read targets and the RFC's row-group table judged from
the numbers measured, the tables that show them, and the typed record it keeps.

Every verdict is computed here from the rows of :mod:`~packlab.lab.measure.latency`,
:mod:`~packlab.lab.measure.throughput`, :mod:`~packlab.lab.measure.rowgroups` and
:func:`~packlab.lab.measure.floors.mmap_floors`, in the words of :mod:`~packlab.lab.measure.verdicts`;
which formats a target names is read from the format facts (``RAW_RUNS``: the reads held to
the Python floor; ``IN_RAM``: no cold read), never from their names.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import numpy as np

from packlab.formats import formats_where, get_format
from packlab.lab.measure.floors import MMAP_MODES
from packlab.lab.measure.rowgroups import RFC_BYTES_PER_ROW, RFC_ROW_GROUPS
from packlab.lab.measure.throughput import steady_rate
from packlab.lab.measure.verdicts import claim_verdict, holds
from packlab.lab.records.random_access import (
    Batched,
    FormatAccess,
    Integrity,
    IntegrityRule,
    Latency,
    MmapProbe,
    RandomAccess,
    RowGroupSize,
    Scan,
)
from packlab.lab.results import finding
from packlab.lab.tables import fmt_us, human_bytes, markdown_table, times


# -- docs/design.md's targets ---------------------------------------------------------------
def target_findings(
    warm: Mapping[str, Mapping[str, Any]],
    cold: Mapping[str, Mapping[str, Any]],
    epochs: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    floor_ratio: float = 1.1,
    cold_ratio: float = 1.5,
    split_cold_ratio: float = 1.3,
    parquet_speedup: float = 100.0,
) -> list[dict[str, Any]]:
    """docs/design.md's "Targets", each verdict computed from the numbers given.

    ``warm`` / ``cold``: per format, rows of
    :func:`~packlab.lab.measure.latency.random_access` (batched reads are measured, never a
    target: docs/design.md says why); ``epochs``: ``{"today": ...,
    "packlab": ...}`` rows of :func:`~packlab.lab.measure.rowgroups.shuffled_epoch`. Floors
    are judged for the formats whose bins are runs of their files' values (``RAW_RUNS``:
    nothing to decode, so the targets hold them to the Python floor and to the raw CSR floor,
    numpy over the same files); cold reads for every format whose bins are not all in RAM
    after opening (``IN_RAM`` formats load everything: they have no cold read), and to
    ``split_cold_ratio`` for the directory shards of those formats, whose bins lie in several
    files (their runs asked for together).
    """
    in_ram = set(formats_where("IN_RAM"))
    raw_runs = formats_where("RAW_RUNS")
    out = []
    for fmt in raw_runs:
        if fmt in warm:
            r = warm[fmt]["ratio_to_python_floor"]
            out.append(finding(f"{fmt}: warm random read within {floor_ratio}x of the Python floor",
                               f"p50 {warm[fmt]['p50_us']:.1f} us vs floor "
                               f"{warm[fmt]['python_floor_p50_us']:.1f} us ({r:.3f}x)",
                               holds(r <= floor_ratio), source="target"))
            raw = warm[fmt].get("ratio_to_raw_csr")
            if raw is not None:
                out.append(finding(
                    f"{fmt}: warm random read within {floor_ratio}x of raw CSR numpy over the "
                    "same files", f"p50 {warm[fmt]['p50_us']:.2f} us vs raw CSR "
                    f"{warm[fmt]['raw_csr_p50_us']:.2f} us ({raw:.3f}x)", holds(raw <= floor_ratio),
                    source="target"))
    split = {f for f in raw_runs if get_format(f).Reader.is_directory()}
    for fmt, row in cold.items():
        if fmt in in_ram:
            continue
        r = row["ratio_to_pread"]
        checked = "" if row.get("cold_verified") else ", pages left resident: not a cold read"
        target = split_cold_ratio if fmt in split else cold_ratio
        out.append(finding(f"{fmt}: cold random read within {target}x of a raw pread",
                           f"p50 {row['p50_us']:,.0f} us vs pread {row['pread_p50_us']:,.0f} us "
                           f"({r:.2f}x){checked}",
                           holds(bool(row.get("cold_verified")) and r <= target),
                           source="target"))
    if epochs and {"today", "packlab"} <= set(epochs):
        today, ours = epochs["today"], epochs["packlab"]
        speedup = today["epoch_seconds"] / ours["epoch_seconds"]
        how = (f"projected from {today['accesses']:,} accesses" if today["projected"]
               else "measured")
        out.append(finding(
            f"parquet: shuffled epoch >= {parquet_speedup:.0f}x faster than the one-row-group policy",
            f"{ours['epoch_seconds']:.2f} s (LRU + block shuffle) vs {today['epoch_seconds']:.1f} s "
            f"(one row group + uniform shuffle, {how}): {times(speedup)}",
            holds(speedup >= parquet_speedup), source="target"))
    return out


# -- the cold floors of a memory map, and the RFC's row-group table ----------------------------
def mmap_finding(row: Mapping[str, Any], *, cold_ratio: float = 1.5) -> dict[str, str]:
    """Whether a memory map advised ``MADV_RANDOM`` + ``MADV_WILLNEED`` reads cold within
    ``cold_ratio`` of a raw pread (what a memory-mapped reader could do for the cold target)."""
    ratio = row["mmap_random_willneed_p50_us"] / row["pread_p50_us"]
    return finding(
        f"a memory map advised MADV_RANDOM + MADV_WILLNEED reads cold within {cold_ratio}x of "
        "a raw pread",
        f"{row['mmap_random_willneed_p50_us']:,.0f} us vs pread {row['pread_p50_us']:,.0f} us "
        f"({ratio:.2f}x); default advice {row['mmap_p50_us']:,.0f} us reading "
        f"{row['mmap_pages']:,.0f} pages (read-ahead {row['read_ahead_kb']} KB)",
        holds(ratio <= cold_ratio))


def row_group_findings(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RFC's row-group table, claim against measured, one finding per checkable cell.

    Write memory: the RFC's ~20 KB per row (2 MB / 20 MB / 200 MB), for the rows a row group
    really holds (never more than the shard's bins), an estimate judged by the one rule of
    :mod:`~packlab.lab.measure.verdicts`, on the
    writer's peak anonymous RSS growth (its own allocations; the file-backed rest is the input
    spool's and the output's pages, reclaimable page cache), with the RSS and the Arrow pool
    beside it. Read latency
    "Lower / Medium / Higher": the p50 of a random read that decodes its row group grows with
    the row-group size. "Best for": the smallest size reads such a bin fastest, the largest
    scans fastest.
    """
    if not rows:
        return []
    ordered = sorted(rows, key=lambda r: r["row_group_size"])
    out = []
    for row in ordered:
        held = min(row["row_group_size"], row["num_bins"])
        claimed = RFC_BYTES_PER_ROW * held
        measured = float(row["write_peak_anon_growth_bytes"])
        rfc = RFC_ROW_GROUPS.get(row["row_group_size"])
        text = (f"~{human_bytes(rfc['write_memory'])}" if rfc and held == row["row_group_size"]
                else f"~{human_bytes(claimed)} (20 KB x {held} rows)")
        out.append(finding(f"RFC row-group table: write memory at row_group_size "
                           f"{row['row_group_size']} is {text}",
                           f"{human_bytes(measured)} peak anonymous RSS growth (RSS "
                           f"{human_bytes(row.get('write_peak_rss_growth_bytes'))}, Arrow pool "
                           f"{human_bytes(row.get('write_arrow_pool_peak_bytes'))})",
                           claim_verdict(measured, claimed, "estimate")))
    if len(ordered) >= 2:
        latencies = [r["miss_p50_us"] for r in ordered]
        sizes = [r["row_group_size"] for r in ordered]
        growing = all(b > a for a, b in zip(latencies, latencies[1:], strict=False))
        out.append(finding(
            "RFC row-group table: random read latency Lower / Medium / Higher as row groups grow",
            ", ".join(f"{s}: {v:,.0f} us" for s, v in zip(sizes, latencies, strict=True)),
            holds(growing)))
        fastest = min(ordered, key=lambda r: r["miss_p50_us"])["row_group_size"]
        out.append(finding(
            f"RFC row-group table: the smallest row group ({sizes[0]}) is best for random access",
            f"lowest random-read p50 at row_group_size {fastest}", holds(fastest == sizes[0])))
        scans = {r["row_group_size"]: r["scan_tokens_per_s"] for r in ordered}
        best = max(scans, key=lambda s: scans[s])
        out.append(finding(
            f"RFC row-group table: the largest row group ({sizes[-1]}) is best for sequential scans",
            ", ".join(f"{s}: {v / 1e6:,.1f} M tokens/s" for s, v in scans.items()),
            holds(best == sizes[-1])))
    return out


# -- tables ------------------------------------------------------------------------------------
def latency_table(latency: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> str:
    """``latency[cache][format]`` rows of :func:`~packlab.lab.measure.latency.random_access` as one
    Markdown table."""
    rows = []
    for name in latency.get("warm", latency.get("cold", {})):
        for cache in ("warm", "cold"):
            r = latency.get(cache, {}).get(name)
            if r is None:
                continue
            raw = r.get("ratio_to_raw_csr")
            rows.append([name, cache, r["samples"]]
                        + [fmt_us(r[k]) for k in ("p50_us", "p90_us", "p99_us", "mean_us")]
                        + [fmt_us(r["raw_csr_p50_us"]) if raw else "n/a"]
                        + [fmt_us(r[k]) for k in ("python_floor_p50_us", "memcpy_p50_us",
                                                   "pread_p50_us")]
                        + [f"{raw:.3f}x" if raw else "n/a",
                           f"{r['ratio_to_python_floor']:.2f}x", f"{r['ratio_to_pread']:.2f}x",
                           r.get("cold_verified", "")])
    return markdown_table(["format", "cache", "samples", "p50 µs", "p90 µs", "p99 µs", "mean µs",
                           "raw CSR p50", "Python floor p50", "memcpy p50", "pread p50",
                           "/ raw CSR", "/ Python floor", "/ pread", "0 pages left (mincore)"],
                          rows)


def mmap_table(row: Mapping[str, Any]) -> str:
    return markdown_table(["cold read of one bin's bytes", "p50 µs", "p90 µs", "pages read"],
                          [[mode, fmt_us(row[f"{mode}_p50_us"]), fmt_us(row[f"{mode}_p90_us"]),
                            row[f"{mode}_pages"]] for mode in MMAP_MODES])


def batched_table(batched: Mapping[str, Mapping[str, Any]]) -> str:
    def raw(b: Mapping[str, Any], key: str) -> str:
        return fmt_us(b[key]) if b.get(key) else "n/a"

    return markdown_table(
        ["format", "batch", "samples", "batched µs/bin", "single µs/bin", "gain",
         "raw CSR single", "raw CSR batch loop", "gain vs raw single", "Python floor batched",
         "Python floor single"],
        [[n, b["batch_size"], b["samples"], fmt_us(b["batched_p50_us"]),
          fmt_us(b["single_p50_us"]), f"{b['gain']:.2f}x", raw(b, "raw_single_p50_us"),
          raw(b, "raw_batch_p50_us"),
          f"{b['gain_vs_raw']:.2f}x" if b.get("gain_vs_raw") else "n/a",
          fmt_us(b["floor_batched_p50_us"]), fmt_us(b["floor_single_p50_us"])]
         for n, b in batched.items()])


def integrity_table(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """:func:`~packlab.lab.measure.integrity.integrity_costs` rows: what each check adds to a read."""
    def us(r: Mapping[str, Any], key: str) -> str:
        return fmt_us(r[key]) if r.get(key) is not None else "n/a"

    def ratio(value: float | None, minus: float = 0.0) -> str:
        return f"{value - minus:+.0%}" if value is not None else "n/a"

    return markdown_table(
        ["format", "read p50 µs", "verify=True p50 µs", "verify adds", "check_bin µs",
         "check_bin adds", "xxh3 µs", "crc32 µs", "structure at open ns/bin"],
        [[n, us(r, "read_p50_us"), us(r, "verified_p50_us"), ratio(r["verify_ratio"], 1.0),
          us(r, "check_bin_p50_us"), ratio(r["check_bin_ratio"]), us(r, "xxh3_p50_us"),
          us(r, "crc32_p50_us"),
          f"{r['structure_ns_per_bin']:,.0f}" if r.get("structure_ns_per_bin") else "n/a"]
         for n, r in rows.items()])


def integrity_findings(rows: Mapping[str, Mapping[str, Any]], rule: Mapping[str, Any], *,
                       verify_default: bool, check_bin_default: bool) -> list[dict[str, Any]]:
    """What each check costs a warm read of the zero-copy formats, against the budget of
    :func:`~packlab.lab.measure.integrity.defaults_rule`, and whether packlab's defaults
    (``verify_default``, ``check_bin_default``: what the readers do) are what the numbers
    choose."""
    budget = rule["budget"]
    fast = [n for n in formats_where("RAW_RUNS") if n in rows]
    out = []
    if rule["check_bin_added"] is not None:
        out.append(finding(
            f"every invariant checked on every read (check_bin) adds at most {budget:.0%} to a "
            "warm read", f"median {rule['check_bin_added']:+.0%} ("
            + ", ".join(f"{n} {rows[n]['check_bin_ratio']:+.0%}" for n in fast) + ")",
            holds(rule["check_bin_added"] <= budget)))
    if rule["verify_added"] is not None:
        out.append(finding(
            f"verify=True (the per-bin checksum) adds at most {budget:.0%} to "
            "a warm read", f"median {rule['verify_added']:+.0%} ("
            + ", ".join(f"{n} {rows[n]['verify_ratio'] - 1:+.0%}" for n in fast
                        if rows[n].get("verify_ratio")) + ")",
            holds(rule["verify_added"] <= budget)))
    out.append(finding(
        "packlab's defaults are the ones the costs choose (verify off and the structure "
        "checked once per process when a check costs more than the budget, on when less)",
        f"verify={verify_default}, check_bin per read={check_bin_default}; the numbers choose "
        f"verify={rule['verify_default']}, check_bin per read={rule['check_bin_default']}",
        holds(verify_default == rule["verify_default"]
              and check_bin_default == rule["check_bin_default"])))
    xxh = [rows[n]["xxh3_p50_us"] / rows[n]["crc32_p50_us"] for n in fast]
    if xxh:
        out.append(finding("xxh3_64 is the faster checksum (zlib.crc32 beside it)",
                           f"xxh3 takes {float(np.median(xxh)):.0%} of crc32's time",
                           holds(float(np.median(xxh)) < 1)))
    return out


def throughput_table(scans: Mapping[str, Mapping[str, Mapping[str, Any]]],
                     loaders: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """Scan tokens/s (warm, cold, Python floor, raw read) and DataLoader bins/s per format."""
    workers = [r["workers"] for r in next(iter(loaders.values()))] if loaders else []
    rows = []
    for n in scans["warm"]:
        warm, cold = scans["warm"][n], scans.get("cold", {}).get(n)
        rows.append([n, warm["tokens_per_s"] / 1e6,
                     cold["tokens_per_s"] / 1e6 if cold else "n/a",
                     warm["python_floor_tokens_per_s"] / 1e6, warm["floor_tokens_per_s"] / 1e6]
                    + [round(steady_rate(r)) for r in loaders.get(n, [])]
                    + [max((r["first_batch_seconds"] for r in loaders.get(n, [])), default=0.0)])
    return markdown_table(["format", "scan warm M tok/s", "scan cold M tok/s",
                           "Python floor M tok/s", "raw read M tok/s"]
                          + [f"DataLoader {w} workers bins/s" for w in workers]
                          + ["first batch s (max)"], rows)


def sweep_table(sweep: Sequence[Mapping[str, Any]]) -> str:
    """:func:`~packlab.lab.measure.rowgroups.row_group_sweep` rows beside the RFC's claims (~20 KB
    per row held)."""
    rows = []
    for r in sweep:
        rfc = RFC_ROW_GROUPS.get(r["row_group_size"], {})
        claimed = RFC_BYTES_PER_ROW * min(r["row_group_size"], r["num_bins"])
        rows.append([r["row_group_size"], r["num_row_groups"], human_bytes(r["bytes_on_disk"]),
                     human_bytes(claimed), human_bytes(r["write_peak_anon_growth_bytes"]),
                     human_bytes(r["write_peak_rss_growth_bytes"]),
                     human_bytes(r["write_arrow_pool_peak_bytes"]),
                     rfc.get("read_latency", "n/a"), fmt_us(r["miss_p50_us"]),
                     fmt_us(r["block_epoch_per_bin_us"]), r["scan_tokens_per_s"] / 1e6,
                     rfc.get("best_for", "n/a")])
    return markdown_table(["bins per row group", "row groups", "file size",
                           "claimed write memory", "write peak anon", "write peak RSS",
                           "write Arrow pool peak",
                           "claimed read latency", "random read p50 µs (decodes its group)",
                           "block-shuffle epoch µs/bin", "scan M tok/s", "claimed best for"], rows)


def epoch_table(epochs: Mapping[str, Mapping[str, Any]]) -> str:
    return markdown_table(
        ["policy", "reader", "sampler", "accesses timed", "epoch s", "projected",
         "row-group decodes", "per-bin p50 µs", "per-bin mean µs"],
        [[k, e["policy"], e["sampler"], e["accesses"], e["epoch_seconds"], e["projected"],
          e["row_group_decodes"], fmt_us(e["per_bin_p50_us"]), fmt_us(e["per_bin_mean_us"])]
         for k, e in epochs.items()])


def findings_table(findings: Sequence[Mapping[str, str]]) -> str:
    return markdown_table(["claim", "measured", "verdict"],
                          [[f["claim"], f["measured"], f["verdict"]] for f in findings])


# -- the numbers notebook 05 records -----------------------------------------------------------
def headline_numbers(
    latency: Mapping[str, Mapping[str, Mapping[str, Any]]],
    scans: Mapping[str, Mapping[str, Mapping[str, Any]]],
    batched: Mapping[str, Mapping[str, Any]],
    loaders: Mapping[str, Sequence[Mapping[str, Any]]],
    sweep: Sequence[Mapping[str, Any]],
    epochs: Mapping[str, Mapping[str, Any]],
    mmap: Mapping[str, Any] | None = None,
    *,
    integrity: Mapping[str, Mapping[str, Any]] | None = None,
    rule: Mapping[str, Any] | None = None,
    num_bins: int | None = None,
) -> RandomAccess:
    """Every figure of notebook 05 in its typed record (what ``results.record`` keeps)."""
    names = list(dict.fromkeys([*latency.get("warm", {}), *latency.get("cold", {}),
                                *scans.get("warm", {}), *batched, *loaders,
                                *(integrity or {})]))
    formats = {}
    for n in names:
        scan = {c: scans.get(c, {}).get(n) for c in ("warm", "cold")}
        formats[n] = FormatAccess(
            warm=_typed(Latency, latency.get("warm", {}).get(n)),
            cold=_typed(Latency, latency.get("cold", {}).get(n)),
            scan_warm=_typed(Scan, scan["warm"]), scan_cold=_typed(Scan, scan["cold"]),
            batched=_typed(Batched, batched.get(n)),
            dataloader_bins_per_s={r["workers"]: steady_rate(r) for r in loaders.get(n, [])},
            integrity=_typed(Integrity, (integrity or {}).get(n)))
    speedup = (epochs["today"]["epoch_seconds"] / epochs["packlab"]["epoch_seconds"]
               if {"today", "packlab"} <= set(epochs) else None)
    return RandomAccess(
        formats=formats, num_bins=num_bins,
        mmap=None if mmap is None else MmapProbe(
            {mode: mmap[f"{mode}_p50_us"] for mode in MMAP_MODES}, mmap["read_ahead_kb"],
            mmap["mmap_pages"], mmap["nbytes"]),
        integrity_rule=_typed(IntegrityRule, rule),
        row_groups=[_typed(RowGroupSize, r) for r in sweep],
        epoch_seconds={k: e["epoch_seconds"] for k, e in epochs.items()},
        shuffled_epoch_speedup=speedup,
        row_group_decodes={k: epochs[k]["row_group_decodes"] for k in ("today", "packlab")
                           if k in epochs})


def _typed(cls: type, row: Mapping[str, Any] | None) -> Any:
    """The fields of ``cls`` a measurement's row holds (None: not measured)."""
    if row is None:
        return None
    return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})
