"""Docstrings say what exists: every ``packlab.…`` name a docstring of the package gives (and
every relative ``:mod:`.name``` in one) is a module of the package, or a name defined in one.

Docstrings are read with ``ast``; a name is looked up in the module's own top-level
definitions and imports, without importing anything. Every module opens with one short
sentence saying what it is (:func:`first_sentence_problem`).
"""

from __future__ import annotations

import ast
import inspect
import re
from functools import cache
from pathlib import Path

from test_architecture import MODULES, ROOT

NAME = re.compile(r"(?<![\w.])packlab(?:\.[A-Za-z_]\w*)+")
RELATIVE = re.compile(r":(?:mod|class|func|data|meth):`~?(\.[A-Za-z_][\w.]*)`")
#: the longest first sentence a module's docstring opens with (a line and a half)
MAX_FIRST_SENTENCE = 200
#: a sentence in a question's word order: an auxiliary first, or a question word (and at most
#: one word) before one ("Does a model...", "How small can...")
AUXILIARY = r"(?:does|do|did|is|are|was|were|can|could|should|will|would|has|have)"
QUESTION = re.compile(rf"(?i:{AUXILIARY})\b|(?:How|What|Why|Which|Where|When|Who)"
                      rf"(?:\s+[\w'`]+)?\s+{AUXILIARY}\b")


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


def first_sentence_problem(doc: str | None) -> str | None:
    """What is wrong with the sentence a module's docstring opens with (None: nothing). The
    sentence ends at the first period followed by whitespace, within the first paragraph: it
    must be there, at most :data:`MAX_FIRST_SENTENCE` characters, and a statement, not a
    question."""
    if doc is None or not doc.strip():
        return "no docstring"
    paragraph = re.split(r"\n\s*\n", inspect.cleandoc(doc).strip(), maxsplit=1)[0]
    end = re.search(r"\.(?=\s|$)", paragraph)
    if end is None:
        return "its first paragraph ends no sentence with a period"
    sentence = " ".join(paragraph[:end.end()].split())
    if len(sentence) > MAX_FIRST_SENTENCE:
        return f"its first sentence is {len(sentence)} characters (at most {MAX_FIRST_SENTENCE})"
    if "?" in sentence or QUESTION.match(sentence):
        return f"its first sentence asks: {sentence!r}"
    return None


def test_every_module_opens_with_one_sentence_saying_what_it_is() -> None:
    bad = [f"{path.relative_to(ROOT.parent)}: {problem}" for path in MODULES.values()
           if (problem := first_sentence_problem(
               ast.get_docstring(ast.parse(path.read_text()), clean=False))) is not None]
    assert not bad, "\n".join(bad)


def test_the_check_sees_a_bad_first_sentence() -> None:
    assert first_sentence_problem("The chunk plan producers and consumers agree on.\n\nMore.") is None
    assert first_sentence_problem("Formats: one module each, a writer and a reader.") is None
    assert first_sentence_problem("How a Parquet shard's bytes are laid out: codec, pages.") is None
    assert first_sentence_problem(None) == "no docstring"
    assert first_sentence_problem("  \n ") == "no docstring"
    assert "no sentence" in first_sentence_problem("A title without a period\n\nThen a sentence.")
    assert "no sentence" in first_sentence_problem("``packlab.formats.read``: no end")
    assert "characters" in first_sentence_problem("A module " + "that does things " * 13 + ".")
    assert "asks" in first_sentence_problem("Does a model keep sequences apart? It does.")
    assert "asks" in first_sentence_problem("How small can bins be and still read fast: a study.")
    assert "asks" in first_sentence_problem("Is this a statement.")
