"""The frame: pyproject.toml and environment.yml list the same dependencies."""

from __future__ import annotations

import ast
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


def test_no_test_can_skip_or_pass_by_returning_early() -> None:
    """A declared dependency or a registered format that goes missing fails the tests that
    need it: no skip, importorskip, skipif or xfail anywhere in tests/; and a Hypothesis test
    rejects an example with assume(), never with a bare return (which counts it as passed)."""
    skips = re.compile(r"\bimportorskip\b|\bpytest\.skip\b|\bmark\.skip(if)?\b|\bxfail\b")
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        found += [f"{path.name}:{n}" for n, line in enumerate(text.splitlines(), 1)
                  if skips.search(line.split("#")[0]) and path.name != Path(__file__).name]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and any(
                    "given" in ast.unparse(d) for d in node.decorator_list):
                found += [f"{path.name}:{r.lineno} ({node.name}: return)" for r in ast.walk(node)
                          if isinstance(r, ast.Return) and r.value is None
                          and not _asserts_before(node, r.lineno)]
    assert not found, found


def _asserts_before(test: ast.FunctionDef, line: int) -> bool:
    """Whether the branch that ends at ``line`` checked something first (an assert or a
    ``pytest.raises`` block in the lines just before it): an example handled, not dropped."""
    branch = [n for n in ast.walk(test) if isinstance(n, ast.If | ast.Try | ast.ExceptHandler)
              and n.lineno < line <= (n.end_lineno or n.lineno)]
    inner = min(branch, key=lambda n: line - n.lineno) if branch else test
    return any(isinstance(n, ast.Assert | ast.With) and n.lineno < line for n in ast.walk(inner))
