"""Every notebook: committed clean, follows the template, and runs at CI scale under papermill."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from packlab.notebooks import notebook_paths, notebooks_dir

NOTEBOOKS = notebook_paths()


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_is_committed_clean_and_follows_the_template(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert nb.metadata.get("kernelspec", {}).get("name") == "python3"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in code)
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1, "exactly one cell tagged 'parameters'"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    assert "results.record(" in "".join(c.source for c in code) or "record(" in code[-1].source
    scales = json.loads((notebooks_dir() / "scales.json").read_text())
    assert path.stem in scales and {"default", "full"} <= set(scales[path.stem])


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_at_ci_scale(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packlab import results
    from packlab.notebooks import execute

    monkeypatch.setenv("PACKLAB_BUILD", str(tmp_path / "build"))
    monkeypatch.setenv("PACKLAB_DATA", str(tmp_path / "data"))
    execute(path, "ci", tmp_path / "build" / "notebooks")
    recorded = results.load(path.stem)
    assert recorded["numbers"], f"{path.stem} recorded no numbers"
    figures = list((tmp_path / "build" / "figures").glob("*.png"))
    assert figures, f"{path.stem} saved no figure under build/figures/"
