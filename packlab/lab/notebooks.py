"""Execute the research notebooks with papermill, render the report, record a run.

``python -m packlab.lab.notebooks run --scale default`` is what ``make run`` does. Scales:
``ci`` (each notebook's own ``parameters`` cell), ``default`` and ``full`` (the values in
``notebooks/scales.json``, passed with papermill ``-p``). Every notebook of one ``run`` records
the run's id beside its numbers, and the run's metadata (date, commit, machine, versions,
timings) goes to ``build/results/run.json``.

``python -m packlab.lab.notebooks record`` keeps the last complete run in the repository
(``results/recorded/``) and regenerates the README's numbers from it; ``readme`` regenerates
them only; ``report`` renders the report again from what ``build/`` holds; ``normalize``
rewrites the notebooks in their committed form (what ``make lab`` saves).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from packlab.lab.results import RUN_ENV, build_dir, notebooks_dir

SCALES = ("ci", "default", "full")


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
    from packlab.lab.summaries.record import RUN_FILE, new_run_id, run_metadata

    out_dir = build_dir() / "notebooks"
    results_dir = build_dir() / "results"
    run_id = os.environ[RUN_ENV] = new_run_id()
    timings: dict[str, float] = {}
    for path in notebook_paths(only):
        began = time.perf_counter()
        print(f"[packlab] executing {path.name} at {scale} scale", flush=True)
        execute(path, scale, out_dir)
        timings[path.stem] = time.perf_counter() - began
        print(f"[packlab]   done in {timings[path.stem]:.0f} s", flush=True)
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / RUN_FILE).write_text(
        json.dumps(run_metadata(run_id, scale, timings), indent=2) + "\n")
    return report()


def report() -> Path:
    from packlab.lab.report import write_report

    index = write_report(build_dir() / "notebooks", build_dir() / "report")
    print(f"[packlab] report: {index}")
    return index


def record() -> None:
    from packlab.lab.summaries.record import readme_path, record_run, update_readme

    target = record_run()
    print(f"[packlab] recorded {build_dir() / 'results'} into {target}")
    changed = update_readme()
    print(f"[packlab] {readme_path()}: {'regenerated' if changed else 'already up to date'}")


def readme() -> None:
    from packlab.lab.summaries.record import readme_path, update_readme

    changed = update_readme()
    print(f"[packlab] {readme_path()}: {'regenerated' if changed else 'already up to date'}")


def normalize() -> None:
    from packlab.lab.jupyter import normalize as rewrite

    for path in rewrite(notebook_paths()):
        print(f"[packlab] {path}: rewritten in its committed form")


def build_parser() -> argparse.ArgumentParser:
    """``python -m packlab.lab.notebooks``'s arguments (the README's commands parse with it)."""
    parser = argparse.ArgumentParser(prog="python -m packlab.lab.notebooks")
    sub = parser.add_subparsers(dest="action", required=True)
    run_parser = sub.add_parser("run", help="execute notebooks and write the report")
    run_parser.add_argument("--scale", choices=SCALES, default="default")
    run_parser.add_argument("--only", nargs="*", help="notebook name prefixes, e.g. 02")
    sub.add_parser("report", help="render the report again from build/ (no execution)")
    sub.add_parser("record", help="keep the last complete run in results/recorded/ and "
                                  "regenerate the README's numbers from it")
    sub.add_parser("readme", help="regenerate the README's numbers from results/recorded/")
    sub.add_parser("normalize", help="rewrite notebooks/NN_*.ipynb in their committed form "
                                     "(no outputs, the metadata JupyterLab would add)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from packlab.errors import PacklabError

    args = build_parser().parse_args(argv)
    try:
        if args.action == "run":
            run(args.scale, args.only)
        else:
            {"report": report, "record": record, "readme": readme,
             "normalize": normalize}[args.action]()
    except PacklabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
