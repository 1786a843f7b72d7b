"""Labels beside scatter points that overlap neither each other nor the points.

Greedy: points taken left to right; each label tries offsets around its point, nearest first,
then a ladder of rows farther out, and keeps the first whose box (measured by the renderer)
lies inside the axes and overlaps no label or point placed before. Every label has a thin
leader line to its point, so a label in a crowd still names one point. Used by notebook 11's latency
against bytes-per-token figure, whose systems that sit on one spot (the same bytes per token,
p50s within the noise) share one label (:func:`coinciding`): six labels on leader lines into
one point read as none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from packlab.lab.tables import fmt_us

OFFSETS = [(6, 4), (6, -12), (-6, 4), (-6, -12), (0, 10), (0, -18), (10, 14), (10, -22),
           (-10, 14), (-10, -22)]
# farther out, with a leader line: a ladder of rows above and below, to either side
FAR = [(dx, sign * dy) for dy in range(16, 241, 12) for sign in (1, -1)
       for dx in (24, -24, 70, -70)]
MARKER_PX = 4.0
PAD_PX = (6.0, 3.0)  # the space kept around a label, horizontally and vertically
#: systems this close share a label: p50s within this factor, bytes per token within SAME_BYTES
SAME_P50 = 1.08
SAME_BYTES = 0.05
LEADER = {"arrowstyle": "-", "color": "0.55", "lw": 0.5, "shrinkA": 0, "shrinkB": 3}


def _padded(box: Any) -> Any:
    """A label's box with a margin: two labels that merely touch read as one string."""
    from matplotlib.transforms import Bbox

    return Bbox.from_extents(box.x0 - PAD_PX[0], box.y0 - PAD_PX[1], box.x1 + PAD_PX[0],
                             box.y1 + PAD_PX[1])


def _overlaps(box: Any, others: Sequence[Any]) -> bool:
    return any(box.overlaps(o) for o in others)


def text_box(annotation: Any, renderer: Any) -> Any:
    """The box of an annotation's text alone (an Annotation's own extent adds its leader)."""
    from matplotlib.text import Text

    annotation.update_positions(renderer)  # where the text goes, before it is first drawn
    return Text.get_window_extent(annotation, renderer)


def place_labels(ax: Any, xs: Sequence[float], ys: Sequence[float], labels: Sequence[str],
                 *, fontsize: float = 7.5,
                 avoid: Sequence[tuple[float, float]] = ()) -> list[Any]:
    """Annotate ``(xs[k], ys[k])`` with ``labels[k]`` on ``ax``, inside the axes, no two labels
    overlapping and no label over a point (nor over the unlabelled points ``avoid``); returns
    the annotations (in input order). Set the
    axes' limits and legend first: the figure is laid out here (``tight_layout``), since the
    boxes are measured in display coordinates and a layout after them would move the points
    under labels that stay put."""
    from matplotlib.transforms import Bbox

    ax.figure.tight_layout()
    renderer = ax.figure.canvas.get_renderer()
    points = ax.transData.transform(list(zip(xs, ys, strict=True)))
    others = ax.transData.transform(list(avoid)) if len(avoid) else []
    blocked = [Bbox.from_extents(x - MARKER_PX, y - MARKER_PX, x + MARKER_PX, y + MARKER_PX)
               for x, y in [*points, *others]]
    placed: list[Any] = [None] * len(labels)
    for k in sorted(range(len(labels)), key=lambda j: (points[j][0], points[j][1])):
        text = None
        for offsets in (OFFSETS, FAR):
            for dx, dy in offsets:
                text = ax.annotate(
                    labels[k], (xs[k], ys[k]), xytext=(dx, dy), textcoords="offset points",
                    fontsize=fontsize, ha="left" if dx >= 0 else "right",
                    va="bottom" if dy >= 0 else "top",
                    arrowprops=LEADER)
                box = _padded(text_box(text, renderer))
                inside = ax.bbox.contains(box.x0, box.y0) and ax.bbox.contains(box.x1, box.y1)
                if inside and not _overlaps(box, blocked):
                    blocked.append(box)
                    break
                text.remove()
                text = None
            if text is not None:
                break
        if text is None:  # nowhere free: the last far offset, said plainly by its leader line
            text = ax.annotate(labels[k], (xs[k], ys[k]), xytext=FAR[-1],
                               textcoords="offset points", fontsize=fontsize,
                               arrowprops=LEADER)
            blocked.append(text_box(text, renderer))
        placed[k] = text
    return placed


def coinciding(xs: Sequence[float], ys: Sequence[float], labels: Sequence[str]
               ) -> list[tuple[float, float, str]]:
    """Points on one spot merged: each group at its fastest member, labelled with every member
    on its own line (fastest first, with its p50). A point joins a group whose first member
    it is within :data:`SAME_P50` and :data:`SAME_BYTES` of."""
    groups: list[list[int]] = []
    for k in sorted(range(len(xs)), key=lambda j: xs[j]):
        home = next((g for g in groups if xs[k] <= SAME_P50 * xs[g[0]]
                     and abs(ys[k] - ys[g[0]]) <= SAME_BYTES), None)
        if home is None:
            groups.append([k])
        else:
            home.append(k)
    return [(xs[g[0]], ys[g[0]], labels[g[0]] if len(g) == 1 else
             "\n".join(f"{labels[k]} ({fmt_us(xs[k])} µs)" for k in g)) for g in groups]


def system_label(row: Mapping[str, Any]) -> str:
    """A system's label: its name, where it ran when not beside packlab, and what reading left
    on disk when more than it wrote (MDS's decompressed copy): the figure plots the size as
    written."""
    after = (f", {row['bytes_per_token']:.1f} B/token after reads"
             if abs(row["bytes_per_token"] - row["bytes_per_token_written"]) > 0.005 else "")
    where = "" if row["environment"] == "venv" else f" [{row['environment']}]"
    return row["system"] + where + after
