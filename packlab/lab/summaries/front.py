"""The answer across notebooks: one row per format, a format per use case, the claims tables.

Everything here is computed from one run's recorded results (``{notebook: results JSON}``, as
:func:`packlab.lab.summaries.record.load_run` returns them) and the formats' facts; the report's
front page and the README's generated blocks print the same Markdown. A notebook missing from
the run leaves its cells ``n/a`` and its use case ``not measured``, never an error.

Where the numbers come from: write and load peak memory, notebook 04 (largest size measured);
warm and cold p50 of one random bin and their floors, and the warm sequential scan, notebook
05; bytes per token on disk, notebook 03 (the same `chat` data as 05).
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
from packlab.lab.tables import fmt_us, human_bytes, markdown_table

Run = Mapping[str, Mapping[str, Any]]
#: formats whose warm p50 is within this factor of the fastest tie for local training
TIE = 1.10
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
    rows = []
    for fmt in format_names():
        facts = get_format(fmt).Reader
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
            "bytes_per_token": sizes.get(fmt),
            "read_by": list(facts.READ_BY), "chosen_by": list(facts.CHOSEN_BY),
            "in_ram": facts.IN_RAM,
            "needs_spool": facts.NEEDS_SPOOL, "reads_in_place": facts.READS_IN_PLACE,
        })
    return rows


def _us(value: float | None, floor: float | None, raw: float | None = None) -> str:
    """A p50 with its floor(s) in parentheses: the raw CSR floor first where it was measured."""
    if value is None:
        return "n/a"
    floors = [fmt_us(f) for f in (raw, floor) if f is not None]
    return f"{fmt_us(value)} µs" + (f" ({' / '.join(floors)})" if floors else "")


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
          ", ".join(r["read_by"]) or "packlab only"] for r in rows])
    return table


# -- a format per use case ---------------------------------------------------------------------
def _choice(use_case: str, rule: str, fmt: str | None, why: str, also: Sequence[str] = ()
            ) -> dict[str, Any]:
    return {"use_case": use_case, "rule": rule, "format": fmt, "why": why if fmt else
            NOT_MEASURED, "also": list(also)}


def _stable_key(row: Mapping[str, Any]) -> tuple[int, float, float, str]:
    """What breaks a speed tie: what does not move between runs (more systems reading the
    files, then fewer bytes per token as printed, then less memory to load it: sizes that
    agree to the printed digit are one size, and a load's peak is the format's own)."""
    size, load = row["bytes_per_token"], row["load_peak_bytes"]
    return (-len(row["read_by"]), round(size, 2) if size is not None else float("inf"),
            load if load is not None else float("inf"), row["format"])


def _fastest_tied(rows: Sequence[Mapping[str, Any]], warm: str, cold: str | None = None,
                  part: int | None = None) -> list[Mapping[str, Any]]:
    """The formats within :data:`TIE` of the fastest warm p50, best first: by what does not
    move (:func:`_stable_key`), or by the lowest ``cold`` p50 (the former rule). ``part``:
    the p50 of one fifth of the reads instead of the whole (a rerun in miniature)."""
    def p50(row: Mapping[str, Any], key: str) -> float:
        return row[key] if part is None else row[f"{key}_parts"][part]

    fastest = min(p50(r, warm) for r in rows)
    tied = [r for r in rows if p50(r, warm) <= TIE * fastest]
    return sorted(tied, key=(lambda r: p50(r, cold)) if cold else _stable_key)


def rerun_agreement(rows: Sequence[Mapping[str, Any]], cold: str | None = None
                    ) -> tuple[int, int] | None:
    """In how many fifths of the run (each a rerun in miniature) the local-training rule
    chooses what the whole run chooses, of how many; ``cold``: the former rule, ties broken
    by the lowest cold p50. None without the parts (a run recorded before them)."""
    keys = ["warm_p50_us"] + ([cold] if cold else [])
    if not rows or any(r.get(f"{k}_parts") is None for r in rows for k in keys):
        return None
    chosen = _fastest_tied(rows, "warm_p50_us", cold)[0]["format"]
    parts = min(len(r[f"{k}_parts"]) for r in rows for k in keys)
    same = sum(_fastest_tied(rows, "warm_p50_us", cold, k)[0]["format"] == chosen
               for k in range(parts))
    return same, parts


def _local_training(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rule = (f"the lowest warm random-read p50 among formats that open lazily (not loading "
            f"every bin at open); formats within {TIE:.2f}x of it tie, and a tie goes to what "
            "does not move between runs: the format more systems read, then the fewest bytes "
            "per token, then the lowest load peak")
    fit = [r for r in rows if not r["in_ram"] and r["warm_p50_us"] is not None
           and r["cold_p50_us"] is not None]
    if not fit:
        return _choice("local training", rule, None, "")
    tied = _fastest_tied(fit, "warm_p50_us")
    best = tied[0]
    why = (f"warm p50 {fmt_us(best['warm_p50_us'])} µs (Python floor "
           f"{fmt_us(best['warm_floor_us'])}), cold {fmt_us(best['cold_p50_us'])} µs (raw pread "
           f"{fmt_us(best['cold_pread_us'])}), writer peak {human_bytes(best['write_peak_bytes'])}"
           f", load peak {human_bytes(best['load_peak_bytes'])}")
    if best["read_by"] or best["bytes_per_token"] is not None:
        why += (f"; read by {', '.join(best['read_by']) or 'packlab only'}, "
                f"{best['bytes_per_token']:.2f} bytes/token")
    agreed, former = rerun_agreement(fit), rerun_agreement(fit, "cold_p50_us")
    if agreed is not None and former is not None:
        why += (f"; the same answer in {agreed[0]} of {agreed[1]} fifths of the run, each a "
                f"rerun in miniature (a tie broken by the lowest cold p50: {former[0]} of "
                f"{former[1]})")
    return _choice("local training", rule, best["format"], why, [r["format"] for r in tied[1:]])


def _object_storage(rows: Sequence[Mapping[str, Any]], cloud: CloudStorage | None
                    ) -> dict[str, Any]:
    rule = ("the fewest bytes per token among formats read in place with ranged requests "
            "(the others are downloaded whole before the first bin)")
    fit = [r for r in rows if r["reads_in_place"] and r["bytes_per_token"] is not None]
    if not fit:
        return _choice("object storage", rule, None, "")
    best = min(fit, key=lambda r: r["bytes_per_token"])
    why = f"{best['bytes_per_token']:.2f} bytes/token"
    if cloud is not None:
        why += (f"; a random access costs {cloud.max_requests_per_access} GET of at most "
                f"{cloud.max_bytes_over_row_group:.2f}x one row group; opening cold fetched "
                f"{human_bytes(cloud.parquet_cold_open_bytes)} against "
                f"{human_bytes(cloud.memmap_cold_open_bytes)} for a downloaded format "
                "(notebook 09)")
    return _choice("object storage", rule, best["format"], why,
                   [r["format"] for r in fit if r is not best])


def _repacking(rows: Sequence[Mapping[str, Any]], writes: WriteFormats | None
               ) -> dict[str, Any]:
    rule = "the fewest bytes written per token (a repack rewrites what a format stores)"
    fit = [r for r in rows if r["bytes_per_token"] is not None]
    if not fit:
        return _choice("repacking often", rule, None, "")
    best = min(fit, key=lambda r: r["bytes_per_token"])
    why = f"{best['bytes_per_token']:.3f} bytes/token"
    if writes is not None and writes.repack_index_bytes is not None:
        why += f"; a repack wrote {_repack(writes)} (notebook 03)"
    if best["needs_spool"]:
        why += "; it reads its tokens from the spool, which must stay"
    return _choice("repacking often", rule, best["format"], why)


def _megatron(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    rule = "the lowest warm random-read p50 among formats Megatron-core reads as they are"
    fit = [r for r in rows if "Megatron-core" in r["read_by"] and r["warm_p50_us"] is not None]
    if not fit:
        return _choice("Megatron pretrain tooling", rule, None, "")
    best = min(fit, key=lambda r: r["warm_p50_us"])
    why = (f"Megatron-core's `IndexedDataset` reads it unchanged; warm p50 "
           f"{fmt_us(best['warm_p50_us'])} µs, {best['bytes_per_token']:.2f} bytes/token"
           if best["bytes_per_token"] is not None else "Megatron-core reads it unchanged")
    return _choice("Megatron pretrain tooling", rule, best["format"], why,
                   [r["format"] for r in fit if r is not best])


def recommendations(run: Run) -> list[dict[str, Any]]:
    """A format per use case, each chosen from the run's numbers by the rule it states."""
    rows = format_rows(run)
    return [_local_training(rows), _object_storage(rows, of_run(run, CloudStorage)),
            _repacking(rows, of_run(run, WriteFormats)), _megatron(rows)]


def recommendations_table(run: Run) -> str:
    return markdown_table(
        ["use case", "format", "measured", "how it is chosen"],
        [[r["use_case"], f"**`{r['format']}`**" + (
            f" (tied: {', '.join(f'`{a}`' for a in r['also'])})"
            if r["also"] and r["use_case"] == "local training" else "")
          if r["format"] else NOT_MEASURED, r["why"], r["rule"]]
         for r in recommendations(run)])


# -- packlab's answer beside another stack's default -------------------------------------------
def _against(value: float | None, other: float | None, unit: str, *, lower_is_better: bool = True
             ) -> str:
    """How ``value`` stands against ``other``: tied within :data:`TIE`, else the ratio."""
    if value is None or other is None or other <= 0:
        return "not measured"
    ratio = value / other
    if 1 / TIE <= ratio <= TIE:
        return "agree (within 1.10x)"
    better = ratio < 1 if lower_is_better else ratio > 1
    return f"{'better' if better else 'worse'}: {ratio:,.2f}x ({unit})"


def _aspects(chosen: Mapping[str, Any], pick: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """Size, warm and cold reads, write memory: (aspect, chosen's value, pick's, verdict)."""
    def size(r: Mapping[str, Any]) -> str:
        return f"{r['bytes_per_token']:.2f} B/token" if r["bytes_per_token"] is not None else "n/a"

    def us(r: Mapping[str, Any], key: str) -> str:
        return f"{fmt_us(r[key])} µs" if r[key] is not None else "n/a"

    return [
        ("size on disk", size(chosen), size(pick),
         _against(chosen["bytes_per_token"], pick["bytes_per_token"], "bytes per token")),
        ("warm random read, p50", us(chosen, "warm_p50_us"), us(pick, "warm_p50_us"),
         _against(chosen["warm_p50_us"], pick["warm_p50_us"], "p50")),
        ("cold random read, p50", us(chosen, "cold_p50_us"), us(pick, "cold_p50_us"),
         _against(chosen["cold_p50_us"], pick["cold_p50_us"], "p50")),
        ("write peak RSS", human_bytes(chosen["write_peak_bytes"]),
         human_bytes(pick["write_peak_bytes"]),
         _against(chosen["write_peak_bytes"], pick["write_peak_bytes"], "peak")),
    ]


def _storage_aspect(chosen: Mapping[str, Any], pick: Mapping[str, Any] | None,
                    in_place: Mapping[str, Mapping[str, Any]]) -> tuple[str, str, str, str]:
    """Object storage: read in place or downloaded first, and what a random bin moves
    (notebook 09's ``in_place`` rows, where the run has them)."""
    def how(r: Mapping[str, Any]) -> str:
        way = "read in place by ranged GETs" if r["reads_in_place"] else "downloaded whole first"
        cost = in_place.get(r["format"])
        if cost is not None and r["reads_in_place"]:
            way += (f": {cost['requests_per_bin']:g} GET and {human_bytes(cost['bytes_per_bin'])}"
                    f" a random bin ({cost['bytes_per_token_read']:.2f} B/token read)")
        size = (f"; {r['bytes_per_token']:.2f} B/token stored"
                if r["bytes_per_token"] is not None else "")
        return way + size

    if pick is None:
        return ("object storage", how(chosen), NOT_MEASURED, "not measured")
    if pick["format"] == chosen["format"]:
        verdict = "agree (the same format)"
    elif not chosen["reads_in_place"]:
        verdict = "differs: downloaded before its first bin"
    else:
        stored = _against(chosen["bytes_per_token"], pick["bytes_per_token"], "bytes stored")
        ours, theirs = in_place.get(chosen["format"]), in_place.get(pick["format"])
        moved = (_against(ours["bytes_per_bin"], theirs["bytes_per_bin"], "bytes a random bin "
                          "moves") if ours and theirs else None)
        verdict = "; ".join(v for v in (stored, moved) if v)
    return ("object storage", how(chosen), f"`{pick['format']}`: {how(pick)}", verdict)


def chosen_elsewhere(run: Run) -> list[dict[str, Any]]:
    """Each format another stack stores by default (``CHOSEN_BY``) beside packlab's
    recommendations, aspect by aspect, with the numbers and where they agree."""
    rows = format_rows(run)
    by_name = {r["format"]: r for r in rows}
    picks = {c["use_case"]: by_name.get(c["format"]) for c in recommendations(run)}
    local, storage = picks.get("local training"), picks.get("object storage")
    cloud = of_run(run, CloudStorage)
    in_place = {r["format"]: r for r in cloud.in_place} if cloud is not None else {}
    out = []
    for chosen in (r for r in rows if r["chosen_by"]):
        aspects = _aspects(chosen, local) if local is not None else []
        out.append({"format": chosen["format"], "stacks": chosen["chosen_by"],
                    "local": local["format"] if local else None,
                    "aspects": [*aspects, _storage_aspect(chosen, storage, in_place)]})
    return out


def chosen_elsewhere_table(run: Run) -> str:
    """The comparison as Markdown: one table per stack's choice."""
    parts = []
    for c in chosen_elsewhere(run):
        stacks = ", ".join(c["stacks"])
        local = f"`{c['local']}`" if c["local"] else NOT_MEASURED
        parts.append(markdown_table(
            ["", f"{stacks}'s choice: `{c['format']}`",
             f"packlab's recommendation (local training: {local})", "where they stand"],
            [list(a) for a in c["aspects"]]))
    return "\n\n".join(parts) or NOT_MEASURED


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
