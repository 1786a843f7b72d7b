"""How the notebooks draw: units people read, legends that never cover data, one way to save.

- :func:`save`: every figure goes through it: legends moved outside the data
  (:func:`legends_outside`), saved tight under ``build/figures/NAME.png``, shown once, closed;
- :func:`bytes_axis`: memory and sizes in B / KB / MB / GB (decimal, as :func:`~packlab.lab.tables.
  human_bytes` prints them), on a linear or a log axis;
- :func:`readable_log_axis`: a log axis spanning less than two decades gets labelled ticks in
  between (else it shows two ticks, or none);
- :func:`log_bars`: bars on a log axis where a value that is missing or zero draws no bar but
  says so at the foot of the axis (a bar drawn at an arbitrary floor looks like data);
- :func:`label_points`: point labels nudged apart so they do not overlap.

matplotlib is imported where it is used: importing packlab never needs it.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packlab.lab.results import figure_path
from packlab.lab.tables import human_bytes

DPI = 120


def save(fig: Any, name: str, *, show: bool = True) -> None:
    """Lay the axes out (``tight_layout`` unless the figure has a layout engine), move legends
    outside the data, save ``build/figures/NAME.png`` (tight, every label kept), display it
    once (in a notebook) and close it."""
    import matplotlib.pyplot as plt

    if fig.get_layout_engine() is None:
        fig.tight_layout()
    legends_outside(fig)
    path = figure_path(name)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    if show:
        _display(path, fig.dpi)
    plt.close(fig)


def _display(png: Path, dpi: float) -> None:
    """Show the PNG just saved, at the size the figure itself would show at ``dpi``: showing
    the figure would draw it once more (twice, for its tight box), half of what saving costs."""
    try:
        from IPython import get_ipython
        from IPython.display import Image, display
    except ImportError:
        return
    if get_ipython() is not None:
        data = png.read_bytes()
        width = struct.unpack(">I", data[16:20])[0]  # the IHDR chunk's width, in pixels
        display(Image(data=data, width=round(width * dpi / DPI)))


def legends_outside(fig: Any) -> None:
    """Every legend that overlaps its axes' plotting area moves outside it: to the right of
    the rightmost axes of a row, below any other (under its tick labels and axis label)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    for ax in axes:
        legend = ax.get_legend()
        if legend is None or not _overlaps(legend.get_window_extent(renderer),
                                           ax.get_window_extent(renderer)):
            continue
        box = ax.get_window_extent(renderer)
        right_of = [o for o in axes if o is not ax and _same_row(o.get_window_extent(renderer), box)
                    and o.get_window_extent(renderer).x0 >= box.x1 - 1]
        handles, labels = ax.get_legend_handles_labels()
        size = legend.get_texts()[0].get_fontsize() if legend.get_texts() else None
        legend.remove()
        if not right_of:
            ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      borderaxespad=0.0, fontsize=size)
            continue
        tight = ax.get_tightbbox(renderer).transformed(ax.transAxes.inverted())
        for ncol in range(min(3, max(1, len(labels))), 0, -1):  # no wider than its axes
            placed = ax.legend(handles, labels, loc="upper center", fontsize=size, ncol=ncol,
                               bbox_to_anchor=(0.5, tight.y0 - 0.02), borderaxespad=0.0)
            if placed.get_window_extent(renderer).width <= box.width or ncol == 1:
                break


def _overlaps(a: Any, b: Any) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _same_row(a: Any, b: Any) -> bool:
    return a.y0 < b.y1 and b.y0 < a.y1


def bytes_axis(ax: Any, axis: str = "y") -> None:
    """Label an axis whose values are bytes as 10 KB, 1 MB, 1 GB (log or linear)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    scale = ax.get_yscale() if axis == "y" else ax.get_xscale()
    if scale == "log":
        target.set_major_locator(LogLocator(base=10))
        target.set_minor_formatter(NullFormatter())
    target.set_major_formatter(FuncFormatter(lambda v, _: human_bytes(v) if v > 0 else "0"))


def readable_log_axis(ax: Any, axis: str = "x") -> None:
    """Plain-number tick labels on a log axis (call it once the data is plotted), with the
    ticks in between labelled when it spans less than two decades (1, 2, 5; below one decade
    every integer multiple)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    if lo <= 0 or hi <= 0:
        return
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}")
    decades = math.log10(hi / lo)
    if decades < 2:
        subs = (1.0, 2.0, 5.0) if decades >= 1 else tuple(float(k) for k in range(1, 10))
        target.set_major_locator(LogLocator(base=10, subs=subs))
    target.set_major_formatter(plain)
    target.set_minor_formatter(NullFormatter())


def log_bars(ax: Any, x: Sequence[float], values: Sequence[float | None], width: float, *,
             label: str, missing: str = "n/a", **style: Any) -> Any:
    """Bars on a log axis; a value that is None or not positive draws no bar and is written
    (``missing``, or ``0``) at the foot of the axis instead."""
    ax.set_yscale("log")
    drawn = [(xi, v) for xi, v in zip(x, values, strict=True) if v is not None and v > 0]
    bars = ax.bar([xi for xi, _ in drawn], [v for _, v in drawn], width, label=label, **style)
    for xi, v in zip(x, values, strict=True):
        if v is None or v <= 0:
            ax.annotate(missing if v is None else "0", (xi, 0), xycoords=("data", "axes fraction"),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6, rotation=90, color="0.4")
    return bars


def label_points(ax: Any, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str], *,
                 fontsize: float = 7) -> None:
    """Write each label beside its point, nudged vertically until it overlaps no label placed
    before it (greedy, in display space)."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    placed: list[Any] = []
    for x, y, text in sorted(zip(xs, ys, labels, strict=True), key=lambda t: (-t[1], t[0])):
        note = None
        for step in range(12):
            dy = (step + 1) // 2 * 7 * (1 if step % 2 else -1)
            note = ax.annotate(text, (x, y), xytext=(4, 2 + dy), textcoords="offset points",
                               fontsize=fontsize, arrowprops=None if step == 0 else
                               {"arrowstyle": "-", "color": "0.6", "linewidth": 0.5})
            box = note.get_window_extent(renderer)
            if not any(_overlaps(box, other) for other in placed):
                break
            note.remove()
            note = None
        if note is None:  # nowhere free: keep the first place
            note = ax.annotate(text, (x, y), xytext=(4, 2), textcoords="offset points",
                               fontsize=fontsize)
        placed.append(note.get_window_extent(renderer))


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of the points no other point beats on both counts (a larger ``x`` and a
    smaller ``y``, e.g. faster and smaller): the ones worth a label on a crowded scatter."""
    points = list(zip(xs, ys, strict=True))
    return [i for i, (x, y) in enumerate(points)
            if not any(ox >= x and oy <= y and (ox, oy) != (x, y) for ox, oy in points)]
