"""Loops compiled to machine code by numba: packing's first fit and MFFD, a spool's chat masks.

Each loop is a plain Python function over numpy arrays; :func:`compiled` hands back the same
function compiled, so the code reads as Python and runs as C, with no C of packlab's own.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

from packlab.executors import interrupts_deferred


@functools.cache
def compiled(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn`` compiled by numba, once per machine (the machine code is cached on disk, or
    compiled anew in each process where no cache folder is writable). Imported on first use:
    importing numba costs ~0.3 s that nothing else needs. Without numba, ``fn`` itself runs:
    the same result, some 100x slower (a warning says so).

    Each new argument signature is compiled (or loaded from the cache) before the call,
    with Ctrl-C deferred until that ends: an interrupt that lands in one of the compiler's
    callbacks into Python would be printed as a traceback and lost."""
    try:
        from numba import njit
    except ImportError:
        warnings.warn("numba is not installed: packlab runs its loops in plain Python, "
                      "~100x slower (pip install numba)", stacklevel=3)
        return fn
    try:
        dispatcher = njit(cache=True, nogil=True)(fn)
    except RuntimeError:  # numba: "cannot cache function ...: no locator available"
        dispatcher = njit(nogil=True)(fn)
    compiled: set[tuple[object, ...]] = set()

    @functools.wraps(fn)
    def run(*args: object) -> object:
        signature = tuple(dispatcher.typeof_pyval(a) for a in args)
        if signature not in compiled:
            with interrupts_deferred():
                dispatcher.compile(signature)
            compiled.add(signature)
        return dispatcher(*args)

    run.dispatcher = dispatcher  # type: ignore[attr-defined]
    return run
