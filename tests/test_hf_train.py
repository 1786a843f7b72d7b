"""The lab's Hugging Face study (notebooks 02 and 10), checked with TRL's and transformers' own
code: TRL's BFD assignment is what ``SFTTrainer(packing=True)`` packs, a packlab shard of it
trains TRL's curve bit for bit, and the per-sequence loss check tells a model that keeps the
boundaries from one that does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from trl import SFTTrainer

from packlab.lab.hf_quiet import quiet
from packlab.lab.measure.trl_packing import beside_trl, trl_bfd
from packlab.lab.train.hf_boundaries import alone_losses, boundary_check, packed_losses, settings
from packlab.lab.train.hf_model import build_llama, id_tokenizer
from packlab.lab.train.hf_report import CURVE_TOLERANCE, TOLERANCE, hf_findings, hf_numbers
from packlab.lab.train.hf_runs import Schedule, conversations, same_rows, train_pipelines
from packlab.lab.train.model import ModelConfig
from packlab.loading.collate import Collator
from packlab.packing import pack
from packlab.pipeline.shards import write_shards
from packlab.sources import open_dataset
from packlab.spool import SpoolReader
from packlab.spool.synth import synth_lengths, synthesize

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

PACK_SIZE = 256
VOCAB = 512


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> SpoolReader:
    """Single-turn chat (several sequences per bin, a prompt not trained, an answer trained)."""
    return synthesize(tmp_path_factory.mktemp("hf_train") / "spool", num_sequences=60,
                      profile="short", vocab_size=VOCAB, seed=2)


def shard_of(spool: SpoolReader, assignment, root: Path):
    write_shards(spool, assignment, root, format="memmap_v1", bins_per_shard=8, workers=1)
    return open_dataset(root)


def test_trl_bfd_is_a_complete_assignment_packed_per_map_batch() -> None:
    lengths = synth_lengths(2500, "chat", 0)
    per_batch, _ = trl_bfd(lengths, 4096)
    whole, _ = trl_bfd(lengths, 4096, map_batch_size=None)
    for assignment in (per_batch, whole):
        assert sorted(assignment.seq_indices.tolist()) == list(range(lengths.shape[0]))
        assert int(assignment.bin_lengths(lengths).max()) <= 4096
    batch_of = [set((per_batch.bin_indices(b) // 1000).tolist())
                for b in range(per_batch.num_bins)]
    assert all(len(b) == 1 for b in batch_of)  # SFTTrainer packs each map batch on its own
    assert per_batch.num_bins >= whole.num_bins


def test_packlab_beside_trl_on_the_same_lengths() -> None:
    lengths = synth_lengths(1500, "chat", 1)
    rows = {row["packer"]: row for row in beside_trl(lengths, 4096)}
    assert {"first_fit_decreasing", "trl_bfd (one batch)", "trl_bfd (map batches of 1,000)"
            } <= set(rows)
    for row in rows.values():
        assert row["num_bins"] >= row["lower_bound_bins"] and 0 < row["fill"] <= 1


def test_sft_trainer_packs_trl_bfd_bins_and_a_packlab_shard_of_them_trains_its_curve(
        spool: SpoolReader, tmp_path: Path) -> None:
    """TRL's own pipeline (labels from assistant_masks, BFD, padding-free) against the packlab
    shard of ``trl_bfd``'s assignment: the same rows, the same curve bit for bit; the
    transformers Trainer with packlab's collator within float tolerance."""
    trl_bins = shard_of(spool, trl_bfd(spool.lengths, PACK_SIZE)[0], tmp_path / "trl")
    own = shard_of(spool, pack(spool.lengths, PACK_SIZE)[0], tmp_path / "own")
    config = ModelConfig(vocab_size=VOCAB, max_positions=PACK_SIZE, width=16, heads=2)
    runs = train_pipelines(spool, trl_bins, own, config, Schedule(steps=3, batch_size=2, lr=3e-3),
                           pack_size=PACK_SIZE)
    assert same_rows(runs["trl_packs"].train_dataset, trl_bins) == len(trl_bins) > 2
    numbers = hf_numbers(runs, same_rows=len(trl_bins), boundaries=[], attentions=[])
    assert numbers["shard_identical"] and len(numbers["losses"]["trl_packs"]) == 3
    assert numbers["collator_max_abs_difference"] <= CURVE_TOLERANCE
    assert runs["trl_from_packlab_packing"].rows == len(own)
    verdicts = [f["verdict"] for f in hf_findings(numbers)[:2]]
    assert verdicts == ["holds", "holds"]


@pytest.mark.parametrize("mask_column", ["assistant_masks", "completion_mask"])
def test_trl_builds_packlab_rows_from_either_mask(spool: SpoolReader, tmp_path: Path,
                                                  mask_column: str) -> None:
    """``SFTTrainer``'s own preparation (labels from the mask column, then BFD) gives exactly
    the rows ``PrepackedExamples`` serves from a packlab shard of ``trl_bfd``'s bins."""
    trl_bins = shard_of(spool, trl_bfd(spool.lengths, PACK_SIZE)[0], tmp_path / "trl")
    schedule = Schedule(steps=1, batch_size=2, lr=1e-3)
    with quiet():
        trainer = SFTTrainer(
            model=build_llama(ModelConfig(vocab_size=VOCAB, max_positions=PACK_SIZE, width=16,
                                          heads=2)),
            train_dataset=conversations(spool, mask_column),
            processing_class=id_tokenizer(VOCAB),
            args=schedule.sft(str(tmp_path / "out"), packing=True, max_length=PACK_SIZE,
                              completion_only_loss=mask_column == "completion_mask"))
    assert same_rows(trainer.train_dataset, trl_bins) == len(trl_bins)


def test_the_per_sequence_losses_are_the_models_own_loss(spool: SpoolReader, tmp_path: Path
                                                         ) -> None:
    """Weighted by trained labels, the per-sequence losses make the model's own loss of the
    flattened batch; alone they equal packed where the model keeps the boundaries, and differ
    where it is called with a cache or an attention mask of ones."""
    dataset = shard_of(spool, pack(spool.lengths, PACK_SIZE)[0], tmp_path / "own")
    items = [dataset[i] for i in range(3)]
    model = build_llama(ModelConfig(vocab_size=VOCAB, max_positions=PACK_SIZE, width=16, heads=2))
    batch = Collator(style="hf_flattening", return_flash_attn_kwargs=True,
                     return_seq_idx=True)(items)
    labels = batch["labels"][0]
    trained = np.bincount(batch["seq_idx"][0][labels != -100].numpy(),
                          minlength=int(batch["seq_idx"].max()) + 1)
    packed = packed_losses(model, batch)
    with torch.no_grad():
        own = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                    labels=batch["labels"]).loss.item()
    mean = np.nansum(packed * trained) / trained.sum()
    assert mean == pytest.approx(own, abs=1e-5)
    assert np.nanmax(np.abs(packed - alone_losses(model, batch))) <= TOLERANCE
    rows = {r["setting"]: r for r in boundary_check(model, items, settings(["sdpa", "eager"]))}
    assert [rows[s]["respects_boundaries"] for s in rows] == [True, True, False, False]
    assert min(rows[s]["max_abs_difference"] for s in list(rows)[2:]) > 10 * TOLERANCE
