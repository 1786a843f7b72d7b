"""One stage of a long run, measured the same way whatever it is: a command or a job in a
process tree of its own, its resident memory sampled through the run, not only at the end.

:func:`run_stage` starts the stage (a ``packlab`` command, or a job: an importable function run
by ``python -m packlab.lab.measure.stages``), and while it runs samples every process of its
tree from ``/proc/<pid>/status`` (``RssAnon``, ``RssFile``, ``RssShmem``: what ``top``, Slurm,
Kubernetes and an OOM killer see, split by kind), each process's peak and the peak of their
sum. When it ends: wall seconds, CPU seconds of the whole tree (what it waited for, or each
process's own CPU seconds as last sampled, whichever is more), tokens per CPU-second, the bytes on disk of what it wrote. A stage may run under
a memory cap (the sum of its processes' resident memory): past it the tree is killed and the
stage says how far it got (its progress) and at what size, so a failure has a measured point
instead of an assertion.

Progress: a job reports ``done`` of ``total`` through :class:`Progress` (a small file the
sampler reads); a command's progress is read off what it writes (a callable given to
:func:`run_stage`). A stage that lasts draws its bar as a line on stdout every
:data:`BAR_EVERY` seconds (a notebook's output, and the terminal of a run that streams it).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm.std import tqdm

from packlab.errors import PacklabError

TRACE_POINTS = 240  # samples kept for a stage's plot (evenly thinned)
BAR_EVERY = 30.0  # seconds between two lines of a long stage's progress
KINDS = ("anon", "file", "shmem")


@dataclass
class Peaks:
    """Peaks of resident memory, bytes, by kind (``rss`` is their sum at one instant)."""

    rss: int = 0
    anon: int = 0
    file: int = 0
    shmem: int = 0

    def take(self, anon: int, file: int, shmem: int) -> None:
        self.rss = max(self.rss, anon + file + shmem)
        self.anon, self.file, self.shmem = max(self.anon, anon), max(self.file, file), \
            max(self.shmem, shmem)


@dataclass
class StageResult:
    """What one stage took. ``per_process``: the largest peaks any one of its processes had;
    ``summed``: the peaks of the sum over its processes at one instant; ``trace``: ``(seconds,
    anon, file, shmem)`` of the sum, thinned to :data:`TRACE_POINTS`."""

    name: str
    outcome: str  # "ok", "capped" (killed at the memory cap), "failed" (exited non-zero)
    seconds: float
    cpu_seconds: float
    tokens: int | None
    tokens_per_cpu_second: float | None
    processes: int  # the most running at once
    per_process: Peaks
    summed: Peaks
    disk_bytes: int | None
    progress: tuple[int, int] | None  # (done, total) when it ended
    detail: str = ""
    result: Any = None  # what a job returned (JSON)
    base_bytes: int | None = None  # resident (all processes) when its work began: its first
    # progress report, or its first sample
    trace: list[tuple[float, int, int, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StageResult:
        data = dict(data)
        data["per_process"], data["summed"] = Peaks(**data["per_process"]), Peaks(**data["summed"])
        data["progress"] = tuple(data["progress"]) if data.get("progress") else None
        data["trace"] = [tuple(t) for t in data.get("trace") or ()]
        return cls(**data)


def status(pid: int) -> tuple[int, int, int] | None:
    """``(RssAnon, RssFile, RssShmem)`` of a process in bytes, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read()
    except OSError:
        return None
    values = {}
    for line in text.split(b"\n"):
        if line.startswith((b"RssAnon:", b"RssFile:", b"RssShmem:")):
            key, value = line.split(b":", 1)
            values[key] = int(value.split()[0]) * 1024
    if not values:  # a zombie: no memory any more
        return None
    return values.get(b"RssAnon", 0), values.get(b"RssFile", 0), values.get(b"RssShmem", 0)


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User and system CPU seconds a process has used itself (``/proc/<pid>/stat``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (``/proc/<pid>/task/*/children``, one read a task)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return found


class Progress:
    """What a job tells its stage of how far it is: ``update(done)`` rewrites a small file
    (at most every ``every`` seconds; the last call always), which the sampler reads."""

    def __init__(self, path: str | os.PathLike[str] | None, total: int, every: float = 0.5
                 ) -> None:
        self.path, self.total, self.every, self._last = path, int(total), every, 0.0

    def update(self, done: int, *, force: bool = False) -> None:
        if self.path is None:
            return
        now = time.monotonic()
        if force or now - self._last >= self.every:
            self._last = now
            tmp = f"{self.path}.tmp"
            with open(tmp, "w") as f:
                f.write(f"{int(done)} {self.total}\n")
            os.replace(tmp, self.path)


def read_progress(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    try:
        done, total = Path(path).read_text().split()
        return int(done), int(total)
    except (OSError, ValueError):
        return None


def job_command(job: str, kwargs: dict[str, Any], result: Path, progress: Path) -> list[str]:
    """The command that runs ``job`` ("module:function", keyword arguments as JSON) as a
    stage: its return value goes to ``result`` (JSON), its progress to ``progress``."""
    return [sys.executable, "-m", "packlab.lab.measure.stages", job, json.dumps(kwargs),
            str(result), str(progress)]


def run_stage(name: str, argv: Sequence[str] | None = None, *, job: str | None = None,
              kwargs: dict[str, Any] | None = None, tokens: int | None = None,
              progress: Callable[[], tuple[int, int] | None] | None = None,
              cap_bytes: int | None = None, disk: Callable[[], int] | None = None,
              env: dict[str, str] | None = None, interval: float = 0.2,
              kill_when: Callable[[tuple[int, int] | None], bool] | None = None,
              timeout: float = 7200.0) -> StageResult:
    """Run one stage (``argv``, or ``job`` with ``kwargs``) and measure it (see the module).

    ``tokens``: what it processed, for tokens per CPU-second; ``progress``: how far a command
    is (a job reports its own); ``cap_bytes``: the memory cap; ``kill_when(progress)``: kill
    the tree with SIGKILL when it says so (an interruption on purpose: outcome "killed");
    ``disk``: the bytes it wrote, asked once it ends."""
    with tempfile.TemporaryDirectory(prefix="packlab-stage-") as tmp:
        result_file, progress_file = Path(tmp) / "result.json", Path(tmp) / "progress"
        if job is not None:
            argv = job_command(job, kwargs or {}, result_file, progress_file)
            progress = progress or (lambda: read_progress(progress_file))
        if argv is None:
            raise PacklabError(f"stage {name}: give a command or a job")
        return _measure(name, list(argv), tokens=tokens, progress=progress, cap_bytes=cap_bytes,
                        disk=disk, env=env, interval=interval, kill_when=kill_when,
                        timeout=timeout, result_file=result_file)


def _measure(name: str, argv: list[str], *, tokens: int | None, progress: Any,
             cap_bytes: int | None, disk: Any, env: dict[str, str] | None, interval: float,
             kill_when: Any, timeout: float, result_file: Path) -> StageResult:
    per, summed = Peaks(), Peaks()
    trace: list[tuple[float, int, int, int]] = []
    most = 0
    seen_cpu: dict[int, float] = {}  # each process's own CPU seconds, last seen
    base: int | None = None  # resident bytes when its work began: what the cap does not count
    outcome, detail = "ok", ""
    before = os.times()
    began = time.perf_counter()
    child = subprocess.Popen(argv, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    output: dict[str, bytes] = {}
    readers = [threading.Thread(target=lambda k=k, s=s: output.__setitem__(k, s.read()),
                                daemon=True)
               for k, s in (("out", child.stdout), ("err", child.stderr))]
    for r in readers:
        r.start()
    shown = began
    done = None
    try:
        while child.poll() is None:
            now = time.perf_counter() - began
            pids = descendants(child.pid)
            totals = [0, 0, 0]
            alive = 0
            for pid in pids:
                s = status(pid)
                if s is None:
                    continue
                used = cpu_seconds(pid)
                if used is not None:
                    seen_cpu[pid] = used
                alive += 1
                per.take(*s)
                for k in range(3):
                    totals[k] += s[k]
            most = max(most, alive)
            summed.take(*totals)
            trace.append((round(now, 2), *totals))
            done = progress() if progress else None
            if time.perf_counter() - shown >= BAR_EVERY:
                shown = time.perf_counter()
                print(bar(name, done, now), flush=True)
            if base is None and (done is not None or progress is None):
                base = sum(totals)  # what it held when its work began (libraries, setup)
            if cap_bytes is not None and base is not None and sum(totals) - base > cap_bytes:
                outcome, detail = "capped", (
                    f"killed holding {sum(totals) - base:,} resident bytes beyond the "
                    f"{base:,} it started its work with (cap {cap_bytes:,})")
                _kill(child)
                break
            if kill_when is not None and kill_when(done):
                outcome, detail = "killed", f"killed on purpose at progress {done}"
                _kill(child)
                break
            if now > timeout:
                outcome, detail = "failed", f"timed out after {timeout:.0f} s"
                _kill(child)
                break
            try:  # the next sample in ``interval`` s, or the end as soon as it exits
                child.wait(interval)
            except subprocess.TimeoutExpired:
                pass
        child.wait()
    finally:
        if child.poll() is None:
            _kill(child)
            child.wait()
    for r in readers:
        r.join(timeout=10)
    seconds = time.perf_counter() - began
    after = os.times()
    # what the processes it waited for used, or (where they were not its children: a pool's
    # forkserver, DataLoader workers) the sum of what each process was last seen using
    cpu = max((after.children_user - before.children_user)
              + (after.children_system - before.children_system), sum(seen_cpu.values()))
    if outcome == "ok" and child.returncode != 0:
        outcome = "failed"
        detail = (output.get("err", b"") or output.get("out", b"")).decode(
            errors="replace").strip().splitlines()[-1:] or [f"exit {child.returncode}"]
        detail = detail[0]
    last = progress() if progress else None
    result = None
    if result_file.is_file():
        result = json.loads(result_file.read_text())
    return StageResult(
        name=name, outcome=outcome, seconds=round(seconds, 3), cpu_seconds=round(cpu, 3),
        tokens=tokens, tokens_per_cpu_second=(tokens / cpu if tokens and cpu > 0 else None),
        processes=most, per_process=per, summed=summed,
        disk_bytes=disk() if disk is not None and outcome == "ok" else None,
        progress=last or done, detail=detail, result=result, base_bytes=base,
        trace=_thin(trace))


def bar(name: str, done: tuple[int, int] | None, seconds: float) -> str:
    """A stage's progress as one line (tqdm's bar, with its rate and ETA where the total is
    known; the time so far where it is not)."""
    if done is None or not done[1]:
        return f"{name}: {seconds:,.0f} s so far"
    return tqdm.format_meter(done[0], done[1], seconds, prefix=name, ncols=90)


def _kill(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the stage's whole process group (it runs in a session of its own)."""
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _thin(trace: list[tuple[float, int, int, int]]) -> list[tuple[float, int, int, int]]:
    if len(trace) <= TRACE_POINTS:
        return trace
    step = len(trace) / TRACE_POINTS
    return [trace[int(i * step)] for i in range(TRACE_POINTS)] + [trace[-1]]


def disk_usage(path: str | os.PathLike[str]) -> int:
    """Bytes on disk of every file under ``path`` (a file: its own), as ``du`` counts them."""
    p = Path(path)
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file() and not f.is_symlink()]
    return sum(f.stat().st_blocks * 512 for f in files)


def main(argv: list[str]) -> int:
    """``python -m packlab.lab.measure.stages MODULE:FUNCTION KWARGS_JSON RESULT PROGRESS``:
    run a job as a stage (the function gets ``progress=`` a :class:`Progress`)."""
    job, kwargs, result, progress = argv
    module, _, function = job.partition(":")
    fn = getattr(importlib.import_module(module), function)
    out = fn(**json.loads(kwargs), progress=progress)
    Path(result).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
