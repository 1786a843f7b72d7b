"""The answer per use case holds across reruns: decided on the recorded runs
(``results/recorded/`` and the run before it, ``results/previous/``) and on copies of them
perturbed as a busy machine or another run would move them.

A warm read moving by 1.6 µs (the swing of two runs of one commit on this machine) must not
move any answer; a load peak 200 MB higher, which 64 processes a node make 12.8 GB, must.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from packlab.lab.notebooks import main as notebooks_main
from packlab.lab.summaries import decide, front
from packlab.lab.summaries.record import (
    RUN_FILE,
    compare_text,
    load_run,
    previous_dir,
    record_run,
    recorded_dir,
)

RECORDED = load_run(recorded_dir())[0]
PREVIOUS = load_run(previous_dir())[0]


def _answers(run: dict[str, Any]) -> dict[str, str | None]:
    return {c["use_case"]: c["format"] for c in front.recommendations(run)}


def _access(run: dict[str, Any], fmt: str) -> dict[str, Any]:
    return run["05_random_access"]["numbers"]["formats"][fmt]


def _load_peak(run: dict[str, Any], fmt: str) -> dict[str, float]:
    return run["04_peak_memory"]["numbers"]["formats"][fmt]["load"]["peak_rss_growth_bytes"]


def test_the_two_recorded_runs_give_the_same_answer_in_every_fifth() -> None:
    answers = _answers(RECORDED)
    assert all(answers.values()), answers
    assert _answers(PREVIOUS) == answers
    for run in (RECORDED, PREVIOUS):
        agree = decide.fifth_agreement(front.format_rows(run), front.pack_size_of(run))
        assert agree and all(same == parts == 5 for same, parts in agree.values()), agree
    assert set(front.reruns(RECORDED, PREVIOUS).values()) == {"5 of 5 fifths; the other run: "
                                                              "the same"}


@pytest.mark.parametrize("shift", [1.6, -1.6])
def test_a_warm_read_swing_of_1_6_us_moves_no_answer(shift: float) -> None:
    """Every format's warm p50 (and every fifth of it) moved by 1.6 µs, one at a time."""
    answers = _answers(RECORDED)
    for fmt in RECORDED["05_random_access"]["numbers"]["formats"]:
        run = copy.deepcopy(RECORDED)
        warm = _access(run, fmt)["warm"]
        warm["p50_us"] = max(0.1, warm["p50_us"] + shift)
        warm["p50_by_part_us"] = [max(0.1, p + shift) for p in warm["p50_by_part_us"]]
        assert _answers(run) == answers, fmt


def test_the_run_the_issue_quotes_keeps_the_answer() -> None:
    """A loaded machine's run: arrow_ipc's warm read 7.1 µs against binidx's 8.7, binidx
    opening with 2.41 MB and arrow_ipc with 205 MB (the former rule answered arrow_ipc)."""
    answers = _answers(RECORDED)
    run = copy.deepcopy(RECORDED)
    for fmt, warm in (("arrow_ipc", 7.1), ("binidx", 8.7)):
        _access(run, fmt)["warm"].update(p50_us=warm, p50_by_part_us=[warm] * 5)
    for fmt, peak in (("arrow_ipc", 205e6), ("binidx", 2.41e6)):
        sizes = _load_peak(run, fmt)
        sizes[max(sizes, key=int)] = peak
    assert _answers(run) == answers and answers["local training"] != "arrow_ipc"


def test_a_load_peak_200_mb_higher_counts_for_every_process_of_a_node() -> None:
    local = next(c for c in front.recommendations(RECORDED) if c["use_case"] == "local training")
    for fmt in [local["format"], *local["tied"]]:
        run = copy.deepcopy(RECORDED)
        sizes = _load_peak(run, fmt)
        sizes[max(sizes, key=int)] += 200e6
        moved = next(c for c in front.recommendations(run) if c["use_case"] == "local training")
        assert fmt not in [moved["format"], *moved["tied"]], fmt
        memory = next(s for s in moved["steps"] if s["criterion"] == "memory per node")
        assert fmt not in memory["kept"]


def test_a_read_a_step_notices_counts() -> None:
    """The chosen format's cold read a millisecond slower (four times what 1% of a 4,096-token
    bin's training allows): it is out."""
    pick = _answers(RECORDED)["local training"]
    run = copy.deepcopy(RECORDED)
    cold = _access(run, pick)["cold"]
    cold["p50_us"] += 1000
    cold["p50_by_part_us"] = [p + 1000 for p in cold["p50_by_part_us"]]
    assert _answers(run)["local training"] != pick
    assert round(decide.noticed_us(4096)) == 248


def _copy(source: Path, target: Path, run: dict[str, Any] | None = None) -> Path:
    shutil.copytree(source, target)
    for name, recorded in (run or {}).items():
        (target / f"{name}.json").write_text(json.dumps(recorded))
    return target


def test_compare_reads_two_recorded_runs_and_says_where_they_agree(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    first = _copy(recorded_dir(), tmp_path / "first")
    second = _copy(previous_dir(), tmp_path / "second")
    text, agree = compare_text(first, second)
    assert agree and text.endswith("4 of 4 use cases agree")
    for directory in (first, second):  # each run named by the commit it ran
        commit = json.loads((directory / "run.json").read_text())["commit"][:10]
        assert f"commit {commit}" in text
    assert notebooks_main(["compare", str(first), str(second)]) == 0
    run = copy.deepcopy(RECORDED)
    pick = _answers(run)["local training"]
    cold = _access(run, pick)["cold"]
    cold["p50_us"] += 1000
    moved = _copy(recorded_dir(), tmp_path / "moved", {"05_random_access":
                                                       run["05_random_access"]})
    capsys.readouterr()
    assert notebooks_main(["compare", str(first), str(moved)]) == 1
    out = capsys.readouterr().out
    assert f"| local training | `{pick}` | `" in out and "**no**" in out
    assert "3 of 4 use cases agree" in out
    assert notebooks_main(["compare", str(first), str(tmp_path / "nothing")]) == 2


def test_recording_keeps_the_run_before_it(tmp_path: Path) -> None:
    """``record`` moves the run it replaces to ``previous/`` (the README's second whole run);
    recording the same run again keeps the one before."""
    recorded = _copy(recorded_dir(), tmp_path / "recorded")
    newer = _copy(previous_dir(), tmp_path / "build")
    record_run(newer, recorded)
    kept = json.loads((tmp_path / "previous" / RUN_FILE).read_text())
    assert kept == json.loads((recorded_dir() / RUN_FILE).read_text())
    record_run(newer, recorded)
    assert json.loads((tmp_path / "previous" / RUN_FILE).read_text()) == kept
