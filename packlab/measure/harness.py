"""Run a job in a fresh Python process and bring back its memory, phase by phase.

Every measured job gets a process of its own (``python -m packlab.measure.child``): nothing the
parent allocated, imported or cached can hide in or leak into the figure. The job is named by
import path (``"packlab.measure.jobs:allocate"`` or an importable function), never defined in
a notebook. :func:`profile` runs a job twice, once for RSS and once under tracemalloc, and puts
the Python heap beside the RSS figures, never instead of them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from packlab.errors import PacklabError

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
HEAP_KEYS = ("python_heap_peak_bytes", "python_heap_end_bytes")


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
    **kwargs: Any,
) -> dict[str, Any]:
    """Run ``job(*args, **kwargs)`` in a fresh process; returns baseline, phases and result.

    Arguments travel as JSON (paths as strings). ``imports`` are modules imported before the
    baseline, so their code and tables are not counted as the job's memory. A job that raises
    comes back as a :class:`PacklabError` naming the job and the child's error.
    """
    name = job_name(job)
    spec = {
        "job": name,
        "args": [_jsonable(a) for a in args],
        "kwargs": {k: _jsonable(v) for k, v in kwargs.items()},
        "imports": list(imports),
        "trace": trace,
        "interval": interval,
    }
    with tempfile.TemporaryDirectory(prefix="packlab-measure-") as tmp:
        spec_path, out_path, err_path = (Path(tmp) / n for n in ("spec.json", "out.json", "err"))
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        with open(err_path, "wb") as err:
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", "packlab.measure.child", str(spec_path), str(out_path)],
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
        payload = json.loads(out_path.read_text())
    if "error" in payload:
        raise PacklabError(f"job {name}: {payload['type']}: {payload['error']}")
    return payload


def profile(
    job: str | Callable[..., Any],
    *args: Any,
    imports: Sequence[str] = (),
    tracemalloc: bool = True,
    timeout: float = 3600.0,
    **kwargs: Any,
) -> dict[str, Any]:
    """RSS, anon/file RSS and Arrow pool per phase; the Python heap from a second, traced run."""
    measured = run_job(job, *args, imports=imports, timeout=timeout, **kwargs)
    if tracemalloc:
        traced = run_job(job, *args, imports=imports, trace=True, timeout=timeout, **kwargs)
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
