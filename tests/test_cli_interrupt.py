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

import psutil
import pytest
from conftest import as_a_terminal_job, write_random_spool

from packlab import open_dataset
from packlab.cli import main
from packlab.errors import PacklabError

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

SEED = 20261121
TIMES = 6  # interruptions: both formats, SIGINT and SIGKILL each, mid-write
ROOT = Path(__file__).resolve().parents[1]
FLAT = ["--pack-size", "256", "--bins-per-shard", "12", "--workers", "2"]


def tree(directory: Path) -> dict[str, object]:
    """Every entry's content, receipts included (links by target)."""
    out: dict[str, object] = {}
    for path in sorted(directory.rglob("*")):
        key = str(path.relative_to(directory))
        if path.is_symlink():
            out[key] = os.readlink(path)
        elif path.is_file():
            out[key] = path.read_bytes()
    return out


def command(spool: Path, out: Path, format: str, extra: list[str]) -> list[str]:
    return ["pack", str(spool), str(out), "--format", format, *extra]


def entries(out: Path) -> int:
    """How many files and folders OUT holds now (a writer renames as we walk: tolerated)."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(out))


def interrupted(argv: list[str], out: Path, at: int, sig: int,
                workers: list[psutil.Process] | None = None,
                outlived: list[psutil.Process] | None = None) -> int:
    """Run ``packlab ARGV`` in a process group of its own; ``sig`` to the group once OUT holds
    ``at`` entries (progress, not time: a loaded machine only slows both); its exit status
    (0: it finished first). Given a ``workers`` list, ``sig`` goes to the command alone, as
    ``kill PID`` or ``timeout`` sends it; the list gets the command's children then, and
    ``outlived`` those still alive 30 s after it, killed (they hold its stderr open)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # the command runs at a lower priority than this watcher: on a loaded machine (two test
    # workers, the command's own pool) a starved watcher saw the count only once the whole
    # output was written, and the signal came after the exit every time. A process group of
    # its own (for the signal), not a session: a new session is a new scheduler autogroup
    # (Linux), where a nice value weighs only against the group's own processes
    process = subprocess.Popen([sys.executable, "-m", "packlab.cli", *argv], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               process_group=0, preexec_fn=as_a_terminal_job)
    while process.poll() is None and entries(out) < at:
        time.sleep(0.001)
    try:
        if workers is None:
            os.killpg(process.pid, sig)
        else:
            workers.extend(psutil.Process(process.pid).children())
            os.kill(process.pid, sig)
    except (ProcessLookupError, psutil.NoSuchProcess):
        pass
    status = process.wait(timeout=60)
    if workers:
        _, alive = psutil.wait_procs(workers, timeout=30)
        for child in alive:
            child.kill()
        if outlived is not None:
            outlived.extend(alive)
    err = process.stderr.read().decode()
    process.stderr.close()
    assert "Traceback" not in err, err
    assert status in (0, 130, -signal.SIGINT, -sig), (status, err)
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


def most_entries(argv: list[str], out: Path) -> int:
    """The most entries OUT held at once during an uninterrupted run: the interruptions are
    drawn below it (mid-write)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "packlab.cli", *argv], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    most = 0
    while process.poll() is None:
        most = max(most, entries(out))
        time.sleep(0.001)
    assert process.returncode == 0
    return max(most, entries(out))


def test_pack_interrupted_at_random_points_resumes_to_the_same_bytes(tmp_path, capsys) -> None:
    spool = write_random_spool(tmp_path / "spool", num_sequences=1500, max_len=300,
                               seed=9).path
    rng = random.Random(SEED)
    formats = ["parquet", "memmap_v1"]  # a one-file format and a directory format
    # each format's own count: their writers leave different files (Parquet one a shard)
    most, reference = {}, {}
    for name in formats:
        ref = tmp_path / f"ref-{name}"
        most[name] = most_entries(command(spool, ref, name, FLAT), ref)
        reference[name] = tree(ref)
    done = attempts = 0
    seen = set()
    missed: list[tuple[str, int, int]] = []
    while done < TIMES:
        attempts += 1
        assert attempts <= 2 * TIMES, ("the command always finished before the signal", most,
                                       missed)
        name = formats[done % 2]
        sig = (signal.SIGINT, signal.SIGKILL)[(done // 2) % 2]
        out = tmp_path / f"run{attempts}"
        argv = command(spool, out, name, FLAT)
        at = rng.randint(1, max(1, int(0.9 * most[name])))
        began = time.monotonic()
        status = interrupted(argv, out, at, sig)
        if status == 0:  # finished before the signal: not an interruption
            missed.append((name, at, status, entries(out), round(time.monotonic() - began, 2)))
            continue
        # 130: it reported the interruption; -SIGINT: the signal came as it was exiting
        assert status in (130, -signal.SIGINT, -signal.SIGKILL), status
        why = refused(out, capsys)
        if why is None:
            missed.append((name, at, status))
            continue  # the job had finished: the signal came as it was exiting
        seen.add(why.split(": ", 2)[-1].split(" (")[0])
        assert main(argv) == 0  # the same command finishes the job
        capsys.readouterr()
        assert tree(out) == reference[name]  # (the reference validates: checked below)
        done += 1
    assert all(main(["validate", str(tmp_path / f"ref-{n}")]) == 0 for n in formats)
    capsys.readouterr()
    assert any("incomplete output" in w for w in seen), seen  # some came mid-write


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_pack_killed_alone_leaves_no_worker_behind_and_the_same_command_finishes_it(
        tmp_path, capsys, sig) -> None:
    """The command killed and its pool workers not (``kill PID``): the workers exit, so
    nothing holds the output's writing lock, and the same command run again finishes the job
    with the bytes of an uninterrupted run."""
    spool = write_random_spool(tmp_path / "spool", num_sequences=1500, max_len=300,
                               seed=9).path
    ref = tmp_path / "ref"
    most = most_entries(command(spool, ref, "memmap_v1", FLAT), ref)
    rng = random.Random(SEED + 2)
    for attempt in range(8):
        out = tmp_path / f"run{attempt}"
        argv = command(spool, out, "memmap_v1", FLAT)
        workers: list[psutil.Process] = []
        outlived: list[psutil.Process] = []
        status = interrupted(argv, out, rng.randint(1, max(1, int(0.9 * most))), sig,
                             workers, outlived)
        assert not outlived, f"pool workers outlived the killed command: {outlived}"
        if status == 0 or not workers:
            continue  # it finished first, or was killed before its pool started
        assert main(argv) == 0, capsys.readouterr().err
        capsys.readouterr()
        assert tree(out) == tree(ref)
        return
    pytest.fail("the command finished, or had no pool, before the signal every time")


def test_an_interrupted_layout_is_refused_until_the_same_pack_finishes_it(tmp_path,
                                                                         capsys) -> None:
    spools = [write_random_spool(tmp_path / n, num_sequences=800, max_len=300, seed=s).path
              for n, s in (("chat", 1), ("code", 2))]
    extra = [*FLAT, "--split", "train=0.9,valid=0.1"]
    ref = tmp_path / "ref"
    argv = ["pack", *map(str, spools), str(ref), "--format", "parquet", *extra]
    most = most_entries(argv, ref)
    rng = random.Random(SEED + 1)
    done = attempts = 0
    while done < 2:
        attempts += 1
        assert attempts <= 8, "the command always finished before the signal"
        out = tmp_path / f"run{attempts}"
        argv = ["pack", *map(str, spools), str(out), "--format", "parquet", *extra]
        status = interrupted(argv, out, rng.randint(1, max(1, int(0.9 * most))),
                             signal.SIGKILL)
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


# -- every writing command, killed between any two of its renames -------------------------------
#: every command that writes, OUT its output (tests/test_cli_errors.py checks the list is whole)
WRITERS = {
    "synth": (["synth", "OUT", "-n", "40"], "spool"),
    "tokenize": (["tokenize", "{chat}", "OUT"], "spool"),
    "corpus": (["corpus", "OUT", "--records", "6"], "docs.jsonl"),
    "pack": (["pack", "{spool}", "OUT", "--format", "parquet", "--pack-size", "256",
              "--bins-per-shard", "4",
              "--workers", "1"], "out"),
    "convert": (["convert", "{packed}", "OUT", "--format", "arrow_ipc"], "arrow"),
    "raw-index": (["raw-index", "{chat}", "--index-path", "OUT"], "chat.idx"),
    "pbin": (["pbin", "{spool}", "OUT"], "chat.pbin"),
    "export": (["export", "{spool}", "OUT"], "prefix"),  # prefix.bin, prefix.idx, ...
}


def killed_at_rename(argv: list[str], k: int) -> int:
    """``packlab ARGV`` in a forked child killed (``os._exit``: no cleanup, as SIGKILL) at its
    ``k``-th rename, the step by which every writer publishes; the child's exit status, or with
    ``k=0`` how many renames an uninterrupted run makes."""
    pid = os.fork()
    if pid == 0:  # the child: nothing of the test's process runs on after this
        calls = [0]
        real = {"rename": os.rename, "replace": os.replace}

        def counted(name: str):  # type: ignore[no-untyped-def]
            def call(*args, **kwargs):  # type: ignore[no-untyped-def]
                calls[0] += 1
                if calls[0] == k:
                    os._exit(99)
                return real[name](*args, **kwargs)
            return call

        os.rename, os.replace = counted("rename"), counted("replace")
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the child exits below
        code = main(argv)
        os._exit(min(calls[0], 98) if code == 0 and k == 0 else 100 + code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def payload(path: Path) -> dict[str, bytes]:
    """What an output holds, records aside (they carry times and the job's temporary names)."""
    if not path.exists():  # a prefix: its files beside it
        files = sorted(path.parent.glob(f"{path.name}.*"))
    else:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p.relative_to(path.parent)): p.read_bytes() for p in files
            if not p.name.endswith(".json")}


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_writing_command_killed_between_any_two_renames_finishes_when_rerun(
        tmp_path, capsys, name) -> None:
    """Killed at its first, middle and last rename (before it, nothing of the run is
    published; after the last, everything), the same command finishes the job: exit 0, the
    output validates and holds what an uninterrupted run writes; nothing of the run is left
    beside it."""
    spool = write_random_spool(tmp_path / "in" / "spool", num_sequences=40, max_len=200,
                               seed=3).path
    chat = tmp_path / "in" / "chat.jsonl"
    chat.write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"question {i}"},
        {"role": "assistant", "content": f"answer {i}"}]}) + "\n" for i in range(5)))
    packed = tmp_path / "in" / "packed"
    assert main(["pack", str(spool), str(packed), "--format", "parquet", "--pack-size", "256",
                 "--bins-per-shard",
                 "4", "--workers", "1"]) == 0
    given = {"spool": str(spool), "chat": str(chat), "packed": str(packed)}
    template, out_name = WRITERS[name]

    def argv(where: Path) -> list[str]:
        return [str(where / out_name) if a == "OUT" else a.format(**given) for a in template]

    reference = tmp_path / "ref"
    reference.mkdir()
    renames = killed_at_rename(argv(reference), 0)
    assert 0 < renames < 98, renames
    expected = payload(reference / out_name)
    for k in sorted({1, (renames + 1) // 2, renames}):
        run = tmp_path / f"killed{k}"
        run.mkdir()
        assert killed_at_rename(argv(run), k) == 99, (name, k)
        capsys.readouterr()
        assert main(argv(run)) == 0, (name, k, capsys.readouterr().err)
        assert main(["validate", str(run / out_name)]) == 0, (name, k, capsys.readouterr().err)
        capsys.readouterr()
        assert payload(run / out_name) == expected, (name, k)
        assert [p.name for p in run.rglob("*") if ".tmp" in p.name] == [], (name, k)
