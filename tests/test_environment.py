"""The frame: pyproject.toml and environment.yml list the same dependencies."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _pyproject_requirements() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = set(project["project"]["dependencies"])
    for extra in project["project"]["optional-dependencies"].values():
        reqs.update(extra)
    reqs.update(project["tool"]["packlab"]["no_deps"])
    return {re.sub(r"\s+", "", r) for r in reqs}


def _environment_requirements() -> set[str]:
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    reqs = set()
    for line in lines[start + 1 :]:
        stripped = line.strip()
        if stripped.startswith("- "):
            reqs.add(re.sub(r"\s+", "", stripped[2:]))
    return reqs


def test_environment_yml_agrees_with_pyproject() -> None:
    assert _environment_requirements() == _pyproject_requirements()


def test_torch_is_pinned_to_the_cpu_build() -> None:
    assert "torch==2.13.0" in _pyproject_requirements()
