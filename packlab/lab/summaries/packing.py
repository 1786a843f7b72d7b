"""Notebook 02's summary: packing algorithms against the lower bound, their speed, the roll."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.packing import Packing

SHORT = {"first_fit_decreasing": "FFD", "best_fit_decreasing": "BFD",
         "first_fit_shuffle": "first-fit shuffle", "next_fit": "next-fit",
         "modified_first_fit_decreasing": "MFFD", "megatron_lm_mffd": "Megatron-LM's MFFD",
         "trl_bfd (map batches of 1,000)": "TRL's BFD as SFTTrainer packs",
         "trl_bfd (one batch)": "TRL's BFD in one batch"}


def _name(algorithm: str) -> str:
    return SHORT.get(algorithm, algorithm)


def bullets(n: Packing, p: Mapping[str, Any]) -> list[str]:
    algorithms = n.algorithms
    closest = n.closest_algorithms
    best = algorithms[closest[0]]
    tie = " (a tie)" if len(closest) > 1 else ""
    over = {a: 100 * r.bins_over_lower_bound for a, r in algorithms.items()}
    trap = n.trap
    return [
        f"**Closest to the bound**: {' and '.join(f'`{a}`' for a in closest)}{tie}, with "
        f"{best.num_bins:,} bins against a lower bound of "
        f"{n.lower_bound_bins:,} ({over[closest[0]]:.3f}% over) for "
        f"{p['num_sequences']:,} `{p['profile']}` sequences at pack size {p['pack_size']} "
        f"(efficiency {best.efficiency:.4f}).",
        f"**The default** (first-fit shuffle) is {over['first_fit_shuffle']:.2f}% over the bound "
        f"and next-fit {over['next_fit']:.1f}% over: concatenating in spool order wastes a bin's "
        "tail whenever the next sequence does not fit.",
        f"**Speed** for {p['num_sequences']:,} sequences"
        + (f" (median of {p['repeats']} runs)" if p["repeats"] > 1 else "") + ": "
        + ", ".join(f"{_name(a)} {r.seconds:.3f} s" for a, r in algorithms.items())
        + ". Log-log slope of time against N: "
        + ", ".join(f"{_name(a)} {n.sweep_loglog_slope[a]:.2f}" for a in algorithms)
        + " (1 is linear). FFD and BFD place each run of equal lengths with a few numpy "
        "operations, so at small N their cost is the number of distinct lengths, not N; the "
        "shuffled order has no runs and walks a tree per sequence (compiled with numba).",
        f"**The loss-mask trap**: on {trap['bins']:,} real bins ({trap['tokens']:,} tokens, "
        f"{trap['targets']:,} trained positions), the whole-bin roll differs from the "
        f"per-sequence alignment at {trap['differ']:,} positions "
        f"({100 * trap['differ'] / trap['tokens']:.1f}%): it misses {trap['missed']:,} targets, "
        f"trains {trap['spurious']:,} positions it should not, and at {trap['leaking']:,} "
        "positions it trains a sequence's last token to predict the next sequence "
        f"({trap['bins_failing']:,} bins fail `check_bin`).",
        *([_mffd(n, p)] if MFFD in algorithms else []),
        *([_beside_trl(n.beside_trl, p)] if n.beside_trl else []),
    ]


MFFD, MEGATRON_MFFD = "modified_first_fit_decreasing", "megatron_lm_mffd"
AGAINST = ("first_fit_decreasing", "best_fit_decreasing", "first_fit_shuffle")


def _mffd(n: Packing, p: Mapping[str, Any]) -> str:
    """Modified First-Fit Decreasing (Megatron-LM's SFTDataset packer) beside FFD, BFD and
    first-fit shuffle: bins over the bound and seconds, at N and per length profile."""
    shown = [a for a in (MFFD, MEGATRON_MFFD, *AGAINST) if a in n.algorithms]

    def row(algorithms: Mapping[str, Any]) -> str:
        return ", ".join(f"{_name(a)} {100 * algorithms[a].bins_over_lower_bound:.3f}%"
                         for a in shown if a in algorithms)

    text = (f"**Modified First-Fit Decreasing** (Megatron-LM's `SFTDataset` packer; "
            f"{p['num_sequences']:,} `{p['profile']}` sequences): bins over the bound "
            f"{row(n.algorithms)}; seconds "
            + ", ".join(f"{_name(a)} {n.algorithms[a].seconds:.2f} s" for a in shown) + ".")
    if n.sweep_over_bound and MFFD in n.sweep_over_bound:
        sizes = n.sweep_sizes
        text += (f" From {sizes[0]:,} to {sizes[-1]:,} sequences MFFD stays within "
                 f"{100 * max(n.sweep_over_bound[MFFD]):.3f}% of the bound (FFD "
                 f"{100 * max(n.sweep_over_bound['first_fit_decreasing']):.3f}%), its time "
                 f"growing with slope {n.sweep_loglog_slope[MFFD]:.2f}.")
    if n.profiles:
        text += " By length profile: " + "; ".join(
            f"`{name}` {row(algorithms)}" for name, algorithms in n.profiles.items()) + "."
    if MEGATRON_MFFD in n.algorithms:
        extra = n.algorithms[MEGATRON_MFFD].num_bins - n.algorithms[MFFD].num_bins
        text += (f" Megatron-LM's code puts the leftovers of step 5 into the least-loaded bin "
                 f"instead of the first that fits: {extra:+,} bins here.")
    return text


def _beside_trl(rows: Mapping[str, Mapping[str, Any]], p: Mapping[str, Any]) -> str:
    """packlab's packers and TRL's BFD on the same lengths."""
    return (f"**Beside TRL's BFD** ({p['trl_sequences']:,} sequences): "
            + ", ".join(f"{_name(name)} {r['num_bins']:,} bins "
                        f"({100 * r['bins_over_lower_bound']:.2f}% over, {r['seconds']:.3f} s)"
                        for name, r in rows.items())
            + ". TRL packs inside `Dataset.map`, one map batch at a time as `SFTTrainer` calls "
            "it, and its time includes moving the tokens into their rows.")
