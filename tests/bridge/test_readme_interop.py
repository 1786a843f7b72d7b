"""README, "Using packlab outputs in Megatron-Bridge, Nemotron and Modalities" and "Megatron-Bridge
and Megatron-LM, as of today": every block of the two sections runs, in order, exactly as
written, from an empty scratch directory: the first section makes its own inputs (a spool,
Nemotron's output directory, Bridge's ``.sft`` pairs and packer output, a JSONL of documents,
the ``tokenizer`` Bridge reads).

The sections' ``sh`` blocks are ``packlab`` commands, run line by line (each must exit 0);
their ``python`` blocks run in one namespace. Their ``s3://lab/...`` lines reach the local S3
server of the ``server`` fixture. It runs in ``.venv-bridge``, Bridge's declared stack, as the
section says (Bridge's one stand-in there, for the LoRA layers that import Transformer Engine:
``tests/bridge/bridge_code.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from bridge_code import import_bridge
from readme_sections import run_section

from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.spool import SpoolReader

TITLE = "## Using packlab outputs in Megatron-Bridge, Nemotron and Modalities"
AS_OF_TODAY = "## Megatron-Bridge and Megatron-LM, as of today"


def test_the_section_runs_as_written(server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                     ) -> None:
    """``server``: the local S3 server (bucket ``lab``) the section's ``s3://`` lines reach."""
    import_bridge()  # its packed datasets, packer and loader builder, from its own code
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PACKLAB_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PACKLAB_STAGING_DIR", str(tmp_path / "staging"))
    assert list(tmp_path.iterdir()) == []
    namespace: dict[str, object] = {}
    python_blocks, commands = run_section(TITLE, namespace)
    assert python_blocks >= 5
    assert commands >= 9
    python_blocks, commands = run_section(AS_OF_TODAY, namespace)
    assert python_blocks >= 4
    assert commands >= 16
    assert len(namespace["bins"]) > 0 and len(namespace["bridge_bins"]) > 0
    assert len(namespace["train"]) == 64  # "Train from packlab outputs in a Megatron-Bridge recipe"
    # "The .sft pair Megatron-Bridge proposed": the proposal's first bin, item-exact (the pairs
    # hold the spool's bins packed by first fit on a shuffled order, seed 1)
    first = pack(SpoolReader(tmp_path / "chat_spool").lengths, 4096, seed=1)[0]
    want = next(iter_bins(SpoolReader(tmp_path / "chat_spool"), first))
    assert namespace["sft_item"]["input_ids"].tolist() == want.input_ids.tolist()
    assert namespace["sft_item"]["loss_mask"].tolist() == want.loss_mask.tolist()
    assert (tmp_path / "sft_again" / "shard_000000.sft.bin").read_bytes() == \
        (tmp_path / "sft_out" / "shard_000000.sft.bin").read_bytes()
    # "Megatron-LM's pre-tokenized conversations": 200 conversations, masks trained and not
    assert len(namespace["conversations"]) == namespace["chats"].num_sequences == 200
    assert 0 < int(namespace["derived"].masks.sum()) < namespace["derived"].num_tokens
