"""A small inline SVG line chart (no script, no external asset)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

__all__ = ["Line", "line_chart"]

_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")
_W, _H, _PAD_L, _PAD_R, _PAD_T, _PAD_B = 560, 220, 52, 12, 26, 34


@dataclass(frozen=True, slots=True)
class Line:
    """One series of a chart."""

    label: str
    points: Sequence[tuple[float, float]]


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def _span(values: list[float]) -> tuple[float, float]:
    low, high = min(values), max(values)
    if high == low:
        pad = abs(high) * 0.1 or 1.0
        return low - pad, high + pad
    return low, high


def line_chart(title: str, lines: Sequence[Line], *, x_label: str, y_label: str, chart_id: str) -> str:
    """An SVG chart of `lines`; an empty chart says that there is nothing yet."""
    drawn = [line for line in lines if line.points]
    head = (
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {_W} {_H}" width="{_W}" height="{_H}" '
        f'role="img" aria-label="{escape(title)}" data-points="{sum(len(x.points) for x in drawn)}">'
        f'<text x="{_PAD_L}" y="16" class="chart-title">{escape(title)}</text>'
    )
    if not drawn:
        empty = f'<text x="{_W // 2}" y="{_H // 2}" text-anchor="middle" class="muted">no data yet</text>'
        return head + empty + "</svg>"
    xs = [x for line in drawn for x, _ in line.points]
    ys = [y for line in drawn for _, y in line.points]
    (x0, x1), (y0, y1) = _span(xs), _span(ys)
    inner_w, inner_h = _W - _PAD_L - _PAD_R, _H - _PAD_T - _PAD_B

    def sx(x: float) -> float:
        return _PAD_L + (x - x0) / (x1 - x0) * inner_w

    def sy(y: float) -> float:
        return _PAD_T + (1 - (y - y0) / (y1 - y0)) * inner_h

    parts = [head, _axes(x0, x1, y0, y1, x_label, y_label)]
    for i, line in enumerate(drawn):
        colour = _COLOURS[i % len(_COLOURS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in line.points)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8" points="{path}"/>')
        parts += [
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6" fill="{colour}">'
            f"<title>{escape(line.label)}: {_fmt(y)} at {_fmt(x)}</title></circle>"
            for x, y in line.points
        ]
        parts.append(
            f'<text x="{_W - _PAD_R - 4}" y="{16 + 13 * i}" text-anchor="end" fill="{colour}" '
            f'class="legend">{escape(line.label)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _axes(x0: float, x1: float, y0: float, y1: float, x_label: str, y_label: str) -> str:
    bottom, right = _H - _PAD_B, _W - _PAD_R
    return (
        f'<line x1="{_PAD_L}" y1="{_PAD_T}" x2="{_PAD_L}" y2="{bottom}" class="axis"/>'
        f'<line x1="{_PAD_L}" y1="{bottom}" x2="{right}" y2="{bottom}" class="axis"/>'
        f'<text x="{_PAD_L - 4}" y="{_PAD_T + 4}" text-anchor="end" class="tick">{_fmt(y1)}</text>'
        f'<text x="{_PAD_L - 4}" y="{bottom}" text-anchor="end" class="tick">{_fmt(y0)}</text>'
        f'<text x="{_PAD_L}" y="{bottom + 14}" class="tick">{_fmt(x0)}</text>'
        f'<text x="{right}" y="{bottom + 14}" text-anchor="end" class="tick">{_fmt(x1)}</text>'
        f'<text x="{(_PAD_L + right) / 2:.0f}" y="{_H - 4}" text-anchor="middle" class="tick">'
        f"{escape(x_label)}</text>"
        f'<text x="12" y="{(_PAD_T + bottom) / 2:.0f}" text-anchor="middle" class="tick" '
        f'transform="rotate(-90 12 {(_PAD_T + bottom) / 2:.0f})">{escape(y_label)}</text>'
    )
