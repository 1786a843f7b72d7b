"""A tiny ``transformers`` model trained by the Hugging Face stack, from TRL's own packing and
from packlab shards (notebook 10; the four runs: :data:`PIPELINES`).

- :func:`trl_packs`: TRL's own pipeline: ``SFTTrainer(packing=True)`` over the conversations
  (``input_ids`` and ``assistant_masks`` straight from the spool), which builds the labels,
  packs with BFD and collates padding-free;
- :func:`trl_from_shard`: the same trainer over a packlab shard as pre-packed rows
  (:func:`packlab.interop.hf_dataset.hf_dataset`, preparation skipped: nothing re-packed);
- :func:`trainer_with_collator`: transformers' own ``Trainer`` over the packlab dataset with
  ``Collator(style="hf_flattening")`` as its ``data_collator``.

Every run builds its model from the same :class:`~packlab.lab.train.model.ModelConfig`
(:func:`~packlab.lab.train.hf_model.build_llama`: same seed, same weights), trains ``steps``
steps of ``batch_size`` rows on CPU in float32 with one intra-op thread and deterministic
algorithms, and keeps each step's loss as the trainer logged it. Two trainers over datasets of
the same length draw the same shuffled order (the sampler is seeded by ``seed``), so a packlab
shard holding TRL's own bins must give TRL's curve.
"""

from __future__ import annotations

import gc
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from packlab.interop.hf_dataset import PrepackedExamples, hf_dataset
from packlab.lab.hf_quiet import quiet
from packlab.lab.train.hf_model import build_llama, id_tokenizer
from packlab.lab.train.model import ModelConfig, deterministic
from packlab.loading.collate import Collator
from packlab.spool import SpoolReader


@dataclass
class HfRun:
    """One training run: its per-step losses, the rows it drew from, the trained model."""

    losses: list[float]
    rows: int
    model: Any
    train_dataset: Any


@dataclass(frozen=True)
class Schedule:
    """What every run shares: steps, rows per step, learning rate, seed, intra-op threads."""

    steps: int
    batch_size: int
    lr: float
    seed: int = 0
    threads: int = 1

    def common(self, out_dir: str) -> dict[str, Any]:
        """Training arguments for this schedule on CPU, float32, nothing saved or reported."""
        return {"output_dir": out_dir, "max_steps": self.steps,
                "per_device_train_batch_size": self.batch_size, "learning_rate": self.lr,
                "seed": self.seed, "bf16": False, "use_cpu": True, "report_to": "none",
                "save_strategy": "no", "logging_steps": 1, "disable_tqdm": True,
                "dataloader_num_workers": 0}

    def sft(self, out_dir: str, **extra: Any) -> Any:
        """TRL's ``SFTConfig`` for this schedule (``extra``: its packing options)."""
        from trl import SFTConfig

        return SFTConfig(**self.common(out_dir), **extra)


def conversations(spool: SpoolReader, mask_column: str = "assistant_masks") -> Any:
    """The spool's sequences as TRL's tokenized conversations: ``input_ids`` and the learn
    mask (token-aligned) as ``assistant_masks`` (what a chat template's generation markers
    give) or ``completion_mask`` (a prompt-completion dataset's; TRL reads it with
    ``completion_only_loss=True``), one row each, in spool order (a ``datasets.Dataset`` in
    memory)."""
    import datasets

    offsets = np.concatenate(([0], np.cumsum(spool.lengths, dtype=np.int64))).astype(np.int32)
    columns = {name: pa.ListArray.from_arrays(pa.array(offsets),
                                              pa.array(np.asarray(values, dtype=np.int64)))
               for name, values in (("input_ids", spool.tokens), (mask_column, spool.masks))}
    return datasets.Dataset(pa.table(columns))


@contextmanager
def _heap_frozen() -> Iterator[None]:
    """What the process holds already left out of every garbage collection meanwhile:
    accelerate collects at the start and end of each ``train()``, and in a notebook's kernel
    (torch, transformers, matplotlib and every earlier cell in memory) one collection took
    0.45 s, for objects that are none of the run's."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _train(make: Callable[[Any, str], Any], model_config: ModelConfig, schedule: Schedule
           ) -> HfRun:
    """Build a trainer with ``make(model, out_dir)``, train it quietly, keep its losses."""
    from transformers.trainer_callback import PrinterCallback

    with quiet(), deterministic(schedule.threads), tempfile.TemporaryDirectory() as out, \
            _heap_frozen():
        trainer = make(build_llama(model_config), out)
        trainer.remove_callback(PrinterCallback)  # it prints every logged step
        trainer.train()
    losses = [float(log["loss"]) for log in trainer.state.log_history if "loss" in log]
    return HfRun(losses, len(trainer.train_dataset), trainer.model, trainer.train_dataset)


def trl_packs(spool: SpoolReader, model_config: ModelConfig, schedule: Schedule, *,
              pack_size: int) -> HfRun:
    """``SFTTrainer(packing=True, packing_strategy="bfd", max_length=pack_size)`` over the
    spool's conversations: TRL builds the labels, packs and collates."""
    from trl import SFTTrainer

    def make(model: Any, out: str) -> Any:
        return SFTTrainer(model=model, train_dataset=conversations(spool),
                          processing_class=id_tokenizer(model_config.vocab_size),
                          args=schedule.sft(out, packing=True, packing_strategy="bfd",
                                                  max_length=pack_size))

    return _train(make, model_config, schedule)


def trl_from_shard(dataset: Any, model_config: ModelConfig, schedule: Schedule) -> HfRun:
    """``SFTTrainer`` over a packlab dataset's bins as they are stored (padding-free)."""
    from trl import SFTTrainer

    def make(model: Any, out: str) -> Any:
        return SFTTrainer(model=model, train_dataset=hf_dataset(dataset),
                          processing_class=id_tokenizer(model_config.vocab_size),
                          args=schedule.sft(
                              out, padding_free=True, max_length=None,
                              dataset_kwargs={"skip_prepare_dataset": True}))

    return _train(make, model_config, schedule)


def trainer_with_collator(dataset: Any, model_config: ModelConfig, schedule: Schedule,
                          **collate_options: Any) -> HfRun:
    """transformers' ``Trainer`` over the packlab dataset itself, batches built by
    ``Collator(style="hf_flattening")`` (its items' ``loss_mask`` and ``seq_boundaries`` are
    the collator's to read: ``remove_unused_columns=False``)."""
    from transformers import Trainer, TrainingArguments

    def make(model: Any, out: str) -> Any:
        args = TrainingArguments(**schedule.common(out), remove_unused_columns=False)
        return Trainer(model=model, args=args, train_dataset=dataset,
                       data_collator=Collator(style="hf_flattening", **collate_options))

    return _train(make, model_config, schedule)


def same_rows(theirs: Any, dataset: Any) -> int:
    """How many of TRL's packed rows equal packlab's pre-packed rows, row for row (input ids,
    labels and sequence lengths)."""
    ours = PrepackedExamples(dataset)
    if len(theirs) != len(ours):
        return 0
    return sum(_row_equal(theirs[i], ours[i]) for i in range(len(ours)))


def _row_equal(theirs: Mapping[str, Any], ours: Mapping[str, Any]) -> bool:
    return all(np.array_equal(np.asarray(theirs[k]), np.asarray(ours[k])) for k in ours)


#: the runs of :func:`train_pipelines`, and how a figure or a table names them
PIPELINES = {
    "trl_packs": "TRL packs (SFTTrainer, packing=True, BFD)",
    "trl_from_shard": "SFTTrainer from a packlab shard of TRL's bins",
    "trainer_with_collator": "Trainer + Collator(style=\"hf_flattening\"), same shard",
    "trl_from_packlab_packing": "SFTTrainer from a packlab shard of packlab's packing",
}


def train_pipelines(spool: SpoolReader, trl_bins: Any, packlab_bins: Any,
                    model_config: ModelConfig, schedule: Schedule, *, pack_size: int
                    ) -> dict[str, HfRun]:
    """The same model and schedule trained the four ways of :data:`PIPELINES`: ``trl_bins``
    is a packlab dataset written from TRL's BFD assignment of the spool
    (:func:`packlab.lab.measure.trl_packing.trl_bfd`), ``packlab_bins`` one written from
    packlab's own packing of it."""
    return {
        "trl_packs": trl_packs(spool, model_config, schedule, pack_size=pack_size),
        "trl_from_shard": trl_from_shard(trl_bins, model_config, schedule),
        "trainer_with_collator": trainer_with_collator(trl_bins, model_config, schedule),
        "trl_from_packlab_packing": trl_from_shard(packlab_bins, model_config, schedule),
    }
