"""Charts as inline SVG strings: no JavaScript, no network, a few kilobytes each.

The report needs five plain chart shapes (columns, horizontal bars, lines over k, CDFs on a log axis).
Drawing them here keeps the report one small self-contained file that opens anywhere; the pip
packages that ship a JS chart library are megabytes (plotly.js, BokehJS) or fetch their scripts
from a CDN (pygal), which a report opened offline must not do. Hovering a bar or point shows its
value (an SVG ``<title>``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

W, H = 520, 260
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 26, 44
PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#b07aa1", "#edc948", "#9c755f")


@dataclass(frozen=True)
class Series:
    name: str
    points: Sequence[tuple[float, float]]
    color: str


def _svg(name: str, label: str, body: list[str]) -> str:
    return (
        f'<svg class="chart" data-chart="{escape(name)}" viewBox="0 0 {W} {H}" role="img" '
        f'aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>"
    )


def _text(x: float, y: float, s: str, anchor: str = "middle", cls: str = "tick", rotate: float = 0) -> str:
    transform = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}" class="{cls}"{transform}>{escape(s)}</text>'


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (steps of 1, 2 or 5 times a power of ten)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _tick_label(v: float) -> str:
    return f"{v:g}"


def _y_axis(ticks: list[float], y: Callable[[float], float], title: str, fmt: Callable[[float], str]) -> list[str]:
    out = []
    for t in ticks:
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y(t):.1f}" y2="{y(t):.1f}" class="grid"/>')
        out.append(_text(LEFT - 6, y(t) + 4, fmt(t), anchor="end"))
    out.append(_text(14, TOP + (H - TOP - BOTTOM) / 2, title, cls="axis", rotate=-90))
    return out


def _x_title(title: str) -> str:
    return _text(LEFT + (W - LEFT - RIGHT) / 2, H - 6, title, cls="axis")


def _legend(series: Sequence[Series]) -> list[str]:
    out, x = [], LEFT + 4
    for s in series:
        out.append(f'<line x1="{x}" x2="{x + 16}" y1="12" y2="12" stroke="{s.color}" stroke-width="3"/>')
        out.append(_text(x + 20, 16, s.name, anchor="start", cls="legend"))
        x += 28 + 7 * len(s.name)
    return out


def columns(
    name: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    x_title: str,
    y_title: str,
    color: str = PALETTE[0],
    tips: Sequence[str] | None = None,
) -> str:
    """Vertical bars, one per label (a histogram when the labels are bins)."""
    ticks = nice_ticks(max(values, default=0) or 1)
    span = H - TOP - BOTTOM

    def y(v: float) -> float:
        return H - BOTTOM - span * v / ticks[-1]

    body = _y_axis(ticks, y, y_title, _tick_label)
    slot = (W - LEFT - RIGHT) / max(len(labels), 1)
    every = max(1, math.ceil(len(labels) / 12))
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        x = LEFT + i * slot + slot * 0.12
        tip = tips[i] if tips else f"{label}: {v:g}"
        body.append(
            f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{slot * 0.76:.1f}" height="{y(0) - y(v):.1f}" '
            f'fill="{color}" rx="2"><title>{escape(tip)}</title></rect>'
        )
        if v:
            body.append(_text(x + slot * 0.38, y(v) - 4, f"{v:g}", cls="value"))
        if i % every == 0:
            body.append(_text(x + slot * 0.38, H - BOTTOM + 15, label))
    body.append(_x_title(x_title))
    return _svg(name, f"{y_title} by {x_title}", body)


def hbars(name: str, labels: Sequence[str], values: Sequence[float], *, x_title: str, color: str = PALETTE[3]) -> str:
    """Horizontal bars, largest first (e.g. failures by kind)."""
    ticks = nice_ticks(max(values, default=0) or 1)
    left = 120
    row = min(34.0, (H - TOP - BOTTOM) / max(len(labels), 1))

    def x(v: float) -> float:
        return left + (W - left - RIGHT) * v / ticks[-1]

    body = []
    for t in ticks:
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP}" y2="{H - BOTTOM}" class="grid"/>')
        body.append(_text(x(t), H - BOTTOM + 15, _tick_label(t)))
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        top = TOP + i * row + row * 0.15
        body.append(
            f'<rect x="{left}" y="{top:.1f}" width="{x(v) - left:.1f}" height="{row * 0.7:.1f}" fill="{color}" rx="2">'
            f"<title>{escape(label)}: {v:g}</title></rect>"
        )
        body.append(_text(left - 6, top + row * 0.45, label, anchor="end"))
        body.append(_text(x(v) + 4, top + row * 0.45, f"{v:g}", anchor="start", cls="value"))
    body.append(_x_title(x_title))
    return _svg(name, f"{x_title} by kind", body)


def lines(
    name: str,
    series: Sequence[Series],
    *,
    x_ticks: Sequence[tuple[float, str]],
    x_title: str,
    y_title: str,
    log2_x: bool = True,
) -> str:
    """Lines with markers over a few x values (pass@k over k, on a log2 axis), y from 0 to 1."""
    xs = [v for v, _ in x_ticks] or [1.0]
    lo, hi = min(xs), max(xs)
    f = math.log2 if log2_x else float
    span_x = (f(hi) - f(lo)) or 1.0

    def x(v: float) -> float:
        return LEFT + 12 + (W - LEFT - RIGHT - 24) * (f(v) - f(lo)) / span_x

    def y(v: float) -> float:
        return H - BOTTOM - (H - TOP - BOTTOM) * v

    body = _y_axis([0, 0.25, 0.5, 0.75, 1.0], y, y_title, _tick_label)
    for v, label in x_ticks:
        body.append(_text(x(v), H - BOTTOM + 15, label))
    for s in series:
        path = " ".join(f"{'M' if i == 0 else 'L'}{x(px):.1f},{y(py):.1f}" for i, (px, py) in enumerate(s.points))
        body.append(f'<path d="{path}" fill="none" stroke="{s.color}" stroke-width="2.5"/>')
        for px, py in s.points:
            body.append(
                f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="4" fill="{s.color}">'
                f"<title>{escape(s.name)} k={px:g}: {py:.3f}</title></circle>"
            )
    body += _legend(series)
    body.append(_x_title(x_title))
    return _svg(name, f"{y_title} over {x_title}", body)


def cdf(name: str, values: Mapping[str, Sequence[float]], *, x_title: str, fmt: Callable[[float], str]) -> str:
    """Empirical CDFs, one per series, on a log10 x axis (durations from milliseconds to minutes)."""
    least = min((v for vs in values.values() for v in vs if v > 0), default=1e-3)
    most = max((v for vs in values.values() for v in vs if v > 0), default=1.0)
    lo = 10 ** math.floor(math.log10(max(least, 1e-4)))
    hi = 10 ** math.ceil(math.log10(max(most, lo * 10)))

    def x(v: float) -> float:
        v = min(max(v, lo), hi)
        return LEFT + (W - LEFT - RIGHT) * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    def y(p: float) -> float:
        return H - BOTTOM - (H - TOP - BOTTOM) * p

    body = _y_axis([0, 0.25, 0.5, 0.75, 1.0], y, "share of rollouts", lambda t: f"{t:.0%}")
    decade = lo
    while decade <= hi * 1.001:
        anchor = "end" if decade * 10 > hi * 1.001 else "middle"  # the last label stays inside the frame
        body.append(_text(x(decade), H - BOTTOM + 15, fmt(decade), anchor=anchor))
        decade *= 10
    series = []
    for i, (label, vs) in enumerate(values.items()):
        if not vs:
            continue
        color = PALETTE[i % len(PALETTE)]
        series.append(Series(label, [], color))
        ordered = sorted(vs)
        n = len(ordered)
        step = max(1, n // 300)
        idx = sorted(set(range(0, n, step)) | {n - 1})
        path = [f"M{x(ordered[0]):.1f},{y(0):.1f}"]
        for j in idx:
            path.append(f"H{x(ordered[j]):.1f}V{y((j + 1) / n):.1f}")
        p50 = ordered[(n - 1) // 2]
        body.append(
            f'<path d="{"".join(path)}" fill="none" stroke="{color}" stroke-width="2">'
            f"<title>{escape(label)}: median {escape(fmt(p50))}, max {escape(fmt(ordered[-1]))}, n={n}</title></path>"
        )
    body += _legend(series)
    body.append(_x_title(x_title))
    return _svg(name, f"CDF of {x_title}", body)
