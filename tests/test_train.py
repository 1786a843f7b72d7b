"""packlab.lab.train: the model's block-diagonal causal attention, equal batches and losses from
every format, exact resume, both THD batch styles, the two traps, fresh-process runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from packlab.errors import PacklabError
from packlab.formats import format_names
from packlab.lab.train import (
    ModelConfig,
    ResumeSampler,
    attention_mask,
    build_model,
    deterministic,
    make_collator,
    masked_loss,
    thd_view,
    train,
)
from packlab.lab.train.runs import (
    compare_curves,
    step_rows,
    step_time_spread,
    train_every_format,
)
from packlab.lab.train.traps import (
    RolledMaskDataset,
    cross_attending_share,
    cross_sequence_change,
    roll_counts,
)
from packlab.loading.collate import Collator
from packlab.loading.samplers import ShuffleSampler
from packlab.packing import BinAssignment, pack
from packlab.packing.materialize import BinMaterializer, bin_masks, roll_whole_bin
from packlab.pipeline.shards import write_shards
from packlab.sources import open_dataset
from packlab.spool import SpoolReader
from packlab.spool.synth import synthesize

PACK_SIZE = 512
VOCAB = 512


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory
           ) -> tuple[SpoolReader, BinAssignment, dict[str, Path]]:
    """One short-chat spool (several sequences per bin), packed once, in every format."""
    root = tmp_path_factory.mktemp("train")
    spool = synthesize(root / "spool", num_sequences=120, profile="short", vocab_size=VOCAB,
                       seed=3)
    assignment, _ = pack(spool.lengths, PACK_SIZE, seed=0)
    out = {}
    for name in format_names():
        write_shards(spool, assignment, root / name, format=name, bins_per_shard=16, workers=1)
        out[name] = root / name
    return spool, assignment, out


def config(**changes: object) -> ModelConfig:
    return ModelConfig(**{"vocab_size": VOCAB, "max_positions": PACK_SIZE, "width": 16,
                          "layers": 2, "heads": 2, "seed": 1, **changes})


def first_batch(path: Path, size: int = 3) -> dict:
    dataset = open_dataset(path)
    return make_collator()([dataset[i] for i in range(size)])


def multi_sequence_batch(path: Path) -> dict:
    """The first batch of 3 bins whose first bin packs at least three sequences."""
    dataset = open_dataset(path)
    rows = [i for i in range(len(dataset)) if len(dataset[i]["seq_boundaries"]) >= 4]
    assert rows, "the fixture must pack several sequences per bin"
    return make_collator()([dataset[i] for i in (rows[0], 0, 1)])


# -- the attention mask --------------------------------------------------------------------------
def test_the_mask_is_block_diagonal_causal_from_cu_seqlens(shards) -> None:
    batch = multi_sequence_batch(shards[2]["memmap_v1"])
    view = thd_view(batch)
    mask = attention_mask(view.segment_ids)
    width = view.tokens.shape[1]
    for row in range(view.tokens.shape[0]):
        cu = [int(c) for c in batch["cu_seqlens"][row] if c >= 0]
        segment = np.searchsorted(np.array(cu), np.arange(width), side="right") - 1
        expected = (np.arange(width)[None, :] <= np.arange(width)[:, None]) & (
            segment[:, None] == segment[None, :])
        assert np.array_equal(mask[row].numpy(), expected)
    assert mask.sum() < attention_mask(view.segment_ids, block_diagonal=False).sum()


def test_a_tokens_output_ignores_every_other_sub_sequence_of_its_bin(shards) -> None:
    batch = multi_sequence_batch(shards[2]["memmap_v1"])
    with deterministic():
        probe = cross_sequence_change(build_model(config()), batch)
        leaky = cross_sequence_change(build_model(config(attention="causal")), batch)
    assert probe is not None and probe["positions"] > 0
    assert probe["identical"] and probe["max_abs_change"] == 0.0
    # the ablation (a trainer that ignores cu_seqlens) does see the other sequences
    assert leaky is not None and not leaky["identical"] and leaky["max_abs_change"] > 0


def test_attention_is_causal_inside_a_sub_sequence(shards) -> None:
    view = thd_view(multi_sequence_batch(shards[2]["memmap_v1"]))
    model = build_model(config())
    row, segment = 0, 0
    where = torch.nonzero(view.segment_ids[row] == segment).flatten()
    cut = int(where[len(where) // 2])
    tokens = view.tokens.clone()
    tokens[row, cut + 1: int(where[-1]) + 1] = (tokens[row, cut + 1: int(where[-1]) + 1] + 7) % VOCAB
    with deterministic(), torch.no_grad():
        before = model(view)[row, : cut + 1]
        after = model(view._replace(tokens=tokens))[row, : cut + 1]
        later = model(view._replace(tokens=tokens))[row, cut + 1]
    assert torch.equal(before, after)
    assert not torch.equal(model(view)[row, cut + 1], later)


def test_the_loss_counts_only_loss_mask_positions(shards) -> None:
    view = thd_view(first_batch(shards[2]["memmap_v1"]))
    model = build_model(config())
    labels = view.labels.clone()
    labels[view.loss_mask == 0] = (labels[view.loss_mask == 0] + 3) % VOCAB
    with deterministic(), torch.no_grad():
        loss, kept = masked_loss(model(view), view)
        moved, _ = masked_loss(model(view._replace(labels=labels)), view)
    assert kept == int(view.loss_mask.sum()) > 0
    assert float(loss) == float(moved)


# -- both batch styles ----------------------------------------------------------------------------
def bridge_style(batch: dict) -> dict:
    """Megatron-Bridge's keys, built from packlab's batch as ``GPTSFTPackedDataset.collate_fn``
    builds them (cu_seqlens_q int32 rows, padded by repeating the last value; no -1)."""
    def rows(key: str) -> torch.Tensor:
        kept = [[int(c) for c in row if c >= 0] for row in batch[key]]
        longest = max(len(r) for r in kept)
        return torch.tensor([r + [r[-1]] * (longest - len(r)) for r in kept], dtype=torch.int32)

    padded = rows("cu_seqlens")  # physical offsets (with pad_seq_to_mult: padded lengths)
    seqlens = padded[:, 1:] - padded[:, :-1]
    out = {"tokens": batch["tokens"], "labels": batch["labels"],
           "loss_mask": batch["loss_mask"], "position_ids": batch["position_ids"],
           "token_count": batch["token_count"].tolist(), "attention_mask": None,
           "max_seqlen_q": seqlens.max(dim=1, keepdim=True)[0],
           "max_seqlen_kv": seqlens.max(dim=1, keepdim=True)[0]}
    if "cu_seqlens_unpadded" in batch:  # logical offsets in cu_seqlens_q, physical in _padded
        out.update(cu_seqlens_q=rows("cu_seqlens_unpadded"), cu_seqlens_q_padded=padded)
        out.update(cu_seqlens_kv=out["cu_seqlens_q"], cu_seqlens_kv_padded=padded)
    else:
        out.update(cu_seqlens_q=padded, cu_seqlens_kv=padded)
    return out


@pytest.mark.parametrize("options", [{}, {"cu_seqlens_size": 12}, {"pad_seq_to_mult": 8},
                                     {"pad_to_length": PACK_SIZE}])
def test_packlab_and_bridge_batches_read_the_same(shards, options: dict) -> None:
    dataset = open_dataset(shards[2]["memmap_v1"])
    items = [dataset[i] for i in range(3)]
    batch = Collator(return_tensors="pt", **options)(items)
    ours, theirs = thd_view(batch), thd_view(bridge_style(batch))
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
    model = build_model(config())
    with deterministic(), torch.no_grad():
        assert float(masked_loss(model(ours), ours)[0]) == float(
            masked_loss(model(theirs), theirs)[0])
    # every real sub-sequence is one segment: its positions count from 0
    for row, item in enumerate(items):
        lengths = np.diff(item["seq_boundaries"]) - 1
        segments = ours.segment_ids[row][: ours.position_ids.shape[1]]
        for k, length in enumerate(lengths):
            positions = ours.position_ids[row][segments == segments[0] + k]
            assert positions[:length].tolist() == list(range(length))


def test_bad_batches_and_models_are_clear_errors(shards) -> None:
    batch = first_batch(shards[2]["memmap_v1"])
    with pytest.raises(PacklabError, match="cu_seqlens_q_padded, cu_seqlens_q, cu_seqlens"):
        thd_view({k: v for k, v in batch.items() if not k.startswith("cu_seqlens")})
    broken = dict(batch, cu_seqlens=batch["cu_seqlens"].flip(1))
    with pytest.raises(PacklabError, match="cu_seqlens must rise"):
        thd_view(broken)
    with pytest.raises(PacklabError, match="outside the model's vocabulary"):
        build_model(config(vocab_size=4))(thd_view(batch))
    with pytest.raises(PacklabError, match="attention must be one of"):
        config(attention="full")
    with pytest.raises(PacklabError, match="unknown style 'nemo'"):
        make_collator("nemo")



@pytest.mark.parametrize("options", [{}, {"pad_to_max_length": True}])
def test_the_model_reads_megatron_bridges_own_batch_as_packlabs(shards, options: dict) -> None:
    """``Collator(style="megatron_bridge")`` (equal to Bridge's collate_fn, tested in
    tests/bridge/test_megatron_bridge.py) gives the model the segments, positions and, with an EOS id no
    token has, the loss that packlab's THD batch gives."""
    dataset = open_dataset(shards[2]["memmap_v1"])
    items = [dataset[i] for i in range(3)]
    eos = VOCAB  # no token of the data
    ours = thd_view(make_collator("thd", pad_token_id=eos)(items))  # Bridge pads with EOS
    theirs = thd_view(make_collator("megatron_bridge", max_seq_length=PACK_SIZE, eos_id=eos,
                                    **options)(items))
    width = ours.tokens.shape[1]
    assert torch.equal(theirs.tokens[:, :width], ours.tokens)
    assert torch.equal(theirs.position_ids[:, :width], ours.position_ids)
    assert torch.equal(theirs.loss_mask[:, :width], ours.loss_mask)
    assert not theirs.loss_mask[:, width:].any()
    model = build_model(config(vocab_size=VOCAB + 1))
    with deterministic(), torch.no_grad():  # equal to rounding: Bridge's rows are wider (a
        # multiple of 16), so the loss sums run over other shapes; within one style, bit for bit
        assert float(masked_loss(model(ours), ours)[0]) == pytest.approx(
            float(masked_loss(model(theirs), theirs)[0]), rel=1e-6)

# -- every format: equal batches, equal losses ----------------------------------------------------
def loader_batches(path: Path, steps: int, batch_size: int, workers: int = 0) -> list[dict]:
    from torch.utils.data import DataLoader

    dataset = open_dataset(path)
    sampler = ResumeSampler(ShuffleSampler(len(dataset), seed=5), count=steps * batch_size)
    return list(DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                           collate_fn=make_collator(), num_workers=workers))


def test_every_format_gives_equal_batches_and_losses_for_one_sampler_seed(shards) -> None:
    paths = shards[2]
    reference = loader_batches(paths["memmap_v1"], steps=4, batch_size=3)
    losses = {}
    for name, path in paths.items():
        batches = loader_batches(path, steps=4, batch_size=3, workers=1 if name == "parquet"
                                 else 0)
        for ours, theirs in zip(reference, batches, strict=True):
            assert ours.keys() == theirs.keys()
            assert all(torch.equal(ours[k], theirs[k]) and ours[k].dtype == theirs[k].dtype
                       for k in ours), name
        dataset = open_dataset(path)
        losses[name] = train(dataset, config(), steps=4, batch_size=3, lr=3e-3,
                             sampler=ShuffleSampler(len(dataset), seed=5),
                             collate_fn=make_collator()).losses
    assert len(set(map(tuple, losses.values()))) == 1, losses
    assert losses["memmap_v1"][0] != losses["memmap_v1"][-1]  # it trained


def test_a_different_sampler_seed_gives_a_different_curve(shards) -> None:
    dataset = open_dataset(shards[2]["memmap_v1"])
    curves = [train(dataset, config(), steps=2, batch_size=2, collate_fn=make_collator(),
                    sampler=ShuffleSampler(len(dataset), seed=seed)).losses for seed in (0, 1)]
    assert curves[0] != curves[1]


# -- resume -------------------------------------------------------------------------------------------
def test_resume_sampler_continues_the_order_across_epochs() -> None:
    base = ShuffleSampler(5, seed=2)
    whole = list(ResumeSampler(base, count=13))
    expected = []
    for epoch in range(3):
        base.set_epoch(epoch)
        expected += list(base)
    assert whole == expected[:13]
    assert list(ResumeSampler(base, start=4, count=5)) + list(
        ResumeSampler(base, start=9, count=4)) == whole[4:13]


def test_resume_from_consumed_samples_continues_the_curve_exactly(shards, tmp_path) -> None:
    paths = shards[2]
    dataset = open_dataset(paths["memmap_v1"])
    steps, batch, stop = 7, 3, 3
    full = train(dataset, config(), steps=steps, batch_size=batch, lr=3e-3,
                 sampler=ShuffleSampler(len(dataset), seed=4), collate_fn=make_collator(),
                 checkpoint_steps={stop: tmp_path / "step3.pt"})
    assert full.checkpoints[stop].is_file()
    # resumed on another format and with a worker: the curve continues all the same
    other = open_dataset(paths["parquet"])
    resumed = train(other, config(), steps=steps - stop, batch_size=batch, lr=3e-3,
                    sampler=ShuffleSampler(len(other), seed=4), collate_fn=make_collator(),
                    num_workers=1, resume=full.checkpoints[stop])
    assert resumed.losses == full.losses[stop:]
    assert [r["step"] for r in resumed.records] == list(range(stop + 1, steps + 1))
    assert resumed.records[0]["consumed_samples"] == (stop + 1) * batch
    assert [r["batch_digest"] for r in resumed.records] == [
        r["batch_digest"] for r in full.records[stop:]]
    with pytest.raises(PacklabError, match="checkpoint's model"):
        train(other, config(width=32), steps=1, batch_size=batch, collate_fn=make_collator(),
              sampler=ShuffleSampler(len(other)), resume=full.checkpoints[stop])
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(PacklabError, match="junk.pt"):
        train(other, config(), steps=1, batch_size=batch, collate_fn=make_collator(),
              sampler=ShuffleSampler(len(other)), resume=tmp_path / "junk.pt")


def test_records_hold_wait_compute_and_memory(shards) -> None:
    dataset = open_dataset(shards[2]["arrow_ipc"])
    run = train(dataset, config(), steps=2, batch_size=2, num_workers=1,
                sampler=ShuffleSampler(len(dataset)), collate_fn=make_collator())
    for record in run.records:
        assert record["wait_seconds"] > 0 and record["compute_seconds"] > 0
        assert record["rss_bytes"] > 0 and record["workers_rss_bytes"] > 0
        assert record["loss_tokens"] > 0 and record["tokens"] >= record["loss_tokens"]


# -- the traps -----------------------------------------------------------------------------------------
def test_the_rolled_dataset_differs_only_in_its_loss_mask(shards) -> None:
    spool, assignment, paths = shards
    rolled = RolledMaskDataset(spool.path, assignment)
    dataset = open_dataset(paths["memmap_v1"])
    materializer = BinMaterializer(spool, assignment)
    assert len(rolled) == len(dataset)
    for index in (0, 5, len(dataset) - 1):
        ours, theirs = rolled[index], dataset[index]
        assert np.array_equal(ours["input_ids"], theirs["input_ids"])
        assert np.array_equal(ours["seq_boundaries"], theirs["seq_boundaries"])
        assert np.array_equal(ours["loss_mask"],
                              roll_whole_bin(bin_masks(materializer, index).raw))
        assert not np.array_equal(ours["loss_mask"], theirs["loss_mask"])


def test_roll_counts_match_a_position_by_position_count(shards) -> None:
    spool, assignment, _ = shards
    indices = [0, 3, 3, 7]
    counts = roll_counts(spool.path, assignment, indices)
    materializer = BinMaterializer(spool, assignment)
    expected = dict.fromkeys(counts, 0)
    for index in indices:
        m = bin_masks(materializer, index)
        starts = [int(s) for s in m.seq_start_id]
        ends = [*starts[1:], len(m.raw)]
        expected["bins"] += 1
        for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
            for j in range(start, end):
                if j == end - 1:
                    expected["cross_boundary"] += int(m.rolled[j]) if k < len(starts) - 1 else 0
                    continue
                expected["positions"] += 1
                expected["targets"] += int(m.aligned[j])
                expected["rolled_targets"] += int(m.rolled[j])
                expected["missed"] += int(m.aligned[j] and not m.rolled[j])
                expected["spurious"] += int(m.rolled[j] and not m.aligned[j])
                expected["borrowed"] += int(j == start and k > 0 and m.rolled[j])
    assert counts == expected
    assert counts["missed"] + counts["spurious"] > 0


def test_cross_attending_share_counts_loss_positions_past_the_first_sequence(shards) -> None:
    batch = multi_sequence_batch(shards[2]["memmap_v1"])
    view = thd_view(batch)
    kept = view.loss_mask > 0
    expected = int((kept & (view.segment_ids > 0)).sum()) / int(kept.sum())
    assert cross_attending_share([batch]) == expected
    assert 0 < expected < 1


# -- every format in a fresh process ---------------------------------------------------------------------
def test_training_every_format_in_fresh_processes_gives_one_curve(shards) -> None:
    paths = shards[2]
    chosen = {name: paths[name] for name in ("memmap_v1", "legacy_npy_pickle")}
    results = train_every_format(chosen, model=config().to_dict(), steps=3, batch_size=2,
                                 workers=[0, 1], lr=3e-3, timeout=600)
    verdict = compare_curves(results)
    assert verdict["identical"] and verdict["runs"] == 4 and verdict["steps"] == 3
    rows = step_rows(results)
    assert {(r["format"], r["workers"]) for r in rows} == {(n, w) for n in chosen for w in (0, 1)}
    for row in rows:
        assert row["step_seconds"] > 0 and 0 < row["wait_share"] < 1
        assert row["startup_seconds"] >= row["open_seconds"] > 0
        assert row["compute_seconds"] > 0 and row["wait_seconds"] > 0
        assert (row["workers_rss_bytes"] > 0) == (row["workers"] > 0)
    spread = step_time_spread(rows)
    assert set(spread) == {0, 1}
    for workers, s in spread.items():
        group = [r for r in rows if r["workers"] == workers]
        assert s["ratio"] >= 1 and s["compute_ratio"] >= 1
        assert s["wait_added"] == pytest.approx(
            (max(r["wait_seconds"] for r in group) - min(r["wait_seconds"] for r in group))
            / min(r["step_seconds"] for r in group))


def test_the_training_process_holds_the_dataset_only_with_a_format_that_loads_it_all(
        tmp_path) -> None:
    """Legacy's reader loads every bin at open: the training process grows by at least the
    bins' bytes; a memory-mapped format's open costs next to nothing."""
    spool = synthesize(tmp_path / "spool", num_sequences=12_000, profile="short",
                       vocab_size=VOCAB, seed=1)
    assignment, report = pack(spool.lengths, PACK_SIZE, seed=0)
    chosen = {}
    for name in ("memmap_v1", "legacy_npy_pickle"):
        write_shards(spool, assignment, tmp_path / name, format=name,
                     bins_per_shard=assignment.num_bins, workers=1)
        chosen[name] = tmp_path / name
    data_bytes = 5 * report.num_tokens  # int32 tokens + uint8 loss mask
    results = train_every_format(chosen, model=config().to_dict(), steps=1, batch_size=2,
                                 workers=[0], timeout=600)
    assert results["legacy_npy_pickle"]["memory"]["open_rss_bytes"] >= 0.8 * data_bytes
    assert results["memmap_v1"]["memory"]["open_rss_bytes"] < 0.1 * data_bytes


def test_compare_curves_names_the_first_step_that_differs() -> None:
    records = [{"step": s, "loss": 1.0 / s, "batch_digest": str(s)} for s in (1, 2, 3)]
    changed = [dict(r) for r in records]
    changed[1]["loss"] += 1e-7
    results = {"a": {"runs": [{"workers": 0, "records": records}]},
               "b": {"runs": [{"workers": 2, "records": changed}]}}
    verdict = compare_curves(results)
    assert not verdict["identical"] and verdict["batches_identical"]
    assert verdict["differences"] == [{"format": "b", "workers": 2, "step": 2,
                                       "loss": changed[1]["loss"], "reference_loss": 0.5,
                                       "batch_equal": True}]


def test_verdicts_follow_the_numbers() -> None:
    """The findings' verdicts are computed: the same rows with a format that adds a large data
    wait, or holds no more memory than the others, turn them."""
    from packlab.formats import formats_where
    from packlab.lab.train.report import findings, headline_numbers

    in_ram = formats_where("IN_RAM")[0]
    rows = [{"format": name, "workers": 0, "open_seconds": 0.01, "startup_seconds": startup,
             "step_seconds": 0.1, "wait_seconds": wait, "compute_seconds": 0.1 - wait,
             "wait_share": wait / 0.1, "open_rss_bytes": held, "peak_rss_bytes": held + 10,
             "peak_anon_bytes": held,
             "workers_rss_bytes": 0}
            for name, startup, wait, held in (("memmap_v1", 0.01, 0.001, 0),
                                              (in_ram, 2.0, 0.002, 10**8))]
    curves = {"identical": True, "batches_identical": True, "runs": 2, "steps": 3,
              "differences": []}
    trap = {"cross_boundary": 3, "bins": 2, "targets": 10, "missed": 1, "spurious": 1,
            "borrowed": 1, "eval_loss": 2.0, "reference_eval_loss": 1.9}
    attention = {"causal_change": 0.5, "block_change": 0.0, "share": 0.5, "eval_loss": 2.0,
                 "alone_eval_loss": 2.1, "reference_eval_loss": 1.9}

    def verdicts(rows: list[dict]) -> list[str]:
        spread = step_time_spread(rows)
        return [f["verdict"] for f in findings(curves, spread, rows, tolerance=0.05,
                                               resumed=True, trap=trap, attention=attention)]

    assert set(verdicts(rows)) == {"holds"}
    rows[1]["wait_seconds"], rows[1]["open_rss_bytes"] = 0.02, 0
    worse = verdicts(rows)
    assert worse[1].startswith("does not hold") and worse[3] == "does not hold"
    numbers = headline_numbers({"memmap_v1": {}, in_ram: {}}, curves, rows,
                               step_time_spread(rows), resumed=True, trap=trap,
                               attention=attention)
    assert numbers["formats"] == ["memmap_v1", in_ram] and numbers["losses_identical"] is True
    assert numbers["wait_seconds"][in_ram] == {"0": 0.02}
