"""Every notebook: committed clean, follows the template, and runs at CI scale under papermill
into a page a reader wants: no warning, no stray output, its findings in the one vocabulary and
rendered from what it recorded."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from packlab.lab.measure.verdicts import VERDICTS
from packlab.lab.notebooks import notebook_paths, notebooks_dir
from packlab.lab.summaries import notebook_markdown

pytestmark = pytest.mark.slow  # minutes of work: `make test-fast` leaves it out

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
    assert "results.record(" in code[-1].source, "the last cell records the results"
    assert code[-1].source.rstrip().endswith(f'summaries.show("{path.stem}")'), \
        "the last cell shows the recorded findings"
    scales = json.loads((notebooks_dir() / "scales.json").read_text())
    assert path.stem in scales and {"default", "full"} <= set(scales[path.stem])


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_at_ci_scale(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packlab.lab import results
    from packlab.lab.notebooks import execute

    monkeypatch.setenv("PACKLAB_BUILD", str(tmp_path / "build"))
    monkeypatch.setenv("PACKLAB_DATA", str(tmp_path / "data"))
    executed = execute(path, "ci", tmp_path / "build" / "notebooks")
    recorded = results.load(path.stem)
    assert recorded["numbers"], f"{path.stem} recorded no numbers"
    figures = list((tmp_path / "build" / "figures").glob("*.png"))
    assert figures, f"{path.stem} saved no figure under build/figures/"
    assert_reads_cleanly(nbformat.read(executed, as_version=4))
    for f in recorded["findings"]:
        assert f["verdict"] in VERDICTS, f
        assert f["source"] in results.SOURCES, f
    assert notebook_markdown(path.stem, recorded)


def assert_reads_cleanly(notebook: nbformat.NotebookNode) -> None:
    """What a reader of the page would trip on: warnings or errors (anything on stderr), and
    outputs that are only a repr (``PosixPath(...)``, a dict): every result is Markdown, HTML
    or an image."""
    for i, cell in enumerate(notebook.cells):
        for out in cell.get("outputs", []):
            where = f"cell {i}: {cell.source[:60]!r}"
            assert out.output_type != "error", where
            assert not (out.output_type == "stream" and out.name == "stderr"), \
                f"{where} wrote to stderr: {out.text[:300]}"
            if out.output_type in ("execute_result", "display_data"):
                assert set(out.data) - {"text/plain"}, \
                    f"{where} shows a bare repr: {out.data['text/plain'][:200]}"


def test_a_long_runs_cell_output_reaches_the_terminal_as_printed(tmp_path: Path, capfd) -> None:
    """At a long scale the stage lines are the run's progress: papermill logs them at INFO,
    which Python drops unless the runner gives its logger a handler."""
    import papermill

    from packlab.lab.notebooks import show_cell_output

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("for i in range(3):\n    print(f'[scale] stage {i}')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, tmp_path / "in.ipynb")
    show_cell_output()
    show_cell_output()  # once is enough: a second call adds no second handler
    papermill.execute_notebook(str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"),
                               kernel_name="python3", progress_bar=False, log_output=True)
    printed = [line for line in capfd.readouterr().err.splitlines() if "[scale]" in line]
    assert printed == ["[scale] stage 0", "[scale] stage 1", "[scale] stage 2"]
