"""README, "Using packlab outputs in Megatron-Bridge, Nemotron and Modalities" and "Megatron-Bridge
and Megatron-LM, as of today": every block of the two sections runs, in order, exactly as written.

The section's ``sh`` blocks are ``packlab`` commands, run line by line (each must exit 0); its
``python`` blocks run in one namespace, in a scratch directory holding the inputs the section
names: ``chat_spool`` (a packlab spool), ``nemotron_out`` (Nemotron's output layout, written
by ``tests/nemotron_layout.py``), ``documents.jsonl`` and ``packed/`` (Megatron-Bridge's own
offline packer output), ``bridge_sft/`` (Bridge's packed ``.sft`` pairs, written as Bridge
writes them: ``tests/sft_pairs.py``); its ``s3://lab/...`` lines reach the local S3 server of
the ``server`` fixture. ``tokenizer`` is an object with ``eos_id``, all Bridge's packed
datasets read of one. It runs in ``.venv-bridge``, Bridge's declared stack, as the section says
(Bridge's one stand-in there, for the LoRA layers that import Transformer Engine:
``tests/bridge/bridge_code.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from bridge_code import SpoolAsTokenizedDataset, Tokenizer, import_bridge
from nemotron_layout import (
    chat_sft_extra,
    length_mix,
    random_sequences,
    write_nemotron_parquet,
    write_nemotron_spool,
)
from readme_sections import run_section
from sft_pairs import builder_pair, item_from_facts

from packlab.materialize import iter_bins
from packlab.packing import pack
from packlab.spool import SpoolReader, SpoolWriter

TITLE = "## Using packlab outputs in Megatron-Bridge, Nemotron and Modalities"
AS_OF_TODAY = "## Megatron-Bridge and Megatron-LM, as of today"
EOS = 2


def make_inputs(root: Path, bridge) -> None:
    rng = np.random.default_rng(4)
    with SpoolWriter(root / "chat_spool", vocab_size=1000) as writer:
        for n in rng.integers(2, 900, 400).tolist():
            tokens = rng.integers(3, 1000, n)
            tokens[-1] = EOS
            writer.append(tokens, (np.arange(n) >= n // 3).astype(np.uint8))
    spool_dir = root / "nemotron_out" / "spool" / "shard_000000"
    write_nemotron_spool(spool_dir, random_sequences(length_mix(2000, seed=5), seed=6),
                         chat_sft_extra(0))
    spool = SpoolReader(spool_dir)
    assignment, _ = pack(spool.lengths, 4096, seed=0)
    write_nemotron_parquet(root / "nemotron_out" / "shard_000000.parquet",
                           [b.copy() for b in iter_bins(spool, assignment)])
    with open(root / "documents.jsonl", "w") as f:
        for i in range(50):
            f.write(json.dumps({"id": i, "text": f"Document {i}: " + "words " * i}) + "\n")
    chat = SpoolReader(root / "chat_spool")
    assignment, _ = pack(chat.lengths, 4096, seed=1)
    sft_bins = [b.copy() for b in iter_bins(chat, assignment)]
    for k, part in enumerate((sft_bins[:len(sft_bins) // 2], sft_bins[len(sft_bins) // 2:])):
        builder_pair(root / "bridge_sft" / f"training_4096_{k}.sft",
                     [item_from_facts(b) for b in part])
    (root / "packed").mkdir()
    bridge.offline.prepare_gpt_sft_packed_data(
        input_path=root / "training.jsonl", output_path=root / "packed/training_4096.idx.parquet",
        output_metadata_path=root / "packed/4096_metadata.jsonl", packed_sequence_size=4096,
        tokenizer=Tokenizer(EOS), max_seq_length=4096, seed=0,
        dataset_builder=lambda path, **kw: SpoolAsTokenizedDataset(
            chat, EOS, kw["dataset_kwargs"]["pad_seq_length_to_mult"]))


def test_the_section_runs_as_written(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                     ) -> None:
    """``server``: the local S3 server (bucket ``lab``) the section's ``s3://`` lines reach."""
    bridge = import_bridge()  # its packed datasets and its loader builder
    make_inputs(tmp_path, bridge)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACKLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKLAB_STAGING_DIR", str(tmp_path / "staging"))
    namespace = {"tokenizer": Tokenizer(EOS)}
    python_blocks, commands = run_section(TITLE, namespace)
    assert python_blocks >= 3
    assert commands >= 8
    python_blocks, commands = run_section(AS_OF_TODAY, namespace)
    assert python_blocks >= 4
    assert commands >= 16
    assert len(namespace["bins"]) > 0 and len(namespace["bridge_bins"]) > 0
    assert len(namespace["train"]) == 64  # "Train from packlab outputs in a Megatron-Bridge recipe"
    # "Megatron-Bridge's packed .sft files": Bridge's first bin, item-exact
    first = pack(SpoolReader(tmp_path / "chat_spool").lengths, 4096, seed=1)[0]
    want = next(iter_bins(SpoolReader(tmp_path / "chat_spool"), first))
    assert namespace["sft_item"]["input_ids"].tolist() == want.input_ids.tolist()
    assert namespace["sft_item"]["loss_mask"].tolist() == want.loss_mask.tolist()
    assert (tmp_path / "sft_again" / "shard_000000.sft.bin").read_bytes() == \
        (tmp_path / "sft_out" / "shard_000000.sft.bin").read_bytes()
    # "Megatron-LM's pre-tokenized conversations": 200 conversations, masks trained and not
    assert len(namespace["conversations"]) == namespace["chats"].num_sequences == 200
    assert 0 < int(namespace["derived"].masks.sum()) < namespace["derived"].num_tokens
