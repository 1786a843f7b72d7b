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
