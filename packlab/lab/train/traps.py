"""The two ways a packed trainer goes wrong without noticing, made measurable.

**The loss-mask trap.** The design documents' materialize example rolls the whole bin's raw
mask right by one (:func:`packlab.packing.materialize.roll_whole_bin`) instead of aligning it per
sub-sequence. :class:`RolledMaskDataset` serves the same bins with that mask, so a run can
train on it; :func:`roll_counts` counts, over the bins a run trained, what the roll changes:
targets it adds and misses among the positions a THD batch holds, the loss bits it borrows
from the previous sub-sequence, and the targets across a boundary it stores (a sub-sequence's
last token trained to predict the next one's first token; the THD collate drops that
position, a trainer that shifts labels over the whole row would train it).

**Attention across boundaries.** A model with ``attention="causal"`` ignores ``cu_seqlens``:
every sub-sequence sees those packed before it. :func:`cross_sequence_change` changes every
other sub-sequence of a bin and measures how far one sub-sequence's logits move (zero, bit
for bit, under the block-diagonal mask); :func:`cross_attending_share` is the share of loss
positions whose attention would reach another sequence.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import torch

from packlab.errors import PacklabError
from packlab.lab.train.batch import ThdView, thd_view
from packlab.lab.train.model import TinyDecoder, build_model, masked_loss
from packlab.packing import BinAssignment
from packlab.packing.materialize import BinMaterializer, bin_masks
from packlab.spool import SpoolReader


class RolledMaskDataset:
    """The bins of ``assignment`` over a spool, with the whole-bin rolled loss mask; the same
    items (``input_ids``, ``loss_mask``, ``seq_boundaries``) as a packed dataset otherwise.
    Picklable: a process opens its own spool on first use."""

    def __init__(self, spool: str | os.PathLike[str], assignment: BinAssignment) -> None:
        self.spool = os.fspath(spool)
        self.assignment = assignment
        self._materializer: BinMaterializer | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_materializer": None}

    def __len__(self) -> int:
        return self.assignment.num_bins

    def materializer(self) -> BinMaterializer:
        if self._materializer is None:
            self._materializer = BinMaterializer(SpoolReader(self.spool), self.assignment)
        return self._materializer

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        masks = bin_masks(self.materializer(), int(index))
        packed = self.materializer().materialize(int(index)).copy()
        return {"input_ids": packed.input_ids, "loss_mask": masks.rolled,
                "seq_boundaries": packed.seq_boundaries()}


def roll_counts(spool: str | os.PathLike[str], assignment: BinAssignment,
                indices: Iterable[int]) -> dict[str, int]:
    """What the whole-bin roll changes over the bins ``indices`` (each as often as trained).

    Among the positions a THD batch holds (every position but a sub-sequence's last):
    ``targets`` (the correct ones), ``rolled_targets``, ``missed`` and ``spurious`` (what the
    roll leaves out and adds), ``borrowed`` (a sub-sequence's first position carrying the
    previous sequence's last mask bit). Outside them: ``cross_boundary`` (the roll's targets
    at a sub-sequence's last token, followed by another sub-sequence in the bin)."""
    materializer = BinMaterializer(SpoolReader(spool), assignment)
    counts = dict.fromkeys(("bins", "positions", "targets", "rolled_targets", "missed",
                            "spurious", "borrowed", "cross_boundary"), 0)
    for index in indices:
        m = bin_masks(materializer, int(index))
        starts = m.seq_start_id.astype(np.int64)
        ends = np.append(starts[1:], m.raw.shape[0]) - 1
        held = np.ones(m.raw.shape[0], dtype=bool)
        held[ends] = False
        rolled, aligned = m.rolled.astype(bool), m.aligned.astype(bool)
        counts["bins"] += 1
        counts["positions"] += int(held.sum())
        counts["targets"] += int(aligned[held].sum())
        counts["rolled_targets"] += int(rolled[held].sum())
        counts["missed"] += int((aligned & ~rolled)[held].sum())
        counts["spurious"] += int((rolled & ~aligned)[held].sum())
        counts["borrowed"] += int(rolled[starts[1:]].sum())
        counts["cross_boundary"] += int(rolled[ends[:-1]].sum())
    return counts


def fixed_batches(dataset: Any, collate_fn: Any, *, count: int, batch_size: int
                  ) -> list[dict[str, Any]]:
    """The first ``count`` batches of bins in order: the same evaluation set for every run."""
    size = min(count * batch_size, len(dataset))
    return [collate_fn([dataset[i] for i in range(start, min(start + batch_size, size))])
            for start in range(0, size, batch_size)]


def evaluate(model: TinyDecoder, batches: Sequence[Any]) -> float:
    """The loss over every kept position of ``batches`` (each position weighs the same)."""
    total, kept_total = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            view = thd_view(batch)
            loss, kept = masked_loss(model(view), view)
            total += float(loss) * kept
            kept_total += kept
    return total / max(kept_total, 1)


def perturb_other_segments(view: ThdView, row: int, segment: int, vocab_size: int) -> ThdView:
    """``view`` with every token of row ``row`` outside segment ``segment`` changed."""
    tokens = view.tokens.clone()
    others = view.segment_ids[row] != segment
    tokens[row, others] = (tokens[row, others] + 1) % vocab_size
    return view._replace(tokens=tokens)


def probe_segment(view: ThdView) -> tuple[int, int] | None:
    """A (row, segment) whose row holds other segments too: the last segment that has loss
    positions, in the first row packing more than one sequence (None if no row does)."""
    for row in range(view.tokens.shape[0]):
        kept = view.loss_mask[row] > 0
        if int(view.segment_ids[row].max()) > 0 and kept.any():
            segment = int(view.segment_ids[row][kept].max())
            if (view.segment_ids[row] != segment).any():
                return row, segment
    return None


def cross_sequence_change(model: TinyDecoder, batch: Any) -> dict[str, Any] | None:
    """How far one sub-sequence's logits move when every other sub-sequence of its bin is
    changed: ``max_abs_change`` over its positions (0.0 under the block-diagonal mask)."""
    view = thd_view(batch)
    probe = probe_segment(view)
    if probe is None:
        return None
    row, segment = probe
    changed = perturb_other_segments(view, row, segment, model.config.vocab_size)
    where = view.segment_ids[row] == segment
    with torch.no_grad():
        before = model(view)[row][where]
        after = model(changed)[row][where]
    return {"row": row, "segment": segment, "positions": int(where.sum()),
            "max_abs_change": float((after - before).abs().max()),
            "identical": bool(torch.equal(before, after))}


def cross_attending_share(batches: Iterable[Any]) -> float:
    """Of all kept loss positions, the share not in their row's first sub-sequence: the ones
    whose attention reaches another sequence when the mask ignores ``cu_seqlens``."""
    crossing, kept = 0, 0
    for batch in batches:
        view = thd_view(batch)
        mask = view.loss_mask > 0
        crossing += int((mask & (view.segment_ids > 0)).sum())
        kept += int(mask.sum())
    return crossing / max(kept, 1)


def with_attention(model: TinyDecoder, attention: str) -> TinyDecoder:
    """The same weights under another attention (a model trained without the block-diagonal
    mask, run on one sequence at a time as at inference)."""
    other = build_model(dataclasses.replace(model.config, attention=attention))
    other.load_state_dict(model.state_dict())
    return other


def attention_effect(reference: TinyDecoder, causal: TinyDecoder, batches: Sequence[Any]
                     ) -> dict[str, Any]:
    """What training without the block-diagonal mask changed, on the same ``batches``:
    how far one sub-sequence's logits move when the others change, under each model
    (``block_change``: 0.0), the share of loss positions attending across a boundary, and the
    loss of each model (the causal one also run one sequence at a time, as at inference)."""
    probes = [b for b in batches if probe_segment(thd_view(b)) is not None]
    if not probes:
        raise PacklabError("no batch packs two sequences in a row: nothing crosses a boundary")
    return {
        "block_change": cross_sequence_change(reference, probes[0])["max_abs_change"],
        "causal_change": cross_sequence_change(causal, probes[0])["max_abs_change"],
        "share": cross_attending_share(batches),
        "eval_loss": evaluate(causal, batches),
        "alone_eval_loss": evaluate(with_attention(causal, "block_causal"), batches),
        "reference_eval_loss": evaluate(reference, batches),
    }
