"""Per-rank loading in one process: plan, atomic chunks, waiting, the rank-local fix,
completion markers and eviction, Megatron's index distribution, and seed 003's design measured.

The same protocol across real processes (torch.distributed) is in test_distributed.py.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool
from hypothesis import given, settings
from hypothesis import strategies as st

from packlab.bins import bin_digest
from packlab.errors import FormatError, InvariantError, PacklabError
from packlab.lab.measure.per_rank import chunks_touched, sweep_chunk_sizes
from packlab.lab.per_rank.coverage import coverage, epoch_table, fixed_epoch, seed_epoch
from packlab.lab.per_rank.megatron_sampler import (
    MegatronPretrainingRandomSampler,
    MegatronPretrainingSampler,
    pretraining_batches,
    random_batches,
)
from packlab.lab.per_rank.seed_design import NOT_SERVED, SeedLazyShardedDataset, served_ids
from packlab.loading.per_rank import (
    ChunkPlan,
    ChunkProducer,
    RankLocalSampler,
    RankShardedDataset,
    read_plan,
    spool_source,
    wait_for_chunk,
    write_chunk,
)
from packlab.loading.per_rank.plan import chunk_path, marker_path, write_plan
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.storage.files import is_temporary

PACK = 512
SPC = 7  # samples per chunk (the bins of the spool below make 6-7 chunks)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory):
    """A spool packed into ~45 bins, the bin source, and every bin's content hash."""
    root = tmp_path_factory.mktemp("sharded")
    spool = write_random_spool(root / "spool", num_sequences=150, max_len=300, seed=5)
    assignment, _ = pack(spool.lengths, PACK, algorithm="next_fit")
    digests = [bin_digest(*b) for b in iter_bins(spool, assignment)]
    assert len(set(digests)) == len(digests)
    return spool_source(spool, assignment), assignment.num_bins, digests


@pytest.fixture(scope="module", params=["jsonl", "parquet"])
def chunks(request, source, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ChunkPlan]:
    bins, num_bins, _ = source
    directory = tmp_path_factory.mktemp(f"chunks_{request.param}")
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format=request.param,
                         pack_size=PACK)
    ChunkProducer(directory, plan).produce(bins)
    return directory, plan


def digest(item: dict) -> str:
    return bin_digest(item["input_ids"], item["loss_mask"], item["seq_boundaries"][:-1])


# -- plan -------------------------------------------------------------------------------------
def test_plan_cuts_samples_into_chunks_and_ranks_own_them_by_modulo(tmp_path: Path) -> None:
    plan = ChunkPlan(num_samples=23, samples_per_chunk=5, format="jsonl")
    assert plan.num_chunks == 5
    assert plan.chunk_sizes().tolist() == [5, 5, 5, 5, 3]
    assert plan.chunk_range(4) == (20, 23)
    assert plan.rank_chunks(1, 2).tolist() == [1, 3]
    assert plan.rank_sizes(2).tolist() == [13, 10]
    assert plan.rank_sizes(3).sum() == 23
    write_plan(tmp_path, plan)
    assert read_plan(tmp_path) == plan
    with pytest.raises(PacklabError, match="already exists"):
        write_plan(tmp_path, plan)
    (tmp_path / "chunks.json").write_text("{not json")
    with pytest.raises(FormatError, match="chunks.json"):
        read_plan(tmp_path)
    with pytest.raises(PacklabError, match="chunk format"):
        ChunkPlan(num_samples=3, samples_per_chunk=1, format="csv")
    with pytest.raises(PacklabError, match="rank 2 out of range"):
        plan.rank_chunks(2, 2)


# -- chunks -------------------------------------------------------------------------------------
def test_chunks_hold_exactly_their_bins_and_leave_no_temporary(chunks, source) -> None:
    directory, plan = chunks
    _, _, digests = source
    assert not [p for p in directory.iterdir() if is_temporary(p)]
    dataset = RankShardedDataset(directory, rank=0, world_size=1)
    assert len(dataset) == plan.num_samples
    got = [dataset[i] for i in range(len(dataset))]
    assert [it["sample_id"] for it in got] == list(range(plan.num_samples))
    assert [digest(it) for it in got] == digests


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_wrong_number_of_bins_publishes_nothing(fmt, source, tmp_path: Path) -> None:
    bins, num_bins, _ = source
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format=fmt, pack_size=PACK)
    with pytest.raises(PacklabError):
        write_chunk(tmp_path, plan, 0, bins(0, SPC - 1))  # one short
    with pytest.raises(PacklabError):
        write_chunk(tmp_path, plan, 0, bins(0, SPC + 1))  # one too many
    assert list(tmp_path.iterdir()) == []
    write_chunk(tmp_path, plan, 0, bins(0, SPC))
    with pytest.raises(PacklabError, match="already exists"):
        write_chunk(tmp_path, plan, 0, bins(0, SPC))


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_stale_chunk_is_refused_naming_it(fmt, source, tmp_path: Path) -> None:
    """Chunk 1's file holding chunk 0's samples (a stale or misnamed file) is an error, not
    data served under the wrong ids."""
    bins, num_bins, _ = source
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format=fmt, pack_size=PACK)
    write_plan(tmp_path, plan)
    write_chunk(tmp_path, plan, 0, bins(0, SPC))
    chunk_path(tmp_path, plan, 0).rename(chunk_path(tmp_path, plan, 1))
    dataset = RankShardedDataset(tmp_path, rank=0, world_size=1, timeout=0.5)
    with pytest.raises(FormatError, match=rf"chunk_00001{plan.chunk_name(0)[11:]}.*stale"):
        dataset[SPC]


def test_a_malformed_jsonl_chunk_names_the_file(source, tmp_path: Path) -> None:
    bins, num_bins, _ = source
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format="jsonl",
                         pack_size=PACK)
    write_plan(tmp_path, plan)
    path = write_chunk(tmp_path, plan, 0, bins(0, SPC))
    path.write_text(path.read_text()[:-40] + "\n")
    with pytest.raises(FormatError, match="chunk_00000.jsonl"):
        RankShardedDataset(tmp_path, rank=0, world_size=1)[0]


# -- waiting ------------------------------------------------------------------------------------
def test_waiting_for_a_missing_chunk_times_out_naming_it(tmp_path: Path) -> None:
    began = time.monotonic()
    with pytest.raises(PacklabError, match=r"chunk_00003.parquet: chunk 3 \(rank 1\) not "
                                           r"published after 0.3 s"):
        wait_for_chunk(tmp_path / "chunk_00003.parquet", chunk=3, rank=1, poll_interval=0.02,
                       timeout=0.3)
    assert time.monotonic() - began < 5
    with pytest.raises(PacklabError, match="finite wait"):
        wait_for_chunk(tmp_path / "x", chunk=0, rank=0, poll_interval=0.1, timeout=0)


def test_a_chunk_published_while_waiting_is_served(source, tmp_path: Path) -> None:
    bins, num_bins, digests = source
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format="parquet",
                         pack_size=PACK)
    producer = ChunkProducer(tmp_path, plan)
    dataset = RankShardedDataset(tmp_path, rank=0, world_size=1, poll_interval=0.01, timeout=20)
    writer = threading.Timer(0.3, lambda: producer.produce(bins, chunks=[0]))
    writer.start()
    try:
        began = time.monotonic()
        item = dataset[3]
        assert time.monotonic() - began >= 0.25  # it did wait
    finally:
        writer.join()
    assert digest(item) == digests[3]


def test_markers_let_the_producer_delete_and_a_deleted_chunk_is_an_error(source, tmp_path):
    bins, num_bins, _ = source
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format="jsonl",
                         pack_size=PACK)
    producer = ChunkProducer(tmp_path, plan)
    producer.produce(bins, chunks=[0, 1])
    dataset = RankShardedDataset(tmp_path, rank=0, world_size=1, timeout=0.5)
    tracker = dataset.tracker(epoch=4)
    assert tracker.update([dataset[i]["chunk"] for i in range(SPC - 1)]) == []
    assert producer.collect() == []  # not fully consumed: kept
    assert tracker.update([dataset[SPC - 1]["chunk"]]) == [0]
    marker = json.loads(marker_path(chunk_path(tmp_path, plan, 0)).read_text())
    assert marker == {"chunk": 0, "rank": 0, "world_size": 1, "epoch": 4, "samples": SPC}
    assert dataset.cached_chunks() == []  # evicted once consumed
    assert producer.collect() == [0]
    assert not chunk_path(tmp_path, plan, 0).exists()
    with pytest.raises(FormatError, match="consumed and deleted"):
        dataset[0]
    with pytest.raises(InvariantError, match="twice"):
        tracker.update([0])
    with pytest.raises(InvariantError, match="not its own"):
        RankShardedDataset(tmp_path, rank=1, world_size=2).tracker().update([0])


def test_the_producer_refuses_to_mix_runs_and_clears_a_stale_one(source, tmp_path: Path) -> None:
    bins, num_bins, _ = source
    plan = ChunkPlan(num_samples=num_bins, samples_per_chunk=SPC, format="jsonl",
                         pack_size=PACK)
    ChunkProducer(tmp_path, plan).produce(bins, chunks=[0, 1])
    with pytest.raises(PacklabError, match="already here"):
        ChunkProducer(tmp_path, plan)
    again = ChunkProducer(tmp_path, plan, overwrite=True)
    assert again.published() == []


# -- the rank-local fix ---------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_every_sample_once_per_epoch_on_files_and_chunks_evicted(chunks, source, world_size):
    directory, plan = chunks
    _, _, digests = source
    served: list[np.ndarray] = []
    for rank in range(world_size):
        dataset = RankShardedDataset(directory, rank=rank, world_size=world_size)
        sampler = RankLocalSampler(plan, rank=rank, world_size=world_size, micro_batch_size=3,
                                   seed=1, epoch=world_size)
        tracker = dataset.tracker()
        ids = []
        for batch in sampler:
            items = [dataset[i] for i in batch]
            assert [digest(it) for it in items] == [digests[it["sample_id"]] for it in items]
            assert all(it["chunk"] % world_size == rank for it in items)
            ids.extend(it["sample_id"] for it in items)
            tracker.update([it["chunk"] for it in items])
        assert tracker.finished and sorted(tracker.completed) == dataset.index.chunks.tolist()
        assert dataset.loads == dataset.index.chunks.shape[0]  # each chunk loaded once
        assert dataset.peak_cached <= 2 and dataset.cached_chunks() == []
        served.append(np.array(ids))
    assert coverage(served, plan.num_samples).exactly_once


@settings(max_examples=40, deadline=None)
@given(num_samples=st.integers(1, 300), spc=st.integers(1, 40), world=st.integers(1, 6),
       mbs=st.integers(1, 9), seed=st.integers(0, 3), epoch=st.integers(0, 3),
       window=st.integers(1, 3))
def test_rank_local_sampler_covers_every_sample_once(num_samples, spc, world, mbs, seed, epoch,
                                                     window) -> None:
    plan = ChunkPlan(num_samples=num_samples, samples_per_chunk=spc, format="jsonl")
    served = fixed_epoch(plan, world, mbs, seed=seed, epoch=epoch, window=window)
    for rank, ids in enumerate(served):
        assert np.all((ids // spc) % world == rank)  # only its own chunks
    assert coverage(served, num_samples).exactly_once


@settings(max_examples=30, deadline=None)
@given(num_samples=st.integers(1, 200), spc=st.integers(1, 30), world=st.integers(1, 4),
       mbs=st.integers(1, 6), steps=st.integers(0, 60), window=st.integers(1, 3))
def test_resume_after_k_steps_loses_and_repeats_nothing(num_samples, spc, world, mbs, steps,
                                                        window) -> None:
    plan = ChunkPlan(num_samples=num_samples, samples_per_chunk=spc, format="jsonl")
    for rank in range(world):
        first = RankLocalSampler(plan, rank=rank, world_size=world, micro_batch_size=mbs,
                                 seed=7, epoch=2, window=window)
        batches = list(first)
        done = batches[:steps]
        state = json.loads(json.dumps(first.state_dict(steps_done=len(done))))
        assert state["consumed_samples"] == len(done) * mbs * world
        again = RankLocalSampler(plan, rank=rank, world_size=world, micro_batch_size=mbs,
                                 seed=7, window=window)
        again.load_state_dict(state)
        before = [i for b in done for i in b]
        assert again.served_before().tolist() == before
        rest = [i for b in again for i in b]
        assert sorted(before + rest) == list(range(len(first.index)))


def test_shuffle_is_seeded_per_epoch_and_resume_checks_the_world_size() -> None:
    plan = ChunkPlan(num_samples=100, samples_per_chunk=10, format="jsonl")
    a = RankLocalSampler(plan, rank=1, world_size=2, micro_batch_size=4, seed=3)
    b = RankLocalSampler(plan, rank=1, world_size=2, micro_batch_size=4, seed=3)
    assert np.array_equal(a.order(), b.order())
    e0 = a.order()
    a.set_epoch(1)
    assert not np.array_equal(e0, a.order()) and sorted(e0) == sorted(a.order())
    # within-chunk shuffle: chunks are still read in production order (window=1)
    assert (np.diff(a.index.chunk_of(a.order())) >= 0).all()
    state = a.state_dict(steps_done=2)
    c = RankLocalSampler(plan, rank=1, world_size=4, micro_batch_size=4, seed=3)
    with pytest.raises(PacklabError, match="mid-epoch with world size 4"):
        c.load_state_dict(state)
    c.load_state_dict({**state, "consumed_samples": 0})  # a new epoch may change it
    with pytest.raises(PacklabError, match="whole number of global micro-batches"):
        c.resume(5)
    with pytest.raises(PacklabError, match="seed"):
        RankLocalSampler(plan, rank=1, world_size=2, micro_batch_size=4).load_state_dict(state)


def test_items_collate_into_the_thd_batch(chunks) -> None:
    """The items are what Megatron-Bridge's packed datasets return (plus ids): the THD collate
    takes them as they are."""
    from packlab.loading.collate import Collator

    directory, _ = chunks
    dataset = RankShardedDataset(directory, rank=1, world_size=2)
    items = [dataset[i] for i in range(3)]
    batch = Collator()(items)
    assert batch["tokens"].shape[0] == 3
    lengths = [it["input_ids"].shape[0] - (it["seq_boundaries"].shape[0] - 1) for it in items]
    assert int(batch["loss_mask"].shape[1]) >= max(lengths)


def test_a_rank_index_never_wraps() -> None:
    plan = ChunkPlan(num_samples=10, samples_per_chunk=4, format="jsonl")
    sampler = RankLocalSampler(plan, rank=1, world_size=2, micro_batch_size=2)
    assert len(sampler.index) == 4
    assert sampler.index.locate(3) == (1, 3)
    with pytest.raises(IndexError, match="out of range"):
        sampler.index.locate(4)


# -- Megatron's samplers ----------------------------------------------------------------------------
def loop_pretraining(total, consumed, mbs, rank, world, drop_last):
    """Megatron's sequential sampler, as a plain loop (the oracle)."""
    out, batch = [], []
    for idx in range(consumed, total):
        batch.append(idx)
        if len(batch) == mbs * world:
            out.append(batch[rank * mbs:(rank + 1) * mbs])
            batch = []
    if batch and not drop_last:
        out.append(batch[rank * mbs:(rank + 1) * mbs])
    return out


@settings(max_examples=60, deadline=None)
@given(total=st.integers(1, 200), consumed=st.integers(0, 199), mbs=st.integers(1, 8),
       world=st.integers(1, 5), drop_last=st.booleans(), data=st.data())
def test_pretraining_sampler_matches_the_loop(total, consumed, mbs, world, drop_last, data):
    consumed = min(consumed, total - 1)
    rank = data.draw(st.integers(0, world - 1))
    got = [b.tolist() for b in pretraining_batches(total, consumed, mbs, rank, world,
                                                   drop_last=drop_last)]
    assert got == loop_pretraining(total, consumed, mbs, rank, world, drop_last)
    assert list(MegatronPretrainingSampler(total, consumed, mbs, rank, world, drop_last)) == got


@pytest.mark.parametrize("sharding", [True, False])
def test_random_sampler_deals_disjoint_micro_batches_and_continues_epochs(sharding) -> None:
    import torch

    total, mbs, world = 103, 4, 3
    for epoch in range(2):
        served = []
        for rank in range(world):
            batches = random_batches(total, epoch * 96, mbs, rank, world, data_sharding=sharding)
            assert all(b.shape == (mbs,) for b in batches)
            served.append(np.concatenate(batches))
        flat = np.concatenate(served)
        assert flat.size == len(set(flat.tolist())) == 96  # whole global batches only
        g = torch.Generator()
        g.manual_seed(epoch)
        if sharding:
            bucket = (total // (mbs * world)) * mbs
            assert served[1].tolist() == [bucket + int(x) for x in torch.randperm(bucket,
                                                                                   generator=g)]
        else:
            perm = torch.randperm((total // mbs) * mbs, generator=g).tolist()
            assert served[2].tolist() == perm[2::world][: len(served[2])]
    sampler = MegatronPretrainingRandomSampler(total, 0, mbs, 0, world, data_sharding=sharding)
    first, second = list(sampler), list(sampler)
    assert first != second and sampler.consumed_samples == 2 * 96  # the next epoch


# -- seed 003's design, measured ------------------------------------------------------------------
def test_seed_dataset_on_files_serves_what_the_model_predicts(chunks, source) -> None:
    directory, plan = chunks
    _, _, digests = source
    world, mbs = 2, 2
    for rank in range(world):
        dataset = SeedLazyShardedDataset(directory, plan, rank=rank, world_size=world,
                                         mark_completed=False)
        asked = np.concatenate(pretraining_batches(plan.num_samples, 0, mbs, rank, world))
        predicted = served_ids(asked, plan, rank, world)
        for idx, expect in zip(asked.tolist(), predicted.tolist(), strict=True):
            if expect == NOT_SERVED:
                with pytest.raises(IndexError):
                    dataset[idx]
                continue
            item = dataset[idx]
            assert item["sample_id"] == expect and digest(item) == digests[expect]


@pytest.mark.parametrize("world", [2, 4, 8])
def test_seed_design_serves_each_kept_sample_world_size_times(world) -> None:
    """With chunks a multiple of one global batch, Megatron's sequential sampler asks every
    rank for the same offsets of every chunk, and the seed's substitution serves the rank's
    own chunk at those offsets: each served sample world-size times, (W-1)/W never."""
    mbs = 4
    spc = mbs * world * 5
    plan = ChunkPlan(num_samples=spc * world * 3, samples_per_chunk=spc, format="jsonl")
    asked, served = seed_epoch(plan, world, mbs)
    cov = coverage(served, plan.num_samples, asked=asked)
    n = plan.num_samples
    assert cov.served == n and cov.errors == 0
    assert cov.lost == n * (world - 1) // world
    assert cov.duplicated == n // world and cov.extra == n * (world - 1) // world
    counts = np.bincount(np.concatenate(served), minlength=n)
    assert set(counts[counts > 0].tolist()) == {world}
    table = epoch_table(plan, world, mbs)
    assert table["global_dataset"]["exactly_once"] and table["rank_local"]["exactly_once"]
    assert sum(table["seed_design"]["per_rank"]["lost_owned"]) == cov.lost


def test_seed_design_with_a_deleted_chunk_substitutes_or_raises() -> None:
    plan = ChunkPlan(num_samples=40, samples_per_chunk=10, format="jsonl")
    available = np.array([True, True, False, True])
    idx = np.arange(40)
    out = served_ids(idx, plan, rank=0, world_size=2, available=available)
    assert (out[20:30] == NOT_SERVED).all()  # its own chunk 2 is gone: IndexError
    assert out[30:40].tolist() == [NOT_SERVED] * 10  # chunk 3 is not its own, 2 is gone
    assert out[10:20].tolist() == list(range(10))  # chunk 1 substituted by chunk 0


def test_megatron_indices_reach_every_chunk_so_modulo_ownership_fails() -> None:
    """The open question answered: under the sequential sampler every rank's indices fall in
    every chunk, and (W-1)/W of its requests land in chunks it does not own."""
    plan = ChunkPlan(num_samples=400, samples_per_chunk=40, format="jsonl")
    for row in chunks_touched(plan, 4, micro_batch_size=2):
        assert row["chunks_touched"] == plan.num_chunks
        assert row["chunks_owned"] in (2, 3)
        assert row["foreign_share"] == pytest.approx(0.75, abs=0.08)
    rows = sweep_chunk_sizes(384, 4, 2, [8, 16, 12])
    assert [r["per_global_batch"] for r in rows] == [1.0, 2.0, 1.5]
    assert rows[0]["lost"] == rows[1]["lost"] == pytest.approx(0.75)
    assert rows[0]["extra"] == pytest.approx(0.75)
