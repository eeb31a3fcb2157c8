"""Small inline SVG charts for the run page: a line of points, and grouped bars on a log scale.

Server-rendered, no script: each point is a `<circle class="point" data-round=...>` and each bar
a `<rect class="bar" data-round=... data-series=...>`, so a reader (or a test) can find the
values, and every mark has a `<title>` shown on hover.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT = 640, 240
LEFT, RIGHT, TOP, BOTTOM = 64, 16, 24, 36  # margins around the plot area
Tick = tuple[float, str]  # (pixel position, label)


class Linear:
    """Data -> pixels; a zero-width range is widened so a single value sits in the middle."""

    def __init__(self, lo: float, hi: float, out_lo: float, out_hi: float) -> None:
        if hi == lo:
            lo, hi = lo - 0.5, hi + 0.5
        self.lo, self.span, self.out_lo, self.out_span = lo, hi - lo, out_lo, out_hi - out_lo

    def __call__(self, value: float) -> float:
        return self.out_lo + (value - self.lo) / self.span * self.out_span


def line_chart(points: Sequence[tuple[int, float]], *, element_id: str, y_label: str) -> str:
    """One value per round, as connected points; no points gives a short note instead."""
    if not points:
        return f'<p class="empty" id="{element_id}">no measurement yet</p>'
    xs, ys = [x for x, _ in points], [y for _, y in points]
    pad = (max(ys) - min(ys)) * 0.08 or abs(ys[0]) * 0.05 or 1.0
    low, high = min(ys) - pad, max(ys) + pad
    x_of, y_of = Linear(min(xs), max(xs), LEFT + 12, WIDTH - RIGHT - 12), Linear(low, high, HEIGHT - BOTTOM, TOP)
    step = max(1, len(xs) // 12)
    y_ticks = [(y_of(low + (high - low) * i / 4), f"{low + (high - low) * i / 4:.3g}") for i in range(5)]
    x_ticks = [(x_of(x), str(x)) for x in xs[::step]]
    line = " ".join(f"{x_of(x):.1f},{y_of(y):.1f}" for x, y in points)
    marks = "".join(
        f'<circle class="point" data-round="{x}" data-value="{y:.6g}" cx="{x_of(x):.1f}" cy="{y_of(y):.1f}" r="3.5">'
        f"<title>round {x}: {y:.4f}</title></circle>"
        for x, y in points
    )
    return _svg(element_id, _axes(y_ticks, x_ticks, y_label) + f'<polyline class="line" points="{line}"/>' + marks)


def bar_chart(rows: Sequence[tuple[int, dict[str, int]]], series: Sequence[str], *, element_id: str) -> str:
    """Per round, one bar per series (bytes), on a log scale; a series missing in a round is left out."""
    values = [v for _, bars in rows for v in bars.values() if v > 0]
    if not values:
        return f'<p class="empty" id="{element_id}">no measurement yet</p>'
    low, high = math.floor(math.log10(min(values))), math.ceil(math.log10(max(values)))
    high = max(high, low + 1)
    y_of = Linear(low, high, HEIGHT - BOTTOM, TOP)
    slot = (WIDTH - LEFT - RIGHT) / len(rows)
    width = slot * 0.8 / len(series)
    marks = []
    for i, (r, bars) in enumerate(rows):
        for j, name in enumerate(series):
            value = bars.get(name, 0)
            if value <= 0:
                continue
            x, top = LEFT + i * slot + slot * 0.1 + j * width, y_of(math.log10(value))
            marks.append(
                f'<rect class="bar s{j}" data-round="{r}" data-series="{escape(name)}" x="{x:.1f}" y="{top:.1f}" '
                f'width="{width:.1f}" height="{HEIGHT - BOTTOM - top:.1f}">'
                f"<title>round {r}, {escape(name)}: {value:,} bytes</title></rect>"
            )
    step = max(1, len(rows) // 12)
    x_ticks = [(LEFT + i * slot + slot / 2, str(r)) for i, (r, _) in enumerate(rows)][::step]
    y_ticks = [(y_of(e), f"1e{e}") for e in range(low, high + 1)]
    legend = "".join(
        f'<rect class="bar s{j}" x="{LEFT + 8 + j * 170}" y="6" width="10" height="10"/>'
        f'<text class="tick" x="{LEFT + 22 + j * 170}" y="15">{escape(name)}</text>'
        for j, name in enumerate(series)
    )
    return _svg(element_id, _axes(y_ticks, x_ticks, "bytes (log scale)") + "".join(marks) + legend)


def _svg(element_id: str, body: str) -> str:
    return (
        f'<svg id="{element_id}" class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" '
        f'role="img" xmlns="http://www.w3.org/2000/svg">{body}</svg>'
    )


def _axes(y_ticks: Sequence[Tick], x_ticks: Sequence[Tick], y_label: str) -> str:
    bottom, middle = HEIGHT - BOTTOM, (TOP + HEIGHT - BOTTOM) / 2
    parts = [
        f'<line class="axis" x1="{LEFT}" y1="{bottom}" x2="{WIDTH - RIGHT}" y2="{bottom}"/>',
        f'<line class="axis" x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{bottom}"/>',
        f'<text class="label" x="{(LEFT + WIDTH) / 2:.0f}" y="{HEIGHT - 4}" text-anchor="middle">round</text>',
        f'<text class="label" x="12" y="{middle:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {middle:.0f})">{escape(y_label)}</text>',
    ]
    for y, label in y_ticks:
        parts.append(f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>')
    for x, label in x_ticks:
        parts.append(f'<text class="tick" x="{x:.1f}" y="{bottom + 16}" text-anchor="middle">{escape(label)}</text>')
    return "".join(parts)
