"""Notebook 12's summary: the RFC's scale end to end, stage by stage, beside the RFC's claims.

The stage table (:func:`stage_rows`), the findings (:func:`findings`) and the bullets
(:func:`bullets`) all read the typed record (:class:`~packlab.lab.records.at_scale.AtScale`),
so the notebook, the report's front page and the README say the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.formats import formats_where
from packlab.lab.measure.stages import StageResult
from packlab.lab.measure.verdicts import approx, at_least, at_most, holds
from packlab.lab.records.at_scale import AtScale
from packlab.lab.results import finding
from packlab.lab.tables import GB, MB, human_bytes, times

RFC_SAMPLES = 13_000_000  # the RFC's post-training corpus (Nemotron-3 Nano)
RFC_LOAD_BYTES = 1e12  # "~1 TB of RAM just to load the dataset"
RFC_REDUCTION = (200, 500)  # "reducing memory usage by 200-500x for large datasets"
WRITER_BOUND = 1 * GB  # a pack process's resident memory, whatever the spool's size
READ_HOLD = 64 * MB  # what random reads may leave resident beyond what opening took
FIRST_PASS_BAND, WARM_BAND = 1.5, 2.0  # a format's random read against binidx's
LEGACY = "write:legacy_npy_pickle"


def _mib(n: float | None) -> str:
    return "n/a" if n is None else f"{n / 2**20:,.0f}"


def stage_rows(n: AtScale) -> list[dict[str, Any]]:
    """One row a stage: wall and CPU seconds, tokens per CPU-second, the largest resident
    memory of one of its processes (anonymous / file-backed) and of all of them at once."""
    rows = []
    for key, s in n.stages.items():
        rows.append({
            "stage": key, "outcome": s.outcome, "seconds": f"{s.seconds:,.1f}",
            "CPU s": f"{s.cpu_seconds:,.1f}",
            "tokens / CPU-s": "" if not s.tokens_per_cpu_second else
            f"{s.tokens_per_cpu_second:,.3g}",
            "processes": s.processes,
            "one process: anon / file (MiB)": f"{_mib(s.per_process.anon)} / "
                                              f"{_mib(s.per_process.file)}",
            "all at once (MiB)": _mib(s.summed.rss),
            "on disk": "" if s.disk_bytes is None else human_bytes(s.disk_bytes)})
    return rows


def read_rows(n: AtScale) -> list[dict[str, Any]]:
    """Per format: random reads first pass and warm (p50), batched per bin, and what the
    reads left resident beyond what opening took (anon, file), against the bytes returned."""
    rows = []
    for fmt in n.num_bins:
        r = n.stages.get(f"reads:{fmt}")
        if r is None or r.result is None:
            continue
        res = r.result
        grown = _grown(res)
        rows.append({"format": fmt, "bins": n.num_bins[fmt], "reads": res["samples"],
                     "first pass p50 (us)": round(res["first"]["p50_us"], 1),
                     "warm p50 (us)": round(res["warm"]["p50_us"], 1),
                     "batched, per bin (us)": round(res["batched"]["per_bin_p50_us"], 1),
                     "returned": human_bytes(res["warm"]["returned_bytes"]),
                     "left resident: anon / file (MiB)": f"{_mib(grown[0])} / {_mib(grown[1])}",
                     "through a map, first / warm (us)": _mapped_text(res.get("mapped"))})
    return rows


def _mapped_text(mapped: Mapping[str, Any] | None) -> str:
    """The same bins through plain memory maps: first / warm p50, and what stayed resident."""
    if not mapped:
        return ""
    held = mapped["warm"]["after"]["file"] - mapped["before"]["file"]
    return (f"{mapped['first']['p50_us']:,.1f} / {mapped['warm']['p50_us']:,.1f} "
            f"({_mib(held)} MiB left resident)")


def _grown(res: Mapping[str, Any]) -> tuple[int, int]:
    """What the reads left resident beyond what opening took: (anon, file) bytes."""
    start, end = res["after_open"], res["batched"]["after"]
    return end["anon"] - start["anon"], end["file"] - start["file"]


def legacy_projection(n: AtScale) -> tuple[float, int, int] | None:
    """Today's format at the run's size, from where it failed: ``(bytes, bins kept, bins)``
    (bytes a bin at the cap, times every bin of the spool); None when it was not capped."""
    s = n.stages.get(LEGACY)
    if s is None or s.outcome != "capped" or not s.progress or not s.trace:
        return None
    kept, total = s.progress
    if kept <= 0 or s.base_bytes is None:
        return None
    per_bin = (s.summed.rss - s.base_bytes) / kept
    return per_bin * total, kept, total


def at_rfc_scale(n: AtScale, value: float) -> float:
    """A size that grows with the corpus, scaled to the RFC's 13M samples."""
    return value * RFC_SAMPLES / n.plan.num_sequences


def _stage(n: AtScale, key: str) -> StageResult | None:
    return n.stages.get(key)


def findings(n: AtScale) -> list[dict[str, str]]:
    out = []
    projected = legacy_projection(n)
    if projected is not None:
        total, kept, bins = projected
        at_rfc = at_rfc_scale(n, total)
        out.append(finding(
            "RFC: the current format would require ~1 TB of RAM to load 13M samples",
            f"{human_bytes(at_rfc)} at 13M sequences: {human_bytes(total / bins)} a bin where "
            f"it hit the cap ({kept:,} of {bins:,} bins kept), times every bin",
            approx(at_rfc, RFC_LOAD_BYTES), source="rfc"))
        readers = [s.per_process.rss for k, s in n.stages.items() if k.startswith("epoch:")]
        if readers:
            ratio = total / max(readers)
            out.append(finding(
                "RFC: the new formats reduce memory 200-500x for large datasets",
                f"{times(ratio)}: today's format's {human_bytes(total)} against the largest "
                f"process of any format's DataLoader epoch ({human_bytes(max(readers))})",
                at_least(ratio, RFC_REDUCTION[0]), source="rfc"))
    packs = {k.split(":", 1)[1]: s for k, s in n.stages.items() if k.startswith("pack:")}
    if packs:
        worst = max(packs, key=lambda f: packs[f].per_process.rss)
        out.append(finding(
            f"a writer's resident memory is bounded whatever the spool's size (under "
            f"{human_bytes(WRITER_BOUND)} a process)",
            f"at most {human_bytes(packs[worst].per_process.rss)} ({worst}; file-backed "
            f"{human_bytes(packs[worst].per_process.file)}) packing "
            f"{n.plan.num_sequences:,} sequences", at_most(packs[worst].per_process.rss,
                                                          WRITER_BOUND / 1.25),
            source="target"))
    reads = {fmt: _stage(n, f"reads:{fmt}") for fmt in n.num_bins}
    reads = {f: s for f, s in reads.items() if s is not None and s.result is not None}
    left = {f: sum(_grown(s.result)) for f, s in reads.items() if not s.result["keeps_blocks"]}
    if left:
        worst = max(left, key=lambda f: left[f])
        out.append(finding(
            f"random reads leave no more than {human_bytes(READ_HOLD)} resident beyond what "
            "opening took (Parquet aside: it keeps up to 8 decoded row groups a process)",
            f"at most {human_bytes(left[worst])} ({worst}) after "
            f"{3 * next(iter(reads.values())).result['samples']:,} reads returning "
            f"{human_bytes(next(iter(reads.values())).result['warm']['returned_bytes'])} a pass",
            holds(left[worst] <= READ_HOLD), source="target"))
    base_name = n.baseline
    if base_name in reads:
        base = reads[base_name].result
        gathers = set(formats_where("NEEDS_SPOOL"))  # a bin gathered sequence by sequence
        for fmt, s in reads.items():
            if fmt == base_name or s.result["keeps_blocks"]:
                continue
            first = s.result["first"]["p50_us"] / base["first"]["p50_us"]
            warm = s.result["warm"]["p50_us"] / base["warm"]["p50_us"]
            band = WARM_BAND if fmt in gathers else FIRST_PASS_BAND
            out.append(finding(
                f"{fmt}: a random read within {band:g}x of {base_name}'s at "
                f"{n.num_bins[fmt]:,} bins (first pass), {WARM_BAND:g}x warm",
                f"{first:.2f}x first pass, {warm:.2f}x warm",
                holds(round(first, 2) <= band and round(warm, 2) <= WARM_BAND),
                source="target"))
    mapped = {f: s.result["mapped"] for f, s in reads.items() if s.result.get("mapped")}
    if mapped:
        held = {f: (m["warm"]["after"]["file"] - m["before"]["file"],
                    sum(_grown(reads[f].result))) for f, m in mapped.items()}
        worst = max(held, key=lambda f: held[f][1])
        m, r = mapped[worst], reads[worst].result
        out.append(finding(
            "random reads by pread leave at most a tenth of what reads of the same bins through "
            "a memory map of the same files leave resident",
            f"{worst}: {human_bytes(held[worst][1])} by pread against "
            f"{human_bytes(held[worst][0])} through a map; a read {r['first']['mean_us']:,.1f} us "
            f"on average, first pass, by pread, {m['first']['mean_us']:,.1f} us through a map "
            f"({m['warm']['mean_us']:,.1f} once its pages are mapped)",
            holds(all(h[1] <= h[0] / 10 for h in held.values())), source="check"))
    if n.byte_identical is not None:
        out.append(finding(
            "a pack killed half-way and finished by the same command is byte for byte an "
            "uninterrupted run's",
            f"{n.resumed_files:,} files compared by sha256"
            + ("" if n.byte_identical else f"; differ: {', '.join(n.differing_files[:4])}"),
            holds(n.byte_identical), source="check"))
    return out


def bullets(n: AtScale, p: Mapping[str, Any]) -> list[str]:
    out = [f"**Scale.** {n.plan.num_sequences:,} sequences of the `short` profile "
           f"({n.num_tokens:,} tokens), {n.plan.reason}; the whole run took "
           f"{n.seconds / 60:,.0f} min."]
    synth, packs = _stage(n, "synth"), {k.split(":", 1)[1]: s for k, s in n.stages.items()
                                        if k.startswith("pack:")}
    if synth is not None:
        out.append(f"**Synth** {synth.seconds:,.0f} s ({human_bytes(synth.disk_bytes)} spool); "
                   "**pack** " + ", ".join(
                       f"{f} {s.seconds:,.0f} s ({human_bytes(s.per_process.rss)} a process at "
                       f"most, {human_bytes(s.per_process.file)} of it file-backed)"
                       for f, s in packs.items()) + ".")
    epochs = {k.split(":", 1)[1]: s for k, s in n.stages.items() if k.startswith("epoch:")}
    if epochs:
        out.append("**A DataLoader epoch** (2 workers, the recommended sampler): " + ", ".join(
            f"{f} {s.seconds:,.0f} s ({n.num_bins.get(f, 0) / max(s.seconds, 1e-9):,.0f} "
            f"bins/s, {human_bytes(s.summed.rss)} over its {s.processes} processes)"
            for f, s in epochs.items()) + ".")
    ranks = {k.split(":", 1)[1]: s for k, s in n.stages.items() if k.startswith("ranks:")}
    for fmt, s in ranks.items():
        out.append(f"**Rank-sharded loading** of {fmt} (world size {p.get('world_size', 4)}, "
                   f"{p.get('loader_workers', 2)} workers each, separate processes): "
                   f"{human_bytes(s.summed.rss)} resident over {s.processes} processes at "
                   f"once (anonymous {human_bytes(s.summed.anon)}, file-backed "
                   f"{human_bytes(s.summed.file)}), {s.seconds:,.0f} s.")
    projected = legacy_projection(n)
    if projected is not None:
        total, kept, bins = projected
        out.append(f"**Today's format** (one pickled .npy of every bin) hit the "
                   f"{human_bytes(p.get('legacy_cap_bytes', 0))} cap after {kept:,} of "
                   f"{bins:,} bins: {human_bytes(total / bins)} a bin, "
                   f"{human_bytes(total)} for this spool, "
                   f"{human_bytes(at_rfc_scale(n, total))} at 13M sequences (the RFC says "
                   "~1 TB, counting 13M packed rows where 13M conversations pack into "
                   f"{at_rfc_scale(n, bins):,.0f}).")
    return out


def format_rows(n: AtScale) -> list[dict[str, Any]]:
    """One row a format: its pack, validate, random reads and DataLoader epoch at this size."""
    rows = []
    for fmt in n.num_bins:
        pack, validate = _stage(n, f"pack:{fmt}"), _stage(n, f"validate:{fmt}")
        reads, epoch = _stage(n, f"reads:{fmt}"), _stage(n, f"epoch:{fmt}")
        rows.append({
            "format": fmt, "bins": f"{n.num_bins[fmt]:,}",
            "pack": "" if pack is None else
            f"{pack.seconds:,.0f} s, {human_bytes(pack.per_process.rss)} a process at most "
            f"({human_bytes(pack.per_process.file)} file-backed)",
            "validate": "" if validate is None else f"{validate.seconds:,.0f} s",
            "random read, first / warm": "" if reads is None or reads.result is None else
            f"{reads.result['first']['p50_us']:,.1f} / {reads.result['warm']['p50_us']:,.1f} µs",
            "DataLoader epoch": "" if epoch is None else
            f"{epoch.seconds:,.0f} s, {human_bytes(epoch.summed.rss)} over "
            f"{epoch.processes} processes",
            "on disk": "" if pack is None else human_bytes(pack.disk_bytes)})
    return rows


def scale_markdown(recorded: Mapping[str, Any] | None, run_text: str) -> str:
    """The recorded scale run (``results/rfc/``) for the README's Findings and the report's
    front page: what it was (``run_text``: its run's metadata), every format at that size,
    and the claims it measured."""
    from packlab.lab.records import load
    from packlab.lab.summaries import findings_table
    from packlab.lab.tables import records_table

    if not recorded:
        return ("No run at the RFC's scale is recorded yet: `make run SCALE=rfc`, then "
                "`python -m packlab.lab.notebooks record --scale rfc`.")
    n = load("12_at_scale", recorded)
    assert isinstance(n, AtScale)
    rows = format_rows(n)
    head = (f"The recorded run at the RFC's scale (notebook 12, `make run SCALE=rfc`, "
            f"{n.seconds / 60:,.0f} min): {n.plan.num_sequences:,} sequences of the `short` "
            f"profile, {n.num_tokens:,} tokens; {run_text}.")
    table = records_table(rows, list(rows[0])) if rows else ""
    return "\n\n".join(part for part in (
        head, "\n".join(f"- {b}" for b in bullets(n, recorded.get("parameters", {}))), table,
        findings_table(recorded.get("findings", []), colour=False)) if part)
