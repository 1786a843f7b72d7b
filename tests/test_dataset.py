"""open_dataset over shards of every format; pickling; DataLoader workers; samplers."""

from __future__ import annotations

import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import Child, write_random_spool

from packlab import open_dataset
from packlab.bins import bin_digest
from packlab.errors import FormatError, PacklabError, PacklabWarning
from packlab.formats import format_names
from packlab.loading.collate import Collator
from packlab.loading.dataset import PackedDataset
from packlab.loading.discovery import find_shards
from packlab.loading.samplers import (
    BlockShuffleSampler,
    ShuffleSampler,
    dataset_blocks,
    recommended_sampler,
)
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import iter_bins
from packlab.pipeline.shards import write_shards
from packlab.spool import SpoolReader

FORMATS = format_names()
BINS_PER_SHARD = 9


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[SpoolReader, BinAssignment, list[str]]:
    """One spool and assignment (about 40 bins), and the content hash of every bin."""
    root = tmp_path_factory.mktemp("dataset")
    spool = write_random_spool(root / "spool", num_sequences=160, max_len=300, seed=11)
    assignment, _ = pack(spool.lengths, 512, algorithm="next_fit")
    digests = [bin_digest(*b) for b in iter_bins(spool, assignment)]
    assert len(set(digests)) == len(digests)
    return spool, assignment, digests


@pytest.fixture(scope="module")
def shard_dirs(packed, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    spool, assignment, _ = packed
    root = tmp_path_factory.mktemp("shards")
    for name in FORMATS:
        write_shards(spool, assignment, root / name, format=name,
                     bins_per_shard=BINS_PER_SHARD, workers=1)
    return {name: root / name for name in FORMATS}


def digests_of(dataset: PackedDataset, indices=None) -> list[str]:
    indices = range(len(dataset)) if indices is None else indices
    out = []
    for i in indices:
        item = dataset[i]
        out.append(bin_digest(item["input_ids"], item["loss_mask"], item["seq_boundaries"][:-1]))
    return out


@pytest.mark.parametrize("name", FORMATS)
def test_directory_of_shards_reads_every_bin_in_order(name, packed, shard_dirs) -> None:
    _, assignment, digests = packed
    ds = open_dataset(shard_dirs[name])
    assert len(ds.shards) == -(-assignment.num_bins // BINS_PER_SHARD) > 1
    assert len(ds) == assignment.num_bins
    assert digests_of(ds) == digests
    item = ds[-1]
    assert item["seq_boundaries"][-1] == item["input_ids"].shape[0] == item["loss_mask"].shape[0]
    assert item["seq_boundaries"].dtype == np.int32 and item["seq_boundaries"][0] == 0
    with pytest.raises(IndexError):
        ds[len(ds)]


@pytest.mark.parametrize("name", FORMATS)
def test_getitems_groups_by_shard_and_keeps_the_order_asked(name, packed, shard_dirs) -> None:
    _, _, digests = packed
    ds = open_dataset(shard_dirs[name])
    order = np.random.default_rng(0).permutation(len(ds))[:25].tolist() + [0, 0, -1]
    items = ds.__getitems__(order)
    got = [bin_digest(i["input_ids"], i["loss_mask"], i["seq_boundaries"][:-1]) for i in items]
    assert got == [digests[i] for i in order]
    # a list of ints, numpy indices and a bool: the same bins whichever way the batch goes
    for batch in ([3, len(ds) - 1], np.array([3, len(ds) - 1]), [np.int64(3), -1], [True, 3]):
        items = ds.__getitems__(batch)
        got = [bin_digest(i["input_ids"], i["loss_mask"], i["seq_boundaries"][:-1])
               for i in items]
        assert got == [digests[int(i)] for i in batch]
    with pytest.raises(IndexError, match=f"bin {len(ds)} out of range \\[0, {len(ds)}\\)"):
        ds.__getitems__([0, len(ds)])


def test_shard_glob_list_and_format_are_all_accepted(packed, shard_dirs) -> None:
    _, _, digests = packed
    name = "parquet" if "parquet" in FORMATS else FORMATS[0]
    directory = shard_dirs[name]
    shards = [p for p, _ in find_shards(directory)]
    one = open_dataset(shards[1])
    assert digests_of(one) == digests[BINS_PER_SHARD : 2 * BINS_PER_SHARD]
    pattern = str(directory / "shard_00000[02]*")
    globbed = open_dataset(pattern)
    assert [p.name for p in globbed.shards] == [shards[0].name, shards[2].name]
    assert digests_of(globbed) == digests[:BINS_PER_SHARD] + digests[2 * BINS_PER_SHARD:
                                                                      3 * BINS_PER_SHARD]
    listed = open_dataset([shards[2], shards[0]], format=name)
    assert digests_of(listed)[:BINS_PER_SHARD] == digests[2 * BINS_PER_SHARD:3 * BINS_PER_SHARD]
    mixed = open_dataset([shard_dirs[f] for f in FORMATS])
    assert len(mixed) == len(digests) * len(FORMATS)
    assert digests_of(mixed, range(len(digests), 2 * len(digests))) == digests


def test_format_given_must_match_what_is_on_disk(shard_dirs) -> None:
    first, other = FORMATS[0], FORMATS[-1]
    with pytest.raises(FormatError, match=f"a {first} shard, not {other}"):
        open_dataset(shard_dirs[first], format=other)
    with pytest.raises(PacklabError, match="unknown format"):
        open_dataset(shard_dirs[first], format="nope")
    assert len(open_dataset(shard_dirs[first], format=first)) > 0


def test_hidden_temporaries_and_receipts_are_ignored_strays_are_said(packed, shard_dirs,
                                                                     tmp_path) -> None:
    _, _, digests = packed
    name = FORMATS[0]
    copy = tmp_path / "copy"
    copy.mkdir()
    for p in shard_dirs[name].iterdir():
        (copy / p.name).symlink_to(p)
    (copy / ".shard_000099.tmp-123-abc").write_bytes(b"half written")
    (copy / "blend.json").write_text("{}")
    assert digests_of(open_dataset(copy)) == digests
    (copy / "notes.bin").write_bytes(b"\x00" * 100)  # not the record's: one warning line
    with pytest.warns(PacklabWarning, match="notes.bin not listed in its dataset.json"):
        assert digests_of(open_dataset(copy)) == digests


def test_splits_resolve_and_unknown_split_lists_the_known(packed, shard_dirs, tmp_path) -> None:
    _, _, digests = packed
    name = FORMATS[0]
    root = tmp_path / "out"
    (root / "splits" / "train").mkdir(parents=True)
    (root / "splits" / "valid").mkdir()
    shards = find_shards(shard_dirs[name])
    for p, _ in shards:
        (root / "splits" / "train" / p.name).symlink_to(p)
    (root / "splits" / "valid" / shards[0][0].name).symlink_to(shards[0][0])
    assert digests_of(open_dataset(root, split="train")) == digests
    assert len(open_dataset(root, split="valid")) == BINS_PER_SHARD
    with pytest.raises(FormatError, match="no split 'test'; splits here: train, valid"):
        open_dataset(root, split="test")
    with pytest.raises(FormatError, match="no splits/ folder"):
        open_dataset(shard_dirs[name], split="train")


def test_missing_and_empty_inputs_are_clear_errors(tmp_path) -> None:
    with pytest.raises(FormatError, match="no such file"):
        open_dataset(tmp_path / "nope")
    with pytest.raises(FormatError, match="matches nothing"):
        open_dataset(str(tmp_path / "*.parquet"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="no shards"):
        open_dataset(tmp_path / "empty")
    with pytest.raises(PacklabError, match="no shards"):
        open_dataset([])


@pytest.mark.parametrize("name", FORMATS)
def test_pickling_drops_open_readers_and_reopens_lazily(name, packed, shard_dirs) -> None:
    _, _, digests = packed
    ds = open_dataset(shard_dirs[name])
    assert ds[3] is not None and ds._readers is not None
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000  # paths and counts, not data
    clone = pickle.loads(blob)
    assert clone._readers is None
    assert digests_of(clone, [3, len(clone) - 1]) == [digests[3], digests[-1]]


def _digests_collate(items):
    return [bin_digest(i["input_ids"], i["loss_mask"], i["seq_boundaries"][:-1]) for i in items]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize("name", FORMATS)
def test_dataloader_with_persistent_workers_yields_every_bin_once_per_epoch(
        name, packed, shard_dirs) -> None:
    import torch.utils.data as torch_data

    _, _, digests = packed
    ds = open_dataset(shard_dirs[name])
    sampler = ShuffleSampler(ds, seed=3)
    loader = torch_data.DataLoader(ds, batch_size=4, sampler=sampler, num_workers=4,
                                   persistent_workers=True, collate_fn=_digests_collate)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = [d for batch in loader for d in batch]
        assert Counter(seen) == Counter(digests)
        epochs.append(seen)
    assert epochs[0] != epochs[1]  # a new order each epoch


def test_dataloader_with_the_thd_collate(packed, shard_dirs) -> None:
    import torch

    _, assignment, _ = packed
    ds = open_dataset(shard_dirs[FORMATS[0]])
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=2,
                                         collate_fn=Collator(return_tensors="pt",
                                                             pad_seq_to_mult=8))
    total = 0
    for batch in loader:
        assert batch["cu_seqlens"].dtype == torch.int32
        assert batch["tokens"].shape == batch["labels"].shape == batch["position_ids"].shape
        assert batch["tokens"].shape[1] % 8 == 0
        total += int(batch["token_count"].sum())
    seqs = int(assignment.seq_indices.shape[0])
    assert total == ds.num_tokens - seqs  # every sub-sequence gives up its last token


# -- samplers ---------------------------------------------------------------------------------
@pytest.mark.parametrize("make", [
    lambda n, seed: ShuffleSampler(n, seed=seed),
    lambda n, seed: BlockShuffleSampler(n, block_size=7, window=3, seed=seed),
], ids=["uniform", "block"])
def test_samplers_cover_every_index_once_deterministically(make) -> None:
    n = 101
    a, b, other = make(n, 5), make(n, 5), make(n, 6)
    orders = []
    for epoch in range(3):
        for s in (a, b, other):
            s.set_epoch(epoch)
        got = list(a)
        assert len(a) == n and sorted(got) == list(range(n))
        assert got == list(b)
        assert got != list(other)
        orders.append(got)
    assert orders[0] != orders[1] != orders[2]
    assert orders[0] != list(range(n))


def test_block_shuffle_stays_inside_its_window_of_blocks() -> None:
    bounds = np.array([0, 5, 12, 13, 30, 41, 50])  # uneven blocks, like row groups
    sampler = BlockShuffleSampler(50, boundaries=bounds, window=2, seed=1)
    order = np.array(list(sampler))
    block_of = np.searchsorted(bounds, order, side="right") - 1
    blocks = sampler.block_order()
    pos = 0
    for w in range(0, len(blocks), 2):
        members = blocks[w : w + 2]
        size = int(sum(bounds[m + 1] - bounds[m] for m in members))
        assert set(block_of[pos : pos + size].tolist()) == set(members.tolist())
        pos += size
    assert pos == 50


def test_block_shuffle_decodes_each_parquet_row_group_once_per_epoch(packed, tmp_path) -> None:
    assert "parquet" in FORMATS  # a registered format: its absence is a failure, not a skip
    spool, assignment, digests = packed
    out = tmp_path / "pq"
    write_shards(spool, assignment, out, format="parquet", bins_per_shard=30, workers=1,
                 row_group_size=4)
    window = 3
    ds = open_dataset(out, cache_row_groups=window)
    bounds = dataset_blocks(ds)
    num_groups = sum(r.num_row_groups for r in ds.readers())
    assert bounds.shape[0] - 1 == num_groups > 6
    block = BlockShuffleSampler(ds, boundaries=bounds, window=window, seed=2)
    seen = digests_of(ds, list(block))
    assert Counter(seen) == Counter(digests)
    misses = sum(r.cache_stats()["misses"] for r in ds.readers())
    assert misses == num_groups  # every row group decoded exactly once
    uniform = open_dataset(out, cache_row_groups=window)
    digests_of(uniform, list(ShuffleSampler(uniform, seed=2)))
    assert sum(r.cache_stats()["misses"] for r in uniform.readers()) > 1.5 * num_groups


def test_the_recommended_sampler_is_one_call_from_the_dataset(packed, shard_dirs,
                                                              tmp_path) -> None:
    """``recommended_sampler(dataset)``: over Parquet, a block shuffle over its own row groups
    (``BlockShuffleSampler(dataset)`` gives the same), decoding each row group once an epoch;
    over a format whose every bin costs the same, a uniform shuffle; never a format's name."""
    spool, assignment, digests = packed
    out = tmp_path / "pq"
    write_shards(spool, assignment, out, format="parquet", bins_per_shard=30, workers=1,
                 row_group_size=4)
    ds = open_dataset(out, cache_row_groups=3)
    sampler = recommended_sampler(ds, seed=2)
    assert isinstance(sampler, BlockShuffleSampler) and len(sampler) == len(ds)
    assert sampler.boundaries.tolist() == dataset_blocks(ds).tolist()
    assert list(BlockShuffleSampler(ds, seed=2)) == list(sampler)
    groups = sum(r.num_row_groups for r in ds.readers())
    for epoch in range(2):
        sampler.set_epoch(epoch)
        assert Counter(digests_of(ds, list(sampler))) == Counter(digests)
        misses = sum(r.cache_stats()["misses"] for r in ds.readers())
        assert misses <= (epoch + 1) * groups  # each row group decoded at most once an epoch
    assert misses > groups  # the second epoch decoded again, in another order
    in_order = recommended_sampler(ds, shuffle=False)
    assert list(in_order) == list(range(len(ds)))
    for name in FORMATS:
        if name != "parquet":
            other = open_dataset(shard_dirs[name])
            uniform = recommended_sampler(other, seed=2)
            assert type(uniform) is ShuffleSampler and sorted(uniform) == list(range(len(other)))


def test_sampler_argument_errors() -> None:
    with pytest.raises(PacklabError, match="a count of items has no blocks of its own"):
        BlockShuffleSampler(10)
    with pytest.raises(PacklabError, match="not both"):
        BlockShuffleSampler(10, block_size=2, boundaries=[0, 10])
    with pytest.raises(PacklabError, match="from 0 to 10"):
        BlockShuffleSampler(10, boundaries=[0, 5, 9])
    with pytest.raises(PacklabError, match="window"):
        BlockShuffleSampler(10, block_size=2, window=0)


@pytest.mark.parametrize("verify", [False, True])
@pytest.mark.parametrize("name", FORMATS)
def test_one_shard_serves_every_kind_of_index_through_its_fast_read(name, verify, packed,
                                                                    shard_dirs) -> None:
    # one shard: dataset[i] is its table's closure (formats whose bins are views), chosen on
    # the first read; negative, numpy and wrong indices go the general way; closing, pickling
    # and a fork each drop the choice, and the reads after are the same bins
    _, _, digests = packed
    shard = find_shards(shard_dirs[name])[1][0]
    want = digests[BINS_PER_SHARD:2 * BINS_PER_SHARD]
    ds = open_dataset(shard, verify=verify)  # packlab wrote it: every format can verify it
    n = len(ds)
    assert digests_of(ds) == want
    assert digests_of(ds, [-1, -n, np.int64(2), np.uint8(n - 1)]) == [want[-1], want[0], want[2],
                                                                       want[-1]]
    for wrong in (n, -n - 1, 10**30):
        with pytest.raises(IndexError, match=f"out of range \\[0, {n}\\)"):
            ds[wrong]
    for wrong in (True, 1.0, "1", None):
        with pytest.raises(TypeError, match="bin index must be an integer"):
            ds[wrong]
    ds.close()
    assert digests_of(ds, [4, 0]) == [want[4], want[0]]
    clone = pickle.loads(pickle.dumps(ds))
    assert digests_of(clone, [n - 1, 1]) == [want[-1], want[1]]
    assert Child(_fresh_then_read, ds, [3, 0]).result() == (True, [want[3], want[0]])
    assert digests_of(ds, [3]) == [want[3]]  # the parent's reads go on
    ds.close()


@pytest.mark.parametrize("name", FORMATS)
def test_many_shards_make_each_table_read_once_per_process(name, packed, shard_dirs) -> None:
    # dataset[i] over several shards calls each shard's read closure, made on the first read
    # (not one per read); numpy and negative indices go through the same ones
    _, _, digests = packed
    ds = open_dataset(shard_dirs[name])
    assert digests_of(ds, [0, len(ds) - 1]) == [digests[0], digests[-1]]
    reads = ds._reads
    assert reads is not None and len(reads) == len(ds.shards) > 1
    assert digests_of(ds, [np.int64(BINS_PER_SHARD), -1, 5]) == [digests[BINS_PER_SHARD],
                                                                 digests[-1], digests[5]]
    assert ds._reads is reads and all(a is b for a, b in zip(ds._reads, reads, strict=True))
    ds.close()
    assert ds._reads is None and digests_of(ds, [3]) == [digests[3]]


def _fresh_then_read(dataset: PackedDataset, indices: list[int]) -> tuple[bool, list[str]]:
    """In a forked child: whether the dataset starts over (its first read opens its own
    readers and maps its own files), and the bins it then reads."""
    return dataset._readers is None and dataset._reads is None, digests_of(dataset, indices)
