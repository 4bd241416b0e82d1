"""Small charts as SVG markup, drawn on the server: bars (the store page) and a histogram (call durations).

Curves of metrics are uPlot's, in the browser (``static/casmon-charts.js``);
these two need no script and no data endpoint. Colours and sizes are SVG attributes, never ``style=`` (the UI's
Content-Security-Policy allows no inline style attributes). Every label comes
from a store, so every label is escaped; a mark's ``<title>`` is its tooltip.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence as Seq

from casmon.view.display import Html, esc
from casmon.view.text import cut
from casmon.ui.values import fmt

#: Distinct colours for up to ten series (then they repeat).
PALETTE = ["#0969da", "#cf222e", "#1a7f37", "#8250df", "#bf8700", "#1b7c83", "#e16f24", "#6e7781", "#bf3989", "#4c2889"]


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _range(values: Seq[float], zero: bool) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    if zero:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
    if hi == lo:
        pad = abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
    return lo, hi


def bars(labels: Seq[str], values: Seq[float], title: str, width: int = 640) -> Html:
    """One bar per run (``class="mark bar"``), its value written on it; zero is the baseline."""
    n = len(values)
    height, left, top, bottom = 220, 56, 24, 60
    lo, hi = _range(values, zero=True)
    plot_w, plot_h = width - left - 12, height - top - bottom
    slot = plot_w / max(n, 1)

    def y(v: float) -> float:
        return top + plot_h * (hi - v) / (hi - lo)

    out = [_open(width, height, title),
           f'<line class="axis" x1="{left}" y1="{y(0):.1f}" x2="{width - 12}" y2="{y(0):.1f}" stroke="#57606a"/>',
           _tick(left, y(hi), fmt(hi)), _tick(left, y(lo), fmt(lo))]
    for i, (label, v) in enumerate(zip(labels, values)):
        x = left + i * slot + slot * 0.15
        w = slot * 0.7
        y0, y1 = sorted((y(0), y(v)))
        out.append(f'<rect class="mark bar" x="{x:.1f}" y="{y0:.1f}" width="{w:.1f}" height="{max(y1 - y0, 1):.1f}" '
                   f'fill="{colour(i)}"><title>{esc(label)}: {esc(fmt(v))}</title></rect>')
        out.append(f'<text x="{x + w / 2:.1f}" y="{y0 - 4:.1f}" text-anchor="middle" font-size="11">{esc(fmt(v))}</text>')
        out.append(f'<text x="{x + w / 2:.1f}" y="{height - bottom + 16:.1f}" text-anchor="middle" font-size="11">'
                   f'{esc(cut(label, max(int(slot / 7), 4)))}</text>')
    out.append("</svg>")
    return Html("".join(out))


def histogram(bins: Seq[tuple[float, float, int]], title: str, label: Callable[[float, float], str],
              width: int = 640) -> Html:
    """Counts per bin (``class="mark bin"``); ``label(low, high)`` names a bin (durations, say)."""
    if not bins:
        return Html("")
    height, left, top, bottom = 200, 56, 24, 36
    top_count = max(c for _, _, c in bins) or 1
    plot_w, plot_h = width - left - 12, height - top - bottom
    slot = plot_w / len(bins)
    out = [_open(width, height, title), _tick(left, top, str(top_count)), _tick(left, top + plot_h, "0"),
           f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{width - 12}" y2="{top + plot_h}" stroke="#57606a"/>']
    for i, (lo, hi, c) in enumerate(bins):
        h = plot_h * c / top_count
        out.append(f'<rect class="mark bin" x="{left + i * slot + 1:.1f}" y="{top + plot_h - h:.1f}" '
                   f'width="{max(slot - 2, 1):.1f}" height="{h:.1f}" fill="#0969da"><title>{esc(label(lo, hi))}: '
                   f'{c:,}</title></rect>')
    out.append(f'<text x="{left}" y="{height - 8}" font-size="11">{esc(label(bins[0][0], bins[0][0]).split(" – ")[0])}</text>')
    out.append(f'<text x="{width - 12}" y="{height - 8}" font-size="11" text-anchor="end">'
               f'{esc(label(bins[-1][1], bins[-1][1]).split(" – ")[0])}</text>')
    out.append("</svg>")
    return Html("".join(out))


def _open(width: int, height: int, title: str) -> str:
    return (f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{esc(title)}"><title>{esc(title)}</title>'
            f'<text x="4" y="14" font-size="12" font-weight="600">{esc(title)}</text>')


def _tick(left: int, y: float, text: str) -> str:
    return f'<text x="{left - 4}" y="{y + 4:.1f}" font-size="11" text-anchor="end">{esc(text)}</text>'
