"""One run kept in the repository, and the README's numbers generated from it.

``python -m packlab.lab.notebooks record`` copies the results of the last ``make run``
(``build/results/*.json`` and ``run.json``: date, commit, scale, machine, versions) into
``results/recorded/`` and rewrites the README's generated parts from them; ``tests/
test_report_readme.py`` checks that the README and the record agree.

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
from packlab.lab.summaries import front
from packlab.lab.tables import human_bytes

RUN_FILE = "run.json"
VERSIONS = ("numpy", "pyarrow", "duckdb", "torch", "polars", "pandas")
MARKER = re.compile(r"(<!-- packlab:([a-z0-9_-]+) -->)(.*?)(<!-- /packlab:\2 -->)", re.DOTALL)


def recorded_dir() -> Path:
    """``results/recorded/`` in the repository: the run the README quotes."""
    return _root() / "results" / "recorded"


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


def record_run(source: Path | None = None, target: Path | None = None) -> Path:
    """Copy one complete run (every notebook's results and ``run.json``) into ``target``
    (default ``results/recorded/``), replacing what was there. Refuses a mix of runs."""
    source = Path(source) if source is not None else build_dir() / "results"
    target = Path(target) if target is not None else recorded_dir()
    run, meta = load_run(source)
    if not meta or not run:
        raise PacklabError(f"{source}: no run to record (run `make run` first)")
    mixed = sorted(n for n, r in run.items() if r.get("run") != meta.get("run"))
    if mixed:
        raise PacklabError(f"{source}: {', '.join(mixed)} came from another run than "
                           f"{RUN_FILE} ({meta.get('run')}); rerun them together")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for name in [*run, RUN_FILE.removesuffix(".json")]:
        shutil.copy2(source / f"{name}.json", target / f"{name}.json")
    return target


# -- the README's generated parts --------------------------------------------------------------
def readme_parts(run: Mapping[str, Any], meta: Mapping[str, Any]
                 ) -> dict[str, Callable[[], str]]:
    """Every name the README may mark, and how its text is made from the run."""
    def block(text: str) -> str:
        return f"\n{text}\n"

    parts: dict[str, Callable[[], str]] = {
        "run": lambda: metadata_text(meta),
        "formats": lambda: block(front.format_table(run)),
        "choose": lambda: block(front.recommendations_table(run)),
        "chosen-elsewhere": lambda: block(front.chosen_elsewhere_table(run)),
        "rfc": lambda: block(front.claims_table(run, "rfc")),
        "targets": lambda: block(front.claims_table(run, "target")),
        "rule": lambda: front.rule_text(),
        "rfc-counts": lambda: front.counts_text(front.findings(run, "rfc")),
        "target-counts": lambda: front.counts_text(front.findings(run, "target")),
        "legacy-load": lambda: front.legacy_load_text(run),
        "repack": lambda: front.repack_text(run),
        "packing": lambda: front.packing_text(run),
        "peers": lambda: block(front.peers_table(run)),
    }
    return parts


def render_readme(text: str, run: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """``text`` with every marked part regenerated from the run."""
    parts = readme_parts(run, meta)

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
