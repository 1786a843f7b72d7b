"""Megatron-Bridge's own code over packlab's outputs, and packlab over Bridge's own outputs.

Runs the ``megatron-bridge`` 0.6.2 package on its declared stack (``.venv-bridge``: Python 3.12
and Bridge's declared requirements, ``make bridge-env``; no copy of its code here): its packed
datasets ``GPTSFTPackedDataset`` (legacy ``.npy``) and ``GPTSFTPackedParquetDataset``, their
``collate_fn``, the builder ``build_gpt_sft_split`` a recipe calls, ``PackedSequenceSpecs``, and
its offline packer ``prepare_gpt_sft_packed_data`` (with its packing algorithms and Parquet
writer). One module of Bridge's is a stand-in, the LoRA layers that import Transformer Engine
(``tests/bridge/bridge_code.py`` says why).

The tokenizer given to Bridge is an object with ``eos_id``/``eod`` (all its packed datasets
and packer read), and Bridge's packer gets its tokenized split from a ``dataset_builder``
that serves a packlab spool's sequences (``TokenizedSpool``): the packing, padding,
loss alignment and writing are Bridge's.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from bridge_code import (
    assert_same_batch,
    import_bridge,
    same_item,
)
from conftest import run_cli

from packlab.bins import PackedBin
from packlab.errors import InvariantError
from packlab.formats import format_names
from packlab.interop.bridge_metadata import (
    PACK_METADATA_FILE,
    metadata_of_bins,
    read_pack_metadata,
)
from packlab.lab.interop_inputs import BridgeTokenizer, TokenizedSpool
from packlab.loading.collate import Collator
from packlab.sources import open_dataset, open_shard
from packlab.spool import SpoolReader, SpoolWriter

PACK_SIZE = 512
EOS = 2
LEGACY = "legacy_npy_pickle"


@pytest.fixture(scope="module")
def bridge() -> Any:
    return import_bridge()


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> SpoolReader:
    """Chat-like sequences that end with EOS and hold EOS inside too (vocabulary of 40, so
    the EOS id 2 is common), masks 0 on a prompt then 1."""
    rng = np.random.default_rng(11)
    lengths = np.concatenate((rng.integers(2, 40, 150), rng.integers(40, 400, 250),
                              [1, 1, 700]))
    rng.shuffle(lengths)
    path = tmp_path_factory.mktemp("bridge") / "spool"
    with SpoolWriter(path, vocab_size=40) as writer:
        for n in lengths.tolist():
            tokens = rng.integers(0, 40, n)
            tokens[-2:] = [3, EOS][-n:]  # ends with one EOS (a padded copy ends with more)
            mask = (np.arange(n) >= rng.integers(0, n)).astype(np.uint8)
            writer.append(tokens, mask)
    return SpoolReader(path)


@pytest.fixture(scope="module")
def packed(spool: SpoolReader, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The spool packed by ``packlab pack`` into every format (several shards each)."""
    from packlab.cli import main

    root = tmp_path_factory.mktemp("packed")
    out = {}
    for name in format_names():
        out[name] = root / name
        assert main(["pack", str(spool.path), str(out[name]), "--format", name, "--pack-size",
                     str(PACK_SIZE), "--bins-per-shard", "40", "--seed", "5"]) == 0
    return out


def bridge_split(bridge: Any, path: Path, **options: Any) -> Any:
    """Bridge's dataset for ``path`` as its recipes build it (``build_gpt_sft_split``)."""
    dataset_kwargs = {key: options.pop(key) for key in ("pad_to_max_length", "answer_only_loss")
                      if key in options}
    return bridge.builders.build_gpt_sft_split(
        str(path), tokenizer=BridgeTokenizer(EOS), seq_length=PACK_SIZE, memmap_workers=1, seed=0,
        packed_sequence_size=PACK_SIZE, pad_seq_to_mult=options.pop("pad_seq_to_mult", 1),
        dataset_kwargs=dataset_kwargs, **options)


# -- Bridge reads packlab ---------------------------------------------------------------------
def bridge_readable(name: str, packed: dict[str, Path], tmp_path: Path, capsys
                    ) -> list[list[Path]]:
    """What Bridge reads of format ``name``, in groups that each hold every bin in order: the
    output itself (its legacy .npy shards, or its Parquet directory), else the output
    converted by ``packlab convert`` into both."""
    if name in (LEGACY, "parquet"):
        sources = {name: packed[name]}
    else:
        sources = {}
        for target in ("parquet", LEGACY):
            code, _, err = run_cli(capsys, "convert", packed[name], tmp_path / target,
                                   "--format", target)
            assert code == 0, err
            sources[target] = tmp_path / target
    return [sorted(path.glob("shard_*.npy")) if target == LEGACY else [path]
            for target, path in sources.items()]


def bins_of(dataset: Any) -> Iterator[PackedBin]:
    return (dataset.read_bin(i) for i in range(len(dataset)))


@pytest.mark.parametrize("name", format_names())
def test_bridge_datasets_read_packlab_outputs_item_exact(name: str, bridge: Any,
                                                          packed: dict[str, Path], tmp_path,
                                                          capsys) -> None:
    ours = open_dataset(packed[name])
    for group in bridge_readable(name, packed, tmp_path, capsys):
        items = []
        for path in group:  # Bridge reads one .npy file, or a whole Parquet directory
            theirs = bridge_split(bridge, path)
            assert type(theirs).__name__ == ("GPTSFTPackedDataset" if path.suffix == ".npy"
                                             else "GPTSFTPackedParquetDataset")
            items += [theirs[i] for i in range(len(theirs))]
        assert len(items) == len(ours) > 0
        assert all(same_item(items[i], ours[i]) for i in range(len(ours)))


def test_bridge_recipe_settings_accept_packlab_output(bridge: Any, packed: dict[str, Path]
                                                      ) -> None:
    out = packed["parquet"]
    specs = bridge.config.PackedSequenceSpecs(
        packed_sequence_size=PACK_SIZE, packed_train_data_path=str(out),
        packed_metadata_path=str(out / PACK_METADATA_FILE), pad_cu_seqlens=True)
    assert specs.packed_train_data_path == str(out)
    metadata = read_pack_metadata(out / PACK_METADATA_FILE)
    dataset = bridge_split(bridge, out, pack_metadata_path=specs.packed_metadata_path,
                           pad_cu_seqlens=True, pad_to_max_length=True)
    assert dataset.pack_metadata == metadata
    assert dataset.pack_metadata[0]["max_samples_per_bin"] == max(
        len(dataset[i]["seq_boundaries"]) - 1 for i in range(len(dataset)))


def test_bridge_reads_a_split_of_a_blended_layout(bridge: Any, spool: SpoolReader,
                                                  tmp_path: Path, capsys) -> None:
    """``splits/train/`` (links to two datasets' shards) read by Bridge; its fixed-shape
    metadata is the list of the two datasets' entries (Bridge takes the max and min over a
    list), gathered from the folders ``blend.json`` names."""
    out = tmp_path / "layout"
    code, _, err = run_cli(capsys, "pack", spool.path, spool.path, out, "--format", "parquet",
                           "--pack-size", PACK_SIZE, "--split", "train=0.8,valid=0.2",
                           "--names", "a,b")
    assert code == 0, err
    train = out / "splits" / "train"
    blend = json.loads((out / "blend.json").read_text())
    entries = [e for d in blend["splits"]["train"]["datasets"]
               for e in read_pack_metadata(out / d["dir"] / PACK_METADATA_FILE)]
    metadata = tmp_path / "train_pack_metadata.json"
    metadata.write_text(json.dumps(entries))
    assert len(entries) == 2
    theirs = bridge_split(bridge, train, pack_metadata_path=metadata, pad_cu_seqlens=True,
                          pad_to_max_length=True)
    ours = open_dataset(out, split="train")
    assert len(theirs) == len(ours)
    assert all(same_item(theirs[i], ours[i]) for i in range(len(ours)))
    collator = Collator(style="megatron_bridge", max_seq_length=PACK_SIZE, eos_id=EOS,
                        pad_to_max_length=True, pad_cu_seqlens=True, pack_metadata=entries)
    indices = [0, len(ours) // 2, len(ours) - 1]
    assert_same_batch(theirs.collate_fn([theirs[i] for i in indices]),
                      collator([ours[i] for i in indices]))


# -- packlab's Bridge-style batch equals Bridge's collate_fn --------------------------------------
MODES = {
    "variable": {},
    "fixed_shape": {"pad_cu_seqlens": True, "pad_to_max_length": True},
    "pad_seq_to_mult": {"pad_seq_to_mult": 4},
    "pad_seq_to_mult_fixed": {"pad_seq_to_mult": 4, "pad_cu_seqlens": True,
                              "pad_to_max_length": True},
    "eos_loss": {"answer_only_loss": False},
}


@pytest.mark.parametrize("source", ["parquet", LEGACY])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_the_bridge_style_batch_equals_bridge_collate_fn(mode: str, source: str, bridge: Any,
                                                         packed: dict[str, Path]) -> None:
    options = dict(MODES[mode])
    out = packed[source]
    metadata = out / PACK_METADATA_FILE
    path = out if source == "parquet" else sorted(out.glob("shard_*.npy"))[0]
    extra = {"pack_metadata_path": metadata} if options.get("pad_cu_seqlens") else {}
    theirs = bridge_split(bridge, path, **options, **extra)
    ours = open_dataset(path)
    collator = Collator(style="megatron_bridge", max_seq_length=PACK_SIZE, eos_id=EOS,
                        pack_metadata=metadata, **options)
    rng = np.random.default_rng(len(mode))
    for size in (1, 3, 8):
        indices = rng.choice(len(ours), size=size, replace=False).tolist()
        expected = theirs.collate_fn([theirs[i] for i in indices])
        assert_same_batch(expected, collator([ours[i] for i in indices]))
    assert int(expected["loss_mask"][expected["tokens"] == EOS].sum()) == 0


def test_the_bridge_style_batch_feeds_a_dataloader(packed: dict[str, Path]) -> None:
    ours = open_dataset(packed["parquet"])
    loader = torch.utils.data.DataLoader(
        ours, batch_size=4, num_workers=2,
        collate_fn=Collator(style="megatron_bridge", max_seq_length=PACK_SIZE, eos_id=EOS))
    batches = list(loader)
    assert sum(b["tokens"].shape[0] for b in batches) == len(ours)
    assert all(b["cu_seqlens_q"].dtype == torch.int32 for b in batches)


# -- packlab reads Bridge's own packer output ----------------------------------------------------
@pytest.fixture(scope="module")
def bridge_packed(bridge: Any, spool: SpoolReader, tmp_path_factory: pytest.TempPathFactory
                  ) -> Callable[[str, int], tuple[Path, Path]]:
    """Files Bridge's offline packer writes from the spool's sequences: (data, metadata)."""
    root = tmp_path_factory.mktemp("bridge_packer")
    made: dict[tuple[str, int], tuple[Path, Path]] = {}

    def make(suffix: str, mult: int) -> tuple[Path, Path]:
        if (suffix, mult) not in made:
            def builder(path: Path, **kwargs: Any) -> TokenizedSpool:
                return TokenizedSpool(
                    spool, EOS, kwargs["dataset_kwargs"]["pad_seq_length_to_mult"])

            data, meta = root / f"train_{mult}.{suffix}", root / f"metadata_{mult}_{suffix}.json"
            bridge.offline.prepare_gpt_sft_packed_data(
                input_path=root / "train.jsonl", output_path=data, output_metadata_path=meta,
                packed_sequence_size=PACK_SIZE, tokenizer=BridgeTokenizer(EOS),
                max_seq_length=PACK_SIZE, seed=0, pad_seq_to_mult=mult,
                dataset_builder=builder)
            made[suffix, mult] = data, meta
        return made[suffix, mult]

    return make


@pytest.mark.parametrize("mult", [1, 4])
@pytest.mark.parametrize("suffix", ["npy", "parquet"])
def test_packlab_reads_bridge_packer_output_under_bridge_convention(
        suffix: str, mult: int, bridge: Any, bridge_packed, spool: SpoolReader) -> None:
    data, meta = bridge_packed(suffix, mult)
    shard = open_shard(data, pack_size=PACK_SIZE, convention="megatron_bridge")
    shard.validate()
    assert shard.packed_lengths().max() > PACK_SIZE  # Bridge's bins store more than its size
    with pytest.raises(InvariantError, match=rf"bin \d+: packed_len \d+ not in \(0, {PACK_SIZE}\]"):
        open_shard(data, pack_size=PACK_SIZE).validate()  # packlab's convention: too long
    ours = open_dataset(data, pack_size=PACK_SIZE, convention="megatron_bridge")
    theirs = bridge_split(bridge, data, pad_seq_to_mult=mult)
    assert len(ours) == len(theirs)
    assert all(same_item(theirs[i], ours[i]) for i in range(len(ours)))
    # the pack metadata packlab computes from Bridge's bins is Bridge's own file
    assert [metadata_of_bins(bins_of(ours), PACK_SIZE)] == json.loads(meta.read_text())
    # every sequence of the spool is in Bridge's bins, its loss aligned as packlab aligns it;
    # a sequence over the pack size (L - 1 > PACK_SIZE) Bridge's packer drops, or, when it
    # pads to a multiple, cuts to PACK_SIZE + 1 tokens
    found = sorted(_sequences(ours, EOS if mult > 1 else None))
    over = spool.lengths.astype(np.int64) - 1 > PACK_SIZE
    assert over.any()
    kept = np.arange(spool.num_sequences) if mult > 1 else np.flatnonzero(~over)
    assert found == sorted(_spool_sequences(spool, kept, PACK_SIZE + 1))


def _sequences(dataset: Any, pad: int | None) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tokens, aligned loss) of every sub-sequence, padding (trailing ``pad``s) stripped."""
    out = []
    for b in bins_of(dataset):
        bounds = np.append(b.seq_start_id, b.packed_len)
        for s, e in zip(bounds[:-1], bounds[1:], strict=True):
            ids, loss = b.input_ids[s:e].tolist(), b.loss_mask[s:e].tolist()
            while pad is not None and len(ids) > 1 and ids[-1] == pad == ids[-2]:
                ids, loss = ids[:-1], loss[:-1]  # padding after the sequence's own final EOS
            out.append((tuple(ids), tuple(loss)))
    return out


def _spool_sequences(spool: SpoolReader, indices: np.ndarray, limit: int
                     ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """(tokens, loss aligned per sequence) of spool sequences, cut to ``limit`` tokens."""
    out = []
    for i in indices.tolist():
        tokens, mask = (a[:limit] for a in spool.read_sequence(i))
        out.append((tuple(tokens.tolist()), tuple(mask[1:].tolist() + [0])))
    return out


def test_the_bridge_style_batch_equals_collate_fn_on_bridge_bins(bridge: Any, bridge_packed
                                                                 ) -> None:
    """Bins pre-padded by Bridge's own packer (pad_seq_to_mult=4), both padding modes."""
    data, meta = bridge_packed("parquet", 4)
    ours = open_dataset(data, pack_size=PACK_SIZE, convention="megatron_bridge")
    for fixed in (False, True):
        options = {"pad_seq_to_mult": 4, "pad_cu_seqlens": fixed, "pad_to_max_length": fixed}
        theirs = bridge_split(bridge, data, pack_metadata_path=meta, **options)
        collator = Collator(style="megatron_bridge", max_seq_length=PACK_SIZE, eos_id=EOS,
                            pack_metadata=meta, **options)
        indices = [0, 3, len(ours) - 1]
        expected = theirs.collate_fn([theirs[i] for i in indices])
        assert_same_batch(expected, collator([ours[i] for i in indices]))
        padded = expected["cu_seqlens_q_padded"]
        assert bool((torch.diff(padded, dim=1)[:, :-2] % 4 == 0).all())


def test_packlab_output_writes_the_pack_metadata_bridge_needs(packed: dict[str, Path]) -> None:
    for name, out in packed.items():
        written = read_pack_metadata(out / PACK_METADATA_FILE)
        assert written == [metadata_of_bins(bins_of(open_dataset(out)), PACK_SIZE)], name


def test_a_copy_without_metadata_is_refused_in_fixed_shape_mode(packed: dict[str, Path],
                                                                tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(packed["parquet"], copy)
    (copy / PACK_METADATA_FILE).unlink()
    collator = Collator(style="megatron_bridge", max_seq_length=PACK_SIZE, eos_id=EOS,
                        pad_cu_seqlens=True, pad_to_max_length=True,
                        pack_metadata=copy / PACK_METADATA_FILE)
    with pytest.raises(Exception, match="pack_metadata.json: unreadable pack metadata"):
        collator([open_dataset(copy)[0]])


def test_each_convention_names_what_its_pack_size_counts(packed: dict[str, Path]) -> None:
    from packlab.bins import check_bin
    from packlab.errors import PacklabError

    ids, mask, starts = np.arange(10), np.zeros(10, dtype=np.uint8), np.array([0, 4, 7])
    check_bin(ids, mask, starts, pack_size=7, convention="megatron_bridge")  # 10 - 3 = 7
    with pytest.raises(InvariantError, match=r"8 next-token positions \(10 tokens, 2 "
                                             r"sequences\) over pack_size 7"):
        check_bin(ids, mask, starts[:2], pack_size=7, convention="megatron_bridge")
    with pytest.raises(InvariantError, match=r"packed_len 10 not in \(0, 7\]"):
        check_bin(ids, mask, starts, pack_size=7)
    with pytest.raises(PacklabError, match="unknown pack-size convention 'nemo'"):
        check_bin(ids, mask, starts, pack_size=7, convention="nemo")
    shard = sorted(packed["parquet"].glob("shard_*.parquet"))[0]
    with pytest.raises(PacklabError, match="written by packlab"):
        open_shard(shard, convention="megatron_bridge")
