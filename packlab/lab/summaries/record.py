"""One run kept in the repository, and the README's numbers generated from it.

``python -m packlab.lab.notebooks record`` copies the results of the last ``make run``
(``build/results/*.json`` and ``run.json``: date, commit, scale, machine, versions) into
``results/recorded/`` and rewrites the README's generated parts from them; ``tests/
test_report_readme.py`` checks that the README and the record agree. The run it replaces moves
to ``results/previous/``: the second whole run the README's answers are compared with (the
report compares a run with the one before it in ``build/`` the same way).

A generated part of the README sits between two markers, on one line or over several::

    <!-- packlab:formats -->
    | format | write peak RSS | ...
    <!-- /packlab:formats -->

:func:`readme_parts` says what each name holds; :func:`render_readme` replaces the text between
every pair of markers (an unknown name is an error naming it).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError
from packlab.lab.results import _root, build_dir
from packlab.lab.summaries import front, stack
from packlab.lab.tables import human_bytes

RUN_FILE = "run.json"
VERSIONS = ("numpy", "pyarrow", "duckdb", "torch", "polars", "pandas")
MARKER = re.compile(r"(<!-- packlab:([a-z0-9_-]+) -->)(.*?)(<!-- /packlab:\2 -->)", re.DOTALL)


def recorded_dir(scale: str = "default") -> Path:
    """``results/recorded/`` in the repository: the run the README quotes; a long scale's
    run in ``results/<scale>/`` (the scale run, beside it)."""
    return _root() / "results" / ("recorded" if scale == "default" else scale)


def previous_dir() -> Path:
    """``results/previous/``: the run recorded before it, the README's second whole run."""
    return _root() / "results" / "previous"


def new_run_id() -> str:
    return f"{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"


# -- what a run ran on -------------------------------------------------------------------------
def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(_root()), *args], capture_output=True, text=True,
                             timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def run_metadata(run_id: str, scale: str, timings: Mapping[str, float]) -> dict[str, Any]:
    """Date, commit, scale, machine (cores, memory, the data disk's read-ahead) and versions."""
    from packlab.lab.measure.floors import read_ahead_kb
    from packlab.lab.results import data_dir

    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "run": run_id, "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "scale": scale, "commit": _git("rev-parse", "HEAD"),
        "dirty": bool(status) if status is not None else None,
        "machine": {"cores": os.cpu_count(), "memory_bytes": _memory_bytes(),
                    "read_ahead_kb": read_ahead_kb(data_dir()), "cpu": _cpu(),
                    "system": f"{platform.system()} {platform.release()}"},
        "versions": {"python": platform.python_version(),
                     **{name: _version(name) for name in VERSIONS}},
        "timings": {k: round(v, 1) for k, v in timings.items()},
    }


def _cpu() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def metadata_text(meta: Mapping[str, Any]) -> str:
    """One line a reader can cite: when, what, on which machine, with which versions."""
    if not meta:
        return "run metadata not recorded"
    machine, versions = meta.get("machine", {}), meta.get("versions", {})
    commit = (meta.get("commit") or "unknown")[:10] + (" (with local changes)"
                                                        if meta.get("dirty") else "")
    took = sum(meta.get("timings", {}).values())
    return (f"{meta.get('scale', '?')} scale, {meta.get('date', '?')}, commit {commit}; "
            f"{machine.get('cores', '?')} cores, {human_bytes(machine.get('memory_bytes'))} RAM, "
            f"disk read-ahead {machine.get('read_ahead_kb', '?')} KB"
            + (f" ({machine['cpu']})" if machine.get("cpu") else "")
            + "; " + ", ".join(f"{k} {v}" for k, v in versions.items() if v)
            + (f"; notebooks took {took / 60:.0f} min" if took else ""))


# -- a run on disk -----------------------------------------------------------------------------
def load_run(directory: Path | None = None) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """``({notebook: results}, run metadata)`` from a results folder (default: the build's)."""
    directory = Path(directory) if directory is not None else build_dir() / "results"
    run = {p.stem: json.loads(p.read_text()) for p in sorted(directory.glob("[0-9][0-9]_*.json"))}
    meta_path = directory / RUN_FILE
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return run, meta


def _complete(directory: Path) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """A folder's run, refused unless it is one whole run (results and ``run.json`` alike)."""
    run, meta = load_run(directory)
    if not meta or not run:
        raise PacklabError(f"{directory}: no run to record (run `make run` first)")
    mixed = sorted(n for n, r in run.items() if r.get("run") != meta.get("run"))
    if mixed:
        raise PacklabError(f"{directory}: {', '.join(mixed)} came from another run than "
                           f"{RUN_FILE} ({meta.get('run')}); rerun them together")
    return run, meta


def _copy_run(source: Path, target: Path) -> None:
    run, _ = load_run(source)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in [*run, RUN_FILE.removesuffix(".json")]:
        shutil.copy2(source / f"{name}.json", target / f"{name}.json")


def keep_previous(current: Path, previous: Path, *, unless: str | None = None) -> bool:
    """Copy the whole run in ``current`` to ``previous`` (replacing it), so the next run has
    one to be compared with; nothing when ``current`` holds no whole run, or holds the run
    ``unless`` names (recording one run twice keeps the run before it)."""
    try:
        _, meta = _complete(current)
    except PacklabError:
        return False
    if meta.get("run") == unless:
        return False
    _copy_run(current, previous)
    return True


def record_run(source: Path | None = None, target: Path | None = None) -> Path:
    """Copy one complete run (every notebook's results and ``run.json``) into ``target``
    (default ``results/recorded/``), replacing what was there; what was there moves to the
    ``previous`` folder beside it. Refuses a mix of runs."""
    source = Path(source) if source is not None else build_dir() / "results"
    target = Path(target) if target is not None else recorded_dir()
    _, meta = _complete(source)
    if target.name == recorded_dir().name:  # the README's second whole run (a scale run: none)
        keep_previous(target, target.with_name("previous"), unless=meta.get("run"))
    _copy_run(source, target)
    return target


def other_run(directory: Path, meta: Mapping[str, Any]
              ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]] | None:
    """The whole run in ``directory`` to compare a run with: none when it is that same run,
    or one of another scale (its reads are of other sizes)."""
    try:
        run, other = _complete(directory)
    except PacklabError:
        return None
    if other.get("run") == meta.get("run") or other.get("scale") != meta.get("scale"):
        return None
    return run, other


def reruns_text(meta: Mapping[str, Any], other: Mapping[str, Any] | None, where: str) -> str:
    """Which reruns the answers are compared over: the run's fifths, and the other whole run."""
    text = ("A fifth re-decides every use case from one fifth of the run's reads (a rerun "
            "in miniature; sizes, memory and counts are one measurement a run)")
    if other is None:
        return text + f"; no other whole run in {where} to compare with."
    return text + f"; the other run is the one in {where}: {metadata_text(other)}."


def compare_text(first: Path, second: Path) -> tuple[str, bool]:
    """Two recorded runs' answers side by side, per use case; whether every one agrees."""
    runs = []
    for directory in (first, second):
        run, meta = load_run(directory)
        if not run:
            raise PacklabError(f"{directory}: no results (NN_*.json) to compare")
        runs.append((run, meta))
    pairs = front.compare_runs(runs[0][0], runs[1][0])
    same = sum(p["same"] for p in pairs)
    lines = [f"first:  {first} ({metadata_text(runs[0][1])})",
             f"second: {second} ({metadata_text(runs[1][1])})", "",
             front.comparison_table(pairs), "",
             f"{same} of {len(pairs)} use cases agree"]
    return "\n".join(lines), same == len(pairs)


# -- the README's generated parts --------------------------------------------------------------
def readme_parts(run: Mapping[str, Any], meta: Mapping[str, Any],
                 previous: tuple[Mapping[str, Any], Mapping[str, Any]] | None = None
                 ) -> dict[str, Callable[[], str]]:
    """Every name the README may mark, and how its text is made from the run (``previous``:
    the whole run it is compared with)."""
    def block(text: str) -> str:
        return f"\n{text}\n"

    other = previous[0] if previous else None
    parts: dict[str, Callable[[], str]] = {
        "run": lambda: metadata_text(meta),
        "formats": lambda: block(front.format_table(run)),
        "choose": lambda: block(front.recommendations_table(run, other)),
        "ties": lambda: front.ties_text(run),
        "reruns": lambda: reruns_text(meta, previous[1] if previous else None,
                                      "`results/previous/`"),
        "stack-inputs": lambda: block(stack.stack_inputs_table()),
        "beside-stack": lambda: block(stack.beside_stack_table(run)),
        "rfc": lambda: block(front.claims_table(run, "rfc")),
        "targets": lambda: block(front.claims_table(run, "target")),
        "rule": lambda: front.rule_text(),
        "rfc-counts": lambda: front.counts_text(front.findings(run, "rfc")),
        "target-counts": lambda: front.counts_text(front.findings(run, "target")),
        "legacy-load": lambda: front.legacy_load_text(run),
        "repack": lambda: front.repack_text(run),
        "packing": lambda: front.packing_text(run),
        "peers": lambda: block(front.peers_table(run)),
        "scale": lambda: block(scale_text()),
    }
    return parts


def scale_text() -> str:
    """The recorded run at the RFC's scale (``results/rfc/``), as the README and the report's
    front page show it."""
    from packlab.lab.summaries.at_scale import scale_markdown

    run, meta = load_run(recorded_dir("rfc"))
    return scale_markdown(run.get("12_at_scale"), metadata_text(meta))


def render_readme(text: str, run: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """``text`` with every marked part regenerated from the run (compared with the run in
    ``results/previous/``)."""
    parts = readme_parts(run, meta, other_run(previous_dir(), meta))

    def fill(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in parts:
            raise PacklabError(f"README: unknown generated part {name!r}; known: {sorted(parts)}")
        return match.group(1) + parts[name]() + match.group(4)

    return MARKER.sub(fill, text)


def readme_path() -> Path:
    return _root() / "README.md"


def update_readme(directory: Path | None = None, path: Path | None = None) -> bool:
    """Regenerate the README's marked parts from the recorded run; True when it changed."""
    path = path or readme_path()
    run, meta = load_run(directory or recorded_dir())
    old = path.read_text()
    new = render_readme(old, run, meta)
    if new != old:
        path.write_text(new)
    return new != old
