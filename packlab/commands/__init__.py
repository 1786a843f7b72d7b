"""One module per ``packlab`` subcommand (see :mod:`packlab.cli`); shared helpers below."""

from __future__ import annotations

import json
import sys
from typing import Any


def emit_json(obj: Any) -> None:
    """One JSON object on stdout (what ``--json`` promises)."""
    json.dump(obj, sys.stdout, default=_jsonable)
    sys.stdout.write("\n")


def _jsonable(value: Any) -> Any:
    import numpy as np

    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def emit_table(rows: dict[str, Any]) -> None:
    """Key/value lines for people."""
    width = max((len(k) for k in rows), default=0)
    for key, value in rows.items():
        if isinstance(value, float):
            value = f"{value:.6g}"
        print(f"{key:<{width}}  {value}")


def flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts as one level of dotted keys (``{"a": {"b": 1}}`` -> ``{"a.b": 1}``), so
    :func:`emit_table` can print them."""
    out: dict[str, Any] = {}
    for key, value in obj.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def emit(obj: dict[str, Any], as_json: bool, *, flat: bool = False) -> None:
    """What every summary-printing subcommand does: one JSON object for ``--json``, else a
    key/value table (nested dicts flattened to dotted keys when ``flat``)."""
    if as_json:
        emit_json(obj)
    else:
        emit_table(flatten(obj) if flat else obj)
