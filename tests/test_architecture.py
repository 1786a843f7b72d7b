"""The house rules of ARCHITECTURE.md, checked on the source: layers, no cycles, the core apart.

Imports are read with ``ast`` from every module of ``packlab/``, imports inside functions
included (an import deferred into a function is still a dependency).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from packlab.formats import format_names

ROOT = Path(__file__).resolve().parents[1] / "packlab"
MAX_LINES = 2000
# Modules whose strings coincide with a format's name but mean something else.
NOT_FORMAT_NAMES = {
    "packlab.loading.per_rank.chunks": "per-rank chunk file kinds (jsonl, parquet), not shard formats",
}

# ARCHITECTURE.md, "Layers": a module may import only from its own layer or the ones before it.
# Layers 0-6 are the core (what a training job or a data pipeline imports); the lab (7) sits on
# the core, and the command line (8) on both.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "version", "limits", "progress", "executors", "compiled", "storage", "codecs",
     "bins"),
    ("spool", "tokenize", "packing"),
    ("formats",),
    ("loading", "pipeline", "interop"),
    ("pipeline.layout",),
    ("cloud",),
    ("sources", "query"),
    ("lab",),
    ("commands", "cli", ""),
]
CORE = {name.split(".")[0] for names in LAYERS[:7] for name in names}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The packlab module an import names (``packlab.x.y`` may be a name inside ``packlab.x``)."""
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in MODULES else None


def imports_of(module: str) -> set[str]:
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([base] if base else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] or [base]
            if not any(resolve(n) not in (None, "packlab") for n in names):
                names.append(base)
        for name in names:
            target = resolve(name) if name.startswith("packlab") else None
            if target is not None and target != module:
                found.add(target)
    return found


GRAPH = {m: imports_of(m) for m in MODULES}


def layer_of(module: str) -> int:
    """The layer of ``module``: that of the longest entry of LAYERS it is or sits under."""
    inner = module.split(".", 1)[1] if "." in module else ""
    parts = inner.split(".")
    for depth in range(len(parts), 0, -1):
        prefix = ".".join(parts[:depth])
        for rank, names in enumerate(LAYERS):
            if prefix in names:
                return rank
    raise AssertionError(f"{module}: in no layer of ARCHITECTURE.md (add it to LAYERS there "
                         "and here)")


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_packlab_is_python_only() -> None:
    """No compiled piece: the install needs no C compiler and nothing can go stale."""
    assert not [p for p in ROOT.rglob("*") if p.suffix in (".c", ".h", ".cpp", ".pyx")]


def test_the_core_imports_nothing_from_the_lab_or_the_commands() -> None:
    """A training job imports the core alone: nothing in it reaches ``packlab.lab`` (the
    measurements, notebooks' back ends, report, local S3 server) or the command line."""
    core = [m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in CORE]
    assert len(core) > 50
    reaching = [f"{m} imports {t}" for m in core for t in sorted(GRAPH[m])
                if t.split(".")[1:2] and t.split(".")[1] not in CORE]
    assert not reaching, "\n".join(reaching)


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [f"{m} (layer {layer_of(m)}) imports {t} (layer {layer_of(t)})"
              for m, targets in GRAPH.items() for t in sorted(targets)
              if t != "packlab" and layer_of(t) > layer_of(m)]
    assert not upward, "\n".join(upward)


def test_nothing_imports_the_package_facade() -> None:
    """``packlab/__init__.py`` sits on top (it re-exports the facade); inside the package,
    import what you need from its own module."""
    assert not [m for m, targets in GRAPH.items() if "packlab" in targets and m != "packlab"]


def test_no_import_cycles() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in MODULES:
        if module not in index:
            visit(module)
    assert not cycles, cycles


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_a_whole_package(module: str) -> None:
    """A smell detector, not a budget: modules are split by concept, and one this long holds
    more than one."""
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{MODULES[module]}: {lines} lines (more than one concept?)"


def test_no_format_name_decides_behaviour_outside_formats() -> None:
    """What a format is lives on its class (FormatFacts): code outside ``formats/`` compares
    no value with a format's name."""
    names = set(format_names())
    found = []
    for module, path in MODULES.items():
        if module.startswith("packlab.formats") or module in NOT_FORMAT_NAMES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            for operand in [node.left, *node.comparators]:
                values = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) \
                    else [operand]
                hits = [v.value for v in values
                        if isinstance(v, ast.Constant) and v.value in names]
                if hits:
                    found.append(f"{path}:{node.lineno}: compares with {hits}")
    assert not found, "\n".join(found)


def _repository_files(repo: Path, suffixes: tuple[str, ...]) -> Iterator[Path]:
    """The repository's files with these suffixes; hidden folders (the virtualenvs, .git) and
    folders named ``build`` or ``data`` are never entered."""
    for folder, subfolders, names in os.walk(repo):
        subfolders[:] = [d for d in subfolders
                         if not d.startswith(".") and d not in ("build", "data")]
        yield from (Path(folder) / n for n in names
                    if n.endswith(suffixes) and not n.startswith("."))


def test_the_repository_cites_nothing_outside_itself() -> None:
    """Every document the code, tests, notebooks and docs cite is in the repository: no
    design document, seed or toolchain note from outside it."""
    repo = ROOT.parent
    names = ["DESIGN" + r"\.md", "TOOLCHAIN" + r"\.md", r"\.\./" + "shared", "shared/" + "seeds",
             "seeds/" + r"\d"]  # spelled in pieces, so this file does not cite them
    outside = re.compile(r"(?<![\w/])(" + "|".join(names) + ")")
    cited = re.compile(r"(?<![\w/.])((?:docs|notebooks|tests|packlab)/[\w/.-]+\.(?:md|py|ipynb))")
    found, missing = [], []
    for path in sorted(_repository_files(repo, (".py", ".md", ".ipynb", ".toml", ".yml"))):
        text = path.read_text(errors="replace")
        found += [f"{path.relative_to(repo)}: {m.group(1)}" for m in outside.finditer(text)]
        missing += [f"{path.relative_to(repo)}: {m.group(1)}" for m in cited.finditer(text)
                    if "*" not in m.group(1) and not (repo / m.group(1)).exists()]
    assert not found, "\n".join(found)
    assert not missing, "\n".join(missing)
