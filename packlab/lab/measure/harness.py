"""Run a job in a fresh Python process and bring back its memory, phase by phase.

Every measured job gets a process of its own, forked from a clean forkserver that imported the
libraries once (or, with ``isolation="subprocess"``, a new ``python -m packlab.lab.measure.child``;
with ``isolation="fork"``, a fork of a caller that is itself a fresh measuring process, so that
its jobs start from one warmed-up state and may start processes of their own, as DataLoader
workers do): nothing the caller allocated or cached can hide in or leak into the figure. The job is named by
import path (``"packlab.lab.measure.jobs:allocate"`` or an importable function), never defined in
a notebook. :func:`profile` runs a job twice, once for RSS and once under tracemalloc, and puts
the Python heap beside the RSS figures, never instead of them.
"""

from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[3])  # the folder holding packlab/
HEAP_KEYS = ("python_heap_peak_bytes", "python_heap_end_bytes")
_CONTEXT: Any = None


def job_name(job: str | Callable[..., Any]) -> str:
    """``"module:qualname"`` of an importable function (what the child imports)."""
    if isinstance(job, str):
        if ":" not in job:
            raise PacklabError(f"job {job!r}: expected 'module:function'")
        return job
    module = getattr(job, "__module__", None)
    qualname = getattr(job, "__qualname__", "")
    if not module or module == "__main__" or "<locals>" in qualname or "<lambda>" in qualname:
        raise PacklabError(
            f"job {qualname or job!r}: a measured job must be an importable function "
            "(defined at module level in a package, not in a notebook or __main__)"
        )
    return f"{module}:{qualname}"


def run_job(
    job: str | Callable[..., Any],
    *args: Any,
    imports: Sequence[str] = (),
    trace: bool = False,
    interval: float = 0.002,
    timeout: float = 3600.0,
    isolation: str = "forkserver",
    python: str | os.PathLike[str] | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``job(*args, **kwargs)`` in a fresh process; returns baseline, phases and result.

    Arguments travel as JSON (paths as strings). ``imports`` are modules imported before the
    baseline, so their code and tables are not counted as the job's memory. ``isolation``:
    ``forkserver`` (default: a child forked from a clean server process that imported the
    libraries once; nothing of the caller's memory is in it), ``subprocess`` (a new
    interpreter per job, slower) or ``fork`` (a non-daemonic fork of the caller: only from a
    process that is itself a fresh measuring process, whose state every job shares). A job that raises comes back as a :class:`PacklabError`
    naming the job and the child's error. ``python``: with ``subprocess``, the interpreter of
    another environment to run it in (packlab from this checkout on its ``PYTHONPATH``).
    """
    name = job_name(job)
    if python is not None and isolation != "subprocess":
        raise PacklabError(f"job {name}: python= needs isolation='subprocess'")
    spec = {
        "job": name,
        "args": [_jsonable(a) for a in args],
        "kwargs": {k: _jsonable(v) for k, v in kwargs.items()},
        "imports": list(imports),
        "trace": trace,
        "interval": interval,
    }
    if isolation == "forkserver":
        payload = _run_forked(spec, name, timeout, _forkserver(), daemon=True)
    elif isolation == "fork":
        payload = _run_forked(spec, name, timeout, multiprocessing.get_context("fork"),
                              daemon=False)
    elif isolation == "subprocess":
        payload = _run_subprocess(spec, name, timeout, python)
    else:
        raise PacklabError(f"isolation must be 'forkserver', 'fork' or 'subprocess', got "
                           f"{isolation!r}")
    if "error" in payload:
        raise PacklabError(f"job {name}: {payload['type']}: {payload['error']}")
    return payload


def _preload() -> list[str]:
    """What the forkserver imports once: the libraries and every format module (code)."""
    from packlab.formats import _MODULES

    names = ["packlab.lab.measure.child", "packlab.lab.measure.jobs", "packlab.packing.materialize", "numpy",
             "pyarrow", "pyarrow.compute", "pyarrow.parquet", *_MODULES.values()]
    if importlib.util.find_spec("pandas") is not None:
        names.append("pandas")  # pyarrow imports it on the first to_numpy()
    return [n for n in names if _importable(n)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _forkserver() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(_preload())
    return _CONTEXT


def _run_forked(spec: dict[str, Any], name: str, timeout: float, context: Any, *,
                daemon: bool) -> dict[str, Any]:
    from packlab.lab.measure.child import forked

    receive, send = context.Pipe(duplex=False)
    proc = context.Process(target=forked, args=(spec, send), daemon=daemon,
                           name=f"packlab-measure-{name}")
    proc.start()
    send.close()
    try:
        if not receive.poll(timeout):
            proc.kill()
            proc.join()
            raise PacklabError(f"job {name}: no result within {timeout:.0f} s (killed)")
        try:
            payload = receive.recv()
        except EOFError:
            proc.join()
            raise PacklabError(
                f"job {name}: the child process died (exit {proc.exitcode}"
                f"{', killed by the kernel: out of memory?' if proc.exitcode == -9 else ''})"
            ) from None
    finally:
        receive.close()
    proc.join()
    return payload


def _run_subprocess(spec: dict[str, Any], name: str, timeout: float,
                    python: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="packlab-measure-") as tmp:
        spec_path, out_path, err_path = (Path(tmp) / n for n in ("spec.json", "out.json", "err"))
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        with open(err_path, "wb") as err:
            try:
                proc = subprocess.run(
                    [os.fspath(python or sys.executable), "-m", "packlab.lab.measure.child",
                     str(spec_path), str(out_path)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                    env=env, timeout=timeout, check=False,
                )
            except subprocess.TimeoutExpired:
                raise PacklabError(f"job {name}: no result within {timeout:.0f} s (killed)") from None
        if not out_path.is_file():
            tail = err_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise PacklabError(
                f"job {name}: the child process died (exit {proc.returncode}): "
                + (" | ".join(tail) or "no message")
            )
        return json.loads(out_path.read_text())


def profile(
    job: str | Callable[..., Any],
    *args: Any,
    imports: Sequence[str] = (),
    tracemalloc: bool = True,
    timeout: float = 3600.0,
    isolation: str = "forkserver",
    **kwargs: Any,
) -> dict[str, Any]:
    """RSS, anon/file RSS and Arrow pool per phase; the Python heap from a second, traced run."""
    measured = run_job(job, *args, imports=imports, timeout=timeout, isolation=isolation, **kwargs)
    if tracemalloc:
        traced = run_job(job, *args, imports=imports, trace=True, timeout=timeout,
                         isolation=isolation, **kwargs)
        for phase, record in measured["phases"].items():
            heap = traced["phases"].get(phase, {})
            for key in HEAP_KEYS:
                record[key] = heap.get(key)
    return measured


def _jsonable(value: Any) -> Any:
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "item"):
        return value.item()
    return value
