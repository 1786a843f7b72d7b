"""Execute the research notebooks with papermill and render the report.

``python -m packlab.notebooks run --scale default`` is what ``make run`` does. Scales:
``ci`` (each notebook's own ``parameters`` cell), ``default`` and ``full`` (the values in
``notebooks/scales.json``, passed with papermill ``-p``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from packlab.results import _root, build_dir

SCALES = ("ci", "default", "full")


def notebooks_dir() -> Path:
    return _root() / "notebooks"


def notebook_paths(only: list[str] | None = None) -> list[Path]:
    paths = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(o) for o in only)]
    return paths


def scale_parameters(name: str, scale: str) -> dict[str, Any]:
    """Papermill parameters for notebook ``name`` at ``scale`` (``ci``: none, the defaults)."""
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}; choose from {SCALES}")
    if scale == "ci":
        return {}
    table = json.loads((notebooks_dir() / "scales.json").read_text())
    return dict(table.get(name, {}).get(scale, {}))


def execute(path: Path, scale: str, out_dir: Path) -> Path:
    import papermill

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / path.name
    os.environ.setdefault("MPLCONFIGDIR", str(build_dir() / "mpl"))
    os.environ.setdefault("HF_HOME", str(build_dir() / "hf"))
    papermill.execute_notebook(
        str(path),
        str(out),
        parameters=scale_parameters(path.stem, scale),
        kernel_name="python3",
        cwd=str(path.parent),
        progress_bar=False,
    )
    return out


def run(scale: str, only: list[str] | None = None) -> Path:
    out_dir = build_dir() / "notebooks"
    timings: dict[str, float] = {}
    for path in notebook_paths(only):
        began = time.perf_counter()
        print(f"[packlab] executing {path.name} at {scale} scale", flush=True)
        execute(path, scale, out_dir)
        timings[path.stem] = time.perf_counter() - began
        print(f"[packlab]   done in {timings[path.stem]:.0f} s", flush=True)
    from packlab.report import write_report

    index = write_report(out_dir, build_dir() / "report", timings=timings, scale=scale)
    print(f"[packlab] report: {index}")
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m packlab.notebooks")
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="execute notebooks and write the report")
    run_parser.add_argument("--scale", choices=SCALES, default="default")
    run_parser.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 02")
    args = parser.parse_args(argv)
    run(args.scale, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
