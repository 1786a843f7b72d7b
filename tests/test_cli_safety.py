"""What the command line may replace, what it may write, and what it shows while it works:
--overwrite only over packlab's own output of the same kind (never a spool packed_index shards
read), query read-only unless --allow-writes, progress bars on a terminal only, help texts."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import one_error_line, run_cli, write_random_spool

from packlab.cli import main
from packlab.formats import format_names
from packlab.packing import pack
from packlab.pipeline.references import spool_users
from packlab.pipeline.shards import REPORT_EVERY, write_shard
from packlab.spool import SpoolReader

ROOT = Path(__file__).resolve().parents[1]
PACK = ["--pack-size", "256", "--bins-per-shard", "8", "--workers", "1"]


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    return write_random_spool(tmp_path / "chat", num_sequences=80, max_len=300, seed=6).path


def test_overwrite_replaces_packlabs_own_outputs(spool, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert run_cli(capsys, "pack", spool, out, "--format", "parquet", *PACK)[0] == 0
    code, _, err = run_cli(capsys, "pack", spool, out, "--format", "arrow_ipc", *PACK)
    assert code == 2
    one_error_line(err, out, "already holds another output", "--overwrite")
    code, _, err = run_cli(capsys, "pack", spool, out, "--format", "arrow_ipc", *PACK,
                           "--overwrite")
    assert code == 0, err
    assert not list(out.glob("*.parquet")) and list(out.glob("*.arrow"))
    (out / "my_notes.txt").write_text("kept\n")  # not the pipeline's: left alone
    assert run_cli(capsys, "pack", spool, out, "--format", "binidx", *PACK, "--overwrite")[0] == 0
    assert (out / "my_notes.txt").read_text() == "kept\n"
    assert run_cli(capsys, "validate", out)[0] == 0
    new = tmp_path / "spool2"
    assert run_cli(capsys, "synth", new, "-n", 10)[0] == 0
    assert run_cli(capsys, "synth", new, "-n", 12, "--overwrite")[0] == 0
    assert SpoolReader(new).num_sequences == 12
    corpus = tmp_path / "c.jsonl"
    assert run_cli(capsys, "corpus", corpus, "--records", 3)[0] == 0
    assert run_cli(capsys, "corpus", corpus, "--records", 4, "--overwrite")[0] == 0
    assert len(corpus.read_text().splitlines()) == 4


def test_an_empty_folder_may_be_written_into(spool, tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    assert run_cli(capsys, "pack", spool, tmp_path / "empty", "--format", "parquet",
                   *PACK)[0] == 0


def test_a_spool_that_packed_index_reads_is_never_replaced(spool, tmp_path, capsys) -> None:
    out = tmp_path / "byref"
    assert run_cli(capsys, "pack", spool, out, "--format", "packed_index", *PACK)[0] == 0
    assert spool_users(spool) == [out.resolve()]
    before = (spool / "tokens.bin").read_bytes()
    for argv in (["synth", spool, "-n", 5, "--overwrite"],):
        code, _, err = run_cli(capsys, *argv)
        assert code == 2
        one_error_line(err, spool, "still read this spool", out.resolve())
    assert (spool / "tokens.bin").read_bytes() == before
    layout = tmp_path / "layout"  # a layout's packed_index parts read it too
    assert run_cli(capsys, "pack", spool, layout, "--format", "packed_index", *PACK,
                   "--split", "train=0.5,valid=0.5")[0] == 0
    assert len(spool_users(spool)) == 3
    for path in [out, layout]:
        subprocess.run(["rm", "-rf", str(path)], check=True)
    assert spool_users(spool) == []  # outputs gone: the spool is free
    assert run_cli(capsys, "synth", spool, "-n", 5, "--overwrite")[0] == 0


def test_synth_over_a_file_leaves_nothing_behind(tmp_path, capsys) -> None:
    target = tmp_path / "x"
    target.write_text("a file\n")
    code, _, err = run_cli(capsys, "synth", target, "-n", 5, "--overwrite")
    assert code == 2
    one_error_line(err, target, "not a folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]  # no hidden temporary
    assert target.read_text() == "a file\n"


def test_query_is_read_only_unless_allowed(spool, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert run_cli(capsys, "pack", spool, out, "--format", "parquet", *PACK)[0] == 0
    before = sorted(p.name for p in out.iterdir())
    spills = set(Path(tempfile.gettempdir()).glob("packlab-query-*"))
    target = tmp_path / "bins.csv"
    copy = f"COPY (SELECT packed_len FROM bins) TO '{target}'"
    code, _, err = run_cli(capsys, "query", copy, "--data", out)
    assert code == 2 and not target.exists()
    one_error_line(err, "COPY statement", "--allow-writes")
    inside = f"COPY (SELECT 1) TO '{out}/shard_000000.parquet' (FORMAT parquet)"
    assert run_cli(capsys, "query", inside, "--data", out)[0] == 2
    assert sorted(p.name for p in out.iterdir()) == before
    assert run_cli(capsys, "validate", out)[0] == 0  # nothing was overwritten
    code, _, err = run_cli(capsys, "query", copy, "--data", out, "--allow-writes")
    assert code == 0, err
    bins = json.loads(run_cli(capsys, "inspect", out, "--json")[1])["num_bins"]
    assert len(target.read_text().splitlines()) == bins + 1
    assert set(Path(tempfile.gettempdir()).glob("packlab-query-*")) == spills  # cleaned up


def test_help_lists_formats_and_shows_defaults(capsys) -> None:
    assert main(["pack", "-h"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for name in format_names():
        assert name in text
    assert "validate -h" not in text
    assert re.search(r"--bins-per-shard BINS_PER_SHARD bins in each shard file; the last shard "
                     r"holds the rest \(default: 8192\)", text)


# -- progress ----------------------------------------------------------------------------------
def on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``packlab ARGV`` with stderr on a pseudo-terminal; exit status and what it drew."""
    leader, follower = pty.openpty()
    process = subprocess.Popen([sys.executable, "-m", "packlab.cli", *argv],
                               stdout=subprocess.DEVNULL, stderr=follower, env=env)
    os.close(follower)
    drawn = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            drawn += chunk
        elif process.poll() is not None:
            break
    os.close(leader)
    return process.wait(timeout=60), drawn.decode(errors="replace")


def frames(drawn: str) -> list[tuple[str, str]]:
    """``(done, total)`` of every frame of the bars drawn (tqdm scales large counts: 17.5k)."""
    return re.findall(r"([\d.]+k?)/([\d.]+k?) \[", drawn)


def test_progress_on_a_terminal_quiet_in_ci_and_in_pipes(tmp_path) -> None:
    spool = write_random_spool(tmp_path / "chat", num_sequences=30000, max_len=120, seed=2).path
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    out = tmp_path / "out"
    code, drawn = on_a_terminal(["pack", str(spool), str(out), "--format", "parquet",
                                 "--pack-size", "128", "--bins-per-shard", "100000",
                                 "--workers", "2"], env)
    assert code == 0, drawn
    seen = frames(drawn)
    assert "bin/s" in drawn and re.search(r"\[\d\d:\d\d<\d\d:\d\d", drawn), drawn  # rate, ETA
    assert any(done not in ("0", "0.00", total) for done, total in seen), seen  # one shard,
    # yet the bar moved through it: per bin, not per shard
    many = tmp_path / "many"  # validate counts bins shard by shard
    assert main(["pack", str(spool), str(many), "--format", "parquet", "--pack-size", "128",
                 "--bins-per-shard", "300", "--workers", "2"]) == 0
    code, drawn = on_a_terminal(["validate", str(many)], env)
    totals = {total for _, total in frames(drawn)}
    assert code == 0 and "bin/s" in drawn and len(totals) == 1, drawn  # bins, all of them
    code, drawn = on_a_terminal(["validate", str(out)], {**env, "CI": "true"})
    assert code == 0 and "bin/s" not in drawn and not frames(drawn)
    piped = subprocess.run([sys.executable, "-m", "packlab.cli", "validate", str(out)],
                           env=env, capture_output=True, text=True)
    assert piped.returncode == 0 and piped.stderr == ""


def test_bench_throughput_reads_the_first_bins_in_training_order_and_its_bar_moves(
        spool, tmp_path, capsys) -> None:
    """The DataLoader part reads --max-bins bins per worker count (2000 by default, shown in
    --help), block-shuffled over Parquet's row groups (--sampler auto); on a terminal the bar
    counts the scan and each worker count's epoch, and is seen between its ends."""
    out = tmp_path / "out"
    assert run_cli(capsys, "pack", spool, out, "--format", "parquet", *PACK)[0] == 0
    code, text, _ = run_cli(capsys, "bench", "throughput", out, "--workers", "0",
                            "--max-bins", "5", "--json")
    loader = json.loads(text)["dataloader"]
    assert code == 0 and set(loader["workers"]) == {"0"} and loader["num_bins"] == 5
    assert loader["workers"]["0"]["sampler"] == "block"
    _, helped, _ = run_cli(capsys, "bench", "-h")
    assert "(default: 2000)" in helped and "(default: 0 2)" in helped
    env = {**{k: v for k, v in os.environ.items() if k != "CI"}, "PYTHONPATH": str(ROOT)}
    code, drawn = on_a_terminal(["bench", "throughput", str(out), "--workers", "0", "1"], env)
    seen = [(float(done), float(total)) for done, total in frames(drawn)]
    assert code == 0 and {total for _, total in seen} == {3.0}, drawn  # scan + two epochs
    # seen between its ends (a step quicker than the bar's refresh interval may go undrawn)
    assert any(0 < done < 3 for done, _ in seen), seen


def test_a_shard_job_reports_its_bins_as_it_goes(tmp_path) -> None:
    spool = write_random_spool(tmp_path / "chat", num_sequences=400, max_len=100, seed=3)
    assignment, _ = pack(spool.lengths, 128, algorithm="next_fit")

    class Heard(list):
        def put(self, n: int) -> None:
            self.append(n)

    heard = Heard()
    receipt = write_shard(str(spool.path), assignment, 0, str(tmp_path / "s.parquet"),
                          "parquet", False, {}, heard)
    assert sum(heard) == receipt["num_bins"] == assignment.num_bins
    assert len(heard) == receipt["num_bins"] // REPORT_EVERY + 1
