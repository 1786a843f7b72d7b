"""Every code block of the README is run by a test as printed: each block with a language is
under a section one of the README tests runs (``readme_sections.RUN_BY``), or is one of the
repository's own commands (``make``, the notebook runner, papermill), which cannot run inside
the suite (``make test`` is the suite; ``make run`` takes half an hour): those are checked
here to name targets, subcommands, options and parameters that exist."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest
from readme_sections import REPOSITORY_COMMANDS, RUN_BY, fenced_blocks

from packlab.lab.notebooks import build_parser, notebook_paths

ROOT = Path(__file__).resolve().parents[1]


def test_every_code_block_is_run_by_a_readme_test() -> None:
    uncovered = []
    for headings, language, code in fenced_blocks():
        if not language:
            continue  # text: the data flow, the command synopsis, the repository's tree
        if any(h in RUN_BY for h in headings) or any(h in REPOSITORY_COMMANDS for h in headings):
            continue
        uncovered.append(f"{headings[-1] if headings else '(top)'}: {code.splitlines()[0]}")
    assert not uncovered, uncovered
    for title, test in RUN_BY.items():
        assert (ROOT / test).is_file() and title.rstrip() in (ROOT / test).read_text(), title
    languages = {language for _, language, _ in fenced_blocks()}
    assert languages <= {"", "sh", "python", "bash"}, languages


def repository_commands() -> list[list[str]]:
    """Each command line of the repository-command sections, its continuations joined."""
    out = []
    for headings, language, code in fenced_blocks():
        if language and any(h in REPOSITORY_COMMANDS for h in headings):
            joined = code.replace("\\\n", " ")
            for line in joined.splitlines():
                for part in line.split("&&"):
                    argv = shlex.split(part, comments=True)
                    if argv:
                        out.append(argv)
    return out


def test_the_repository_commands_name_what_exists() -> None:
    commands = repository_commands()
    assert {argv[0] for argv in commands} == {"make", ".venv/bin/python", ".venv/bin/papermill"}
    for argv in commands:
        if argv[0] == "make":  # a dry run: the target and its variables resolve, nothing runs
            done = subprocess.run(["make", "-n", "-C", str(ROOT), *argv[1:]],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, (argv, done.stderr)
        elif argv[0] == ".venv/bin/python":
            assert argv[1:3] == ["-m", "packlab.lab.notebooks"], argv
            args = build_parser().parse_args(argv[3:])
            if args.action == "run":
                assert all(notebook_paths([o]) for o in args.only or ()), argv
        else:
            notebook, out, *params = argv[1:]
            assert (ROOT / notebook).is_file() and out.startswith("build/notebooks/"), argv
            cells = json.loads((ROOT / notebook).read_text())["cells"]
            cell = next(c for c in cells if "parameters" in c["metadata"].get("tags", []))
            names = {line.split("=")[0].strip() for line in "".join(cell["source"]).splitlines()
                     if "=" in line and not line.startswith("#")}
            scales = json.loads((ROOT / "notebooks" / "scales.json").read_text())
            given = dict(zip(params[1::3], params[2::3], strict=True))
            assert params[0::3] == ["-p"] * len(given), argv
            assert set(given) <= names, (given, names)
            full = scales[Path(notebook).stem]["full"]
            assert {k: str(full[k]) for k in given} == given  # the full scale's values


@pytest.mark.parametrize("title", sorted(RUN_BY))
def test_each_section_the_tests_run_has_code(title: str) -> None:
    assert any(title in headings and language for headings, language, _ in fenced_blocks())
