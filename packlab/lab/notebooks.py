"""Execute the research notebooks with papermill, render the report, record a run.

``python -m packlab.lab.notebooks run --scale default`` is what ``make run`` does. Scales:
``ci`` (each notebook's own ``parameters`` cell), ``default`` and ``full`` (the values in
``notebooks/scales.json``, passed with papermill ``-p``), and ``rfc`` (``make run SCALE=rfc``:
the RFC's 13M sequences, only the notebooks that have that scale, under ``build/rfc/``, their
output streamed to the terminal as it comes; ``record --scale rfc`` keeps it in
``results/rfc/``). Every notebook of one ``run`` records
the run's id beside its numbers, and the run's metadata (date, commit, machine, versions,
timings) goes to ``build/results/run.json``.

``python -m packlab.lab.notebooks record`` keeps the last complete run in the repository
(``results/recorded/``) and regenerates the README's numbers from it; ``readme`` regenerates
them only; ``report`` renders the report again from what ``build/`` holds; ``normalize``
rewrites the notebooks in their committed form (what ``make lab`` saves); ``compare A B``
prints two runs' answers per use case (a whole ``run`` keeps the run before it in
``build/previous/``, so ``compare build/previous build/results`` compares the last two).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from packlab.lab.results import RUN_ENV, build_dir, notebooks_dir

SCALES = ("ci", "default", "full", "rfc")
LONG = ("rfc",)  # scales run by notebooks that say so only, their outputs streamed


def notebook_paths(only: list[str] | None = None, scale: str | None = None) -> list[Path]:
    """The notebooks (those ``only`` names by prefix); at a long scale, only the notebooks
    that have one."""
    paths = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    if only:
        paths = [p for p in paths if any(p.stem.startswith(o) for o in only)]
    if scale in LONG:
        table = json.loads((notebooks_dir() / "scales.json").read_text())
        paths = [p for p in paths if scale in table.get(p.stem, {})]
    return paths


def scale_build_dir(scale: str) -> Path:
    """Where a run at ``scale`` writes: ``build/``, or ``build/<scale>/`` for a long scale
    (its record is kept apart from the default run's, in ``results/<scale>/``)."""
    return build_dir() / scale if scale in LONG else build_dir()


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
    if scale in LONG:
        show_cell_output()
    papermill.execute_notebook(
        str(path),
        str(out),
        parameters=scale_parameters(path.stem, scale),
        kernel_name="python3",
        cwd=str(path.parent),
        progress_bar=False,
        log_output=scale in LONG,  # a long run's stage lines reach the terminal as they come
    )
    return out


def show_cell_output() -> None:
    """Papermill logs a cell's output at INFO, which Python drops without a handler: one that
    prints the lines, and only them, on stderr."""
    logger = logging.getLogger("papermill")
    if not any(getattr(h, "packlab", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.addFilter(_cell_output)
        handler.packlab = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _cell_output(record: logging.LogRecord) -> bool:
    """A cell's lines as printed (papermill's own messages left out)."""
    text = record.getMessage()
    if text.startswith(("Executing", "Input Notebook", "Output Notebook", "Ending")):
        return False
    record.msg, record.args = text.rstrip("\n"), ()
    return bool(record.msg)


def run(scale: str, only: list[str] | None = None) -> Path:
    from packlab.lab.summaries.record import RUN_FILE, keep_previous, new_run_id, run_metadata

    if scale in LONG:  # the notebooks' kernels write there too
        os.environ["PACKLAB_BUILD"] = str(scale_build_dir(scale))
    out_dir = build_dir() / "notebooks"
    results_dir = build_dir() / "results"
    if not only:  # a whole run: the one before it stays, to be compared with
        keep_previous(results_dir, build_dir() / "previous")
    run_id = os.environ[RUN_ENV] = new_run_id()
    timings: dict[str, float] = {}
    for path in notebook_paths(only, scale):
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


def record(scale: str = "default") -> None:
    from packlab.lab.summaries.record import readme_path, record_run, recorded_dir, update_readme

    source = scale_build_dir(scale) / "results"
    target = record_run(source, recorded_dir(scale))
    print(f"[packlab] recorded {source} into {target}")
    changed = update_readme()
    print(f"[packlab] {readme_path()}: {'regenerated' if changed else 'already up to date'}")


def readme() -> None:
    from packlab.lab.summaries.record import readme_path, update_readme

    changed = update_readme()
    print(f"[packlab] {readme_path()}: {'regenerated' if changed else 'already up to date'}")


def compare(first: str, second: str) -> int:
    """Print two recorded runs' answers per use case; 0 when every one agrees, 1 when not."""
    from packlab.lab.summaries.record import compare_text

    text, agree = compare_text(Path(first), Path(second))
    print(text)
    return 0 if agree else 1


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
    record_parser = sub.add_parser(
        "record", help="keep the last complete run in results/recorded/ (a run at --scale rfc: "
                       "in results/rfc/) and regenerate the README's numbers from them")
    record_parser.add_argument("--scale", choices=("default", *LONG), default="default")
    sub.add_parser("readme", help="regenerate the README's numbers from results/recorded/")
    sub.add_parser("normalize", help="rewrite notebooks/NN_*.ipynb in their committed form "
                                     "(no outputs, the metadata JupyterLab would add)")
    compare_parser = sub.add_parser(
        "compare", help="two runs' answers per use case (results folders, e.g. build/previous "
                        "build/results); exit 1 when any use case differs")
    compare_parser.add_argument("first")
    compare_parser.add_argument("second")
    return parser


def main(argv: list[str] | None = None) -> int:
    from packlab.errors import PacklabError

    args = build_parser().parse_args(argv)
    try:
        if args.action == "run":
            run(args.scale, args.only)
        elif args.action == "compare":
            return compare(args.first, args.second)
        elif args.action == "record":
            record(args.scale)
        else:
            {"report": report, "record": record, "readme": readme,
             "normalize": normalize}[args.action]()
    except PacklabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
