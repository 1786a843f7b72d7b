"""``packlab pack`` interrupted at random points (SIGINT as a terminal's Ctrl-C sends it, and
SIGKILL, to the whole process group): every time, ``validate`` and ``open_dataset`` refuse
the output, the same command finishes it, and the result is byte for byte the output of an
uninterrupted run (receipts aside from their timing), with no temporary left behind."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import write_random_spool

from packlab import open_dataset
from packlab.cli import main
from packlab.errors import PacklabError

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

SEED = 20261121
TIMES = 10
ROOT = Path(__file__).resolve().parents[1]
FLAT = ["--pack-size", "256", "--bins-per-shard", "12", "--workers", "2"]


def tree(directory: Path) -> dict[str, object]:
    """Every entry's content (links by target; receipts without their timing)."""
    out: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            out[key] = os.readlink(path)
        elif path.is_file():
            data = path.read_bytes()
            if path.name.endswith(".receipt.json"):
                data = {k: v for k, v in json.loads(data).items() if k != "seconds"}
            out[key] = data
    return out


def command(spool: Path, out: Path, format: str, extra: list[str]) -> list[str]:
    return ["pack", str(spool), str(out), "--format", format, *extra]


def interrupted(argv: list[str], delay: float, sig: int) -> int:
    """Run ``packlab ARGV`` in a process group of its own; ``sig`` to the group after
    ``delay`` seconds; its exit status (0: it finished first)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "packlab.cli", *argv], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               start_new_session=True)
    time.sleep(delay)
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
    status = process.wait(timeout=60)
    err = process.stderr.read().decode()
    process.stderr.close()
    assert "Traceback" not in err, err
    assert status in (0, 130, -signal.SIGINT, -signal.SIGKILL), (status, err)
    return status


def refused(out: Path, capsys: pytest.CaptureFixture[str]) -> str | None:
    """``validate`` exits 2 with one line naming OUT, and ``open_dataset`` refuses too; None
    when the job had finished after all (the signal came as the process was exiting)."""
    code = main(["validate", str(out)])
    err = capsys.readouterr().err
    if code == 0:
        return None
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(out) in err
    with pytest.raises(PacklabError):
        open_dataset(out)
    return err


def timeline(argv: list[str], out: Path) -> tuple[float, float]:
    """When, in an uninterrupted run, the first file appears in OUT (writing starts) and when
    the run ends: the window the interruptions are drawn from (mostly mid-write)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    began = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "packlab.cli", *argv], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first = None
    while process.poll() is None:
        if first is None and out.is_dir() and any(out.iterdir()):
            first = time.perf_counter() - began
        time.sleep(0.005)
    assert process.returncode == 0
    end = time.perf_counter() - began
    return (first if first is not None else 0.5 * end), end


def test_pack_interrupted_at_random_points_resumes_to_the_same_bytes(tmp_path, capsys) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=1500, max_len=300,
                               seed=9).path
    rng = random.Random(SEED)
    formats = ["parquet", "memmap_v1"]  # a one-file format and a directory format
    # each format's own window: their writers differ in speed (Parquet compresses harder)
    window = {name: timeline(command(spool, tmp_path / f"timed-{name}", name, FLAT),
                             tmp_path / f"timed-{name}") for name in formats}
    reference = {}
    for name in formats:
        assert main(command(spool, tmp_path / f"ref-{name}", name, FLAT)) == 0
        reference[name] = tree(tmp_path / f"ref-{name}")
    capsys.readouterr()
    done = attempts = 0
    seen = set()
    missed: list[tuple[str, float, int]] = []
    while done < TIMES:
        attempts += 1
        assert attempts <= 4 * TIMES, ("the command always finished before the signal", window,
                                       missed)
        name = formats[done % 2]
        sig = (signal.SIGINT, signal.SIGKILL)[(done // 2) % 2]
        out = tmp_path / f"run{attempts}"
        argv = command(spool, out, name, FLAT)
        start, end = window[name]
        delay = rng.uniform(0.8 * start, 0.85 * end)
        status = interrupted(argv, delay, sig)
        if status == 0:  # finished before the signal: not an interruption; the machine's
            missed.append((name, delay, status))  # load changed, so time the window again
            timed = tmp_path / f"timed{attempts}"
            window[name] = timeline(command(spool, timed, name, FLAT), timed)
            continue
        # 130: it reported the interruption; -SIGINT: the signal came as it was exiting
        assert status in (130, -signal.SIGINT, -signal.SIGKILL), status
        why = refused(out, capsys)
        if why is None:
            missed.append((name, delay, status))
            continue  # the job had finished: the signal came as it was exiting
        seen.add(why.split(": ", 2)[-1].split(" (")[0])
        assert main(argv) == 0  # the same command finishes the job
        capsys.readouterr()
        assert tree(out) == reference[name]  # (the reference validates: checked below)
        done += 1
    assert all(main(["validate", str(tmp_path / f"ref-{n}")]) == 0 for n in formats)
    capsys.readouterr()
    assert any("incomplete output" in w for w in seen), seen  # some came mid-write


def test_an_interrupted_layout_is_refused_until_the_same_pack_finishes_it(tmp_path,
                                                                         capsys) -> None:
    spools = [write_random_spool(tmp_path / n, num_sequences=800, max_len=300, seed=s).path
              for n, s in (("chat", 1), ("code", 2))]
    extra = [*FLAT, "--split", "train=0.9,valid=0.1"]
    ref = tmp_path / "ref"
    argv = ["pack", *map(str, spools), str(ref), "--format", "parquet", *extra]
    start, end = timeline(argv, ref)
    rng = random.Random(SEED + 1)
    done = attempts = 0
    while done < 2:
        attempts += 1
        assert attempts <= 12, "the command always finished before the signal"
        out = tmp_path / f"run{attempts}"
        argv = ["pack", *map(str, spools), str(out), "--format", "parquet", *extra]
        status = interrupted(argv, rng.uniform(start, 0.85 * end), signal.SIGKILL)
        if status == 0:
            continue
        if main(["validate", str(out)]) == 0:
            continue  # it had finished: the signal came as it was exiting
        for call in (["inspect", str(out)], ["query", "SELECT 1", "--data", str(out)]):
            assert main(call) == 2
        errors = capsys.readouterr().err.strip().splitlines()
        assert len(errors) == 3
        if (out / "blend.json").exists():
            assert all("incomplete output" in e for e in errors), errors
        assert main(argv) == 0
        capsys.readouterr()
        assert tree(out) == tree(ref)
        done += 1
