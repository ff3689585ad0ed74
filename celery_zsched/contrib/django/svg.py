"""Charts as inline SVG text: bars, stacked bars and lines, with no script and no asset.

Pure Python (no Django): each function returns a complete ``<svg>`` element
as a string, with every caller-given text escaped. Each chart names itself
for screen readers (``role="img"``, ``<title>`` and ``<desc>``), and every
bar and point carries a ``<title>`` the browser shows on hover. Text and axes
use ``currentColor``, so a chart follows the admin's light or dark theme.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

#: Drawing area margins: room for the y tick labels on the left, x labels below.
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 20, 40
_ids = itertools.count(1)


@dataclass(frozen=True)
class Series:
    """One line of a line chart, or one layer of a stacked bar chart."""

    name: str
    values: Sequence[float | None]
    colour: str


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k that is >= ``value`` (1 for nothing to show)."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * (1 - 1e-12):
            return float(step * power)
    return float(10 * power)  # unreachable: 10 * power > value


def number(value: float) -> str:
    """A tick or hover number, short: 1200 -> "1.2k", 2500000 -> "2.5M", 0.5 -> "0.5"."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}" if value != int(value) else str(int(value))


def _f(value: float) -> str:
    return f"{value:.1f}".removesuffix(".0")


class _Frame:
    """The axes of one chart: ``n`` x slots over ``0 .. top`` on y."""

    def __init__(self, n: int, top: float, width: int, height: int) -> None:
        self.n, self.top = max(n, 1), top
        self.width, self.height = width, height
        self.plot_w = width - LEFT - RIGHT
        self.plot_h = height - TOP - BOTTOM

    def x(self, slot: float) -> float:
        return LEFT + self.plot_w * slot / self.n

    def y(self, value: float) -> float:
        return TOP + self.plot_h * (1 - min(value, self.top) / self.top)

    def axes(self, labels: Sequence[str], every: int, y_label: str) -> list[str]:
        out = ['<g class="axes" font-size="11" fill="currentColor">']
        for i in range(5):
            value = self.top * i / 4
            y = self.y(value)
            out.append(f'<line x1="{LEFT}" x2="{self.width - RIGHT}" y1="{_f(y)}" y2="{_f(y)}"'
                       f' stroke="currentColor" stroke-opacity="{0.5 if i == 0 else 0.12}"/>')
            out.append(f'<text x="{LEFT - 6}" y="{_f(y + 4)}" text-anchor="end">'
                       f"{escape(number(value))}</text>")
        for slot, label in enumerate(labels):
            if label and slot % every == 0:
                x = self.x(slot + 0.5)
                out.append(f'<line x1="{_f(x)}" x2="{_f(x)}" y1="{TOP + self.plot_h}" '
                           f'y2="{TOP + self.plot_h + 4}" stroke="currentColor"/>')
                out.append(f'<text x="{_f(x)}" y="{TOP + self.plot_h + 16}" '
                           f'text-anchor="middle">{escape(label)}</text>')
        out.append(f'<text transform="translate(12 {_f(TOP + self.plot_h / 2)}) rotate(-90)" '
                   f'text-anchor="middle">{escape(y_label)}</text>')
        out.append("</g>")
        return out


def _svg(title: str, desc: str, frame: _Frame, body: list[str], x_label: str) -> str:
    uid = f"zsched-chart-{next(_ids)}"
    caption = (f'<text x="{_f(LEFT + frame.plot_w / 2)}" y="{frame.height - 6}" font-size="11"'
               f' text-anchor="middle" fill="currentColor">{escape(x_label)}</text>')
    return (f'<svg xmlns="http://www.w3.org/2000/svg" class="zsched-chart" role="img" '
            f'viewBox="0 0 {frame.width} {frame.height}" width="{frame.width}" '
            f'height="{frame.height}" aria-labelledby="{uid}-t {uid}-d">'
            f'<title id="{uid}-t">{escape(title)}</title><desc id="{uid}-d">{escape(desc)}</desc>'
            + "".join(body) + caption + "</svg>")


def bar_chart(values: Sequence[float], labels: Sequence[str], hovers: Sequence[str], *,
              title: str, desc: str, y_label: str, x_label: str = "", colour: str = "#417690",
              colours: Sequence[str | None] = (), every: int = 1, width: int = 760,
              height: int = 220) -> str:
    """One bar per value; ``hovers[i]`` is bar i's tooltip, ``colours[i]`` overrides its colour.

    ``labels`` name the x slots; only every ``every``-th is drawn, to stay legible.
    """
    _same_length(values=values, labels=labels, hovers=hovers)
    frame = _Frame(len(values), nice_ceiling(max(values, default=0)), width, height)
    body = frame.axes(labels, every, y_label)
    slot_w = frame.plot_w / frame.n
    for i, value in enumerate(values):
        fill = (colours[i] if i < len(colours) else None) or colour
        top = frame.y(value)
        body.append(f'<rect class="bar" x="{_f(frame.x(i) + 1)}" y="{_f(top)}" '
                    f'width="{_f(max(slot_w - 2, 1))}" height="{_f(TOP + frame.plot_h - top)}" '
                    f'fill="{escape(fill)}"><title>{escape(hovers[i])}</title></rect>')
    return _svg(title, desc, frame, body, x_label)


def stacked_bars(layers: Sequence[Series], labels: Sequence[str], *, title: str, desc: str,
                 y_label: str, x_label: str = "", every: int = 1, width: int = 760,
                 height: int = 220) -> str:
    """One bar per slot, made of one segment per layer (bottom first), with a legend."""
    _same_length(labels=labels, **{layer.name: layer.values for layer in layers})
    totals = [sum(layer.values[i] or 0 for layer in layers) for i in range(len(labels))]
    frame = _Frame(len(labels), nice_ceiling(max(totals, default=0)), width, height)
    body = frame.axes(labels, every, y_label)
    slot_w = frame.plot_w / frame.n
    for i, label in enumerate(labels):
        base = 0.0
        for layer in layers:
            value = layer.values[i] or 0
            if not value:
                continue
            top, bottom = frame.y(base + value), frame.y(base)
            body.append(f'<rect class="bar" x="{_f(frame.x(i) + 1)}" y="{_f(top)}" '
                        f'width="{_f(max(slot_w - 2, 1))}" height="{_f(bottom - top)}" '
                        f'fill="{escape(layer.colour)}"><title>{escape(label)}: '
                        f"{escape(number(value))} {escape(layer.name)}</title></rect>")
            base += value
    body += _legend(layers, width)
    return _svg(title, desc, frame, body, x_label)


def line_chart(lines: Sequence[Series], labels: Sequence[str], *, title: str, desc: str,
               y_label: str, unit: str = "", x_label: str = "", every: int = 1,
               width: int = 760, height: int = 220) -> str:
    """One polyline per series, with a dot (and tooltip) per value; ``None`` is a gap."""
    _same_length(labels=labels, **{line.name: line.values for line in lines})
    top = nice_ceiling(max((v for line in lines for v in line.values if v is not None),
                           default=0))
    frame = _Frame(len(labels), top, width, height)
    body = frame.axes(labels, every, y_label)
    half = frame.plot_w / frame.n / 2
    for line in lines:
        points = [(frame.x(i) + half, frame.y(v), i, v) for i, v in enumerate(line.values)
                  if v is not None]
        # A slot without a value breaks the line, so no trend is drawn through it.
        for _, run in itertools.groupby(enumerate(points), lambda p: p[1][2] - p[0]):
            coords = " ".join(f"{_f(x)},{_f(y)}" for _, (x, y, _i, _v) in run)
            body.append(f'<polyline points="{coords}" fill="none" '
                        f'stroke="{escape(line.colour)}" stroke-width="2"/>')
        for x, y, i, v in points:
            body.append(f'<circle class="point" cx="{_f(x)}" cy="{_f(y)}" r="3" '
                        f'fill="{escape(line.colour)}"><title>{escape(labels[i])}: '
                        f"{escape(line.name)} {escape(number(v))}{escape(unit)}</title></circle>")
    body += _legend(lines, width)
    return _svg(title, desc, frame, body, x_label)


def _legend(series: Sequence[Series], width: int) -> list[str]:
    out = ['<g class="legend" font-size="11" fill="currentColor">']
    x = width - RIGHT
    # Right-aligned, last entry first: about 7 px a character plus the swatch.
    for item in reversed(series):
        x -= 7 * len(item.name) + 22
        out.append(f'<rect x="{x}" y="2" width="10" height="10" fill="{escape(item.colour)}"/>'
                   f'<text x="{x + 14}" y="11">{escape(item.name)}</text>')
    out.append("</g>")
    return out


def _same_length(**sequences: Sequence[object]) -> None:
    lengths = {name: len(values) for name, values in sequences.items()}
    if len(set(lengths.values())) > 1:
        raise ValueError("chart data of unequal lengths: "
                         + ", ".join(f"{name} has {n}" for name, n in lengths.items()))
