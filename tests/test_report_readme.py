"""One source of truth for numbers: the README quotes the run recorded in the repository.

The README's findings (and the few numbers its prose quotes) are generated parts between
``<!-- packlab:NAME -->`` markers, rendered from ``results/recorded/``; here they must equal what
the record renders today, the record must be one complete run, and the Findings section must
hold no number typed by hand.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from packlab.errors import PacklabError
from packlab.lab.notebooks import notebook_paths
from packlab.lab.summaries.record import (
    MARKER,
    RUN_FILE,
    load_run,
    readme_path,
    record_run,
    recorded_dir,
    render_readme,
    update_readme,
)

README = readme_path().read_text()
REQUIRED = ("run", "choose", "ties", "reruns", "formats", "rule", "rfc", "targets", "stack-inputs",
            "beside-stack")


def test_the_readme_agrees_with_the_recorded_run() -> None:
    run, meta = load_run(recorded_dir())
    assert render_readme(README, run, meta) == README, (
        "README and results/recorded/ disagree: run `python -m packlab.lab.notebooks readme` "
        "(or `record` after `make run`)")
    names = {m.group(2) for m in MARKER.finditer(README)}
    assert set(REQUIRED) <= names


def test_the_record_is_one_complete_run_with_its_machine() -> None:
    run, meta = load_run(recorded_dir())
    assert {p.stem for p in notebook_paths()} <= set(run), "every notebook is in the record"
    assert meta["scale"] in ("default", "full"), "the README quotes the default scale or more"
    assert {r.get("run") for r in run.values()} == {meta["run"]}
    assert meta["commit"] and meta["date"]
    assert {"cores", "memory_bytes", "read_ahead_kb"} <= set(meta["machine"])
    assert {"python", "numpy", "pyarrow", "duckdb", "torch"} <= set(meta["versions"])


def test_no_number_in_the_findings_is_typed_by_hand() -> None:
    section = README[README.index("## Findings"):]
    section = section[:section.index("\n## ", 4)]
    text = MARKER.sub("", section)
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`]*`", "", text)
    text = re.sub(r"\b(notebook|seed) \d+|\bp\d\d\b", "", text)
    assert not re.findall(r"\d", text), f"hand-typed numbers in Findings: {text}"


def _fake_run(directory: Path, run_id: str, *, other: str | None = None) -> None:
    directory.mkdir(parents=True)
    for i, name in enumerate(("02_packing", "03_write_formats")):
        (directory / f"{name}.json").write_text(json.dumps(
            {"notebook": name, "run": other if (other and i) else run_id, "parameters": {},
             "numbers": {"bytes_per_token": {"parquet": 1.5}}, "findings": []}))
    (directory / RUN_FILE).write_text(json.dumps({"run": run_id, "scale": "ci"}))


def test_record_keeps_one_run_and_refuses_a_mix(tmp_path: Path) -> None:
    _fake_run(tmp_path / "good", "r1")
    target = record_run(tmp_path / "good", tmp_path / "recorded")
    assert sorted(p.name for p in target.iterdir()) == [
        "02_packing.json", "03_write_formats.json", RUN_FILE]
    _fake_run(tmp_path / "mixed", "r2", other="r0")
    with pytest.raises(PacklabError, match="03_write_formats.*another run"):
        record_run(tmp_path / "mixed", tmp_path / "recorded")
    assert load_run(tmp_path / "recorded")[1]["run"] == "r1"  # the good record is untouched
    with pytest.raises(PacklabError, match="no run to record"):
        record_run(tmp_path / "nothing", tmp_path / "recorded")


def test_update_readme_regenerates_every_marked_part(tmp_path: Path) -> None:
    shutil.copytree(recorded_dir(), tmp_path / "recorded")
    readme = tmp_path / "README.md"
    stale = README.replace("<!-- packlab:formats -->\n", "<!-- packlab:formats -->\n| stale |\n")
    readme.write_text(stale)
    assert update_readme(tmp_path / "recorded", readme)
    assert readme.read_text() == README
    assert not update_readme(tmp_path / "recorded", readme)
    readme.write_text(README + "\n<!-- packlab:nonsense -->x<!-- /packlab:nonsense -->\n")
    with pytest.raises(PacklabError, match="nonsense"):
        update_readme(tmp_path / "recorded", readme)
