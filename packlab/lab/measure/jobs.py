"""Jobs the memory harness runs in a fresh process (importable, so never notebook-defined).

A job is a plain function (one phase, ``job``) or a generator that yields the name of each
phase as it ends. Arguments and return values are JSON: paths as strings, small dicts back.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import numpy as np

Via = str  # "reader" (packlab.open_shard) or "dataset" (packlab.open_dataset)


def resolve_via(via: str) -> str:
    """``auto`` means the dataset when :mod:`packlab.loading.dataset` exists, else the shard reader."""
    if via == "auto":
        return "dataset" if importlib.util.find_spec("packlab.loading.dataset") is not None else "reader"
    if via not in ("reader", "dataset"):
        from packlab.errors import PacklabError

        raise PacklabError(f"via must be 'reader', 'dataset' or 'auto', got {via!r}")
    return via


def format_imports(format: str, via: str = "reader") -> list[str]:
    """Modules a job over a shard of ``format`` imports before its baseline: code is not data.

    pyarrow imports ``pyarrow.compute`` and pandas lazily, on the first ``to_numpy()``: about
    1 s and 25 MB of code that would otherwise be counted as the first read's memory.
    """
    from packlab.formats import _MODULES, get_format

    modules = [_MODULES[format]]
    if _uses_arrow(get_format(format)):
        modules.append("pyarrow.compute")
        if importlib.util.find_spec("pandas") is not None:
            modules.append("pandas")
    if via == "dataset":
        modules.append("packlab.loading.dataset")
    return modules


def shard_imports(path: str | os.PathLike[str], via: str = "reader") -> list[str]:
    """:func:`format_imports` of every format of the dataset at ``path`` (a shard, a
    directory, a layout's split, a URI...)."""
    from packlab.sources import detect_format

    return list(dict.fromkeys(m for name in detect_format(path).split("+")
                              for m in format_imports(name, via)))


def _uses_arrow(module: ModuleType) -> bool:
    names = (getattr(v, "__name__", "") for v in vars(module).values() if isinstance(v, ModuleType))
    return any(name == "pyarrow" or name.startswith("pyarrow.") for name in names)


def open_items(path: str | os.PathLike[str], via: str, **options: Any) -> Any:
    """A reader (``read_bin``) or a dataset (``ds[i]``) over ``path``; ``options`` go to the
    reader(s)."""
    if via == "dataset":
        from packlab.sources import open_dataset

        return open_dataset(path, **options)
    from packlab.sources import open_shard

    return open_shard(path, **options)


def item_tokens(items: Any, index: int, via: str) -> int:
    """Read item ``index`` once and return how many tokens it held."""
    if via == "dataset":
        return int(len(items[index]["input_ids"]))
    return items.read_bin(index).packed_len


# -- the standard benchmark jobs -------------------------------------------------------------
def open_and_read(path: str, via: str = "reader") -> Iterator[str]:
    """``load``: open the shard or dataset and read its first bin (a lazy reader defers its work
    to the first access, so "ready to serve" is the honest end of loading); ``read``: read
    every other bin once, keeping none."""
    items = open_items(path, via)
    count = len(items)
    tokens = item_tokens(items, 0, via) if count else 0
    yield "load"
    for i in range(1, count):
        tokens += item_tokens(items, i, via)
    yield "read"
    return {"num_bins": count, "num_tokens": tokens, "via": via}


def write_shard(
    format: str,
    spool: str,
    assignment: str,
    out: str,
    options: dict[str, Any] | None = None,
) -> Iterator[str]:
    """``prepare``: open the spool and assignment; ``write``: write every bin, finalize.

    Bins come from packlab's materializer one at a time, as a pipeline writes them (it reads
    the spool by ``pread``: the figure is the writer's memory, nothing of the spool's)."""
    from packlab.formats import get_format
    from packlab.packing import BinAssignment
    from packlab.packing.materialize import BinMaterializer
    from packlab.spool import SpoolReader

    reader = SpoolReader(spool)
    plan = BinAssignment.load(assignment)
    materializer = BinMaterializer(reader, plan)
    options = dict(options or {})
    if get_format(format).Writer.NEEDS_SPOOL:  # a reference to the spool, no tokens
        options.setdefault("spool", spool)
        options.setdefault("assignment", assignment)
    yield "prepare"
    with get_format(format).Writer(out, pack_size=plan.pack_size, num_bins=plan.num_bins,
                     overwrite=True, **options) as writer:
        for b in range(plan.num_bins):
            writer.write(materializer.materialize(b))
    yield "write"
    return {"format": format, "num_bins": plan.num_bins}


# -- calibration jobs (the tests use them to prove the harness honest) -----------------------
def allocate(nbytes: int, hold: float = 0.05) -> int:
    """A numpy allocation of ``nbytes``, every page touched: RSS and tracemalloc both see it.
    Held ``hold`` seconds before it is freed: anonymous RSS is sampled (every 2 ms, by a
    thread that waits for the GIL numpy's fill holds), and a peak shorter than a few samples
    can be missed; ``VmHWM`` never misses one."""
    data = np.ones(nbytes, dtype=np.uint8)
    time.sleep(hold)
    return int(data[:: 4096].sum())


def map_untouched(path: str) -> int:
    """Memory-map a (possibly huge, sparse) file and never touch it: costs no RSS."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    return int(data.shape[0])


def read_memmap(path: str) -> int:
    """Read a whole file through a numpy memmap: file-backed RSS, invisible to tracemalloc."""
    data = np.memmap(path, dtype=np.uint8, mode="r")
    return int(data.sum(dtype=np.uint64))


def arrow_allocate(nbytes: int) -> int:
    """An Arrow buffer of ``nbytes``, filled: anonymous RSS in Arrow's pool, not Python's heap."""
    import pyarrow as pa

    buf = pa.allocate_buffer(nbytes, resizable=False)
    view = np.frombuffer(buf, dtype=np.uint8)
    view.fill(1)
    return int(buf.size)
