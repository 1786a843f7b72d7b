"""One module per ``packlab`` subcommand (see :mod:`packlab.cli`), and the helpers they share.
Below: argument types whose errors name the flag (argparse adds ``argument --seed:``), the
descriptions every command shares, and output (``--json``, tables)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from packlab.limits import MAX_COUNT

DATASET_HELP = ("a shard, a directory of shards, a glob, an output layout (with --split), "
                "ROOT/splits/NAME, a run folder (ROOT/runs/...), a Nemotron output directory; "
                "local or a URI (s3://bucket/prefix)")
OUTPUT_HELP = "a local path or a URI (s3://bucket/prefix: written locally, then uploaded)"


MAX_SEED = (1 << 63) - 1


def positive_int(text: str) -> int:
    """An argparse type: an integer from 1 to :data:`~packlab.limits.MAX_COUNT`."""
    return int_in_range(text, 1, MAX_COUNT)


def nonnegative_int(text: str) -> int:
    """An argparse type: an integer from 0 (seeds up to 2**63 - 1, counts that may be zero)."""
    return int_in_range(text, 0, MAX_SEED)


def pack_size_int(text: str) -> int:
    """An argparse type: tokens per bin, from 1 to 2**31 - 1 (a bin's positions are int32;
    each format's own bounds are checked with the plan, before any work)."""
    from packlab.formats.shared.base import MAX_PACK_SIZE

    return int_in_range(text, 1, MAX_PACK_SIZE)


def int_in_range(text: str, low: int, high: int) -> int:
    """An integer from ``low`` to ``high``, or argparse's one-line error naming the flag."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r:.40}") from None
    if value < low:
        raise argparse.ArgumentTypeError(
            f"expected {'a positive integer' if low == 1 else f'an integer >= {low}'}, "
            f"got {value}")
    if value > high:
        raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high:,}, "
                                         f"got {str(value)[:40]}")
    return value


def add_executor_options(parser: argparse.ArgumentParser, *, workers: int, jobs: str) -> None:
    """``--workers``, ``--executor`` and ``--ray-address``: how a command spreads its jobs
    (``jobs`` says what they are) over local processes or a Ray cluster."""
    parser.add_argument("--workers", type=positive_int, default=workers, metavar="N",
                        help=f"{jobs} run in parallel")
    parser.add_argument("--executor", choices=("process", "ray"), default="process",
                        help="run them in a local process pool or as Ray tasks")
    parser.add_argument("--ray-address", default=None, metavar="ADDRESS",
                        help="with --executor ray: join the Ray cluster at ADDRESS (default: "
                             "start a local one, listening on 127.0.0.1 only)")


def format_choices() -> str:
    """The registered shard formats, for help texts."""
    from packlab.formats import format_names

    return ", ".join(format_names())


def warn(command: str, message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    print(f"packlab {command}: warning: {message}", file=sys.stderr)


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
    """Key/value lines for people (values in :func:`plain` words)."""
    width = max((len(k) for k in rows), default=0)
    for key, value in rows.items():
        print(f"{key:<{width}}  {plain(value)}".rstrip())


def plain(value: Any) -> str:
    """A value as a person reads it, never a Python repr: lists as ``a, b``, a mapping as
    ``key value; ...``, None as ``-``, True/False as yes/no, a large float with thousands
    separators (``13,540,000``, not ``1.354e+07``), a small one to six digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1e5 else f"{value:.6g}"
    if isinstance(value, dict):
        return "; ".join(f"{k} {plain(v)}" for k, v in value.items())
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(plain(v) for v in value)
    return str(value)


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
