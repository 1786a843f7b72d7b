"""Notebook 10's summary: the same small model trained from every format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packlab.lab.records.training import Training
from packlab.lab.tables import human_bytes
from packlab.lab.train.hf_report import boundary_text
from packlab.lab.train.report import BRIDGE_5289_SECONDS


def _curves(n: Training) -> str:
    if n.losses_identical:
        return (f"{n.runs} runs of {n.steps} steps (every format and worker count): "
                "losses and batches identical bit for bit")
    first = n.first_difference
    cause = ("the same batch: the computation differs" if first["batch_equal"]
             else "a different batch: the data differs")
    return (f"{first['format']} with {first['workers']} workers departs at step {first['step']} "
            f"({first['loss']!r} against {first['reference_loss']!r}), on {cause}")


def bullets(n: Training, p: Mapping[str, Any]) -> list[str]:
    workers = [str(w) for w in p["worker_counts"]]
    share = {w: [per[w] for per in n.wait_share.values() if w in per] for w in workers}
    startup = {f: per[workers[0]] for f, per in n.startup_seconds.items() if workers[0] in per}
    trap, attention = n.loss_mask_roll, n.attention_without_mask
    bridge = max(BRIDGE_5289_SECONDS) / min(BRIDGE_5289_SECONDS)
    return [
        f"Trained {len(n.formats)} formats x {len(workers)} worker counts, {n.steps} "
        f"steps each: {_curves(n)}.",
        "Data wait as a share of the step: " + "; ".join(
            f"{w} workers {min(s):.1%} to {max(s):.1%}" for w, s in share.items() if s)
        + ". Data wait a format adds over the least: " + "; ".join(
            f"{w} workers {n.wait_added_share[w]:.1%} of a step "
            f"({n.wait_added_by[w]})" for w in workers)
        + ". Median step, slowest over fastest format: " + "; ".join(
            f"{w} workers {n.step_time_ratio[w]:.2f}x (the identical computation alone: "
            f"{n.compute_ratio[w]:.2f}x)" for w in workers)
        + f" (Megatron-Bridge #5289: {bridge:.3f}x).",
        f"Startup (open + first batch, {workers[0]} workers): "
        + ", ".join(f"{f} {v:.3f} s" for f, v in startup.items()) + ".",
        "Training process RSS growth with the dataset open (peak while training; anonymous): "
        + ", ".join(f"{f} {human_bytes(v)} ({human_bytes(n.peak_rss_bytes[f])}; "
                    f"{human_bytes(n.peak_anon_bytes[f])})"
                    for f, v in n.open_rss_bytes.items()) + ".",
        f"Resume at step {p['resume_step']} on another format: identical "
        f"**{n.resume_identical}**.",
        f"Whole-bin roll over the {trap['bins']} bins trained: {trap['cross_boundary']:,} "
        f"cross-boundary targets stored (dropped by the THD collate), {trap['missed']:,} of "
        f"{trap['targets']:,} targets missed and {trap['spurious']:,} added; loss on the correct "
        f"targets {trap['eval_loss']:.4f} against {trap['reference_eval_loss']:.4f}.",
        f"Without the block-diagonal mask: {attention['share']:.1%} of loss positions attend "
        f"across a boundary; one sub-sequence's logits move by {attention['causal_change']:.3g} "
        f"when the others change (with the mask: {attention['block_change']:.3g}); loss "
        f"{attention['eval_loss']:.4f}, {attention['alone_eval_loss']:.4f} with each sequence "
        f"alone, against {attention['reference_eval_loss']:.4f}.",
        *(_hugging_face(n.hf, p) if n.hf else []),
    ]


def _hugging_face(hf: Mapping[str, Any], p: Mapping[str, Any]) -> list[str]:
    """The Hugging Face section: TRL's pipeline against packlab's shard and collator."""
    losses = hf["losses"]
    kept = [r for r in hf["boundaries"] if r["setting"] in hf["attentions"]]
    lost = [r for r in hf["boundaries"] if r["setting"] not in hf["attentions"]]
    return [
        f"**Hugging Face**: a tiny Llama trained {len(losses['trl_packs'])} steps by TRL's "
        f"`SFTTrainer` from a packlab `{p.get('hf_format', 'parquet')}` shard of TRL's own BFD "
        f"bins: {hf['same_rows']:,} of {hf['rows']['trl_packs']:,} rows identical to TRL's, "
        f"loss curve {'identical bit for bit' if hf['shard_identical'] else 'different'}; "
        f"transformers' `Trainer` with `Collator(style=\"hf_flattening\")` within "
        f"{hf['collator_max_abs_difference']:.2g} nats of it; from packlab's own packing "
        f"({hf['rows']['trl_from_packlab_packing']:,} bins against TRL's "
        f"{hf['rows']['trl_packs']:,}) the last loss is "
        f"{losses['trl_from_packlab_packing'][-1]:.4f} against {losses['trl_packs'][-1]:.4f}.",
        f"Per-sequence loss in a packed batch against alone ({kept[0]['sequences'] if kept else 0} "
        f"sequences): {boundary_text(kept)} (the boundaries are kept); {boundary_text(lost)} "
        "(the model attends across them).",
    ]
