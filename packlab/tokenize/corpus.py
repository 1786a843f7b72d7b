"""A real-text chat corpus from text already on the machine: docstrings of installed packages.

Nothing is downloaded. Every installed distribution's Python files are listed from its
``RECORD`` (``importlib.metadata``), parsed with ``ast`` (never imported: safe, fast, no side
effects), and each public function, method or class with a docstring becomes a question and its
answer::

    {"messages": [{"role": "system", "content": "You are a concise Python documentation assistant."},
                  {"role": "user", "content": "What does `json.decoder.JSONDecoder.decode` do?"},
                  {"role": "assistant", "content": "Signature: `def decode(self, s, _w=...)`\\n\\n..."}],
     "source": {"distribution": "...", "version": "...", "module": "...", "objects": ["..."]}}

Some conversations have two or three turns (objects from the same module), some a system
prompt, so lengths vary the way real SFT data does. The output is deterministic for a seed on
a given environment (files are sorted, then shuffled by the seed); other installed packages
give another corpus. It is written to a temporary name and renamed into place.
"""

from __future__ import annotations

import ast
import csv
import importlib.metadata as metadata
import json
import os
import random
import re
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from packlab.errors import PacklabError
from packlab.progress import progress
from packlab.storage.files import staged

MIN_DOC_CHARS = 40
MAX_DOC_CHARS = 12_000
MAX_ITEMS_PER_FILE = 24
MAX_FILE_BYTES = 1 << 20  # larger sources are generated tables, slow to parse, few docstrings
SKIP_DISTRIBUTIONS = {"packlab"}  # our own code changes as we work: not a fixed corpus
SYSTEM_PROMPTS = (
    "You are a concise Python documentation assistant.",
    "You answer questions about Python libraries using their official documentation.",
    "Explain Python APIs accurately. Quote the documentation when it helps.",
)
ASK_WHAT = (
    "What does `{qualified}` do?",
    "Can you explain `{qualified}` from the {distribution} package?",
    "I found `{name}` in `{module}`. What is it for?",
    "Describe the {kind} `{qualified}`.",
)
ASK_SIGNATURE = (
    "Here is a signature from `{module}`:\n\n```python\n{signature}\n```\n\nWhat does it do?",
    "What is `{name}` in this code?\n\n```python\n{signature}\n```",
)
ASK_FOLLOW_UP = (
    "And `{name}`?",
    "Same module: what about `{name}`?",
    "Thanks. Now explain `{qualified}`.",
)


class DocItem(NamedTuple):
    """One documented object found in a source file."""

    distribution: str
    version: str
    module: str
    qualname: str
    kind: str  # "function" or "class"
    signature: str
    doc: str


def build_docstring_corpus(
    out_jsonl: Path, max_records: int, seed: int = 0, *, overwrite: bool = True,
    show_progress: bool = False,
) -> Path:
    """Write ``max_records`` chat records built from installed docstrings; returns the path.

    Raises a PacklabError when the environment holds fewer documented objects than asked for
    (never a silently shorter corpus). ``overwrite`` defaults to True because the result is a
    pure function of the seed and the environment.
    """
    out_jsonl = Path(out_jsonl)
    if max_records < 1:
        raise PacklabError(f"max_records must be positive, got {max_records}")
    out_jsonl.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with staged(out_jsonl, overwrite=overwrite) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            records = iter_docstring_records(seed)
            if show_progress:
                records = progress(records, total=max_records, desc="corpus", unit="record")
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
                written += 1
                if written == max_records:
                    break
            f.flush()
            os.fsync(f.fileno())
        if written < max_records:
            raise PacklabError(f"{out_jsonl}: only {written} records could be built from the "
                               f"installed packages' docstrings, {max_records} were asked for")
    return out_jsonl


def iter_docstring_records(seed: int = 0) -> Iterator[dict[str, Any]]:
    """Chat records, file by file in a seeded order, until the installed sources run out."""
    rng = random.Random(seed)
    files = source_files()
    rng.shuffle(files)
    for distribution, version, module, path in files:
        items = list(iter_doc_items(Path(path), distribution, version, module))
        if len(items) > MAX_ITEMS_PER_FILE:
            items = rng.sample(items, MAX_ITEMS_PER_FILE)
        while items:
            turns = min(len(items), rng.choice((1, 1, 1, 2, 2, 3)))
            conversation, items = items[:turns], items[turns:]
            yield _record(conversation, rng)


def source_files() -> list[tuple[str, str, str, str]]:
    """``(distribution, version, module, path)`` of every installed, non-test Python file, sorted."""
    seen: set[str] = set()
    found = []
    for dist in metadata.distributions():
        fields = dist.metadata  # parses the METADATA file: once per distribution
        name = fields["Name"] or ""
        key = re.sub(r"[-_.]+", "-", name).lower()
        if not key or key in seen or key in SKIP_DISTRIBUTIONS:
            continue
        seen.add(key)
        version = fields["Version"]
        root = str(dist.locate_file(""))
        for listed in _listed_files(dist):
            module = _module_name(tuple(listed.split("/"))) if listed.endswith(".py") else None
            if module is not None:
                found.append((name, version, module, os.path.join(root, listed)))
    found.sort(key=lambda row: (row[0].lower(), row[2], row[3]))
    return found


def _listed_files(dist: metadata.Distribution) -> list[str]:
    """The files a distribution installed, relative to its root, as ``/``-separated strings.

    Read from ``RECORD``'s first column where there is one: ``Distribution.files`` makes a
    path object of every one of an environment's ~75,000 files, for the ~20,000 that are
    modules; this listing is paid by every corpus built, however small.
    """
    record = dist.read_text("RECORD")
    if record is None:
        return [str(file) for file in dist.files or ()]
    return [row[0] for row in csv.reader(record.splitlines()) if row]


def _module_name(parts: tuple[str, ...]) -> str | None:
    """``("pkg", "sub", "mod.py")`` -> ``"pkg.sub.mod"``; None for tests and non-modules."""
    if not parts or not parts[-1].endswith(".py") or ".." in parts:
        return None
    names = [*parts[:-1], parts[-1][:-3]]
    if names[-1] == "__init__":
        names = names[:-1]
    lowered = [n.lower() for n in parts]
    if (not names or any(not n.isidentifier() for n in names)
            or any(n in ("test", "tests", "testing") for n in lowered)
            or parts[-1].startswith("test_") or parts[-1] in ("conftest.py", "setup.py")):
        return None
    return ".".join(names)


def iter_doc_items(path: Path, distribution: str, version: str, module: str) -> Iterator[DocItem]:
    """Public functions, methods and classes of one file that carry a useful docstring."""
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        return
    stack: list[tuple[str, ast.AST]] = [("", tree)]
    while stack:
        prefix, node = stack.pop(0)
        for child in getattr(node, "body", ()):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if child.name.startswith("_"):
                continue
            qualname = f"{prefix}{child.name}"
            if isinstance(child, ast.ClassDef):
                stack.append((f"{qualname}.", child))
            doc = ast.get_docstring(child, clean=True)
            if doc and MIN_DOC_CHARS <= len(doc) <= MAX_DOC_CHARS:
                kind = "class" if isinstance(child, ast.ClassDef) else "function"
                yield DocItem(distribution, version, module, qualname, kind,
                              _signature(child), doc)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> str:
    try:
        if isinstance(node, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in [*node.bases, *node.keywords])
            return f"class {node.name}({bases})" if bases else f"class {node.name}"
        prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
        returns = f" -> {ast.unparse(node.returns)}" if node.returns else ""
        return f"{prefix} {node.name}({ast.unparse(node.args)}){returns}"
    except (ValueError, RecursionError):
        return f"{node.name}(...)"


def _record(conversation: list[DocItem], rng: random.Random) -> dict[str, Any]:
    """One chat record: an optional system prompt, then a question and answer per item."""
    messages = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    for turn, item in enumerate(conversation):
        fields = {"qualified": f"{item.module}.{item.qualname}", "name": item.qualname,
                  "module": item.module, "distribution": item.distribution,
                  "kind": item.kind, "signature": item.signature}
        shows_signature = turn == 0 and rng.random() < 0.35
        if turn > 0:
            question = rng.choice(ASK_FOLLOW_UP)
        else:
            question = rng.choice(ASK_SIGNATURE if shows_signature else ASK_WHAT)
        answer = item.doc if shows_signature else f"Signature: `{item.signature}`\n\n{item.doc}"
        messages.append({"role": "user", "content": question.format(**fields)})
        messages.append({"role": "assistant", "content": answer})
    first = conversation[0]
    return {"messages": messages,
            "source": {"distribution": first.distribution, "version": first.version,
                       "module": first.module,
                       "objects": [item.qualname for item in conversation]}}
