"""Progress bars for long work: shown on a terminal, quiet in CI and in notebooks run headless.

A bar is drawn only when a person watches a terminal (stderr is a TTY), so the plain terminal
``tqdm`` is the one to use: ``tqdm.auto`` would pick the notebook widget inside a kernel and,
without ipywidgets, warn at import in every notebook that imports packlab.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress_enabled() -> bool:
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str = "") -> Iterator[T]:
    """``tqdm`` when a person is watching, the plain iterable otherwise."""
    if not progress_enabled():
        yield from iterable
        return
    from tqdm.std import tqdm

    yield from tqdm(iterable, total=total, desc=desc, unit_scale=True, leave=False)
