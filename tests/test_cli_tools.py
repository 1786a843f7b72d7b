"""`packlab pack / convert / validate`: exit codes, output, and damaged shards caught in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import one_error_line, run_cli, write_random_spool

from packlab import open_dataset
from packlab.cli import main
from packlab.formats import format_names, get_format
from packlab.loading.discovery import find_shards
from packlab.pipeline.receipts import RECEIPT_SUFFIX

FORMATS = format_names()
TARGETS = [name for name in FORMATS if not get_format(name).Writer.NEEDS_SPOOL]


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    write_random_spool(root / "spool", num_sequences=90, max_len=300, seed=3)
    return root / "spool"


@pytest.fixture(scope="module")
def packed_dirs(spool: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("packed")
    out = {}
    for name in FORMATS:
        code = main(["pack", str(spool), str(root / name), "--format", name, "--pack-size",
                     "512", "--bins-per-shard", "8", "--workers", "2"])
        assert code == 0
        out[name] = root / name
    return out


def test_pack_json_reports_the_plan_and_the_shards(spool, tmp_path, capsys) -> None:
    code, out, _ = run_cli(capsys, "pack", spool, tmp_path / "o", "--format", FORMATS[0],
                       "--pack-size", 700, "--algorithm", "first_fit_decreasing",
                       "--bins-per-shard", 5, "--workers", 2, "--json")
    assert code == 0
    result = json.loads(out)
    plan = result["plan"]
    for key in ("num_sequences", "num_tokens", "pack_size", "num_bins", "lower_bound_bins",
                "efficiency", "dropped", "truncated", "seconds"):
        assert key in plan
    assert plan["num_sequences"] == 90 and plan["pack_size"] == 700
    assert result["written"]["num_bins"] == plan["num_bins"] == len(open_dataset(tmp_path / "o"))
    assert result["written"]["num_shards"] == len(result["shards"]) == -(-plan["num_bins"] // 5)
    code, out, _ = run_cli(capsys, "pack", spool, tmp_path / "p", "--format", FORMATS[0],
                       "--pack-size", 100, "--overlong", "drop")
    assert code == 0 and "dropped" in out and "num_shards" in out


@pytest.mark.parametrize("argv, names", [
    (["pack", "{tmp}/missing", "{tmp}/o", "--format", "parquet", "--pack-size", "64"], "missing"),
    (["pack", "{spool}", "{tmp}/o", "--format", "nope", "--pack-size", "64"], "nope"),
    (["pack", "{spool}", "{tmp}/o", "--format", "parquet", "--pack-size", "0"], "--pack-size"),
    (["pack", "{spool}", "{tmp}/o", "--format", "parquet", "--pack-size", "64",
      "--algorithm", "magic"], "magic"),
    (["pack", "{spool}", "{tmp}/o", "--format", "parquet", "--pack-size", "8", "--workers", "0"],
     "--workers"),
    (["convert", "{tmp}/missing", "{tmp}/o", "--format", "parquet"], "missing"),
    (["validate", "{tmp}/missing"], "missing"),
    (["validate", "{spool}", "--split", "train"], "a spool (spool_v1), not packed shards"),
])
def test_errors_in_use_exit_2_with_one_line(argv, names, spool, tmp_path, capsys) -> None:
    args = [a.format(tmp=tmp_path, spool=spool) for a in argv]
    code, _, err = run_cli(capsys, *args)
    assert code == 2
    one_error_line(err, names)


def test_pack_refuses_to_mix_with_existing_shards(spool, packed_dirs, capsys) -> None:
    name = FORMATS[0]
    code, _, err = run_cli(capsys, "pack", spool, packed_dirs[name], "--format", name,
                       "--pack-size", 512, "--bins-per-shard", 9)
    assert code == 2
    one_error_line(err, "already holds another output")
    code, _, err = run_cli(capsys, "pack", spool, packed_dirs[name], "--format", name,
                       "--pack-size", 512, "--bins-per-shard", 8)  # the job that wrote it
    assert code == 0, err


@pytest.mark.parametrize("name", FORMATS)
def test_validate_accepts_whole_shards(name, packed_dirs, capsys) -> None:
    code, out, err = run_cli(capsys, "validate", packed_dirs[name])
    assert code == 0, err
    shards = find_shards(packed_dirs[name])
    assert out.count("ok ") == len(shards) > 1 and "record+receipt" in out
    code, out, _ = run_cli(capsys, "validate", shards[0][0], "--json")
    assert code == 0 and json.loads(out)["num_shards"] == 1


def test_convert_prints_sizes_before_and_after(packed_dirs, tmp_path, capsys) -> None:
    src = packed_dirs[FORMATS[0]]
    target = TARGETS[-1]
    code, out, _ = run_cli(capsys, "convert", src, tmp_path / "c", "--format", target)
    assert code == 0
    assert "total:" in out and " B -> " in out and "B/token" in out
    assert len(open_dataset(tmp_path / "c")) == len(open_dataset(src))
    code, out, _ = run_cli(capsys, "validate", tmp_path / "c")
    assert code == 0
    one = find_shards(src)[0][0]
    code, out, _ = run_cli(capsys, "convert", one, tmp_path / "single", "--format", target, "--json")
    assert code == 0 and json.loads(out)["bytes_after"] > 0
    code, _, err = run_cli(capsys, "convert", one, tmp_path / "single", "--format", target)
    assert code == 2
    one_error_line(err, "already exists")


def victim(shard: Path) -> Path:
    """The file of a shard to damage: the shard itself, or its largest data file."""
    if shard.is_file():
        return shard
    files = [p for p in shard.rglob("*") if p.is_file() and p.name != "manifest.json"]
    return max(files, key=lambda p: (p.stat().st_size, p.name))


def damaged_copy(src: Path, dst: Path, how: str, *, receipts: bool) -> Path:
    """Copy a shard directory, damage its second shard; return that shard's path."""
    shutil.copytree(src, dst, symlinks=False)
    if not receipts:
        for receipt in dst.glob(f"*{RECEIPT_SUFFIX}"):
            receipt.unlink()
    shard = find_shards(dst)[1][0]
    target = victim(shard)
    data = bytearray(target.read_bytes())
    if how == "truncate":
        data = data[: len(data) * 2 // 3]
    else:
        data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    return shard


@pytest.mark.parametrize("how", ["truncate", "bitflip"])
@pytest.mark.parametrize("name", FORMATS)
def test_validate_catches_a_damaged_shard_of_every_format(name, how, packed_dirs, tmp_path,
                                                          capsys) -> None:
    shard = damaged_copy(packed_dirs[name], tmp_path / "d", how, receipts=True)
    code, out, err = run_cli(capsys, "validate", tmp_path / "d")
    assert code == 2, out
    one_error_line(err, str(shard))


@pytest.mark.parametrize("name", FORMATS)
def test_validate_catches_truncation_from_the_format_alone(name, packed_dirs, tmp_path,
                                                           capsys) -> None:
    """No receipts: the shard's own manifest, footer or structure must reveal the damage."""
    shard = damaged_copy(packed_dirs[name], tmp_path / "d", "truncate", receipts=False)
    code, out, err = run_cli(capsys, "validate", tmp_path / "d")
    assert code == 2, out
    one_error_line(err, str(shard))


def test_validate_notices_a_shard_missing_beside_its_receipt(packed_dirs, tmp_path,
                                                             capsys) -> None:
    shutil.copytree(packed_dirs[FORMATS[0]], tmp_path / "d")
    shard = find_shards(tmp_path / "d")[1][0]
    shutil.rmtree(shard) if shard.is_dir() else shard.unlink()
    code, _, err = run_cli(capsys, "validate", tmp_path / "d")
    assert code == 2
    one_error_line(err, f"{shard}: missing")
