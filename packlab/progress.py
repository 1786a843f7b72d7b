"""Progress bars for long work: shown on a terminal, quiet in CI and wherever stderr is not one.

A bar counts what the work is made of (``bin``, ``record``, ``sequence``), so it shows a rate
in those units (bins/s, records/s) and, with a known total, an ETA. Quiet means no bar at all:
nothing is written to stderr when it is not a terminal (a pipe, a log file, a notebook run
headless) or when ``CI`` is set to anything but ``""``/``0``/``false``. A bar is drawn only on
a terminal, so the plain terminal ``tqdm`` is the one imported: ``tqdm.auto`` picks the notebook
widget inside a kernel and, without ipywidgets, warns at import in every notebook.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from tqdm.std import tqdm  # the terminal bar: tqdm.auto warns in every notebook kernel

T = TypeVar("T")


def settle_tqdm_auto() -> None:
    """Import ``tqdm.auto`` once with its "IProgress not found" warning silenced. Libraries
    import it at their own import (Hugging Face ``datasets``, LitData); in a notebook kernel
    without ipywidgets it warns, then falls back to this same terminal bar, so the warning
    says nothing a reader needs and its absolute path lands on the page."""
    import warnings

    from tqdm import TqdmWarning

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=TqdmWarning, message="IProgress not found")
        import tqdm.auto  # noqa: F401


def progress_enabled() -> bool:
    """Whether a person is watching: stderr is a terminal and this is not CI."""
    ci = os.environ.get("CI", "").strip().lower()
    return sys.stderr.isatty() and ci in ("", "0", "false", "no")


def progress(iterable: Iterable[T], *, total: int | None = None, desc: str | None = "",
             unit: str = "it") -> Iterator[T]:
    """``tqdm`` when a person is watching, the plain iterable otherwise (and with ``desc``
    None: the caller shows progress its own way)."""
    if desc is None or not progress_enabled():
        yield from iterable
        return
    yield from tqdm(iterable, total=total, desc=desc, unit=unit, unit_scale=True, leave=False,
                    **_screen())


def _screen() -> dict[str, int]:
    """The terminal's size (one that reports none, as a fresh pseudo-terminal may, counts as
    100 x 24: tqdm draws nothing on a screen of zero rows)."""
    size = shutil.get_terminal_size((100, 24))
    return {"ncols": size.columns, "nrows": size.lines}


class _Quiet:
    """What :func:`progress_bar` yields when nobody watches: counts, draws nothing."""

    def __init__(self, total: int | None) -> None:
        self.total = total
        self.n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix_str(self, text: str) -> None:
        pass


@contextmanager
def progress_bar(*, total: int | None, desc: str, unit: str = "it") -> Iterator[Any]:
    """A bar to ``update(n)`` by hand (work done elsewhere, in other processes), or a quiet
    stand-in with the same methods."""
    if not progress_enabled():
        yield _Quiet(total)
        return
    bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, leave=False,
               file=sys.stderr, **_screen())
    try:
        yield bar
    finally:
        bar.close()


class _Relay:
    """Carries counts from any process to the bar: ``put(n)`` (a queue underneath)."""

    def __init__(self, queue: Any) -> None:
        self.queue = queue

    def put(self, n: int) -> None:
        self.queue.put(int(n))


@contextmanager
def shared_counter(*, total: int | None, desc: str, unit: str = "it", processes: bool = False,
                   enabled: bool = True) -> Iterator[_Relay | None]:
    """A bar fed by work running elsewhere: yields a picklable reporter whose ``put(n)`` (from
    this process, or with ``processes`` from pool workers, through a multiprocessing manager's
    queue) advances the bar; None when nobody watches (or not ``enabled``), costing nothing."""
    if not (enabled and progress_enabled()):
        yield None
        return
    import multiprocessing
    import queue as queues
    import threading

    manager = multiprocessing.Manager() if processes else None
    channel = manager.Queue() if manager is not None else queues.SimpleQueue()
    stop = threading.Event()

    def drain(bar: Any) -> None:
        while not stop.is_set() or not channel.empty():
            try:
                bar.update(channel.get(timeout=0.1))
            except (queues.Empty, EOFError, OSError):
                if stop.is_set():
                    return

    with progress_bar(total=total, desc=desc, unit=unit) as bar:
        thread = threading.Thread(target=drain, args=(bar,), daemon=True)
        thread.start()
        try:
            yield _Relay(channel)
        finally:
            stop.set()
            thread.join(timeout=2)
            if manager is not None:
                manager.shutdown()
