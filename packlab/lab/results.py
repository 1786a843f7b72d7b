"""Where notebooks put what they found: results JSON, figures and data under the build folder.

Every notebook ends with one :func:`record` call; tests and the report read the JSON back, so
the words in a notebook's conclusion never drift from its numbers.

The numbers are the notebook's typed record (:mod:`packlab.lab.records`), stored as its JSON
under the record's name. A literal results file (``build/results/03_write_formats.json``)::

    {"notebook": "03_write_formats", "record": "WriteFormats",
     "parameters": {"num_sequences": 20000},
     "numbers": {"bytes_per_token": {"parquet": 2.31, "memmap_v1": 5.04}, "num_bins": 4502},
     "findings": [{"claim": "FFD within 0.5% of the lower bound", "measured": "0.09%",
                   "verdict": "holds", "source": "target"}]}

A finding's ``source`` says whose claim it is: ``rfc`` (the RFC and the design documents: the
seeds), ``target`` (packlab's targets, docs/design.md) or ``check`` (packlab checking itself). Its
``verdict`` is one of the words of :mod:`packlab.lab.measure.verdicts`, decided by the one rule
stated there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from packlab.lab.records.base import Record
from packlab.storage.files import json_default

_REPO = Path(__file__).resolve().parents[2]  # packlab/lab/results.py -> the checkout
#: the id of the ``python -m packlab.lab.notebooks run`` a notebook runs in (kept in its results, so
#: a recorded run is known to be one run)
RUN_ENV = "PACKLAB_RUN"


def _root() -> Path:
    """The repository when packlab runs from a checkout, else the working directory."""
    return _REPO if (_REPO / "pyproject.toml").is_file() else Path.cwd()


def notebooks_dir() -> Path:
    """``notebooks/`` of the repository: the research notebooks."""
    return _root() / "notebooks"


def build_dir() -> Path:
    return Path(os.environ.get("PACKLAB_BUILD", _root() / "build"))


def data_dir(name: str = "") -> Path:
    """A folder for generated data (``data/`` in the repository, git-ignored)."""
    path = Path(os.environ.get("PACKLAB_DATA", _root() / "data")) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def figure_path(name: str) -> Path:
    """``build/figures/NAME.png``: where a notebook saves a figure."""
    path = build_dir() / "figures" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def results_path(notebook: str) -> Path:
    return build_dir() / "results" / f"{notebook}.json"


SOURCES = {"rfc": "the RFC and the design documents", "target": "packlab's targets (docs/design.md)",
           "check": "packlab's own checks"}


def finding(claim: str, measured: str, verdict: str, *, source: str | None = None
            ) -> dict[str, str]:
    """One row of the claims table: what was said, what we measured, and whether it holds.

    ``source`` (see :data:`SOURCES`); by default ``rfc`` for a claim written ``RFC...``, else
    ``check``."""
    source = source or _source(claim)
    if source not in SOURCES:
        raise ValueError(f"finding source must be one of {sorted(SOURCES)}, got {source!r}")
    return {"claim": claim, "measured": measured, "verdict": verdict, "source": source}


def _source(claim: str) -> str:
    return "rfc" if claim.startswith("RFC") else "check"


def record(
    notebook: str,
    numbers: Record,
    *,
    parameters: dict[str, Any] | None = None,
    findings: list[dict[str, str]] | None = None,
) -> None:
    """Write a notebook's headline numbers, its typed record, to :func:`results_path` (returns
    nothing, so a notebook's last cell shows no stray output)."""
    if type(numbers).NOTEBOOK != notebook:
        raise ValueError(f"{notebook}: its numbers must be its record, got "
                         f"{type(numbers).__name__} (of {type(numbers).NOTEBOOK or 'no notebook'})")
    path = results_path(notebook)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "notebook": notebook,
        "record": type(numbers).__name__,
        "run": os.environ.get(RUN_ENV),
        "parameters": parameters or {},
        "numbers": numbers.to_json(),
        "findings": [{**f, "source": f.get("source") or _source(f["claim"])}
                     for f in findings or []],
    }
    path.write_text(json.dumps(payload, indent=2, default=json_default) + "\n")


def load(notebook: str) -> dict[str, Any]:
    return json.loads(results_path(notebook).read_text())
