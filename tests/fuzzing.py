"""Seeded mutations of real packlab outputs (:mod:`mutations`), and what each must survive.

Mutation ``i`` of a format damages a copy of the reference, then runs the checks in a forked
child: every shard opened on its own with the reader's defaults (the read path most users
take), every bin read (one by one and through ``iter_bins``), the shard validated, ``packlab
inspect`` of it; then ``open_dataset`` of the output directory with ``verify=True`` where the
format stores per-bin checksums, every bin read (one by one and in one batch) and compared
with the reference; then ``packlab validate`` (one line and exit 2 when it fails). The parent
judges the child's report (:func:`judge`):

- a signal (segfault, bus error), no answer within the timeout, any exception that is not a
  :class:`~packlab.errors.PacklabError`, or a hostile pickle that ran (its marker file exists)
  is a failure;
- a dataset that opens and serves other bins than the reference while ``validate`` passes is a
  *silent* difference: a failure, unless the mutation recomputed every checksum consistently
  (class ``forged``); so is a shard that serves other bins than any shard of the reference
  while its own ``validate`` (with checksums) passes, and a hostile pickle ``validate`` passes;
- with ``strict`` (the dataset opened with ``verify=True`` and every shard of the reference
  recording checksums to verify against), a dataset that serves other bins at all is a failure
  (``read-silent``), even when ``validate`` notices.

Run it long: ``make fuzz`` (3,000 a format: ``tests/fuzzing.py --per-format 3000``, seeded as the
tests are, or ``FUZZ_SEED=...``); one failure again: ``--seed SEED --first I --per-format 1``.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import select
import shutil
import signal
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mutations import (
    CLASSES,
    MARKER,
    Mutation,
    Reference,
    build_reference,
    classes_for,
    fuzz_seed,
    mutate,
)

from packlab.bins import bin_digest
from packlab.errors import PacklabError

__all__ = ["CLASSES", "MARKER", "Mutation", "Reference", "fuzz_format", "fuzz_seed", "judge"]
FAILURES = ("crash", "hang", "foreign", "silent", "read-silent", "pickle-ran")
TIMEOUT = 60.0  # seconds a child may take for one mutation


# -- the checks, in a forked child --------------------------------------------------------------
def _stage(report: dict, name: str, fn: Callable[[], Any]) -> Any:
    """Run one step; record ``ok``, ``refused`` (a packlab error) or ``foreign``."""
    try:
        value = fn()
    except PacklabError as exc:
        report["stages"].append((name, "refused", type(exc).__name__, str(exc)))
        return None
    except Exception as exc:  # noqa: BLE001 - exactly what the fuzzing hunts
        report["stages"].append((name, "foreign", type(exc).__name__,
                                 f"{exc}\n{traceback.format_exc()}"))
        return None
    report["stages"].append((name, "ok", "", ""))
    return value


def _command(*argv: object) -> tuple[int, str]:
    """``packlab ARGV`` in this process; a failure must be one line and exit 2."""
    import io
    from contextlib import redirect_stderr, redirect_stdout

    from packlab.cli import main

    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        code = main([str(a) for a in argv])
    lines = err.getvalue().strip().splitlines()
    if code not in (0, 2) or (code == 2 and len(lines) != 1):
        raise AssertionError(f"packlab {argv[0]}: exit {code}, stderr {err.getvalue()[-2000:]!r}")
    return code, err.getvalue()


def check_tree(tree: Path, ref: Reference, read_options: dict[str, Any]) -> dict[str, Any]:
    """Everything a user does with an output directory, each step recorded (never raises):
    shards read with the defaults, the dataset with ``read_options``."""
    from packlab import open_dataset
    from packlab.sources import open_shard

    report: dict[str, Any] = {"stages": [], "shards": {}}
    out = tree / "out"
    for shard in sorted(p for p in out.iterdir() if p.name.startswith("shard_")
                        and not p.name.endswith(".json")):
        reader = _stage(report, f"open {shard.name}",
                        lambda s=shard: open_shard(s))
        if reader is None:
            continue
        got = _stage(report, f"read {shard.name}", lambda r=reader: _digests(r))
        _stage(report, f"iter_bins {shard.name}",
               lambda r=reader: [bin_digest(*b) for b in r.iter_bins()])
        summary = _stage(report, f"validate {shard.name}", reader.validate)
        if got is not None:  # a shard without checksums of its own cannot tell a changed token
            report["shards"][shard.name] = (got, summary is not None
                                            and summary.get("checksums", True))
        _stage(report, f"close {shard.name}", reader.close)
        _stage(report, f"packlab inspect {shard.name}", lambda s=shard: _command("inspect", s))
    dataset = _stage(report, "open_dataset", lambda: open_dataset(out, **read_options))
    if dataset is not None:
        report["dataset"] = _stage(report, "read dataset", lambda: _digests(dataset))
        batch = _stage(report, "read_bins dataset",
                       lambda: [bin_digest(*b) for b in dataset.read_bins(range(len(dataset)))])
        if batch is not None and batch != report["dataset"]:
            report["stages"].append(("read_bins dataset", "foreign", "Mismatch",
                                     "read_bins and read_bin disagree"))
    validated = _stage(report, "packlab validate", lambda: _command("validate", out))
    report["validate"] = validated is not None and validated[0] == 0
    return report


def _digests(reader: Any) -> list[str]:
    return [bin_digest(*reader.read_bin(i)) for i in range(len(reader))]


def run_in_child(fn: Callable[[], Any], timeout: float = TIMEOUT) -> tuple[str, Any]:
    """``fn()`` in a forked child: ``("ok", value)``, ``("crash", signal name)`` or
    ``("hang", seconds)``. The child writes a C traceback to stderr if it dies of a signal."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into the caller's stack
        code = 0
        try:
            import faulthandler

            os.close(read_end)
            faulthandler.enable()
            data = pickle.dumps(fn())
            with os.fdopen(write_end, "wb") as f:
                f.write(struct.pack("<Q", len(data)) + data)
        except BaseException:  # noqa: BLE001 - report and leave
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    chunks, deadline = [], time.monotonic() + timeout
    with os.fdopen(read_end, "rb", buffering=0) as f:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([f], [], [], left)[0]:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return "hang", timeout
            chunk = f.read(1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
    _, status = os.waitpid(pid, 0)
    raw = b"".join(chunks)
    if os.WIFSIGNALED(status):
        return "crash", signal.Signals(os.WTERMSIG(status)).name
    if len(raw) < 8 or os.WEXITSTATUS(status) != 0:
        return "crash", f"exit status {os.WEXITSTATUS(status)}"
    return "ok", pickle.loads(raw[8:])


# -- judging ---------------------------------------------------------------------------------
@dataclass
class Verdict:
    mutation: Mutation
    outcome: str  # refused, harmless, validate-caught, read-caught-by-validate, forged-*, or a failure
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome in FAILURES


def judge(m: Mutation, ran: tuple[str, Any], ref: Reference, tree: Path, *,
          strict: bool) -> Verdict:
    kind, report = ran
    if (tree / MARKER).exists():
        return Verdict(m, "pickle-ran", "the hostile pickle created its marker")
    if kind != "ok":
        return Verdict(m, kind, str(report))
    foreign = [s for s in report["stages"] if s[1] == "foreign"]
    if foreign:
        name, _, exc, text = foreign[0]
        return Verdict(m, "foreign", f"{name}: {exc}: {text}")
    for name, (got, vouched) in report["shards"].items():  # a shard read on its own
        if tuple(got) not in ref.contents and vouched and not m.forged:
            return Verdict(m, "silent", f"{name} serves other bins and validates")
    served = report.get("dataset")
    if served is None:
        return Verdict(m, "forged-refused" if m.forged else "refused")
    if served == ref.digests:
        if m.cls == "pickle" and report["validate"]:
            return Verdict(m, "silent", "a hostile pickle in the shard passes validate")
        outcome = "harmless" if report["validate"] else "validate-caught"
        return Verdict(m, f"forged-{outcome}" if m.forged else outcome)
    changed = sum(a != b for a, b in zip(served, ref.digests, strict=False)) + abs(
        len(served) - len(ref.digests))
    if m.forged:
        return Verdict(m, "forged-served" if report["validate"] else "forged-validate-caught",
                       f"{changed} bins differ")
    if report["validate"]:
        return Verdict(m, "silent", f"{changed} of {len(ref.digests)} bins differ, validate "
                                    "passes")
    if strict:
        return Verdict(m, "read-silent", f"{changed} bins differ on read (validate notices)")
    return Verdict(m, "read-caught-by-validate", f"{changed} bins differ")


# -- a run -----------------------------------------------------------------------------------
@dataclass
class FuzzRun:
    format: str
    seed: str = ""
    classes: list[str] = field(default_factory=list)  # the classes that apply to the format
    reads_spool: bool = False
    strict: bool = False  # a bin read differently is a failure even when validate notices
    counts: Counter = field(default_factory=Counter)  # (class, outcome) -> mutations
    failures: list[Verdict] = field(default_factory=list)
    seconds: float = 0.0

    def table(self) -> str:
        mode = "strict: reads verified" if self.strict else "reads unverified"
        lines = [f"{self.format}: {sum(self.counts.values())} mutations (seed {self.seed}) in "
                 f"{self.seconds:.0f} s ({mode})"]
        for (cls, outcome), n in sorted(self.counts.items()):
            lines.append(f"  {cls:<10} {outcome:<26} {n}")
        return "\n".join(lines)


def read_options_for(format: str) -> dict[str, Any]:
    """Reader options for the fuzzed reads: per-bin verification where the reader offers it."""
    import inspect

    from packlab.formats import get_format

    reader = get_format(format).Reader
    return {"verify": True} if "verify" in inspect.signature(reader.__init__).parameters else {}


def fuzz_format(format: str, root: Path, count: int, *, seed: str, first: int = 0,
                progress: Callable[[Verdict], None] | None = None) -> FuzzRun:
    """Mutations ``first .. first + count`` of ``format`` under ``seed``, each on a fresh copy of
    the reference."""
    began = time.monotonic()
    ref = build_reference(root, format)
    options = read_options_for(format)
    # the untouched reference passes every check (here, in this process: the children then
    # inherit every module the checks import instead of importing it again each)
    report = check_tree(ref.tree, ref, options)
    untouched = judge(Mutation(format, -1, "none"), ("ok", report), ref, ref.tree, strict=False)
    if untouched.outcome != "harmless":
        raise AssertionError(f"the reference itself fails its checks: {untouched.outcome}: "
                             f"{untouched.detail}")
    # strict: the reader verifies what it returns and every shard has checksums to verify
    # against (legacy_npy_pickle has no room for one: its receipt's, checked by validate, only)
    strict = bool(options) and all(vouched for _, vouched in report["shards"].values())
    run = FuzzRun(format, seed, classes_for(ref), ref.reads_spool, strict)
    for index in range(first, first + count):
        tree = root / f"case-{index}"
        shutil.copytree(ref.tree, tree, symlinks=True)
        try:
            m = mutate(tree, ref, index, seed)
            verdict = judge(m, run_in_child(lambda t=tree: check_tree(t, ref, options)),
                            ref, tree, strict=strict)
        finally:
            shutil.rmtree(tree, ignore_errors=True)
        run.counts[(verdict.mutation.cls, verdict.outcome)] += 1
        if verdict.failed:
            run.failures.append(verdict)
        if progress is not None:
            progress(verdict)
    run.seconds = time.monotonic() - began
    return run


def main(argv: list[str] | None = None) -> int:
    import tempfile

    from packlab.formats import format_names

    parser = argparse.ArgumentParser(description="Fuzz packlab's readers with seeded mutations.")
    parser.add_argument("--per-format", type=int, default=300)
    parser.add_argument("--first", type=int, default=0, help="first mutation index")
    parser.add_argument("--formats", default=",".join(format_names()))
    parser.add_argument("--seed", help="the mutations' seed (default: $PACKLAB_FUZZ_SEED, else "
                                       "the commit checked out)")
    parser.add_argument("--json", action="store_true", help="counts as one JSON object")
    args = parser.parse_args(argv)
    seed, source = fuzz_seed(args.seed)
    print(f"fuzz seed {seed} ({source}; again: --seed {seed})", file=sys.stderr)
    runs = []
    for format in args.formats.split(","):
        with tempfile.TemporaryDirectory(prefix=f"fuzz-{format}-") as tmp:
            run = fuzz_format(format, Path(tmp), args.per_format, seed=seed, first=args.first)
        runs.append(run)
        print(run.table(), file=sys.stderr)
        for verdict in run.failures[:20]:
            print(f"FAIL {verdict.mutation} -> {verdict.outcome}: {verdict.detail[:2000]}",
                  file=sys.stderr)
    if args.json:
        print(json.dumps({r.format: {"seed": r.seed, "seconds": round(r.seconds, 1),
                                     "strict": r.strict,
                                     "counts": {f"{c}/{o}": n for (c, o), n in
                                                sorted(r.counts.items())},
                                     "failures": len(r.failures)} for r in runs}, indent=1))
    return 1 if any(r.failures for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
