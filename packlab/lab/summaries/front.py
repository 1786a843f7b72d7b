"""The answer across notebooks: one row per format, a format per use case, the claims tables.

Everything here is computed from one run's recorded results (``{notebook: results JSON}``, as
:func:`packlab.lab.summaries.record.load_run` returns them) and the formats' facts; the report's
front page and the README's generated blocks print the same Markdown. A notebook missing from
the run leaves its cells ``n/a`` and its use case ``not measured``, never an error.

Where the numbers come from: write and load peak memory, notebook 04 (largest size measured);
warm and cold p50 of one random bin and their floors, and the warm sequential scan, notebook
05; bytes per token on disk, notebook 03 (the same `chat` data as 05); the wait of a random bin
read in place on object storage, notebook 09. How a use case is decided: :mod:`.decide`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from packlab.formats import format_names, get_format
from packlab.lab.measure.verdicts import NOT_MEASURED, RULE, badge
from packlab.lab.records import (
    CloudStorage,
    Packing,
    PeakMemory,
    Peers,
    RandomAccess,
    WriteFormats,
    of_run,
)
from packlab.lab.summaries import decide
from packlab.lab.tables import fmt_us, human_bytes, markdown_table

Run = Mapping[str, Mapping[str, Any]]
#: the figures that carry the answer (notebook figure names), with what each shows
KEY_FIGURES = (
    ("05_latency_floors", "One random bin, warm and cold, against the memcpy, pread and Python "
                          "floors (notebook 05)"),
    ("04_peak_memory_growth", "Peak memory writing and loading as the data grows (notebook 04)"),
    ("03_bytes_per_token", "Bytes on disk per token, every format (notebook 03)"),
)


def format_rows(run: Run) -> list[dict[str, Any]]:
    """One row per registered format: its measured numbers (None where not measured) and facts."""
    memory = of_run(run, PeakMemory)
    access = of_run(run, RandomAccess)
    writes = of_run(run, WriteFormats)
    sizes = writes.bytes_per_token if writes is not None else {}
    # a format that reads its tokens from the spool keeps the spool on disk (its bytes; the
    # raw payload in runs that did not record them)
    spool = (writes.spool_bytes_per_token or writes.raw_bytes_per_token) if writes else None
    cloud = of_run(run, CloudStorage)
    remote = {r["format"]: r for r in cloud.in_place if r.get("reads_in_place")} if cloud else {}
    rows = []
    for fmt in format_names():
        facts = get_format(fmt).Reader
        size = sizes.get(fmt)
        s3 = remote.get(fmt, {})
        held = memory.formats.get(fmt) if memory is not None else None
        write, write_bins = held.write.largest() if held else (None, None)
        load, load_bins = held.load.largest() if held else (None, None)
        measured = access.formats.get(fmt) if access is not None else None
        warm = measured.warm if measured else None
        cold = measured.cold if measured else None
        scan = measured.scan_warm if measured else None
        rows.append({
            "format": fmt, "write_peak_bytes": write, "load_peak_bytes": load,
            "memory_bins": write_bins or load_bins,
            "write_slope": held.write.loglog_slope if held else None,
            "warm_p50_us": warm.p50_us if warm else None,
            "warm_floor_us": warm.python_floor_p50_us if warm else None,
            "warm_raw_csr_us": warm.raw_csr_p50_us if warm else None,
            "cold_p50_us": cold.p50_us if cold else None,
            "warm_p50_us_parts": warm.p50_by_part_us if warm else None,
            "cold_p50_us_parts": cold.p50_by_part_us if cold else None,
            "cold_pread_us": cold.pread_p50_us if cold else None,
            "scan_tokens_per_s": scan.tokens_per_s if scan else None,
            "bytes_per_token": size,
            "disk_bytes_per_token": size + spool if facts.NEEDS_SPOOL and size is not None
            and spool is not None else size,
            "s3_wait_ms": s3.get("modelled_s3_ms_per_bin"),
            "s3_requests_per_bin": s3.get("requests_per_bin"),
            "read_by": list(facts.READ_BY),
            "token_readers": [r for r in facts.READ_BY if r not in facts.ITEMS_READ_BY],
            "stack_inputs": list(facts.STACK_INPUTS), "in_ram": facts.IN_RAM,
            "needs_spool": facts.NEEDS_SPOOL, "reads_in_place": facts.READS_IN_PLACE,
        })
    return rows


def _us(value: float | None, floor: float | None, raw: float | None = None) -> str:
    """A p50 with its floor(s) in parentheses: the raw CSR floor first where it was measured."""
    if value is None:
        return "n/a"
    floors = [fmt_us(f) for f in (raw, floor) if f is not None]
    return f"{fmt_us(value)} µs" + (f" ({' / '.join(floors)})" if floors else "")


def _readers(row: Mapping[str, Any]) -> str:
    """Who reads a format's files: a reader that returns raw items, not tokens, says so."""
    return ", ".join(r if r in row["token_readers"] else f"{r} (raw items)"
                     for r in row["read_by"]) or "packlab only"


def format_table(run: Run) -> str:
    """The per-format table, as Markdown."""
    rows = format_rows(run)
    bins = next((r["memory_bins"] for r in rows if r["memory_bins"]), None)
    at = f" ({bins:,} bins)" if bins else ""
    table = markdown_table(
        ["format", f"write peak RSS{at}", f"load peak RSS{at}", "warm p50 (raw CSR / Python floor)",
         "cold p50 (raw pread)", "scan, warm", "bytes/token", "read by"],
        [[f"`{r['format']}`", human_bytes(r["write_peak_bytes"]),
          human_bytes(r["load_peak_bytes"]), _us(r["warm_p50_us"], r["warm_floor_us"], r["warm_raw_csr_us"]),
          _us(r["cold_p50_us"], r["cold_pread_us"]) if not r["in_ram"] else
          "n/a (loads all at open)",
          f"{r['scan_tokens_per_s'] / 1e6:,.0f} M tok/s" if r["scan_tokens_per_s"] else "n/a",
          f"{r['bytes_per_token']:.2f}" if r["bytes_per_token"] is not None else "n/a",
          _readers(r)] for r in rows])
    return table


# -- a format per use case ---------------------------------------------------------------------
def pack_size_of(run: Run) -> int:
    """The pack size of notebook 05's reads (what a bin's training time is counted for)."""
    recorded = run.get(RandomAccess.NOTEBOOK, {})
    return int(recorded.get("parameters", {}).get("pack_size", decide.REFERENCE_PACK_SIZE))


def recommendations(run: Run) -> list[dict[str, Any]]:
    """A format per use case, each decided on what its users feel (:mod:`.decide`): the
    choice (``format``, ``tied``, ``steps``) with its rule and its numbers (``why``)."""
    rows, pack_size = format_rows(run), pack_size_of(run)
    out = []
    for case, choice in zip(decide.use_cases(pack_size), decide.decide_all(rows, pack_size),
                            strict=True):
        row = choice["row"]
        out.append({**choice, "rule": _rule(case),
                    "why": _measured(case, row, run) if row else NOT_MEASURED})
    return out


def _rule(case: decide.UseCase) -> str:
    return f"among {case.who}: {' → '.join(c.name for c in case.criteria)}; then the name"


def _measured(case: decide.UseCase, row: Mapping[str, Any], run: Run) -> str:
    """The chosen format's numbers on the use case's criteria."""
    shown = {c.name for c in case.criteria}
    parts = []
    if "warm read" in shown:
        parts.append(f"warm read {fmt_us(row['warm_p50_us'])} µs, cold "
                     + (f"{fmt_us(row['cold_p50_us'])} µs" if row["cold_p50_us"] is not None
                        else "n/a (loads all at open)"))
    if "wait on object storage" in shown and row["s3_wait_ms"] is not None:
        parts.append(f"{row['s3_wait_ms']:.1f} ms a random bin on object storage "
                     f"({row['s3_requests_per_bin']:g} GET, notebook 09's model)")
    if "memory per node" in shown and row["load_peak_bytes"] is not None:
        parts.append(f"{human_bytes(row['load_peak_bytes'] * decide.PROCESSES_PER_NODE)} a "
                     f"node ({human_bytes(row['load_peak_bytes'])} a process)")
    if "who reads the files" in shown:
        parts.append(f"read by {', '.join(row['token_readers']) or 'packlab only'}")
    if "bytes on disk" in shown and row["disk_bytes_per_token"] is not None:
        parts.append(f"{row['disk_bytes_per_token']:.2f} bytes/token on disk"
                     + (" (its spool included)" if row["needs_spool"] else ""))
    if case.criteria[0].name == "bytes a repack writes" or "bytes stored" in shown:
        parts.append(f"{row['bytes_per_token']:.3f} bytes/token stored")
        writes = of_run(run, WriteFormats)
        if case.criteria[0].name == "bytes a repack writes" and writes is not None and \
                writes.repack_index_bytes is not None:
            parts.append(f"a repack wrote {_repack(writes)} (notebook 03)")
    return "; ".join(parts)


def _steps(choice: Mapping[str, Any]) -> str:
    """How the criteria narrowed the formats: each one's tie limit and what it left out."""
    def limit(step: Mapping[str, Any]) -> str:
        name, value = step["criterion"], step["limit"]
        if name == "who reads the files":
            return f"the most: {-int(step['best'])}"
        if name == "memory per node":
            return f"≤ {human_bytes(value)}"
        if name == "wait on object storage":
            return f"≤ {value:.1f} ms"
        if name.endswith("read"):
            return f"≤ {fmt_us(value)} µs"
        return f"≤ {value:.2f} B/token"

    def names(formats: Sequence[str]) -> str:
        return ", ".join(f"`{f}`" for f in formats)

    before = set(choice["eligible"])
    parts = [f"{len(before)} eligible"]
    for step in choice["steps"]:
        if step["skipped"]:
            parts.append(f"{step['criterion']}: not measured for every format, skipped")
            continue
        dropped = sorted(before - set(step["kept"]))
        before = set(step["kept"])
        parts.append(f"{step['criterion']} ({limit(step)}): "
                     + (f"drops {names(dropped)}" if dropped else "drops none"))
    left = [choice["format"], *choice["tied"]]
    return " → ".join(parts) + f"; left: {names(left)}" + (
        " (the first by name)" if choice["tied"] else "")


def reruns(run: Run, other: Run | None = None) -> dict[str, str]:
    """Per use case, how often reruns give the same answer: the run's fifths, and ``other``
    (another whole run) when given."""
    rows, pack_size = format_rows(run), pack_size_of(run)
    fifths = decide.fifth_agreement(rows, pack_size)
    ours = recommendations(run)
    theirs = compare_runs(run, other) if other is not None else []
    out = {}
    for choice in ours:
        case = choice["use_case"]
        words = [f"{fifths[case][0]} of {fifths[case][1]} fifths" if case in fifths
                 else "no fifths recorded"]
        for pair in theirs:
            if pair["use_case"] == case:
                words.append("the other run: the same" if pair["same"] else
                             f"the other run: `{pair['other']}`")
        out[case] = "; ".join(words)
    return out


def compare_runs(first: Run, second: Run) -> list[dict[str, Any]]:
    """Two runs' answers per use case: ``this`` (the first's), ``other``, ``same``."""
    return decide.agreement(recommendations(first), recommendations(second))


def comparison_table(pairs: Sequence[Mapping[str, Any]]) -> str:
    return markdown_table(
        ["use case", "first run", "second run", "agree"],
        [[p["use_case"], f"`{p['this']}`" if p["this"] else NOT_MEASURED,
          f"`{p['other']}`" if p["other"] else NOT_MEASURED, "yes" if p["same"] else "**no**"]
         for p in pairs])


def recommendations_table(run: Run, other: Run | None = None) -> str:
    """The answer per use case: the format, its numbers, the rule, how the criteria narrowed
    it, and how often reruns (fifths; ``other``, a second whole run) agree."""
    agree = reruns(run, other)
    return markdown_table(
        ["use case", "format", "measured", "how it is chosen", "how it was decided",
         "the same in reruns"],
        [[r["use_case"], (f"**`{r['format']}`**" + (
            f" (tied: {', '.join(f'`{a}`' for a in r['tied'])})" if r["tied"] else ""))
          if r["format"] else NOT_MEASURED, r["why"], r["rule"],
          _steps(r) if r["format"] else NOT_MEASURED, agree[r["use_case"]]]
         for r in recommendations(run)])


def ties_text(run: Run) -> str:
    """The bands every use case decides with, their numbers and why."""
    pack_size = pack_size_of(run)
    noticed = decide.noticed_us(pack_size)
    per_token_us = decide.TRAIN_SECONDS_PER_TOKEN * 1e6
    return (
        f"A data wait ties the fastest when it is longer by less than {fmt_us(noticed)} µs a "
        f"bin of {pack_size:,} tokens or by less than "
        f"{100 * (decide.SPEED_FACTOR - 1):.0f}% of the fastest, whichever is larger: "
        f"{100 * decide.NOTICED_SHARE:.0f}% of what the bin's tokens cost to train at the "
        f"least (a model of a billion parameters, 6 FLOP a parameter a token, on one H100 at "
        f"its dense bf16 peak: {per_token_us:.1f} µs a token) is a difference no step would "
        "notice, and one format's cold reads move by more than a tenth between the fifths of "
        "one run. Memory is a process's load peak times the "
        f"{decide.PROCESSES_PER_NODE} processes of a node that open the dataset (8 ranks "
        f"times 8 DataLoader workers); nodes within {human_bytes(decide.NODE_MEMORY_BAND)} of "
        f"the least tie ({human_bytes(decide.NODE_MEMORY_BAND / decide.PROCESSES_PER_NODE)} a "
        "process: ten times what a load peak moves between runs, and a twentieth of a percent "
        "of a DGX H100's 2 TB). Bytes within "
        f"{100 * (decide.SIZE_BAND - 1):.0f}% of the smallest tie (a format's size is the same "
        "at every run). Who reads the files counts the released stacks and tools that read the "
        "bins' tokens as packlab writes them, each run by a test.")


# -- claims across notebooks -------------------------------------------------------------------
def findings(run: Run, source: str | None = None) -> list[dict[str, str]]:
    """Every finding of the run (of one ``source``: ``rfc``, ``target``, ``check``), each
    with its notebook."""
    return [{**f, "notebook": name} for name, recorded in run.items()
            for f in recorded.get("findings", [])
            if source is None or f.get("source", "check") == source]


def claims_table(run: Run, source: str, *, colour: bool = False) -> str:
    from packlab.lab.summaries import findings_table

    return findings_table(findings(run, source), colour=colour, notebook=True)


def verdict_counts(found: Sequence[Mapping[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in found:
        counts[f["verdict"]] = counts.get(f["verdict"], 0) + 1
    return counts


def counts_text(found: Sequence[Mapping[str, str]], *, colour: bool = False) -> str:
    return ", ".join(f"{n} {badge(v) if colour else v}" for v, n in verdict_counts(found).items())


def rule_text() -> str:
    return RULE


def peers_table(run: Run) -> str:
    """Notebook 11: every system on the same bins, fastest (over its in-RAM floor) first."""
    from packlab.lab.measure.peers import summary

    peers = of_run(run, Peers)
    rows = peers.rows if peers is not None else None
    if not rows:
        return NOT_MEASURED
    return markdown_table(
        ["system", "columns", "warm p50", "x in-RAM floor", "bytes/token", "ran in"],
        [[r["system"], r["columns"], f"{fmt_us(r['p50_us'])} µs", f"{r['x_floor']:.2f}x" if r["x_floor"] < 10 else f"{r['x_floor']:,.0f}x",
          f"{r['bytes_per_token']:.2f}", r["environment"]] for r in summary.systems(rows)])


# -- numbers the README quotes in its prose ---------------------------------------------------
def legacy_load_text(run: Run) -> str:
    """The legacy format's load peak at the RFC's 50k bins (notebook 04)."""
    memory = of_run(run, PeakMemory)
    values = [m.load.rss_at_50k_bytes for f, m in (memory.formats.items() if memory else ())
              if get_format(f).Reader.IN_RAM and m.load.rss_at_50k_bytes is not None]
    return human_bytes(values[0]) if values else "n/a"


def _repack(writes: WriteFormats) -> str:
    return (f"{human_bytes(writes.repack_index_bytes)} in {writes.repack_index_seconds:.2f} s "
            f"against {human_bytes(writes.repack_parquet_bytes)} in "
            f"{writes.repack_parquet_seconds:.2f} s as Parquet")


def repack_text(run: Run) -> str:
    """What a repack wrote through the index against rewriting the bins (notebook 03)."""
    writes = of_run(run, WriteFormats)
    if writes is None or writes.repack_index_bytes is None:
        return NOT_MEASURED
    return f"{_repack(writes)}, notebook 03"


def packing_text(run: Run) -> str:
    """Each algorithm's distance to the lower bound and time at the largest N (notebook 02)."""
    packing = of_run(run, Packing)
    if packing is None or not packing.algorithms:
        return NOT_MEASURED
    size = max(packing.sweep_sizes or [0])
    return (f"for {size:,} sequences, " + ", ".join(
        f"`{a}` {100 * r.bins_over_lower_bound:.3f}% over the lower bound in "
        f"{r.seconds:.2f} s" for a, r in packing.algorithms.items()))
