"""The fresh process a measured job runs in: forked from a clean forkserver
(:func:`forked`), or ``python -m packlab.lab.measure.child SPEC OUT``.

``SPEC`` is a JSON file: ``{"job": "module:function", "args": [...], "kwargs": {...},
"imports": [...], "trace": false, "interval": 0.002}``. The child imports what the job needs,
takes its baseline, runs the job (a generator marks phase ends by yielding their names; a plain
function is one phase, ``job``), and writes ``{"baseline", "phases", "result"}`` (or
``{"error"}``) as JSON to ``OUT``.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import traceback
from typing import Any

from packlab.lab.measure.memory import PhaseRecorder, RssPoller
from packlab.storage.files import json_default

DEFAULT_IMPORTS = ("numpy", "pyarrow", "packlab", "packlab.formats", "packlab.bins")


def resolve(job: str) -> Any:
    module, _, name = job.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def run(spec: dict[str, Any]) -> dict[str, Any]:
    for name in (*DEFAULT_IMPORTS, *spec.get("imports", ())):
        importlib.import_module(name)
    from packlab.formats import format_names

    format_names()  # detect_format imports every format module: code, not the job's data
    fn = resolve(spec["job"])
    poller = RssPoller(float(spec.get("interval", 0.002)))
    poller.start()
    recorder = PhaseRecorder(poller, trace=bool(spec.get("trace", False)))
    try:
        out = fn(*spec.get("args", ()), **spec.get("kwargs", {}))
        if inspect.isgenerator(out):
            result = None
            while True:
                try:
                    phase = next(out)
                except StopIteration as stop:
                    result = stop.value
                    break
                recorder.close(str(phase))
        else:
            result = out
            recorder.close("job")
    finally:
        recorder.finish()
        poller.stop()
    return {
        "baseline": recorder.baseline,
        "hwm_reset": recorder.hwm_reset,
        "phases": recorder.phases,
        "result": result,
    }


def run_safely(spec: dict[str, Any]) -> dict[str, Any]:
    """:func:`run`, or ``{"error", "type", "traceback"}`` for the parent to raise."""
    try:
        return json.loads(json.dumps(run(spec), default=json_default))
    except Exception as exc:  # reported to the parent, which raises it as a PacklabError
        from packlab.errors import PacklabError

        kind = "PacklabError" if isinstance(exc, PacklabError) else type(exc).__name__
        return {"error": str(exc), "type": kind, "traceback": traceback.format_exc()}


def forked(spec: dict[str, Any], conn: Any) -> None:
    """Entry point of a child forked from the forkserver: the payload goes back on ``conn``."""
    conn.send(run_safely(spec))
    conn.close()


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    payload = run_safely(spec)
    with open(out_path, "w") as f:
        json.dump(payload, f)
    return 3 if "error" in payload else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
