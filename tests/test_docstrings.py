"""Docstrings say what exists: every ``packlab.…`` name a docstring of the package gives (and
every relative ``:mod:`.name``` in one) is a module of the package, or a name defined in one.

Docstrings are read with ``ast``; a name is looked up in the module's own top-level
definitions and imports, without importing anything.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from test_architecture import MODULES, ROOT

NAME = re.compile(r"(?<![\w.])packlab(?:\.[A-Za-z_]\w*)+")
RELATIVE = re.compile(r":(?:mod|class|func|data|meth):`~?(\.[A-Za-z_][\w.]*)`")



@cache
def top_level_names(module: str) -> frozenset[str]:
    """What ``module`` defines or imports at its top level (and in its top-level ``if``s)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
                if "__all__" in names and isinstance(node.value, ast.List | ast.Tuple):
                    names.update(e.value for e in node.value.elts if isinstance(e, ast.Constant))
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, ast.If | ast.Try):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(MODULES[module].read_text()).body)
    return frozenset(names)


def exists(name: str) -> bool:
    """``name`` is a module of packlab, or a module followed by a name it defines (and, for a
    class, anything after it: attributes are not checked)."""
    parts = name.split(".")
    for depth in range(len(parts), 0, -1):
        module = ".".join(parts[:depth])
        if module in MODULES:
            rest = parts[depth:]
            return not rest or rest[0] in top_level_names(module) or f"{module}.{rest[0]}" in MODULES
    return False


def docstrings(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                found.append((getattr(node, "lineno", 1), doc))
    return found


def absolute(module: str, relative: str) -> str:
    """``.name`` in a docstring of ``module``: a name in its package."""
    package = module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]
    return package + relative


def test_every_name_a_docstring_gives_exists() -> None:
    missing = [f"{path.relative_to(ROOT.parent)}:{line}: {name}"
               for module, path in MODULES.items() for line, doc in docstrings(path)
               for name in [*NAME.findall(doc),
                            *(absolute(module, r) for r in RELATIVE.findall(doc))]
               if not exists(name.rstrip("."))]
    assert not missing, "\n".join(missing)


def test_the_check_sees_a_name_that_does_not_exist() -> None:
    assert exists("packlab.storage.location.Location")
    assert exists("packlab.formats.read.table")
    assert not exists("packlab.formats.mmidx")
    assert not exists("packlab.storage.location.NoSuchClass")
    assert absolute("packlab.sources", ".validate") == "packlab.sources.validate"
    assert not exists(absolute("packlab.sources", ".checks"))
