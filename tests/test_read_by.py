"""Who reads each format, as its facts say (``FormatFacts.READ_BY``), checked for real.

Every (format, reader) pair a format declares is run here: the other stack's own reader opens
the output of ``packlab pack`` in that format and must return every bin's tokens as packlab
reads them. The report's per-format table prints ``READ_BY``, so every name it shows is backed
by one of these runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import write_random_spool

from packlab.formats import format_names, get_format
from packlab.formats.shared.base import READERS
from packlab.sources import open_dataset

ROOT = Path(__file__).resolve().parents[1]
PACK_SIZE = 1024
EOS = 2


def _megatron_core(out: Path) -> list[np.ndarray]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    pairs = sorted(out.glob("shard_*.sft.idx"))  # Megatron-Bridge's packed items
    if pairs:
        (pair,) = pairs
        dataset = IndexedDataset(str(pair)[:-len(".idx")])
        items = [np.array(dataset[i]) for i in range(len(dataset))]
        del dataset
        # an item: magic, version, n, n starts, then the ids with the loss-mask bit on top
        return [item[3 + item[2]:] & 0x7FFFFFFF for item in items]
    (shard,) = sorted(p for p in out.glob("shard_*") if p.is_dir())
    dataset = IndexedDataset(str(shard / "data"))
    rows = [np.array(dataset[i]) for i in range(len(dataset))]  # copies: the map may close
    del dataset
    return rows


def _duckdb(out: Path) -> list[np.ndarray]:
    import duckdb

    (shard,) = sorted(out.glob("shard_*.parquet"))
    con = duckdb.connect()
    return [np.asarray(row[0]) for row in con.execute(
        "SELECT input_ids FROM read_parquet(?) ", [str(shard)]).fetchall()]


def _hf_datasets(out: Path) -> list[np.ndarray]:
    from datasets import load_dataset

    (shard,) = [p for p in sorted(out.glob("shard_*")) if p.suffix in (".parquet", ".arrow")]
    builder = {".parquet": "parquet", ".arrow": "arrow"}[shard.suffix]
    dataset = load_dataset(builder, data_files=[str(shard)], split="train")
    return [np.asarray(row["input_ids"]) for row in dataset]


def _modalities(out: Path) -> list[np.ndarray]:
    from modalities.dataloader.dataset import PackedMemMapDatasetBase

    (shard,) = sorted(out.glob("shard_*.pbin"))
    dataset = PackedMemMapDatasetBase(shard, sample_key="input_ids")
    return [np.asarray(dataset[i]["input_ids"]) for i in range(len(dataset))]


RUN: dict[str, Callable[[Path], list[np.ndarray]]] = {
    "Megatron-core": _megatron_core, "DuckDB": _duckdb, "HF datasets": _hf_datasets,
    "Modalities": _modalities,
}
# readers run in another environment, by the test file named (Megatron-Bridge: its declared
# stack, .venv-bridge)
ELSEWHERE = {"Megatron-Bridge": "tests/bridge/test_read_by_bridge.py"}


def declared_by(reader: str) -> list[str]:
    """The formats whose facts name ``reader`` among those that read them."""
    return [name for name in format_names() if reader in get_format(name).Reader.READ_BY]


PAIRS = [(name, reader) for reader in RUN for name in declared_by(reader)]


def test_every_declared_reader_is_known_and_has_a_run() -> None:
    assert set(RUN) | set(ELSEWHERE) == set(READERS)
    assert not set(RUN) & set(ELSEWHERE)
    for reader, test_file in ELSEWHERE.items():
        assert f'declared_by("{reader}")' in (ROOT / test_file).read_text(), test_file
    assert PAIRS, "no format declares a reader"
    for name in format_names():
        declared = get_format(name).Reader.READ_BY
        assert set(declared) <= set(READERS), (name, declared)
        assert len(set(declared)) == len(declared), name


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """``packed(format)``: one shard of a random spool (ids below 40, so EOS appears), packed
    by ``packlab pack`` once per format."""
    from packlab.cli import main

    root = tmp_path_factory.mktemp("read_by")
    spool = write_random_spool(root / "spool", num_sequences=120, max_len=300, vocab_size=40)
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            out = root / name
            assert main(["pack", str(spool.path), str(out), "--format", name,
                         "--pack-size", str(PACK_SIZE), "--bins-per-shard", "1000"]) == 0
            done[name] = out
        return done[name]

    return get


@pytest.mark.parametrize(("name", "reader"), PAIRS, ids=[f"{n}-{r}" for n, r in PAIRS])
def test_the_declared_reader_reads_every_bin(name: str, reader: str, packed: Any,
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert_reads_every_bin(RUN[reader], packed(name))


def assert_reads_every_bin(read: Callable[[Path], list[np.ndarray]], out: Path) -> None:
    """``read(out)`` returns every bin's tokens, in order, as packlab reads them."""
    ours = open_dataset(out)
    theirs = read(out)
    assert len(theirs) == len(ours) > 1
    for i, row in enumerate(theirs):
        assert row.astype(np.int64).tolist() == ours[i]["input_ids"].astype(np.int64).tolist(), i
