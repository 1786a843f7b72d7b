"""Megatron-Bridge reads the formats whose facts say it does (``FormatFacts.READ_BY``): its
own packed datasets over ``packlab pack``'s output, on its declared stack (the other readers:
``tests/test_read_by.py``, whose fixture and check this file shares)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from bridge_code import import_bridge
from test_read_by import EOS, PACK_SIZE, assert_reads_every_bin, declared_by, packed

from packlab.lab.interop_inputs import BridgeTokenizer

__all__ = ["packed"]  # the fixture, shared

FORMATS = declared_by("Megatron-Bridge")


def _megatron_bridge(out: Path) -> list[np.ndarray]:
    bridge = import_bridge()
    npy = sorted(out.glob("shard_*.npy"))
    sources = npy or [out]  # Bridge reads one legacy .npy, or a directory of Parquet shards
    rows = []
    for source in sources:
        dataset = bridge.builders.build_gpt_sft_split(
            str(source), tokenizer=BridgeTokenizer(EOS), seq_length=PACK_SIZE, memmap_workers=1,
            seed=0, packed_sequence_size=PACK_SIZE, pad_seq_to_mult=1, dataset_kwargs={})
        rows += [np.asarray(dataset[i]["input_ids"]) for i in range(len(dataset))]
    return rows


def test_some_format_declares_bridge() -> None:
    assert FORMATS


@pytest.mark.parametrize("name", FORMATS)
def test_megatron_bridge_reads_every_bin(name: str, packed) -> None:
    assert_reads_every_bin(_megatron_bridge, packed(name))
