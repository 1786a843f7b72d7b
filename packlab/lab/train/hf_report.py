"""Notebook 10's Hugging Face section: the numbers it records and its verdicts.

The runs are :data:`packlab.lab.train.hf_runs.PIPELINES`; the boundary rows
:func:`packlab.lab.train.hf_boundaries.boundary_check`'s. Imports neither torch nor
transformers (the summaries read it). Recorded under ``"hf"`` in
``build/results/10_training.json``; the summary's words are built from that record
(:mod:`packlab.lab.summaries.training`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from packlab.lab.measure.verdicts import holds
from packlab.lab.results import finding

#: nats: per-sequence losses this close are equal in float32
TOLERANCE = 1e-5
#: nats: two float32 computations of the same loss, over the steps trained, stay this close
CURVE_TOLERANCE = 1e-3


def hf_numbers(runs: Mapping[str, Any], *, same_rows: int,
               boundaries: Sequence[Mapping[str, Any]], attentions: Sequence[str]
               ) -> dict[str, Any]:
    """Per run its losses and rows; TRL's rows found in the packlab shard; how far the
    shard's and the collator's curves are from TRL's; the boundary check."""
    losses = {name: list(run.losses) for name, run in runs.items()}
    reference = np.array(losses["trl_packs"])
    return {
        "losses": losses,
        "rows": {name: int(run.rows) for name, run in runs.items()},
        "same_rows": int(same_rows),
        "shard_identical": losses["trl_from_shard"] == losses["trl_packs"],
        "collator_max_abs_difference": float(np.max(np.abs(
            np.array(losses["trainer_with_collator"]) - reference))),
        "boundaries": [dict(row) for row in boundaries],
        "attentions": list(attentions),
    }


def _rows_of(n: Mapping[str, Any], traps: bool) -> list[Mapping[str, Any]]:
    return [r for r in n["boundaries"] if (r["setting"] not in n["attentions"]) == traps]


def boundary_text(rows: Sequence[Mapping[str, Any]]) -> str:
    return "; ".join(f"{r['setting']} {r['max_abs_difference']:.3g} nats" for r in rows)


def hf_findings(n: Mapping[str, Any]) -> list[dict[str, str]]:
    """The Hugging Face study's claims against what the runs measured."""
    trl_rows = n["rows"]["trl_packs"]
    steps = len(n["losses"]["trl_packs"])
    kept = _rows_of(n, traps=False)
    lost = _rows_of(n, traps=True)
    sequences = kept[0]["sequences"] if kept else 0
    return [
        finding("A packlab shard holding TRL's bins trains TRL's SFTTrainer exactly as TRL's "
                "own packing does",
                f"{n['same_rows']:,} of {trl_rows:,} packed rows identical (input ids, labels TRL "
                f"built from assistant_masks, seq_lengths); {steps} steps: loss curves "
                f"{'identical bit for bit' if n['shard_identical'] else 'differ'}",
                holds(n["same_rows"] == trl_rows and n["shard_identical"])),
        finding("transformers' Trainer fed by Collator(style=\"hf_flattening\") trains TRL's "
                "curve", f"largest difference from TRL's curve over {steps} steps "
                f"{n['collator_max_abs_difference']:.3g} nats (TRL computes the loss from "
                "fused log-probabilities, the model from its logits)",
                holds(n["collator_max_abs_difference"] <= CURVE_TOLERANCE)),
        finding("A packed batch's per-sequence losses equal each sequence's loss alone (the "
                "attention used on CPU respects the boundaries)",
                f"{sequences} sequences of the trained model: " + boundary_text(kept)
                + f" (tolerance {TOLERANCE:g})",
                holds(all(r["respects_boundaries"] for r in kept))),
        finding("Called with a cache or an attention mask of ones, the model attends across "
                "the boundaries", boundary_text(lost),
                holds(all(not r["respects_boundaries"] for r in lost))),
    ]
