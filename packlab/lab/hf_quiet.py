"""Hugging Face libraries without their chatter: what a notebook page or a test should show.

``transformers``, ``datasets``, ``trl`` and ``accelerate`` log through Python's ``logging`` (to
stderr), draw progress bars over every ``Dataset.map``, and print a dict per logged step from
the Trainer's ``PrinterCallback``. Inside :func:`quiet` their loggers keep errors only and
``datasets``' progress bars are off; both are restored on exit. Errors are never hidden.
Importing this module settles ``tqdm.auto`` first (in a notebook kernel without ipywidgets its
import warns on the page): import it before any of those libraries.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

from packlab.progress import settle_tqdm_auto

LIBRARIES = ("transformers", "datasets", "trl", "accelerate")

settle_tqdm_auto()


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Only errors from the Hugging Face libraries' loggers; no ``datasets`` progress bars;
    their deprecation notices (``FutureWarning``) not shown."""
    import datasets

    loggers = [logging.getLogger(name) for name in LIBRARIES]
    levels = [logger.level for logger in loggers]
    bars = datasets.is_progress_bar_enabled()
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    datasets.disable_progress_bars()
    try:
        with warnings.catch_warnings():
            for library in LIBRARIES:
                warnings.filterwarnings("ignore", category=FutureWarning, module=library)
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
        if bars:
            datasets.enable_progress_bars()
