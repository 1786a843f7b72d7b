"""``packlab gc`` and the lock between two ``pack`` runs, with real writer processes.

A ``packlab pack`` is started for real and killed (SIGKILL, its process group: the pool
workers too) while it writes; gc removes what its writers left, and nothing else: not the
finished shards, not a temporary whose writer still runs, not anything in a directory a running
job holds. A second ``pack`` into an output directory another one is writing is refused in one
line, exit 2.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import as_a_terminal_job, one_error_line, run_cli, write_random_spool

from packlab.pipeline.dataset_record import read_dataset_record, writing_lock
from packlab.sources.validate import validate_path
from packlab.storage.files import is_temporary, process_running, temporary_owner, temporary_sibling

ROOT = Path(__file__).resolve().parents[1]


def start_pack(spool: Path, out: Path, *extra: str) -> subprocess.Popen:
    """``packlab pack`` in a process group of its own (so its pool workers can be signalled),
    at a lower priority than the test watching it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "packlab.cli", "pack", str(spool), str(out), "--format",
         "memmap_v1", "--pack-size", "512", "--bins-per-shard", "4", *extra],
        env=env, process_group=0, preexec_fn=as_a_terminal_job, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE)


def wait_for(process: subprocess.Popen, ready, what: str, timeout: float = 120) -> None:
    """Poll until ``ready()``; fail if the process ended first (the job was too small)."""
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            pytest.fail(f"the pack ended before {what} (exit {process.returncode}): "
                        f"{process.stderr.read().decode()[-2000:]}")
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(0.001)


def stop_when(process: subprocess.Popen, ready, what: str) -> None:
    """Stop the process group (SIGSTOP) at a moment ``ready()`` holds (checked once stopped:
    a temporary seen while running may have been renamed into place since)."""
    while True:
        wait_for(process, ready, what)
        os.killpg(process.pid, signal.SIGSTOP)
        time.sleep(0.05)  # every process of the group has stopped
        if ready():
            return
        os.killpg(process.pid, signal.SIGCONT)


def temporaries(root: Path) -> set[Path]:
    """The outermost temporaries under ``root``, listed while a writer may be renaming them
    (``os.walk`` passes over a folder that vanished between its listing and its scan)."""
    found: set[Path] = set()
    for folder, folders, files in os.walk(root):
        found.update(Path(folder) / name for name in [*folders, *files]
                     if is_temporary(Path(name)))
        folders[:] = [name for name in folders if not is_temporary(Path(name))]
    return found


def snapshot(root: Path) -> dict[str, str]:
    """Every file that is no temporary (nor inside one), with its content hash."""
    inside = temporaries(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*")
            if p.is_file() and p not in inside and not any(q in inside for q in p.parents)}


def wait_until_dead(pids: set[int | None], timeout: float = 30) -> None:
    """A SIGKILL is delivered at once, but the killed processes take a moment to exit (the
    pool's workers are the pack's children, not this process's): wait until none runs."""
    deadline = time.monotonic() + timeout
    while any(pid is not None and process_running(pid) for pid in pids):
        assert time.monotonic() < deadline, f"writers {sorted(pids)} still run after {timeout} s"
        time.sleep(0.01)


def dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.fixture(scope="module")
def spool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gc")
    return write_random_spool(root / "spool", num_sequences=4000, max_len=200, seed=3).path


def test_gc_removes_a_killed_writers_temporaries_and_nothing_else(spool, tmp_path,
                                                                  capsys) -> None:
    out = tmp_path / "out"
    pack = start_pack(spool, out, "--workers", "2")
    stop_when(pack, lambda: temporaries(out) and list(out.glob("shard_*.receipt.json")),
              "a temporary beside a finished shard")
    os.killpg(pack.pid, signal.SIGKILL)
    pack.wait()
    left = temporaries(out)
    assert left and all(p.name.startswith(".") for p in left)
    wait_until_dead({temporary_owner(p) for p in left})
    live = temporary_sibling(out / "shard_live")  # this process writes it: still running
    live.mkdir()
    (live / "input_ids.npy").write_bytes(b"partial")
    before = snapshot(out)
    assert any(name.endswith(".receipt.json") for name in before)  # finished shards are there

    code, stdout, _ = run_cli(capsys, "gc", out, "--dry-run", "--json")
    planned = json.loads(stdout)
    assert code == 0 and planned["dry_run"] is True
    assert {Path(p) for p in planned["removed"]} == left
    assert planned["kept"] == [{"path": str(live), "reason":
                                f"its writer (pid {os.getpid()}) is running"}]
    assert temporaries(out) == left | {live} and snapshot(out) == before  # nothing removed

    code, stdout, _ = run_cli(capsys, "gc", out)
    assert code == 0
    assert stdout.strip().splitlines() == [
        f"gc {out}: removed {len(left)} temporaries ({planned['bytes']:,} bytes); kept 1 in use"]
    assert temporaries(out) == {live}
    assert snapshot(out) == before  # every finished shard, receipt and manifest as it was
    live.rename(tmp_path / "elsewhere")

    assert read_dataset_record(out)["state"] == "writing"  # the same job run again finishes it
    finish = start_pack(spool, out, "--workers", "2")
    assert finish.wait(timeout=300) == 0, finish.stderr.read().decode()
    assert validate_path(out)["num_bins"] == read_dataset_record(out)["num_bins"]


def test_gc_leaves_a_directory_a_running_job_holds(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stale = out / f".shard_000000.parquet.tmp-{dead_pid()}-0123abcd"
    stale.write_bytes(b"half a shard")
    unnamed = out / ".shard_000001.parquet.tmp-by-someone"  # no writer id: never guessed at
    unnamed.write_bytes(b"?")
    with writing_lock(out):
        code, stdout, _ = run_cli(capsys, "gc", out, "--json")
        assert code == 0
        assert [k["reason"] for k in json.loads(stdout)["kept"]] == [
            "a packlab job is writing here"] * 2
        assert stale.exists()
    code, stdout, _ = run_cli(capsys, "gc", out, "--json")
    result = json.loads(stdout)
    assert result["removed"] == [str(stale)] and result["bytes"] == len(b"half a shard")
    assert result["kept"] == [{"path": str(unnamed), "reason": "no writer id in its name"}]
    assert not stale.exists() and unnamed.exists()


def test_a_second_pack_into_a_directory_being_written_is_refused(spool, tmp_path,
                                                                  capsys) -> None:
    out = tmp_path / "out"
    first = start_pack(spool, out, "--workers", "1")
    stop_when(first, lambda: (out / "dataset.json").is_file()
              and read_dataset_record(out)["state"] == "writing", "its dataset record")
    try:  # stopped, it holds its lock while the others try
        for options in ([], ["--pack-size", "1024"], ["--overwrite"]):
            argv = ["pack", spool, out, "--format", "memmap_v1", "--pack-size", "512",
                    "--bins-per-shard", "4", "--workers", "1", *options]
            code, _, err = run_cli(capsys, *argv)
            assert code == 2, options
            one_error_line(err, out, "another packlab job is writing here",
                           prefix="packlab pack: error:")
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert first.wait(timeout=300) == 0, first.stderr.read().decode()
    assert read_dataset_record(out)["state"] == "complete"
    assert validate_path(out)["num_shards"] == len(read_dataset_record(out)["shards"])


def test_gc_never_follows_a_link(tmp_path, capsys) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / f".shard_000000.parquet.tmp-{dead_pid()}-0123abcd"
    precious.write_bytes(b"not under OUT")
    out = tmp_path / "out"
    out.mkdir()
    (out / "linked").symlink_to(elsewhere)  # a link to a directory: not looked into
    stale_link = out / f".shard_000001.parquet.tmp-{dead_pid()}-89abcdef"
    stale_link.symlink_to(elsewhere)  # a killed writer's temporary that is a link: unlinked
    code, stdout, _ = run_cli(capsys, "gc", out, "--json")
    assert code == 0 and json.loads(stdout)["removed"] == [str(stale_link)]
    assert not stale_link.is_symlink() and precious.read_bytes() == b"not under OUT"
