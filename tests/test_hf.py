"""Hugging Face's own code over packlab's bins: ``Collator(style="hf_flattening")`` against
transformers' ``DataCollatorWithFlattening`` and TRL's ``DataCollatorForLanguageModeling(
padding_free=True)`` on the same sequences, and packlab shards served to TRL's ``SFTTrainer``
as pre-packed rows (``PrepackedExamples``, ``hf_dataset``).

The Hugging Face side is fed from the spool, not from packlab's batch: each sequence's tokens
and its learn mask as a chat template's ``assistant_masks`` gives them (token-aligned: label
``j`` is token ``j`` where the mask is 1, ``-100`` elsewhere, as TRL builds them). packlab's
side reads the bins materialized from the same spool, whose loss mask is target-aligned.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DataCollatorWithFlattening
from trl import SFTConfig, SFTTrainer
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from packlab.errors import PacklabError
from packlab.interop.hf_batch import hf_flattening_batch, token_labels
from packlab.interop.hf_dataset import PrepackedExamples, hf_dataset
from packlab.lab.hf_quiet import quiet
from packlab.lab.train.hf_model import build_llama, id_tokenizer
from packlab.lab.train.model import ModelConfig
from packlab.loading.collate import Collator
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.shards import write_shards
from packlab.sources import open_dataset
from packlab.spool import SpoolReader

PACK_SIZE = 96
VOCAB = 64


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> tuple[SpoolReader, BinAssignment]:
    """Many short sequences (length 1 included) with random learn masks, packed into bins."""
    spool = write_random_spool(tmp_path_factory.mktemp("hf") / "spool", num_sequences=120,
                               max_len=40, vocab_size=VOCAB, seed=3)
    assignment, _ = pack(spool.lengths, PACK_SIZE, algorithm="first_fit_decreasing")
    return spool, assignment


@pytest.fixture(scope="module")
def items(job: tuple[SpoolReader, BinAssignment]) -> list[dict[str, np.ndarray]]:
    return [b.item() for b in iter_bins(*job, copy=True)]


def features(job: tuple[SpoolReader, BinAssignment], bins: list[int], *, labels: bool = True
             ) -> list[dict[str, list[int]]]:
    """The sequences of ``bins`` from the spool, in order, as Hugging Face features."""
    spool, assignment = job
    out = []
    for b in bins:
        for index in assignment.bin_indices(b).tolist():
            tokens, learn = spool.read_sequence(index)
            feature = {"input_ids": tokens.astype(np.int64).tolist()}
            if labels:
                feature["labels"] = np.where(learn == 1, tokens, -100).astype(np.int64).tolist()
            out.append(feature)
    return out


def assert_same(theirs: dict[str, Any], ours: dict[str, Any], *, ordered: bool = True) -> None:
    """Key for key (in order unless not ``ordered``), type, dtype, shape and value."""
    assert (list(theirs) == list(ours)) if ordered else (set(theirs) == set(ours))
    for key, value in theirs.items():
        mine = ours[key]
        assert type(value) is type(mine), key
        if isinstance(value, torch.Tensor | np.ndarray):
            assert (value.dtype, tuple(value.shape)) == (mine.dtype, tuple(mine.shape)), key
            assert np.array_equal(np.asarray(value), np.asarray(mine)), key
        else:
            assert value == mine, key


def test_a_small_batch_by_hand() -> None:
    """Two sequences, [10 11 12] learning 11 and 12, and [20 21] learning nothing; the stored
    mask is target-aligned: position t trains the prediction of t + 1."""
    item = {"input_ids": np.array([10, 11, 12, 20, 21], dtype=np.int32),
            "loss_mask": np.array([1, 1, 0, 0, 0], dtype=np.uint8),
            "seq_boundaries": np.array([0, 3, 5], dtype=np.int32)}
    assert token_labels(item).tolist() == [-100, 11, 12, -100, -100]
    out = hf_flattening_batch([item, item], return_flash_attn_kwargs=True, return_seq_idx=True,
                              separator_id=-7, position_ids_start=1, return_tensors="np")
    assert out["input_ids"].tolist() == [[10, 11, 12, 20, 21] * 2]
    assert out["labels"].tolist() == [[-7, 11, 12, -7, -100] * 2]
    assert out["position_ids"].tolist() == [[1, 2, 3, 1, 2] * 2]
    assert out["seq_idx"].tolist() == [[0, 0, 0, 1, 1, 2, 2, 2, 3, 3]]
    assert out["cu_seq_lens_q"].tolist() == [0, 3, 5, 8, 10]
    assert out["max_length_q"] == out["max_length_k"] == 3


@settings(max_examples=60, deadline=None)
@given(data=st.data(), position_ids=st.booleans(), flash=st.booleans(), seq_idx=st.booleans(),
       separator=st.sampled_from([-100, 0, 5]), start=st.sampled_from([0, 2]),
       tensors=st.sampled_from(["pt", "np"]))
def test_equals_transformers_flattening_collator(job, items, data, position_ids: bool,
                                                 flash: bool, seq_idx: bool, separator: int,
                                                 start: int, tensors: str) -> None:
    bins = data.draw(st.lists(st.integers(0, len(items) - 1), min_size=1, max_size=4))
    options = {"return_position_ids": position_ids, "separator_id": separator,
               "return_flash_attn_kwargs": flash, "return_seq_idx": seq_idx,
               "position_ids_start": start}
    theirs = DataCollatorWithFlattening(return_tensors=tensors, **options)(features(job, bins))
    ours = Collator(style="hf_flattening", return_tensors=tensors, **options)(
        [items[b] for b in bins])
    assert_same(theirs, ours)


def test_every_token_trained_equals_transformers_without_labels(tmp_path: Path) -> None:
    """A spool that learns every token: Hugging Face's collator given no labels (labels are
    then the tokens) builds the same batch."""
    spool = write_random_spool(tmp_path / "spool", num_sequences=30, max_len=20,
                               vocab_size=VOCAB, seed=1)
    assignment, _ = pack(spool.lengths, PACK_SIZE)
    ones = [b.item() for b in iter_bins(spool, assignment, copy=True)]
    for item in ones:
        item["loss_mask"][:] = 1
        item["loss_mask"][item["seq_boundaries"][1:] - 1] = 0
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        features((spool, assignment), list(range(3)), labels=False))
    assert_same(theirs, Collator(style="hf_flattening", return_flash_attn_kwargs=True)(ones[:3]))


def test_trl_padding_free_collator_builds_the_same_batch(job, items) -> None:
    """TRL's collator on the sequences one by one, on packlab's bins as pre-packed rows (its
    ``seq_lengths`` path), and on those rows through a ``datasets.Dataset``: packlab's batch
    with FlashAttention kwargs and ``seq_idx`` (TRL always returns both), key order aside."""
    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    ours = Collator(style="hf_flattening", return_flash_attn_kwargs=True, return_seq_idx=True)
    rows = hf_dataset(items)
    for bins in ([0], [1, 2], [3, 0, 5]):
        expected = ours([items[b] for b in bins])
        assert_same(trl(features(job, bins)), expected, ordered=False)
        assert_same(trl([PrepackedExamples(items)[b] for b in bins]), expected, ordered=False)
        assert_same(trl([rows[b] for b in bins]), expected, ordered=False)


def test_prepacked_examples_serve_every_bin(items) -> None:
    examples = PrepackedExamples(items)
    assert len(examples) == len(items) == len(list(examples))
    row = examples[-1]
    assert set(row) == {"input_ids", "labels", "seq_lengths"}
    assert row["seq_lengths"] == np.diff(items[-1]["seq_boundaries"]).tolist()
    assert row["input_ids"].dtype == row["labels"].dtype == np.int64
    with pytest.raises(IndexError, match="out of range"):
        examples[len(items)]


@pytest.fixture(scope="module")
def shard(job: tuple[SpoolReader, BinAssignment], tmp_path_factory: pytest.TempPathFactory
          ) -> Path:
    out = tmp_path_factory.mktemp("shard") / "out"
    write_shards(job[0], job[1], out, format="parquet", bins_per_shard=8, workers=1)
    return out


def sft_trainer(train_dataset: Any, tmp_path: Path, **config: Any) -> SFTTrainer:
    model = build_llama(ModelConfig(vocab_size=VOCAB, max_positions=PACK_SIZE, width=16,
                                    heads=2))
    args = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2,
                     bf16=False, use_cpu=True, report_to="none", save_strategy="no",
                     logging_steps=1, disable_tqdm=True, seed=0, **config)
    return SFTTrainer(model=model, args=args, train_dataset=train_dataset,
                      processing_class=id_tokenizer(VOCAB))


@pytest.mark.parametrize("streaming", [False, True], ids=["in_memory", "streaming"])
def test_sft_trainer_trains_from_a_packlab_shard(shard: Path, tmp_path: Path, streaming: bool
                                                 ) -> None:
    """``SFTTrainer`` (padding-free, preparation skipped: no re-packing) over a packlab shard:
    the collator it builds from its config gives packlab's batch, and it trains."""
    dataset = open_dataset(shard)
    source = hf_dataset(dataset, streaming=streaming)
    rows = PrepackedExamples(dataset)
    with quiet():
        trainer = sft_trainer(source, tmp_path, padding_free=True, max_length=None,
                              dataset_kwargs={"skip_prepare_dataset": True})
        assert_same(trainer.data_collator([rows[0], rows[3]]),
                    Collator(style="hf_flattening", return_flash_attn_kwargs=True,
                             return_seq_idx=True)([dataset[0], dataset[3]]), ordered=False)
        trainer.train()
    losses = [log["loss"] for log in trainer.state.log_history if "loss" in log]
    assert len(losses) == 2 and all(np.isfinite(losses))
    if not streaming:
        assert [source[i] for i in range(len(source))] == [
            {k: np.asarray(v).tolist() for k, v in row.items()} for row in rows]


def test_a_streamed_dataset_follows_the_order_given(items) -> None:
    streamed = list(hf_dataset(items, streaming=True, order=np.array([4, 1, 2])))
    assert [r["input_ids"] for r in streamed] == [
        PrepackedExamples(items)[b]["input_ids"].tolist() for b in (4, 1, 2)]


def test_errors_are_one_line() -> None:
    item = {"input_ids": np.arange(4), "loss_mask": np.zeros(4, np.uint8),
            "seq_boundaries": np.array([0, 4])}
    with pytest.raises(PacklabError, match="empty batch"):
        hf_flattening_batch([])
    with pytest.raises(PacklabError, match="return_tensors"):
        hf_flattening_batch([item], return_tensors="tf")
    with pytest.raises(PacklabError, match="loss_mask has 3 positions"):
        token_labels({**item, "loss_mask": np.zeros(3, np.uint8)})
    with pytest.raises(PacklabError, match="seq_boundaries"):
        hf_flattening_batch([{**item, "seq_boundaries": np.array([0, 3])}])
    with pytest.raises(PacklabError, match="hf_flattening"):
        Collator(style="hf")
