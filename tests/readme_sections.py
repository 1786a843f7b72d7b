"""Run a README section as written: its ``sh`` blocks are ``packlab`` commands, run line by
line (each must exit 0); its ``python`` blocks run in order in one namespace. Used by the tests
that keep a README section honest (``tests/bridge/test_readme_interop.py``, ``tests/test_readme_hf.py``)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packlab.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"

#: the README's sections whose blocks a test runs as printed, and the test that runs them
#: (a heading and everything under it, to the next heading of its level or above)
RUN_BY = {
    "### Integrity on read": "tests/test_readme_python.py",
    "## Python": "tests/test_readme_python.py",
    "## Object storage, step by step": "tests/test_readme_s3.py",
    "## Using packlab outputs in Megatron-Bridge, Nemotron and Modalities":
        "tests/bridge/test_readme_interop.py",
    "## Megatron-Bridge and Megatron-LM, as of today": "tests/bridge/test_readme_interop.py",
    "## Using packlab outputs with transformers and TRL": "tests/test_readme_hf.py",
}
#: the sections whose blocks are the repository's own ``make`` targets and notebook runner:
#: ``make test`` is this suite and ``make run`` half an hour, so a test checks that each
#: command names what exists (``tests/test_readme_blocks.py``) instead of running it
REPOSITORY_COMMANDS = ("## Two commands", "### Scales", "## Findings")


def fenced_blocks() -> list[tuple[list[str], str, str]]:
    """Every fenced block of the README: the headings it is under (outermost first), its
    language (``""`` for a block of text: a diagram, a synopsis, a tree) and its code."""
    headings: list[str] = []
    out = []
    lines = README.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            headings = [h for h in headings if len(h) - len(h.lstrip("#")) < level] + [line]
        elif line.startswith("```"):
            end = next(k for k in range(i + 1, len(lines)) if lines[k] == "```")
            out.append((list(headings), line[3:].strip(), "\n".join(lines[i + 1:end])))
            i = end
        i += 1
    return out


def section_blocks(title: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block of the section ``title``, in order."""
    text = README.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    body = text[start:end if end > 0 else len(text)]
    fences = re.findall(r"^```(\w*)$", body, flags=re.M)
    blocks = re.findall(r"^```(\w+)\n(.*?)^```$", body, flags=re.M | re.S)
    assert len(fences) == 2 * len(blocks), "every block of the section names its language"
    assert {lang for lang, _ in blocks} <= {"sh", "python"}
    return blocks


def run_section(title: str, namespace: dict[str, Any],
                shell: Callable[[list[str]], None] | None = None) -> tuple[int, int]:
    """Run every block of the section in the current directory; how many ``python`` blocks
    and ``packlab`` commands ran. A line of an ``sh`` block that is not a ``packlab`` command
    goes to ``shell(argv)`` (a section that starts a server or sets the environment); without
    one, it is an error."""
    blocks = section_blocks(title)
    commands = 0
    for number, (lang, code) in enumerate(blocks):
        if lang == "python":
            exec(compile(code, f"{README.name} block {number}", "exec"), namespace)
            continue
        for line in code.splitlines():
            argv = shlex.split(line, comments=True)
            if not argv:
                continue
            if argv[0] != "packlab" and shell is not None:
                shell(argv)
                continue
            assert argv[0] == "packlab", line
            assert main(argv[1:]) == 0, line
            commands += 1
    return [lang for lang, _ in blocks].count("python"), commands
