"""A packlab output in a Megatron-Bridge recipe: ``PacklabDatasetProvider`` through Bridge's own
``get_dataset_provider``, loader builder and samplers, against Bridge's own packed datasets.

Bridge's code is megatron-bridge 0.6.2 on its declared stack (``.venv-bridge``), run in one
process with a real gloo process group (127.0.0.1): ``get_dataset_provider`` (``data/utils.py``)
adapts the provider; ``build_train_valid_test_data_iterators`` /
``build_train_valid_test_data_loaders`` (``data/loaders.py``) build its datasets and wrap them
in Bridge's samplers (``data/samplers.py``: ``single``, ``cyclic``, ``batch``), reading Bridge's
own ``ConfigContainer`` (``TrainingConfig``, ``ValidationConfig``) and ``TrainState``. The
reference is Bridge's own GPT SFT path through the same builder: a ``GPTSFTDatasetConfig`` whose
packed data is packlab's output (Bridge opens ``GPTSFTPackedParquetDataset`` over the Parquet
shards, ``GPTSFTPackedDataset`` over the ``.npy``), so both read the same bins. One Bridge
module is a stand-in (its LoRA layers, which import Transformer Engine) and the builder's CUDA
flags are made on the CPU: ``tests/bridge/bridge_code.py`` says why.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist
from bridge_code import (
    assert_same_batch,
    cuda_flags_on_cpu,
    import_bridge,
    recipe_config,
    same_item,
)
from conftest import BUCKET, write_random_spool

from packlab.cloud import upload_layout, upload_tree
from packlab.errors import PacklabError
from packlab.formats import format_names
from packlab.interop.bridge_dataset import BridgeSFTDataset, bridge_samples_mapping
from packlab.interop.bridge_metadata import PACK_METADATA_FILE
from packlab.lab.interop_inputs import BridgeTokenizer
from packlab.lab.per_rank.launch import free_port
from packlab.sources import open_dataset

PACK = 512
EOS = 2
MBS = 2
GBS = 8
STEPS = 20  # past the first epoch (about 9 global batches)
SEED = 77
TYPES = ("single", "cyclic", "batch")
LOADER = {"num_workers": 0, "pin_memory": False, "persistent_workers": False}


@pytest.fixture(scope="module")
def bridge() -> Any:
    return import_bridge()


@pytest.fixture(scope="module")
def provider_class(bridge: Any) -> type:
    from packlab.sources.bridge_provider import PacklabDatasetProvider  # imports Bridge

    return PacklabDatasetProvider


@pytest.fixture(scope="module")
def group() -> Iterator[Any]:
    """A real one-rank gloo group on 127.0.0.1: the data-parallel group the builder asks."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One spool (vocabulary 40: EOS, id 2, is frequent inside sequences) packed by ``packlab
    pack`` into every format (shards of 16 bins), the same bins each time; ``npy`` is the
    legacy format as one file, which Bridge's ``GPTSFTPackedDataset`` reads."""
    from packlab.cli import main

    root = tmp_path_factory.mktemp("provider")
    spool = write_random_spool(root / "spool", num_sequences=230, max_len=300, vocab_size=40,
                               seed=7)
    paths = {"spool": spool.path, "root": root}
    for name in format_names():
        paths[name] = root / name
        assert main(["pack", str(spool.path), str(paths[name]), "--format", name,
                     "--pack-size", str(PACK), "--bins-per-shard", "16", "--seed", "3"]) == 0
    paths["npy"] = root / "npy"
    assert main(["pack", str(spool.path), str(paths["npy"]), "--format", "legacy_npy_pickle",
                 "--pack-size", str(PACK), "--seed", "3"]) == 0
    return paths


def npy_file(out: dict[str, Path]) -> Path:
    (file,) = sorted(out["npy"].glob("shard_*.npy"))
    return file


def bridge_config(bridge: Any, out: dict[str, Path], reference: str, *,
                  valid: Path | None = None, **settings: Any) -> Any:
    """Bridge's own GPT SFT config over packlab's packed files (its recipes' path)."""
    data = out["parquet"] if reference == "parquet" else npy_file(out)
    folder = data if data.is_dir() else data.parent
    specs = bridge.config.PackedSequenceSpecs(
        packed_sequence_size=PACK, packed_train_data_path=str(data),
        packed_val_data_path=None if valid is None else str(valid),
        packed_metadata_path=str(folder / PACK_METADATA_FILE),
        pad_cu_seqlens=settings.pop("pad_cu_seqlens", False))
    kwargs = {k: settings.pop(k) for k in ("pad_to_max_length",) if k in settings}
    return bridge.builders.GPTSFTDatasetConfig(
        seq_length=PACK, dataset_root=str(out["root"]), enable_offline_packing=True,
        offline_packing_specs=specs, do_validation=valid is not None, do_test=False,
        seed=SEED, dataset_kwargs=kwargs, **LOADER, **settings)


def iterators(bridge: Any, group: Any, dataset_config: Any, *, consumed: int = 0,
              train_iters: int = STEPS, eval_iters: int = 0) -> tuple[Any, Any, Any]:
    """Bridge's train/valid/test iterators for ``dataset_config`` as its training setup builds
    them: ``get_dataset_provider``, the provider bound to the tokenizer (as ``setup`` binds it),
    ``build_train_valid_test_data_iterators`` (the loaders and their samplers) resumed from
    ``consumed`` training samples."""
    training = bridge.training
    cfg = recipe_config(
        bridge, train=training.TrainingConfig(micro_batch_size=MBS, global_batch_size=GBS,
                                              train_iters=train_iters),
        validation=training.ValidationConfig(eval_interval=4 if eval_iters else None,
                                             eval_iters=eval_iters), dataset=dataset_config)
    dataset_config.finalize()
    build = partial(bridge.utils.get_dataset_provider(dataset_config), tokenizer=BridgeTokenizer(EOS))
    with cuda_flags_on_cpu():
        return bridge.loaders.build_train_valid_test_data_iterators(
            cfg, bridge.state.TrainState(consumed_train_samples=consumed), build, group)


def take(iterator: Any, count: int) -> list[dict[str, Any]]:
    """Up to ``count`` batches (a ``single`` loader ends after one pass)."""
    batches = []
    for _ in range(count):
        try:
            batches.append(next(iterator))
        except StopIteration:
            break
    return batches


def per_step(dataloader_type: str) -> int:
    """Batches a training step takes from the iterator: one global batch per rank from
    ``batch``, its micro-batches from the others."""
    return 1 if dataloader_type == "batch" else GBS // MBS


def assert_same_batches(theirs: list[dict[str, Any]], ours: list[dict[str, Any]]) -> None:
    assert len(theirs) == len(ours) > 0
    for a, b in zip(theirs, ours, strict=True):
        assert_same_batch(a, b)


# -- the contract ------------------------------------------------------------------------------
def test_get_dataset_provider_adapts_the_provider(bridge: Any, provider_class: type,
                                                  out: dict[str, Path]) -> None:
    provider = provider_class(path=str(out["binidx"]), seq_length=PACK)
    assert isinstance(provider, bridge.base.DatasetProvider)
    build = bridge.utils.get_dataset_provider(provider)
    assert build.__name__ == "protocol_adapter"  # Bridge's adapter, not one of its builders
    train, valid, test = build([100, 0, 0], provider, tokenizer=BridgeTokenizer(EOS))
    assert valid is None and test is None
    ours = open_dataset(out["binidx"])
    assert isinstance(train, BridgeSFTDataset) and len(train) == len(ours)
    assert all(same_item(train[i], ours[i]) for i in range(len(ours)))
    assert callable(train.collate_fn)


@pytest.mark.parametrize("reference", ["parquet", "npy"])
@pytest.mark.parametrize("samples", [13, 70, 150])
def test_the_samples_mapping_is_bridges(bridge: Any, out: dict[str, Path], reference: str,
                                        samples: int) -> None:
    """Bridge's packed datasets map ``max_num_samples`` through NumPy's seeded global
    generator; packlab draws the same permutations and leaves the global generator alone."""
    data = out["parquet"] if reference == "parquet" else npy_file(out)
    theirs = bridge.builders.build_gpt_sft_split(
        str(data), tokenizer=BridgeTokenizer(EOS), seq_length=PACK, memmap_workers=1, seed=SEED,
        packed_sequence_size=PACK, pack_metadata_path=data.parent / PACK_METADATA_FILE,
        dataset_kwargs={"max_num_samples": samples})
    state = np.random.get_state()[1].copy()
    ours = bridge_samples_mapping(len(open_dataset(out["parquet"])), samples, SEED)
    assert np.array_equal(np.random.get_state()[1], state)
    assert ours.tolist() == np.asarray(theirs.samples_mapping).tolist()
    assert len(theirs) == samples


# -- every dataloader type, against Bridge's own datasets ----------------------------------------
@pytest.mark.parametrize("reference", ["parquet", "npy"])
@pytest.mark.parametrize("dataloader_type", TYPES)
def test_batches_and_resume_equal_bridges_own(bridge: Any, provider_class: type, group: Any,
                                              out: dict[str, Path], dataloader_type: str,
                                              reference: str) -> None:
    """The same batches as Bridge's own packed dataset over the same bins, through the same
    builder and sampler, ``max_train_samples`` past one epoch; then resumed after 3 and 11
    steps (consumed samples), each continuing exactly where the whole run was."""
    settings = {"dataloader_type": dataloader_type, "max_train_samples": 150}
    path = out["parquet"] if reference == "parquet" else out["npy"]

    def ours(consumed: int = 0) -> Any:
        provider = provider_class(path=str(path), seq_length=PACK, seed=SEED, **LOADER,
                                  **settings)
        return iterators(bridge, group, provider, consumed=consumed)[0]

    def theirs(consumed: int = 0) -> Any:
        return iterators(bridge, group, bridge_config(bridge, out, reference, **settings),
                         consumed=consumed)[0]

    count = STEPS * per_step(dataloader_type)
    whole = take(theirs(), count)
    assert len(whole) == (150 // MBS if dataloader_type == "single" else count)
    assert_same_batches(whole, take(ours(), count))
    for steps in (3, 11):
        skip = steps * per_step(dataloader_type)
        resumed = take(ours(steps * GBS), count - skip)
        assert_same_batches(whole[skip:], resumed)
        assert_same_batches(take(theirs(steps * GBS), count - skip), resumed)


@pytest.mark.parametrize("name", format_names())
def test_every_format_trains_as_bridges_parquet(bridge: Any, provider_class: type, group: Any,
                                                out: dict[str, Path], name: str) -> None:
    """The provider over each format's output (the same bins) gives the batches of Bridge's
    ``GPTSFTPackedParquetDataset``: fixed-shape batches (``pad_cu_seqlens``, the pack metadata
    ``packlab pack`` wrote) read by two DataLoader workers."""
    settings = {"dataloader_type": "batch", "pad_cu_seqlens": True, "pad_to_max_length": True}
    metadata = str(out[name] / PACK_METADATA_FILE)
    workers = {**LOADER, "num_workers": 2}
    provider = provider_class(path=str(out[name]), seq_length=PACK, seed=SEED,
                              pack_metadata=metadata, **workers, **settings)
    reference = bridge_config(bridge, out, "parquet", **settings)
    count = 12
    theirs = take(iterators(bridge, group, reference)[0], count)
    assert_same_batches(theirs, take(iterators(bridge, group, provider)[0], count))
    assert theirs[0]["max_seqlen_q"].shape == (GBS,)


# -- padding samples: dataloader_type="batch", drop_last=False ------------------------------------
def test_negative_indices_are_bridges_padding_samples(bridge: Any, provider_class: type,
                                                      out: dict[str, Path]) -> None:
    """Bridge's ``batch`` sampler with ``drop_last=False`` pads the last global batch with -1;
    over two data-parallel ranks, from the start and resumed inside the padded epoch, the
    provider's dataset gives Bridge's own batches, padding rows training nothing."""
    provider = provider_class(path=str(out["memmap_v1"]), seq_length=PACK, seed=SEED)
    (ours, _, _) = provider.build_datasets(bridge.base.DatasetBuildContext(0, 0, 0,
                                                                           BridgeTokenizer(EOS)))
    theirs = bridge.builders.build_gpt_sft_split(
        str(out["parquet"]), tokenizer=BridgeTokenizer(EOS), seq_length=PACK, memmap_workers=1,
        seed=SEED, packed_sequence_size=PACK, pad_seq_to_mult=1)
    assert len(ours) == len(theirs) and len(ours) % GBS != 0
    padded = 0
    for consumed in (0, (len(ours) // GBS) * GBS):
        for rank in range(2):
            loaders = [bridge.samplers.build_pretraining_data_loader(
                dataset, consumed, "batch", MBS, 0, True, collate_fn=dataset.collate_fn,
                pin_memory=False, data_parallel_rank=rank, data_parallel_size=2,
                drop_last=False, global_batch_size=GBS, seed=SEED) for dataset in (theirs, ours)]
            batches = [list(loader) for loader in loaders]
            assert_same_batches(*batches)
            sampler = loaders[1].batch_sampler
            sampler.consumed_samples = consumed  # the loader above advanced it
            last = list(sampler)[-1]
            rows = [i for i, index in enumerate(last) if index < 0]
            assert rows and int(batches[1][-1]["loss_mask"][rows].sum()) == 0
            padded += len(rows)
    assert padded > 0
    assert same_item(theirs[-1], ours[-1]) and not np.asarray(ours[-1]["loss_mask"]).any()


def test_the_builder_keeps_negative_indices_for_its_own_sft_config(
        bridge: Any, provider_class: type, group: Any, out: dict[str, Path]) -> None:
    """Bridge 0.6.2's builder pads incomplete global batches only for its ``GPTSFTDatasetConfig``
    and refuses ``drop_last=False`` for any other provider unless the training length is whole
    global batches: ``max_train_samples="recipe"`` (``train_iters * global_batch_size``) is."""
    settings = {"dataloader_type": "batch", "drop_last": False}
    provider = provider_class(path=str(out["arrow_ipc"]), seq_length=PACK, seed=SEED, **LOADER,
                              **settings)
    with pytest.raises(ValueError, match="requires GPTSFTDatasetConfig because incomplete"):
        iterators(bridge, group, provider)
    whole = provider_class(path=str(out["arrow_ipc"]), seq_length=PACK, seed=SEED,
                           max_train_samples="recipe", **LOADER, **settings)
    ours = take(iterators(bridge, group, whole)[0], STEPS)
    theirs = take(iterators(bridge, group, bridge_config(
        bridge, out, "parquet", max_train_samples=STEPS * GBS, **settings))[0], STEPS)
    assert_same_batches(theirs, ours)


# -- a layout's splits, object storage ---------------------------------------------------------
@pytest.fixture(scope="module")
def layout(out: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from packlab.cli import main

    root = tmp_path_factory.mktemp("layout") / "layout"
    assert main(["pack", str(out["spool"]), str(root), "--format", "parquet", "--pack-size",
                 str(PACK), "--split", "train=0.8,valid=0.2", "--seed", "3"]) == 0
    return root


@pytest.mark.parametrize("dataloader_type", TYPES)
def test_a_layout_gives_its_splits(bridge: Any, provider_class: type, group: Any,
                                   out: dict[str, Path], layout: Path,
                                   dataloader_type: str) -> None:
    """An output layout: train and validation from its splits (no test split: ``None``), the
    validation iterator equal to Bridge's own over ``splits/valid``."""
    provider = provider_class(path=str(layout), seq_length=PACK, seed=SEED, **LOADER,
                              dataloader_type=dataloader_type)
    train, valid, test = provider.build_datasets(
        bridge.base.DatasetBuildContext(0, 0, 0, BridgeTokenizer(EOS)))
    assert test is None
    for dataset, split in ((train, "train"), (valid, "valid")):
        expected = open_dataset(layout, split=split)
        assert len(dataset) == len(expected)
        assert all(same_item(dataset[i], expected[i]) for i in range(len(expected)))
    layout_out = {**out, "parquet": layout / "splits" / "train"}
    reference = bridge_config(bridge, layout_out, "parquet", valid=layout / "splits" / "valid",
                              dataloader_type=dataloader_type)
    theirs = iterators(bridge, group, reference, eval_iters=2)
    ours = iterators(bridge, group, provider, eval_iters=2)
    for a, b in zip(theirs[:2], ours[:2], strict=True):
        assert_same_batches(take(a, 6), take(b, 6))
    assert theirs[2] is None and ours[2] is None


def test_object_storage_trains_as_local(bridge: Any, provider_class: type, out: dict[str, Path],
                                        layout: Path, server: Any, tmp_path: Path) -> None:
    """The same provider over ``s3://`` (Parquet read in place, binidx downloaded and verified,
    a layout through its ``blend.json``) serves the local output's items and batches."""
    upload_tree(out["parquet"], f"s3://{BUCKET}/bridge/parquet")
    upload_tree(out["binidx"], f"s3://{BUCKET}/bridge/binidx")
    upload_layout(layout, f"s3://{BUCKET}/bridge/layout")
    context = bridge.base.DatasetBuildContext(0, 0, 0, BridgeTokenizer(EOS))
    for name, local in (("parquet", out["parquet"]), ("binidx", out["binidx"]),
                        ("layout", layout)):
        remote = provider_class(path=f"s3://{BUCKET}/bridge/{name}", seq_length=PACK,
                                cache_dir=str(tmp_path / "cache"), max_train_samples=50)
        here = provider_class(path=str(local), seq_length=PACK, max_train_samples=50)
        pairs = zip(remote.build_datasets(context), here.build_datasets(context), strict=True)
        for theirs, ours in pairs:
            assert (theirs is None) == (ours is None)
            if ours is None:
                continue
            assert len(theirs) == len(ours)
            indices = [0, len(ours) - 1, -1, 7]
            assert_same_batch(theirs.collate_fn(theirs.__getitems__(indices)),
                              ours.collate_fn([ours[i] for i in indices]))
            assert all(same_item(theirs[i], ours[i]) for i in range(len(ours)))


# -- what it refuses -------------------------------------------------------------------------
def test_bad_settings_are_one_clear_line(bridge: Any, provider_class: type,
                                         out: dict[str, Path], layout: Path) -> None:
    context = bridge.base.DatasetBuildContext(10, 0, 0, BridgeTokenizer(EOS))
    cases = [
        ({"path": str(out["pbin"]), "seq_length": PACK - 2},
         r"pbin: bins of up to 512 tokens \(511 positions\) do not fit seq_length 510"),
        ({"path": str(layout), "seq_length": PACK, "splits": ("training", "valid", "test")},
         r"layout: no training split 'training' \(splits here: train, valid\)"),
        ({"path": str(layout), "seq_length": PACK, "splits": ("train", "validation", "test")},
         r"layout: no split 'validation', and its split 'valid' is read by none of train, "
         "validation, test"),
        ({"path": str(layout), "seq_length": PACK, "valid_path": str(out["parquet"])},
         "valid_path and test_path are for a path without splits"),
        ({"path": str(out["parquet"]), "seq_length": PACK, "pad_cu_seqlens": True,
          "pad_to_max_length": True}, "pad_cu_seqlens needs pad_to_max_length=True and "
                                      "pack_metadata="),
        ({"path": str(out["parquet"]), "seq_length": PACK, "max_train_samples": 0},
         "max_train_samples must be None, 'recipe' or a number >= 1, got 0"),
        ({"path": str(out["root"] / "missing"), "seq_length": PACK}, "missing"),
    ]
    for fields, message in cases:
        with pytest.raises(PacklabError, match=message) as caught:
            provider_class(**fields).build_datasets(context)
        assert "\n" not in str(caught.value)
    no_eos = bridge.base.DatasetBuildContext(10, 0, 0, None)
    with pytest.raises(PacklabError, match="no eos_id"):
        provider_class(path=str(out["parquet"]), seq_length=PACK).build_datasets(no_eos)
    ours = provider_class(path=str(out["parquet"]), seq_length=PACK).build_datasets(context)[0]
    with pytest.raises(IndexError, match=rf"sample {len(ours)} out of range"):
        ours[len(ours)]
    with pytest.raises(IndexError, match=rf"sample {-len(ours) - 1} out of range"):
        ours[-len(ours) - 1]


def test_finalize_is_bridges_then_the_providers(provider_class: type,
                                               out: dict[str, Path]) -> None:
    """Bridge's config validation calls ``finalize``: its loader settings are settled (no
    persistent workers without workers), then the provider's own are checked."""
    provider = provider_class(path=str(out["parquet"]), seq_length=PACK, num_workers=0)
    provider.finalize()
    assert (provider.dataloader_type, provider.persistent_workers) == ("batch", False)
    with pytest.raises(PacklabError, match="max_train_samples must be None"):
        provider_class(path=str(out["parquet"]), seq_length=PACK,
                       max_train_samples="all").finalize()
