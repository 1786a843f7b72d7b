"""Notebook 10's tables, findings (verdicts computed from the numbers) and headline numbers.

Formats are told apart by their facts, never their names: the ones that load everything at
open are ``formats_where("IN_RAM")``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from packlab.formats import formats_where
from packlab.lab.measure.verdicts import holds
from packlab.lab.results import finding
from packlab.lab.tables import human_bytes, markdown_table, times

#: Megatron-Bridge #5289, cited by the RFC: one run per format, seconds
BRIDGE_5289_SECONDS = (104.7, 103.8)


def step_table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Per format and worker count: startup, steady step, data wait, compute, share, memory."""
    return markdown_table(
        ["format", "workers", "startup (s)", "step (ms)", "data wait (ms)", "compute (ms)",
         "wait share", "RSS at open", "peak RSS (anonymous)", "workers' RSS"],
        [[r["format"], r["workers"], f"{r['startup_seconds']:.3f}",
          f"{r['step_seconds'] * 1e3:.1f}", f"{r['wait_seconds'] * 1e3:.2f}",
          f"{r['compute_seconds'] * 1e3:.1f}", f"{r['wait_share']:.1%}",
          human_bytes(r["open_rss_bytes"]),
          f"{human_bytes(r['peak_rss_bytes'])} ({human_bytes(r['peak_anon_bytes'])})",
          human_bytes(r["workers_rss_bytes"])] for r in rows])


def by_format(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, dict[str, float]]:
    """``{format: {str(workers): row[key]}}`` (JSON keys are strings)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        out.setdefault(r["format"], {})[str(r["workers"])] = r[key]
    return out


def memory_split(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per format the memory its dataset holds once opened (``open_rss_bytes``) and its peak
    while training (``peak_rss_bytes``; ``peak_anon_bytes``: anonymous only, without the pages
    of mapped files), all as growth over its process's baseline; the
    formats that load everything at open against the others, on the opened dataset."""
    first = {r["format"]: r for r in rows}
    opened = {n: int(r["open_rss_bytes"]) for n, r in first.items()}
    in_ram = [n for n in formats_where("IN_RAM") if n in opened]
    others = [n for n in opened if n not in in_ram]
    return {"open_rss_bytes": opened,
            "peak_rss_bytes": {n: int(r["peak_rss_bytes"]) for n, r in first.items()},
            "peak_anon_bytes": {n: int(r["peak_anon_bytes"]) for n, r in first.items()},
            "in_ram": in_ram,
            "in_ram_min_bytes": min((opened[n] for n in in_ram), default=None),
            "others_max_bytes": max((opened[n] for n in others), default=None),
            "others_max_format": max(others, key=opened.get) if others else None}


def startup_split(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Startup (open + first batch) without workers, the in-RAM formats against the others'
    slowest."""
    first = {r["format"]: r["startup_seconds"] for r in rows
             if r["workers"] == min(x["workers"] for x in rows)}
    in_ram = [n for n in formats_where("IN_RAM") if n in first]
    others = [n for n in first if n not in in_ram]
    return {"startup_seconds": first, "in_ram": in_ram,
            "in_ram_max_seconds": max((first[n] for n in in_ram), default=None),
            "others_max_seconds": max((first[n] for n in others), default=None)}


def curve_text(curves: Mapping[str, Any]) -> str:
    if curves["identical"]:
        return (f"{curves['runs']} runs of {curves['steps']} steps (every format and worker "
                "count): losses and batches identical bit for bit")
    first = curves["differences"][0]
    cause = "the same batch: the computation differs" if first["batch_equal"] else \
        "a different batch: the data differs"
    return (f"{first['format']} with {first['workers']} workers departs at step "
            f"{first['step']} ({first['loss']!r} against {first['reference_loss']!r}), on "
            f"{cause}; {len(curves['differences'])} of {curves['runs'] - 1} runs differ")


def findings(
    curves: Mapping[str, Any],
    spread: Mapping[int, Mapping[str, Any]],
    rows: Sequence[Mapping[str, Any]],
    *,
    tolerance: float,
    resumed: bool,
    trap: Mapping[str, Any],
    attention: Mapping[str, Any],
) -> list[dict[str, str]]:
    """The training study's claims against what the runs measured."""
    worst = max(s["wait_added"] for s in spread.values())
    memory = memory_split(rows)
    startup = startup_split(rows)
    bridge = max(BRIDGE_5289_SECONDS) / min(BRIDGE_5289_SECONDS)
    out = [
        finding("Phase 2: the same run from any format gives identical loss curves",
                curve_text(curves), holds(curves["identical"]), source="rfc"),
        finding(f"Storage format does not change step time (Megatron-Bridge #5289: "
                f"{BRIDGE_5289_SECONDS[0]} s against {BRIDGE_5289_SECONDS[1]} s, "
                f"{bridge:.3f}x); judged on the data wait a format adds, within "
                f"{tolerance:.0%} of a step",
                "; ".join(
                    f"{w} workers: {s['wait_added_by']} adds {s['wait_added']:.1%} of a step "
                    f"in data wait; median step slowest over fastest {s['ratio']:.2f}x "
                    f"({s['slowest']} / {s['fastest']}) where the same computation alone "
                    f"spreads {s['compute_ratio']:.2f}x" for w, s in spread.items()),
                holds(worst <= tolerance), source="rfc"),
    ]
    if startup["in_ram"]:
        ratio = startup["in_ram_max_seconds"] / max(startup["others_max_seconds"], 1e-9)
        out.append(finding(
            "A format that loads everything first pays it before the first step",
            f"startup (open + first batch, no workers): {', '.join(startup['in_ram'])} "
            f"{startup['in_ram_max_seconds']:.3f} s, the others at most "
            f"{startup['others_max_seconds']:.3f} s ({times(ratio)})",
            holds(ratio > 1)))
    if memory["in_ram"]:
        out.append(finding(
            "The training process holds the dataset with a format that loads everything, "
            "not with the others",
            f"RSS growth once the dataset is open: {', '.join(memory['in_ram'])} at least "
            f"{human_bytes(memory['in_ram_min_bytes'])}; the others at most "
            f"{human_bytes(memory['others_max_bytes'])} ({memory['others_max_format']}). "
            "Peak while training: " + ", ".join(
                f"{n} {human_bytes(v)}" for n, v in memory["peak_rss_bytes"].items()),
            holds(memory["in_ram_min_bytes"] > memory["others_max_bytes"])))
    out += [
        finding("Resume: stop at step k, restart from the consumed-samples count, the curve "
                "continues identically", f"identical after resuming: {resumed}", holds(resumed)),
        finding("The design documents' whole-bin roll puts loss across sequence boundaries",
                f"{trap['cross_boundary']:,} targets across a boundary stored in the "
                f"{trap['bins']:,} bins trained; the THD collate drops every one (a "
                "sub-sequence's last position is only a label); a trainer that shifts labels "
                "over the whole row would train them", holds(trap["cross_boundary"] > 0)),
        finding("The roll trains other targets than the per-sequence alignment",
                f"of {trap['targets']:,} correct targets {trap['missed']:,} missed, "
                f"{trap['spurious']:,} added ({trap['borrowed']:,} borrowed from the previous "
                f"sequence); loss on the correct targets after training "
                f"{trap['eval_loss']:.4f} against {trap['reference_eval_loss']:.4f}",
                holds(trap["missed"] + trap["spurious"] > 0)),
        finding("Without the block-diagonal mask a sub-sequence sees the ones packed before it",
                f"logits of one sub-sequence move by {attention['causal_change']:.3g} when the "
                f"others change (block-diagonal: {attention['block_change']:.3g}); "
                f"{attention['share']:.1%} of loss positions attend across a boundary; the "
                f"model trained so: loss {attention['eval_loss']:.5f} on the rows it trained "
                f"on, {attention['alone_eval_loss'] - attention['eval_loss']:+.5f} when each "
                "sequence is alone (as at inference); the block-diagonal model's "
                f"{attention['reference_eval_loss']:.5f} (a small model after a few steps: the "
                "losses differ little; the logits' change above is the effect)",
                holds(attention["causal_change"] > 0 and attention["block_change"] == 0)),
    ]
    return out


def loss_curves(results: Mapping[str, Mapping[str, Any]]) -> dict[str, list[float]]:
    """``{"format, N workers": losses}`` of every run, in run order."""
    return {f"{name}, {run['workers']} workers": [r["loss"] for r in run["records"]]
            for name, result in results.items() for run in result["runs"]}


def headline_numbers(
    results: Mapping[str, Mapping[str, Any]],
    curves: Mapping[str, Any],
    rows: Sequence[Mapping[str, Any]],
    spread: Mapping[int, Mapping[str, Any]],
    *,
    resumed: bool,
    trap: Mapping[str, Any],
    attention: Mapping[str, Any],
) -> dict[str, Any]:
    """What ``build/results/10_training.json`` keeps: the formats trained, whether their
    curves are identical, per format (and worker count) step, data-wait, compute and startup
    seconds, the wait share, peak RSS growth; resume; the traps."""
    return {
        "formats": list(results),
        "losses_identical": bool(curves["identical"]),
        "batches_identical": bool(curves["batches_identical"]),
        "runs": curves["runs"], "steps": curves["steps"],
        "first_difference": curves["differences"][0] if curves["differences"] else None,
        "step_seconds": by_format(rows, "step_seconds"),
        "wait_seconds": by_format(rows, "wait_seconds"),
        "compute_seconds": by_format(rows, "compute_seconds"),
        "wait_share": by_format(rows, "wait_share"),
        "startup_seconds": by_format(rows, "startup_seconds"),
        "open_seconds": {r["format"]: r["open_seconds"] for r in rows},
        "open_rss_bytes": memory_split(rows)["open_rss_bytes"],
        "peak_rss_bytes": memory_split(rows)["peak_rss_bytes"],
        "peak_anon_bytes": memory_split(rows)["peak_anon_bytes"],
        "workers_rss_bytes": by_format(rows, "workers_rss_bytes"),
        "step_time_ratio": {str(w): s["ratio"] for w, s in spread.items()},
        "wait_added_share": {str(w): s["wait_added"] for w, s in spread.items()},
        "compute_ratio": {str(w): s["compute_ratio"] for w, s in spread.items()},
        "resume_identical": bool(resumed),
        "loss_mask_roll": dict(trap),
        "attention_without_mask": dict(attention),
    }
