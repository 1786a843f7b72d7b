"""Whether a ``transformers`` model keeps packed sequences apart: per-sequence losses of one
flattened batch against each sequence's loss computed alone.

Hugging Face models find the boundaries of a flattened row in ``position_ids`` (a position that
does not follow the one before starts a sequence) and, with no ``attention_mask`` and no
cache, mask attention block-diagonally; on GPU, FlashAttention reads ``cu_seq_lens_q/k``
instead. On CPU the attention is ``sdpa``, ``eager`` or ``flex_attention``. Each is checked the
same way: one forward of the batch ``Collator(style="hf_flattening")`` builds, the mean loss of
each sequence's trained labels, and the same sequence run alone (positions from 0, nothing
else in the row). Two ways of calling the model that lose the boundaries are measured beside
them: ``use_cache=True`` (``LlamaConfig``'s default, which trainers turn off; with a cache the
model skips the packed-sequence detection) and an ``attention_mask`` of ones (what a padding
collator adds; TRL's padding-free collator leaves it out for this reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from packlab.interop.hf_batch import IGNORE_INDEX
from packlab.lab.train.hf_model import CPU_ATTENTIONS
from packlab.lab.train.hf_report import TOLERANCE
from packlab.loading.collate import Collator

#: the ways of calling the model that lose the boundaries, measured with ``sdpa``
TRAPS: dict[str, dict[str, Any]] = {
    "sdpa, use_cache=True": {"attention": "sdpa", "use_cache": True},
    "sdpa, attention_mask of ones": {"attention": "sdpa", "ones_mask": True},
}


def _mean_losses(logits: torch.Tensor, labels: torch.Tensor, seq_of: torch.Tensor,
                 count: int) -> np.ndarray:
    """Mean next-token loss of each sequence's trained labels (NaN: none trained), the labels
    shifted as the model's own loss shifts them."""
    target = labels[1:]
    losses = F.cross_entropy(logits[:-1].float(), target.clamp(min=0), reduction="none")
    keep = target != IGNORE_INDEX
    seq = seq_of[1:][keep].numpy()
    sums = np.bincount(seq, weights=losses[keep].double().numpy(), minlength=count)
    counts = np.bincount(seq, minlength=count)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


@torch.no_grad()
def packed_losses(model: Any, batch: Mapping[str, torch.Tensor], *, use_cache: bool = False,
                  ones_mask: bool = False) -> np.ndarray:
    """Per-sequence losses of one forward of the flattened ``batch`` (``seq_idx`` needed)."""
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"],
              "use_cache": use_cache}
    if ones_mask:
        inputs["attention_mask"] = torch.ones_like(batch["input_ids"])
    logits = model(**inputs).logits[0]
    seq_of = batch["seq_idx"][0].long()
    return _mean_losses(logits, batch["labels"][0], seq_of, int(seq_of.max()) + 1)


@torch.no_grad()
def alone_losses(model: Any, batch: Mapping[str, torch.Tensor]) -> np.ndarray:
    """Each sequence of ``batch`` forwarded alone: its loss as if nothing were packed with it."""
    cu = batch["cu_seq_lens_q"].tolist()
    out = []
    for start, stop in zip(cu[:-1], cu[1:], strict=True):
        ids = batch["input_ids"][:, start:stop]
        logits = model(input_ids=ids, use_cache=False).logits[0]
        out.append(_mean_losses(logits, batch["labels"][0, start:stop],
                                torch.zeros(stop - start, dtype=torch.long), 1)[0])
    return np.array(out)


def settings(attentions: Sequence[str] = CPU_ATTENTIONS) -> dict[str, dict[str, Any]]:
    """Each attention implementation called as a trainer calls it, then the traps.
    (``flex_attention`` compiles a kernel per sequence length on CPU: minutes, not seconds.)"""
    return {**{name: {"attention": name} for name in attentions}, **TRAPS}


def boundary_check(model: Any, items: Sequence[Mapping[str, Any]],
                   ways: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """For each way of calling the model (default: :func:`settings`): the largest difference
    between a sequence's loss in the packed batch of ``items`` and alone, over the sequences
    with trained labels."""
    batch = Collator(style="hf_flattening", return_flash_attn_kwargs=True,
                     return_seq_idx=True)(items)
    was = model.config._attn_implementation
    was_training = model.training
    model.eval()
    rows = []
    try:
        alone: dict[str, np.ndarray] = {}
        for name, setting in (settings() if ways is None else ways).items():
            attention = setting["attention"]
            model.set_attn_implementation(attention)
            if attention not in alone:
                alone[attention] = alone_losses(model, batch)
            packed = packed_losses(model, batch, use_cache=setting.get("use_cache", False),
                                   ones_mask=setting.get("ones_mask", False))
            trained = ~np.isnan(alone[attention])
            gap = float(np.max(np.abs(packed[trained] - alone[attention][trained])))
            rows.append({"setting": name, "max_abs_difference": gap,
                         "sequences": int(trained.sum()), "bins": len(items),
                         "respects_boundaries": gap <= TOLERANCE})
    finally:
        model.set_attn_implementation(was)
        model.train(was_training)
    return rows
