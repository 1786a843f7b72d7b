"""`packlab synth` and `packlab inspect`: exit codes, JSON, one-line errors naming the path."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import one_error_line, run_cli, write_empty_spool

from packlab.cli import main
from packlab.packing import pack
from packlab.packing.materialize import iter_bins
from packlab.sources import open_writer
from packlab.spool import SPOOL_RECORD, SpoolReader
from packlab.spool.synth import synthesize


@pytest.fixture
def chat_spool(tmp_path: Path) -> SpoolReader:
    return synthesize(tmp_path / "chat", num_sequences=300, seed=3)


# -- synth -----------------------------------------------------------------------------------


def test_synth_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_dir = tmp_path / "s"
    code, out, err = run_cli(capsys, "synth", str(out_dir), "--num-sequences", "250",
                          "--profile", "short", "--seed", "9", "--json")
    assert code == 0, err
    summary = json.loads(out)
    reader = SpoolReader(out_dir)
    assert summary["num_sequences"] == 250 == reader.num_sequences
    assert summary["num_tokens"] == reader.num_tokens
    assert summary["bytes_on_disk"] == sum(p.stat().st_size for p in out_dir.iterdir())
    assert summary["profile"] == "short" and summary["seed"] == 9
    assert summary["seconds"] >= 0
    assert reader.record["source"]["profile"] == "short"


def test_synth_table_and_vocab(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "synth", str(tmp_path / "s"), "-n", "40", "--profile", "uniform",
                        "--vocab-size", "300")
    assert code == 0
    rows = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert rows["num_sequences"] == "40" and rows["vocab_size"] == "300"
    assert int(np.asarray(SpoolReader(tmp_path / "s").tokens).max()) < 300


def test_synth_refuses_to_overwrite_unless_asked(chat_spool: SpoolReader,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = (chat_spool.path / "tokens.bin").read_bytes()
    code, out, err = run_cli(capsys, "synth", str(chat_spool.path), "-n", "10")
    assert code == 2 and out == ""
    one_error_line(err, chat_spool.path, "already exists")
    assert (chat_spool.path / "tokens.bin").read_bytes() == before
    code, _, _ = run_cli(capsys, "synth", str(chat_spool.path), "-n", "10", "--overwrite")
    assert code == 0 and SpoolReader(chat_spool.path).num_sequences == 10


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-n", "0"], "argument --num-sequences/-n: expected a positive integer, got 0"),
        (["-n", "-5"], "argument --num-sequences/-n: expected a positive integer, got -5"),
        (["-n", "10", "--vocab-size", "10"], "--vocab-size must be an integer in [256"),
        (["-n", "10", "--vocab-size", "-1", "--profile", "uniform"],
         "argument --vocab-size: expected a positive integer, got -1"),
        (["-n", "10", "--seed", "-2"], "argument --seed: expected an integer >= 0, got -2"),
    ],
)
def test_synth_bad_counts_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 args: list[str], message: str) -> None:
    out_dir = tmp_path / "s"
    code, out, err = run_cli(capsys, "synth", str(out_dir), *args)
    assert code == 2 and out == ""
    one_error_line(err, message)
    assert list(tmp_path.iterdir()) == []  # nothing left behind, not even a temporary


def test_synth_unknown_profile_is_a_usage_error(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["synth", str(tmp_path / "s"), "-n", "5", "--profile", "nope"]) == 2
    one_error_line(capsys.readouterr().err, "invalid choice: 'nope'", "--profile")


# -- inspect: spools -------------------------------------------------------------------------


def test_inspect_spool_json(chat_spool: SpoolReader, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "inspect", str(chat_spool.path), "--json")
    assert code == 0, err
    info = json.loads(out)
    lengths = np.asarray(chat_spool.lengths, dtype=np.int64)
    assert info["format"] == "spool_v1"
    assert info["num_sequences"] == 300 and info["num_tokens"] == int(lengths.sum())
    assert info["length_mean"] == pytest.approx(lengths.mean())
    assert info["length_p50"] == pytest.approx(np.percentile(lengths, 50))
    assert info["length_p99"] == pytest.approx(np.percentile(lengths, 99))
    assert info["length_max"] == int(lengths.max())
    assert info["mask_fraction"] == pytest.approx(float(np.asarray(chat_spool.masks).mean()))
    on_disk = sum(p.stat().st_size for p in chat_spool.path.iterdir())
    assert info["bytes_on_disk"] == on_disk == sum(info["files"].values())
    assert info["bytes_per_token"] == pytest.approx(on_disk / info["num_tokens"])
    assert info["source"]["profile"] == "chat"


def test_inspect_spool_table(chat_spool: SpoolReader, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "inspect", str(chat_spool.path))
    assert code == 0
    rows = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert rows["format"] == "spool_v1" and rows["num_sequences"] == "300"
    assert int(rows["files.tokens.bin"]) == 4 * chat_spool.num_tokens


def _broken(chat_spool: SpoolReader, tmp_path: Path) -> Path:
    path = tmp_path / "broken"
    shutil.copytree(chat_spool.path, path)
    return path


def test_inspect_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "inspect", str(tmp_path / "missing"), "--json")
    assert code == 2 and json.loads(out)["error"] == one_error_line(err, tmp_path / "missing")


def test_inspect_truncated_tokens(chat_spool: SpoolReader, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = _broken(chat_spool, tmp_path)
    with open(path / "tokens.bin", "r+b") as f:
        f.truncate(1000)
    code, out, err = run_cli(capsys, "inspect", str(path), "--json")
    line = one_error_line(err, path / "tokens.bin", "truncated")
    assert code == 2 and json.loads(out) == {"error": line, "exit_code": 2}
    assert "int32 values" in line and "<i4" not in line


def test_inspect_empty_spool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_empty_spool(tmp_path / "empty")
    code, out, err = run_cli(capsys, "inspect", str(path))
    assert code == 2 and out == ""
    one_error_line(err, path, "empty spool")


def test_inspect_spool_without_manifest(chat_spool: SpoolReader, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    path = _broken(chat_spool, tmp_path)
    (path / SPOOL_RECORD).unlink()
    code, _, err = run_cli(capsys, "inspect", str(path))
    assert code == 2
    one_error_line(err, path / SPOOL_RECORD, "missing")


def test_inspect_bad_manifest(chat_spool: SpoolReader, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    path = _broken(chat_spool, tmp_path)
    (path / SPOOL_RECORD).write_text("{truncated")
    code, _, err = run_cli(capsys, "inspect", str(path))
    assert code == 2
    one_error_line(err, path / SPOOL_RECORD)


@pytest.mark.parametrize("make", ["empty_dir", "junk_file"])
def test_inspect_unknown_things(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                make: str) -> None:
    path = tmp_path / make
    if make == "empty_dir":
        path.mkdir()
    else:
        path.write_bytes(b"not a shard at all")
    code, out, err = run_cli(capsys, "inspect", str(path))
    assert code == 2 and out == ""
    one_error_line(err, path)


# -- inspect: shards -------------------------------------------------------------------------


def test_inspect_a_shard(chat_spool: SpoolReader, tmp_path: Path,
                         capsys: pytest.CaptureFixture[str]) -> None:
    assignment, _ = pack(chat_spool.lengths, 4096, algorithm="next_fit", seed=0)
    shard = tmp_path / "shard"
    with open_writer("binidx", shard, pack_size=4096, num_bins=assignment.num_bins) as writer:
        for packed in iter_bins(chat_spool, assignment):
            writer.write(packed)
    code, out, err = run_cli(capsys, "inspect", str(shard), "--json")
    assert code == 0, err
    info = json.loads(out)
    assert info["format"] == "binidx" and info["num_bins"] == assignment.num_bins
    assert info["pack_size"] == 4096
    assert info["num_tokens"] == int(np.minimum(chat_spool.lengths, 4096).sum())
    assert info["bytes_on_disk"] == sum(p.stat().st_size for p in shard.iterdir())


# -- the installed command -------------------------------------------------------------------


def test_the_command_line_entry_point(tmp_path: Path) -> None:
    """The real process: exit codes and exactly one line on stderr."""
    exe = [sys.executable, "-m", "packlab.cli"]
    ok = subprocess.run([*exe, "synth", str(tmp_path / "s"), "-n", "50", "--json"],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["num_sequences"] == 50
    bad = subprocess.run([*exe, "inspect", str(tmp_path / "nope")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    one_error_line(bad.stderr, tmp_path / "nope")
