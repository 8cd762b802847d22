"""Small server-side SVG charts (stacked bars, lines on a linear or log scale): inline in the page,
coloured by the stylesheet's classes, so the page needs no script and no style attribute to show
them. Each bucket carries a ``<title>`` tooltip with its values."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from markupsafe import Markup, escape

WIDTH, HEIGHT = 720, 190
LEFT, RIGHT, TOP, BOTTOM = 64, 12, 10, 24
PLOT_W, PLOT_H = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
LABEL_EVERY_MINUTES = 15

Format = Callable[[float], str]


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    css: str
    """Class of its marks (``stroke``/``fill`` come from the stylesheet)."""
    values: Sequence[float | None]
    """One per bucket; None: nothing to show there (a gap in a line)."""


def stacked_bars(
    times: Sequence[datetime], series: Sequence[Series], *, empty: str, fmt: Format
) -> Markup:
    totals = [sum(s.values[i] or 0 for s in series) for i in range(len(times))]
    if not any(totals):
        return _empty(times, empty)
    top, ticks = _linear_ticks(max(totals))
    slot = PLOT_W / len(times)
    marks = []
    for i, moment in enumerate(times):
        base = 0.0
        tip = [f"{moment:%H:%M} UTC"] + [f"{fmt(s.values[i] or 0)} {s.label}" for s in series]
        bars = []
        for s in series:
            value = s.values[i] or 0
            if value:
                y0, y1 = _y_linear(base, top), _y_linear(base + value, top)
                bars.append(
                    f'<rect class="{s.css}" x="{LEFT + i * slot + 1:.1f}" y="{y1:.1f}" '
                    f'width="{max(slot - 2, 1):.1f}" height="{max(y0 - y1, 0.5):.1f}"/>'
                )
            base += value
        marks.append(_hover(i, slot, ", ".join(tip)) + "".join(bars))
    grid = [(_y_linear(t, top), fmt(t)) for t in ticks]
    return _svg(times, grid, "".join(marks))


def lines(
    times: Sequence[datetime],
    series: Sequence[Series],
    *,
    empty: str,
    fmt: Format,
    log: bool = False,
) -> Markup:
    values = [v for s in series for v in s.values if v is not None and (v > 0 or not log)]
    if not values or not any(values):
        return _empty(times, empty)
    if log:
        low, high = _log_range(min(values), max(values))

        def y_of(v: float) -> float:
            share = (math.log10(max(v, low)) - math.log10(low)) / math.log10(high / low)
            return TOP + PLOT_H * (1 - share)

        grid = [
            (y_of(low * 10**k), fmt(low * 10**k)) for k in range(round(math.log10(high / low)) + 1)
        ]
    else:
        top, ticks = _linear_ticks(max(values))

        def y_of(v: float) -> float:
            return _y_linear(v, top)

        grid = [(y_of(t), fmt(t)) for t in ticks]
    slot = PLOT_W / len(times)
    marks = []
    for i, moment in enumerate(times):
        tip = [f"{moment:%H:%M} UTC"] + [
            f"{s.label} {fmt(v) if (v := s.values[i]) is not None else '-'}" for s in series
        ]
        marks.append(_hover(i, slot, ", ".join(tip)))
    for s in series:
        points = [
            (LEFT + (i + 0.5) * slot, y_of(v)) if v is not None else None
            for i, v in enumerate(s.values)
        ]
        marks.append(f'<path class="line {s.css}" d="{_path(points)}"/>')
        marks.extend(
            f'<circle class="dot {s.css}" cx="{p[0]:.1f}" cy="{p[1]:.1f}" r="2"/>'
            for p in points
            if p is not None
        )
    return _svg(times, grid, "".join(marks))


# --- geometry -----------------------------------------------------------------------------------
def _linear_ticks(maximum: float) -> tuple[float, list[float]]:
    """A round top of the axis at or above ``maximum`` (a count) and up to five whole-number
    ticks from 0 to it."""
    step = max(1, 10 ** math.floor(math.log10(maximum / 4))) if maximum > 0 else 1
    for factor in (1, 2, 5, 10):
        if maximum / (step * factor) <= 4:
            step *= factor
            break
    count = max(1, math.ceil(maximum / step - 1e-9))
    return step * count, [step * k for k in range(count + 1)]


def _y_linear(value: float, top: float) -> float:
    return TOP + PLOT_H * (1 - value / top)


def _log_range(low: float, high: float) -> tuple[float, float]:
    low_exp, high_exp = math.floor(math.log10(low)), math.ceil(math.log10(high))
    return 10.0**low_exp, 10.0 ** max(high_exp, low_exp + 1)


def _path(points: Sequence[tuple[float, float] | None]) -> str:
    parts, pen_down = [], False
    for point in points:
        if point is None:
            pen_down = False
            continue
        parts.append(f"{'L' if pen_down else 'M'}{point[0]:.1f} {point[1]:.1f}")
        pen_down = True
    return " ".join(parts)


def _hover(i: int, slot: float, tip: str) -> str:
    return (
        f'<rect class="hover" x="{LEFT + i * slot:.1f}" y="{TOP}" width="{slot:.1f}" '
        f'height="{PLOT_H}"><title>{escape(tip)}</title></rect>'
    )


def _svg(times: Sequence[datetime], grid: Sequence[tuple[float, str]], marks: str) -> Markup:
    rules = [
        f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>'
        f'<text class="axis" x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(label)}</text>'
        for y, label in grid
    ]
    return _frame(times, "".join(rules) + marks)


def _empty(times: Sequence[datetime], message: str) -> Markup:
    text = (
        f'<text class="empty" x="{LEFT + PLOT_W / 2}" y="{TOP + PLOT_H / 2}" '
        f'text-anchor="middle">{escape(message)}</text>'
    )
    baseline = f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + PLOT_H}" y2="{TOP + PLOT_H}"/>'
    return _frame(times, baseline + text)


def _frame(times: Sequence[datetime], body: str) -> Markup:
    slot = PLOT_W / max(len(times), 1)
    labels = [
        f'<text class="axis" x="{LEFT + (i + 0.5) * slot:.1f}" y="{HEIGHT - 6}" '
        f'text-anchor="middle">{moment:%H:%M}</text>'
        for i, moment in enumerate(times)
        if moment.minute % LABEL_EVERY_MINUTES == 0 and moment.second == 0
    ]
    return Markup(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'preserveAspectRatio="xMidYMid meet">{body}{"".join(labels)}</svg>'
    )
