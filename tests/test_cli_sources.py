"""One notion of a dataset: every kind of path (a shard, a directory of shards, a glob, a list,
a layout root with --split, ROOT/splits/NAME, a run folder, a Nemotron-style output) is read
alike by open_dataset and by every command that reads (validate, inspect, bench size, query,
convert)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli, write_random_spool

from packlab import open_dataset
from packlab.errors import FormatError
from packlab.loading.dataset import bin_digests
from packlab.pipeline.dataset_record import DATASET_RECORD
from packlab.sources import resolve_source

SPLITS = "train=0.75,valid=0.25"
PACK = ["--pack-size", "256", "--bins-per-shard", "6", "--workers", "1"]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sources")
    chat = write_random_spool(root / "chat", num_sequences=90, max_len=200, seed=1).path
    code = write_random_spool(root / "code", num_sequences=60, max_len=200, seed=2).path
    from packlab.cli import main

    assert main(["pack", str(chat), str(root / "flat"), "--format", "parquet", *PACK]) == 0
    assert main(["pack", str(chat), str(code), str(root / "layout"), "--format", "parquet",
                 *PACK, "--split", SPLITS]) == 0
    nemotron = root / "nemotron"  # Nemotron's output directory: shards beside spool/
    nemotron.mkdir()
    for shard in sorted((root / "flat").glob("shard_*.parquet")):
        shutil.copy(shard, nemotron / shard.name)
    shutil.copytree(chat, nemotron / "spool" / "shard_000000")
    return {"root": root, "chat": chat, "flat": root / "flat", "layout": root / "layout",
            "nemotron": nemotron}


def run_folder(layout: Path) -> Path:
    return next((layout / "runs").iterdir())


def test_every_kind_of_path_names_the_same_bins(outputs) -> None:
    flat, layout = outputs["flat"], outputs["layout"]
    want = bin_digests(open_dataset(flat))
    shards = sorted(flat.glob("*.parquet"))
    assert bin_digests(open_dataset(str(flat / "*.parquet"))) == want
    assert bin_digests(open_dataset([str(s) for s in shards])) == want
    assert bin_digests(open_dataset(outputs["nemotron"])) == want
    assert bin_digests(open_dataset(shards[0])) == want[:6]
    for split in ("train", "valid"):
        by_root = bin_digests(open_dataset(layout, split=split))
        assert bin_digests(open_dataset(layout / "splits" / split)) == by_root
        assert bin_digests(open_dataset(run_folder(layout), split=split)) == by_root
        assert bin_digests(open_dataset(layout / "runs", split=split)) == by_root
    with pytest.raises(FormatError, match="open one split .*train, valid"):
        open_dataset(layout)
    with pytest.raises(FormatError, match="a run folder: open one split"):
        open_dataset(run_folder(layout))
    kinds = {p: resolve_source(p).kind for p in (flat, shards[0], layout, run_folder(layout),
                                                  layout / "splits" / "train")}
    assert list(kinds.values()) == ["directory", "shard", "layout", "run", "split"]


@pytest.mark.parametrize("where", ["flat", "nemotron", "glob", "layout", "split", "runs",
                                   "layout:valid", "runs:train"])
def test_every_reading_command_takes_every_kind_of_path(outputs, tmp_path, capsys,
                                                        where) -> None:
    name, _, split = where.partition(":")
    path = {"flat": outputs["flat"], "nemotron": outputs["nemotron"],
            "glob": f"{outputs['flat']}/shard_00000[0-2].parquet", "layout": outputs["layout"],
            "split": outputs["layout"] / "splits" / "valid",
            "runs": outputs["layout"] / "runs"}[name]
    opt = ["--split", split] if split else []
    code, out, err = run_cli(capsys, "validate", path, *opt, "--json")
    assert code == 0, err
    checked = json.loads(out)
    code, out, err = run_cli(capsys, "inspect", path, *opt, "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["num_bins"] == checked["num_bins"] and info["num_tokens"] == checked["num_tokens"]
    code, out, err = run_cli(capsys, "bench", "size", path, *opt, "--json")
    assert code == 0, err
    assert json.loads(out)["num_bins"] == checked["num_bins"]
    code, out, err = run_cli(capsys, "query", "SELECT count(*) AS n, sum(packed_len) AS t "
                             "FROM bins", "--data", path, *opt, "--format", "json")
    assert code == 0, err
    assert json.loads(out)["rows"] == [{"n": checked["num_bins"], "t": checked["num_tokens"]}]
    if len(checked.get("splits", {})) > 1:  # several splits: convert wants one
        code, _, err = run_cli(capsys, "convert", path, tmp_path / "c", "--format", "arrow_ipc")
        assert code == 2 and "one split" in err
        return
    code, _, err = run_cli(capsys, "convert", path, tmp_path / "c", "--format", "arrow_ipc",
                           *opt)
    assert code == 0, err
    assert bin_digests(open_dataset(tmp_path / "c")) == bin_digests(
        open_dataset(str(path), split=split or None))
    assert run_cli(capsys, "validate", tmp_path / "c")[0] == 0


def test_a_converted_folder_is_a_dataset_like_a_packed_one(outputs, tmp_path, capsys) -> None:
    out = tmp_path / "c"
    assert run_cli(capsys, "convert", outputs["flat"], out, "--format", "binidx")[0] == 0
    manifest = json.loads((out / DATASET_RECORD).read_text())
    assert manifest["state"] == "complete" and manifest["format"] == "binidx"
    assert [s["name"] for s in manifest["shards"]] == sorted(
        p.name for p in out.iterdir() if p.name.startswith("shard_") and
        not p.name.endswith(".json"))
    shutil.rmtree(out / manifest["shards"][0]["name"])  # a missing shard is refused
    code, _, err = run_cli(capsys, "validate", out)
    assert code == 2 and "missing" in err
    code, _, err = run_cli(capsys, "convert", outputs["flat"], out, "--format", "binidx",
                           "--overwrite")  # its own output: replaceable
    assert code == 0, err
    assert run_cli(capsys, "validate", out)[0] == 0


def test_a_shard_named_alone_must_be_in_its_finished_dataset(outputs, tmp_path) -> None:
    out = tmp_path / "flat"
    shutil.copytree(outputs["flat"], out)
    shard = sorted(out.glob("*.parquet"))[0]
    manifest = json.loads((out / DATASET_RECORD).read_text())
    (out / DATASET_RECORD).write_text(json.dumps({**manifest, "state": "writing"}))
    for path in (shard, str(out / "*.parquet")):
        with pytest.raises(FormatError, match="incomplete output"):
            open_dataset(path)
    (out / DATASET_RECORD).write_text(json.dumps(manifest))
    stray = out / "shard_999999.parquet"
    shutil.copy(shard, stray)
    with pytest.raises(FormatError, match="not listed in"):
        open_dataset(stray)


def test_layout_counts_dropped_sequences_apart(tmp_path, capsys) -> None:
    spool = write_random_spool(tmp_path / "chat", num_sequences=80, max_len=300, seed=4)
    code, out, err = run_cli(capsys, "pack", spool.path, tmp_path / "out", "--format", "parquet",
                             "--pack-size", 128, "--split", "train=0.5,valid=0.5",
                             "--overlong", "drop", "--json")
    assert code == 0, err
    result = json.loads(out)
    lengths = spool.lengths
    dropped = int((lengths > 128).sum())
    assert dropped > 0
    assert sum(s["dropped_sequences"] for s in result["splits"].values()) == dropped
    assert sum(s["num_sequences"] for s in result["splits"].values()) == 80 - dropped
    blend = json.loads((tmp_path / "out" / "blend.json").read_text())
    seqs = sum(len(item["seq_boundaries"]) - 1 for split in blend["splits"]
               for item in open_dataset(tmp_path / "out", split=split))
    assert seqs == 80 - dropped


@pytest.mark.parametrize("format", ["parquet", "megatron_sft"])
def test_a_shard_converts_into_a_bare_name_in_the_working_folder(outputs, tmp_path, capsys,
                                                                  monkeypatch, format) -> None:
    """``convert SHARD one.parquet`` in the folder it runs in: one shard, there (a Parquet
    stream to a name with no folder once asked pyarrow to make the folder '')."""
    shard = sorted(outputs["flat"].glob("shard_*.parquet"))[0]
    monkeypatch.chdir(tmp_path)
    name = "one.parquet" if format == "parquet" else "one.sft"
    code, _, err = run_cli(capsys, "convert", shard, name, "--format", format)
    assert code == 0, err
    written = tmp_path / ("one.parquet" if format == "parquet" else "one.sft.idx")
    assert written.is_file()
    assert bin_digests(open_dataset(name)) == bin_digests(open_dataset(shard))
