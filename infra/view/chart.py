"""Line charts drawn by matplotlib as inline SVG (no script, no external asset): its axes, ticks
and labels (a wide label such as `4.35e+03` is laid out, not clipped), text kept as text."""

from __future__ import annotations

import functools
import io
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Line", "line_chart"]

WIDTH_IN, HEIGHT_IN = 5.8, 2.6
"""Size of one chart (inches at matplotlib's 72 points per inch in SVG)."""


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a chart."""

    label: str
    points: Sequence[tuple[float, float]]


def line_chart(title: str, lines: Sequence[Line], *, x_label: str, y_label: str, chart_id: str) -> str:
    """A `<figure class="chart">` holding the SVG of `lines` (`data-points`: how many points are
    drawn); an empty chart says that there is nothing yet."""
    drawn = tuple(Line(line.label, tuple((x, y) for x, y in line.points)) for line in lines if line.points)
    count = sum(len(line.points) for line in drawn)
    svg = _svg(title, drawn, x_label, y_label)
    return (
        f'<figure class="chart" id="{escape(chart_id)}" data-points="{count}" '
        f'aria-label="{escape(title)}">{svg}</figure>'
    )


@functools.lru_cache(maxsize=64)
def _svg(title: str, lines: tuple[Line, ...], x_label: str, y_label: str) -> str:
    """The chart's SVG; a finished run's unchanged charts are drawn once (matplotlib takes ~0.2 s
    a chart), a live run's when their points change."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    with matplotlib.rc_context({"svg.fonttype": "none", "font.size": 8}):
        fig, ax = plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN))
        ax.set_title(title, fontsize=9, loc="left")
        ax.set_xlabel(x_label)
        ax.set_ylabel(y_label)
        ax.grid(alpha=0.3)
        for line in lines:
            xs, ys = zip(*line.points, strict=True)
            ax.plot(xs, ys, marker="o", markersize=2.5, linewidth=1.4, label=line.label)
        if lines and all(float(x).is_integer() for line in lines for x, _ in line.points):
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # versions and steps: whole ticks
        if lines:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", color="#777")
            ax.set_xticks([])
            ax.set_yticks([])
        fig.tight_layout()
        buffer = io.StringIO()
        fig.savefig(buffer, format="svg")
        plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]
