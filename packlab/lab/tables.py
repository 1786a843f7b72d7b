"""How a report shows numbers: Markdown tables and the units people read.

One home for what notebooks, the report and the measurements print, so a table or a byte
count reads the same everywhere: :func:`markdown_table` (rows as lists),
:func:`records_table` (rows as dicts, a formatter per column), :func:`human_bytes`
(``35 MB``), :func:`times` (``12x``) and :func:`fmt_us` (``1,234``). Verdict words live with
the measurements (:mod:`packlab.lab.measure.verdicts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

KB, MB, GB = 1e3, 1e6, 1e9


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (numbers with thousands separators, floats to 4 significant digits)."""
    def cell(value: Any) -> str:
        if isinstance(value, bool):
            return "yes" if value else "no"
        if isinstance(value, int):
            return f"{value:,}"
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def records_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str],
                  formats: Mapping[str, Callable[[Any], Any]] | None = None) -> str:
    """A Markdown table of dict ``rows``; ``formats`` maps a column to a function of its value
    (other values as they print, a missing one empty)."""
    formats = formats or {}
    return markdown_table(columns, [[str(formats.get(c, _plain)(row.get(c))) for c in columns]
                                    for row in rows])


def _plain(value: Any) -> str:
    return "" if value is None else str(value)


def human_bytes(n: float | None) -> str:
    """1.2 GB, 35 MB, 16 KB, 512 B (decimal units, as the RFC writes them)."""
    if n is None or not math.isfinite(n):
        return "n/a"
    for unit, size in (("GB", GB), ("MB", MB), ("KB", KB)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def times(ratio: float) -> str:
    """A ratio as people write it: 3,333x, 12x, 1.7x."""
    return f"{ratio:,.0f}x" if ratio >= 10 else f"{ratio:.2g}x"


def fmt_us(value: float | None) -> str:
    """Microseconds as a table shows them: one decimal below 100, none above."""
    if value is None:
        return "n/a"
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"
