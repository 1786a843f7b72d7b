"""The output layout (seed 001): splits by sequence, hashes, links, blend.json, resumable reruns."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import write_random_spool

from packlab import open_dataset
from packlab.bins import bin_digest
from packlab.cli import main
from packlab.errors import FormatError, PacklabError
from packlab.formats import format_names
from packlab.pipeline.layout import (
    build_layout,
    copy_layout,
    known_splits,
    nano3_paths,
    parse_fractions,
    parse_weights,
    read_blend,
    sequence_keys,
    split_sequences,
    weighted_indices,
)
from packlab.pipeline.receipts import RECEIPT_SUFFIX
from packlab.sources.validate import validate_path
from packlab.spool import SpoolReader, SpoolWriter
from packlab.storage.files import sha256_file

SPLITS = "train=0.8,valid=0.1,test=0.1"


@pytest.fixture(scope="module")
def spools(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("spools")
    write_random_spool(root / "chat", num_sequences=240, max_len=150, seed=11)
    write_random_spool(root / "code", num_sequences=90, max_len=150, seed=12)
    return root / "chat", root / "code"


def build(spools, out: Path, **options):
    kwargs = {"format": "parquet", "pack_size": 256, "splits": SPLITS, "bins_per_shard": 6,
              "workers": 1, **options}
    return build_layout(list(spools), out, **kwargs)


def spool_sequence_digests(path: Path) -> Counter:
    spool = SpoolReader(path)
    return Counter(bin_digest(t, np.zeros(0, np.uint8), np.zeros(0, np.int64))
                   for t, _ in spool.iter_sequences())


def split_sequence_digests(out: Path, split: str) -> Counter:
    """The token runs of every sub-sequence of every bin of a split."""
    found: Counter = Counter()
    for item in open_dataset(out, split=split):
        bounds = item["seq_boundaries"]
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            found[bin_digest(item["input_ids"][a:b], np.zeros(0, np.uint8),
                             np.zeros(0, np.int64))] += 1
    return found


# -- splits ---------------------------------------------------------------------------------------
def test_split_and_weight_specs_are_parsed_and_refused_clearly() -> None:
    assert parse_fractions("train=0.98,valid=0.01,test=0.01") == {
        "train": 0.98, "valid": 0.01, "test": 0.01}
    assert parse_fractions("train=0.3333333,valid=0.6666667") == pytest.approx(
        {"train": 1 / 3, "valid": 2 / 3}, abs=1e-6)
    assert list(parse_fractions({"b": 1, "a": 0})) == ["b", "a"]
    assert parse_fractions(None) == {"train": 1.0}
    for bad, message in [("train", "NAME=FRACTION"), ("train=x", "not a number"),
                         ("train=-1", ">= 0"), ("train=1,train=2", "twice"),
                         ("tr ain=1", "split name"), ("train=0", "positive"),
                         ("train=0.5,valid=0.6", "sum to 1.1, not 1"),
                         ("train=1.5", "over 1"), ("train=98,valid=1,test=1", "over 1"),
                         ("train=0.5", "sum to 0.5, not 1")]:
        with pytest.raises(PacklabError, match=message):
            parse_fractions(bad)
    assert parse_weights("0.7,0.3", 2) == pytest.approx([0.7, 0.3])
    assert parse_weights("7,3", 2) == pytest.approx([0.7, 0.3])
    assert parse_weights(None, 3) is None
    with pytest.raises(PacklabError, match="2 weights for 3 inputs"):
        parse_weights("1,1", 3)


def test_sequence_split_is_a_seeded_partition_keyed_by_content(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 40, size=3000)
    tokens = rng.integers(0, 1000, size=int(lengths.sum()))
    masks = rng.integers(0, 2, size=tokens.shape[0])
    with SpoolWriter(tmp_path / "s", vocab_size=1000) as w:
        w.append_many(tokens, masks, lengths)
        w.append_many(tokens[: lengths[0]], masks[: lengths[0]], lengths[:1])  # a duplicate
        w.append(tokens[: lengths[0]], 1 - masks[: lengths[0]])  # same tokens, other mask
    spool = SpoolReader(tmp_path / "s")
    keys = sequence_keys(spool, seed=0)
    assert keys[0] == keys[3000] and keys[0] != keys[3001]
    distinct = {(t.tobytes(), m.tobytes()) for t, m in spool.iter_sequences()}
    assert len(set(keys.tolist())) == len(distinct)  # equal content, equal key; else distinct
    assert np.array_equal(keys, sequence_keys(spool, seed=0, chunk_tokens=37))
    assert not np.array_equal(keys, sequence_keys(spool, seed=1))

    fractions = parse_fractions(SPLITS)
    parts = split_sequences(spool, fractions, seed=0)
    every = np.sort(np.concatenate(list(parts.values())))
    assert np.array_equal(every, np.arange(spool.num_sequences))  # each in exactly one split
    assert all(np.all(np.diff(p) > 0) for p in parts.values())
    share = {k: v.shape[0] / spool.num_sequences for k, v in parts.items()}
    assert share == pytest.approx(fractions, abs=0.03)
    dup = [k for k, v in parts.items() if 0 in v]
    assert dup == [k for k, v in parts.items() if 3000 in v]
    again = split_sequences(spool, fractions, seed=0)
    assert all(np.array_equal(parts[k], again[k]) for k in parts)


# -- the layout -----------------------------------------------------------------------------------
def test_layout_has_relative_links_a_blend_and_every_sequence_once(spools, tmp_path: Path
                                                                    ) -> None:
    out = tmp_path / "out"
    report = build(spools, out, weights="0.7,0.3")
    blend = read_blend(out)
    assert blend is not None and blend["run_hash"] == report["run_hash"]
    assert known_splits(out) == ["train", "valid", "test"]
    assert report["written"] == report["num_shards"] > 0 and report["reused"] == 0
    run = out / "runs" / report["run_hash"] / "datasets"
    assert sorted(p.name for p in run.iterdir()) == ["chat", "code"]
    for split, entry in blend["splits"].items():
        links = sorted(p for p in (out / "splits" / split).iterdir()
                       if not p.name.endswith(RECEIPT_SUFFIX))
        assert [p.name for p in links] == entry["links"]
        for link, shard in zip(links, entry["shards"], strict=True):
            target = os.readlink(link)
            assert not os.path.isabs(target) and target.startswith("../../runs/")
            assert link.resolve() == (out / shard).resolve()
            assert link.name.split("__")[0] in ("chat", "code")
        assert sum(entry["weights"]) == pytest.approx(1.0)
        weights = {d["name"]: d["weight"] for d in entry["datasets"]}
        assert weights == pytest.approx({"chat": 0.7, "code": 0.3})
        ds = open_dataset(out, split=split)
        assert len(ds) == entry["num_bins"] == sum(entry["shard_bins"])
        assert ds.num_tokens == entry["num_tokens"]
    assert blend["inputs"][0]["manifest"] == SpoolReader(spools[0]).record
    assert blend["packing"]["pack_size"] == 256 and blend["packlab_version"]
    # every spool sequence is in exactly one split, none lost, none duplicated
    seen = sum((split_sequence_digests(out, s) for s in known_splits(out)), Counter())
    assert seen == spool_sequence_digests(spools[0]) + spool_sequence_digests(spools[1])
    assert validate_path(out / "splits" / "train")["num_bins"] == len(
        open_dataset(out, split="train"))


def test_hashes_follow_content_and_configuration_not_paths(spools, tmp_path: Path) -> None:
    first = build(spools[:1], tmp_path / "a")
    moved = tmp_path / "elsewhere" / "chat"
    shutil.copytree(spools[0], moved)
    same = build([moved], tmp_path / "b")
    assert same["run_hash"] == first["run_hash"]
    assert [p["config_hash"] for p in same["parts"]] == [p["config_hash"] for p in first["parts"]]
    for change in ({"pack_size": 300}, {"seed": 1}, {"splits": "train=0.5,valid=0.5"},
                   {"algorithm": "next_fit"}, {"bins_per_shard": 7}):
        other = build(spools[:1], tmp_path / f"c{len(os.listdir(tmp_path))}", **change)
        assert other["run_hash"] != first["run_hash"], change
    # a single spool keeps the seed's link names
    assert (tmp_path / "a" / "splits" / "train" / "shard_000000.parquet").is_symlink()


def test_rerun_reuses_valid_shards_and_rewrites_only_the_deleted_one(spools, tmp_path: Path
                                                                     ) -> None:
    out = tmp_path / "out"
    first = build(spools, out)
    shards = sorted((out / "runs").rglob("shard_*.parquet"))
    assert len(shards) >= 6
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns, sha256_file(p)) for p in shards}
    again = build(spools, out)
    assert (again["reused"], again["written"]) == (first["num_shards"], 0)
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns, sha256_file(p)) for p in shards} == before

    victim = shards[2]
    victim.unlink()
    third = build(spools, out)
    assert (third["reused"], third["written"]) == (first["num_shards"] - 1, 1)
    after = {p: (p.stat().st_ino, p.stat().st_mtime_ns, sha256_file(p)) for p in shards}
    assert all(after[p] == before[p] for p in shards if p != victim)
    assert after[victim][2] == before[victim][2]  # deterministic: the same bytes again

    with open(shards[0], "r+b") as f:  # damage: a truncated shard is rewritten too
        f.truncate(shards[0].stat().st_size // 2)
    fourth = build(spools, out)
    assert fourth["written"] == 1 and sha256_file(shards[0]) == before[shards[0]][2]
    assert build(spools, out, reuse=False)["written"] == first["num_shards"]


def test_moved_output_keeps_its_links_and_blend_json_serves_without_them(spools, tmp_path: Path
                                                                         ) -> None:
    out = tmp_path / "out"
    build(spools, out)
    want = {s: [bin_digest(*b) for b in open_dataset(out, split=s).read_bins(
        np.arange(len(open_dataset(out, split=s))))] for s in known_splits(out)}
    moved = tmp_path / "moved" / "deeper"
    moved.parent.mkdir()
    shutil.move(str(out), str(moved))
    assert not out.exists()
    for s, digests in want.items():
        ds = open_dataset(moved, split=s)
        assert [bin_digest(*b) for b in ds.read_bins(np.arange(len(ds)))] == digests
        assert all(p.exists() for p in (moved / "splits" / s).iterdir())
    assert validate_path(moved / "splits" / "valid")["num_shards"] > 0

    copied = copy_layout(moved, tmp_path / "copy")  # links stay links, and resolve in the copy
    assert all(os.readlink(p).startswith("../../runs/") and str(p.resolve()).startswith(
        str(copied.resolve())) for p in (copied / "splits" / "train").iterdir())
    with pytest.raises(PacklabError, match="already exists"):
        copy_layout(moved, copied)
    shutil.rmtree(moved / "splits")  # e.g. a copy to object storage: no symlinks
    for s, digests in want.items():
        ds = open_dataset(moved, split=s)
        assert [bin_digest(*b) for b in ds.read_bins(np.arange(len(ds)))] == digests
    with pytest.raises(FormatError, match="no split 'dev'; splits here: train, valid, test"):
        open_dataset(moved, split="dev")
    assert known_splits(moved) == ["train", "valid", "test"]


def test_nano3_paths_and_weighted_sampling(spools, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build(spools, out, weights="0.9,0.1", splits="train=1")
    paths = nano3_paths(out)
    assert paths == {"packed_train_data_path": f"{out / 'splits' / 'train'}/"}
    ds = open_dataset(paths["packed_train_data_path"])
    entry = read_blend(out)["splits"]["train"]
    chat_bins = sum(n for link, n in zip(entry["links"], entry["shard_bins"], strict=True)
                    if link.startswith("chat__"))
    picks = weighted_indices(out, "train", 20_000, seed=5)
    assert picks.min() >= 0 and picks.max() < len(ds)
    # links sort chat__ before code__, so chat's bins come first in the dataset
    assert np.mean(picks < chat_bins) == pytest.approx(0.9, abs=0.01)
    assert np.array_equal(picks, weighted_indices(out, "train", 20_000, seed=5))


def test_an_empty_split_is_listed_and_explained(spools, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = build(spools[:1], out, splits="train=1,valid=0")
    assert report["splits"]["valid"] == {"num_shards": 0, "num_bins": 0, "num_tokens": 0,
                                         "num_sequences": 0, "dropped_sequences": 0}
    assert known_splits(out) == ["train", "valid"]
    with pytest.raises(FormatError, match="split 'valid' is empty"):
        open_dataset(out, split="valid")


@pytest.mark.parametrize("name", [f for f in ("memmap_v1", "binidx", "arrow_ipc")
                                  if f in format_names()])
def test_other_formats_link_and_resume_too(name: str, spools, tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = build(spools[:1], out, format=name)
    again = build(spools[:1], out, format=name)
    assert again["reused"] == first["num_shards"] and again["written"] == 0
    moved = tmp_path / "moved"
    shutil.move(str(out), str(moved))
    total = sum(len(open_dataset(moved, split=s)) for s in known_splits(moved))
    assert total == sum(e["num_bins"] for e in first["splits"].values())
    assert validate_path(moved / "splits" / "train")["num_shards"] >= 1


def test_pack_command_writes_the_layout_and_reports_reuse(spools, tmp_path: Path, capsys
                                                          ) -> None:
    out = tmp_path / "out"
    argv = ["pack", str(spools[0]), str(spools[1]), str(out), "--format", "parquet",
            "--pack-size", "256", "--split", SPLITS, "--weights", "0.7,0.3",
            "--bins-per-shard", "8", "--workers", "2", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["written"] == first["num_shards"] and set(first["splits"]) == {
        "train", "valid", "test"}
    assert main(argv[:-1]) == 0
    text = capsys.readouterr().out
    assert f"reused      {first['num_shards']}" in text and "written     0" in text
    assert "splits/valid/" in text
    assert main(argv[:-3] + ["--weights", "1"]) == 2
    assert "1 weights for 2 inputs" in capsys.readouterr().err
    assert main(["pack", str(spools[0]), str(tmp_path / "x"), "--format", "parquet",
                 "--pack-size", "256", "--split", "train=1,valid"]) == 2
    assert "NAME=FRACTION" in capsys.readouterr().err
    assert main(["pack", str(spools[0]), str(spools[0]), str(tmp_path / "y"), "--format",
                 "parquet", "--pack-size", "256"]) == 2
    assert "not unique" in capsys.readouterr().err


def test_validate_a_whole_layout_and_name_a_missing_shard(spools, tmp_path: Path, capsys
                                                          ) -> None:
    out = tmp_path / "out"
    report = build(spools, out, splits="train=0.9,valid=0.1,test=0")
    result = validate_path(out)
    assert result["num_bins"] == sum(s["num_bins"] for s in report["splits"].values())
    assert result["splits"]["test"]["num_bins"] == 0 and len(result["splits"]) == 3
    assert main(["validate", str(out)]) == 0
    capsys.readouterr()
    with pytest.raises(FormatError, match="open one split .*splits here: train, valid, test"):
        open_dataset(out)
    link = sorted((out / "splits" / "valid").glob("*.parquet"))[0]
    link.resolve().unlink()
    for call in (lambda: validate_path(out), lambda: open_dataset(out, split="valid")):
        with pytest.raises(FormatError, match=f"{link.name}: broken link to ../../runs/.*rerun"):
            call()
    assert main(["validate", str(out)]) == 2
    assert "broken link" in capsys.readouterr().err


def test_full_verification_catches_damage_a_receipt_cannot_see(spools, tmp_path: Path) -> None:
    """A directory shard's receipt covers its manifest; a same-size bit flip in a data file
    passes the receipt check and is caught only by --verify full (the reader's validate)."""
    out = tmp_path / "out"
    build(spools[:1], out, format="memmap_v1", splits="train=1")
    shard = sorted((out / "runs").rglob("shard_000001"))[0]
    data = shard / "input_ids.npy"
    raw = bytearray(data.read_bytes())
    raw[-1] ^= 0xFF
    data.write_bytes(bytes(raw))
    assert build(spools[:1], out, format="memmap_v1", splits="train=1")["written"] == 0
    with pytest.raises(FormatError, match="input_ids.npy"):
        validate_path(out)
    fixed = build(spools[:1], out, format="memmap_v1", splits="train=1", verify="full")
    assert fixed["written"] == 1
    assert validate_path(out)["num_shards"] == fixed["num_shards"]
