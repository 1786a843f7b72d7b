"""Training from packed shards: the RFC's Phase 2 ("run training with the new format, verify
identical loss curves; benchmark memory usage and throughput"), in plain torch on CPU.

- :mod:`~packlab.lab.train.batch`: one view of a THD batch, packlab's or Megatron-Bridge's
  (``cu_seqlens`` or ``cu_seqlens_q``), and the block-diagonal causal mask built from it;
- :mod:`~packlab.lab.train.model`: a small decoder-only transformer (position ids from the batch,
  attention causal within each sub-sequence, loss on ``loss_mask``), seeded, deterministic;
- :mod:`~packlab.lab.train.loop`: the loop over ``DataLoader(dataset, sampler=..., collate_fn=...,
  num_workers=N)``: per step loss, data wait, compute, RSS; checkpoints; resume from a
  consumed-samples count;
- :mod:`~packlab.lab.train.runs`: every format trained in a fresh process; curves compared bit for
  bit; step time, data-wait share, startup and peak memory per format (notebook 10);
- :mod:`~packlab.lab.train.traps`: the whole-bin loss-mask roll and attention across sequence
  boundaries, measured;
- the Hugging Face stack (transformers and TRL, imported only by these modules):
  :mod:`~packlab.lab.train.hf_model` (a tiny Llama and a tokenizer over ids, nothing
  downloaded), :mod:`~packlab.lab.train.hf_runs` (TRL's own packing against packlab shards and
  ``Collator(style="hf_flattening")``), :mod:`~packlab.lab.train.hf_boundaries` (per-sequence
  losses packed against alone), :mod:`~packlab.lab.train.hf_report`.

Layer 7, beside :mod:`packlab.lab.measure`: a training run is a measurement of the data path (it
opens datasets by path through :mod:`packlab.sources` and runs in a fresh process through
:mod:`packlab.lab.measure.harness`); it needs torch.
"""

from __future__ import annotations

from packlab.lab.train.batch import ThdView, attention_mask, make_collator, thd_view
from packlab.lab.train.loop import ResumeSampler, TrainRun, load_checkpoint, save_checkpoint, train
from packlab.lab.train.model import (
    ModelConfig,
    TinyDecoder,
    build_model,
    deterministic,
    masked_loss,
)

__all__ = [
    "ModelConfig", "ResumeSampler", "ThdView", "TinyDecoder", "TrainRun", "attention_mask",
    "build_model", "deterministic", "load_checkpoint", "make_collator", "masked_loss",
    "save_checkpoint", "thd_view", "train",
]
