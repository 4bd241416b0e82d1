"""Values as the UI shows them in a cell: short, never wider than a column, numbers in lists summarised.

A list or 1-D array of numbers is ``[500 floats: 0.0123 .. 1]`` (with a
sparkline beside it on a page), a dict ``{3 keys: a, b, c}``, a long string cut;
nothing is printed inline at its full length. Also here: :func:`json_block`,
data for a page's script as a ``<script type="application/json">`` block that
no ``</script>`` inside a store string can end early.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
from typing import Any

from casmon.runs.metrics import json_safe, number_text
from casmon.store.peek import Described
from casmon.view.display import Html, esc
from casmon.view.text import cut

#: A text cell longer than this is cut (its full text is the cell's title).
TEXT_MAX = 120


def fmt(x: float) -> str:
    """A number in a cell, on an axis or in a label: short, and exact enough to tell runs apart."""
    if x == 0:
        return "0"
    if not math.isfinite(x):
        return number_text(x)  # NaN, inf, -inf
    a = abs(x)
    if a >= 1e5 or a < 1e-3:
        return f"{x:.3g}"
    return f"{x:.4g}"


def numbers_of(v: Any) -> list[float] | None:
    """The numbers of a JSON list of numbers (no bools), or None."""
    if not isinstance(v, list) or not v:
        return None
    if any(type(x) not in (int, float) for x in v):
        return None
    return [float(x) for x in v]


def numbers_summary(xs: list[float], kind: str) -> str:
    """``[500 floats: 0.0123 .. 1]``: how many, and the finite range."""
    finite = [x for x in xs if math.isfinite(x)]
    word = kind + ("" if len(xs) == 1 else "s")
    if not finite:
        return f"[{len(xs):,} {word}]"
    return f"[{len(xs):,} {word}: {fmt(min(finite))} .. {fmt(max(finite))}]"


def summary_text(v: Any) -> str:
    """Any cell value as one short line of text."""
    if isinstance(v, Described):
        return cut(str(v), TEXT_MAX, flatten=True)
    if isinstance(v, list):
        nums = numbers_of(v)
        if nums is not None:
            return numbers_summary(nums, "int" if all(type(x) is int for x in v) else "float")
        if not v:
            return "[]"
        return cut(f"[{len(v):,} items: " + ", ".join(summary_text(x) for x in v[:4]) + (", …]" if len(v) > 4 else "]"),
                   TEXT_MAX, flatten=True)
    if isinstance(v, dict):
        keys = list(v)
        return cut(f"{{{len(keys):,} keys: " + ", ".join(map(str, keys[:6])) + (", …}" if len(keys) > 6 else "}"),
                   TEXT_MAX, flatten=True)
    if isinstance(v, float):
        return fmt(v)
    if isinstance(v, bool):
        return "yes" if v else "no"
    if v is None:
        return ""
    return cut(str(v), TEXT_MAX, flatten=True)


def cell_text(v: Any) -> str:
    """A value in a numeric column as text: numbers as they are (floats short), yes/no, anything else its
    summary (what a live table sets a cell to)."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return fmt(v)
    if isinstance(v, int):
        return f"{v}"
    return summary_text(v)


def status_text(status: Any, signal: Any = None) -> str:
    """``killed (SIGTERM)``: a killed run says by which signal (``manifest["signal"]``)."""
    s = str(status)
    if s == "killed" and type(signal) is str and 0 < len(signal) <= 16:
        return f"{s} ({signal})"
    return s


def short_when(t: Any) -> str:
    """A start time in a table cell: ``2026-12-02 01:51``, local time (the cell's title has the seconds and the
    zone): one line in a narrow column."""
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not math.isfinite(t):
        return "-" if t is None else "?"
    try:
        return _dt.datetime.fromtimestamp(float(t)).strftime("%Y-%m-%d %H:%M")
    except (ValueError, OverflowError, OSError):
        return "?"


def console_text(text: str) -> str:
    """Console output as a terminal leaves it on screen: a line rewritten with carriage returns (a progress
    bar) shows its last state, ``\r\n`` is a line end; what follows the last newline (the line being
    written) stays."""
    if "\r" not in text:
        return text
    out = []
    for line in text.replace("\r\n", "\n").split("\n"):
        shown = ""
        for part in line.split("\r"):  # each part overwrites the start of what is shown
            shown = part + shown[len(part):]
        out.append(shown)
    return "\n".join(out)


def cell_html(v: Any, spark: list[float] | None = None) -> Html:
    """A value in a table cell: a summary, with a sparkline when it is a sequence of numbers. A cut text keeps
    its whole text as the cell's tooltip."""
    nums = spark if spark is not None else numbers_of(v)
    text = summary_text(v)
    if nums is not None and len(nums) >= 2:
        return Html(f'<span class="summary-value">{esc(text)}</span>{sparkline(nums)}')
    full = str(v) if isinstance(v, (str, Described)) else ""
    title = f' title="{esc(cut(full, 2000))}"' if full and len(full) > TEXT_MAX else ""
    return Html(f"<span{title}>{esc(text)}</span>" if title else esc(text))


def json_block(element_id: str, data: Any) -> Html:
    """``data`` as a ``<script type="application/json">`` block: read by the page's script, never run (the
    Content-Security-Policy does not apply to it). ``<``, ``>`` and ``&`` are written as JSON escapes, so
    no text inside can close the element or open a comment."""
    text = json.dumps(json_safe(data), separators=(",", ":"), allow_nan=False, default=str)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return Html(f'<script type="application/json" id="{esc(element_id)}">{text}</script>')


def sparkline(xs: list[float], width: int = 90, height: int = 18) -> Html:
    """A small line of a sequence (evenly spaced samples of it), as SVG attributes (no style attribute)."""
    n = len(xs)
    if n > width:
        xs = [xs[round(i * (n - 1) / (width - 1))] for i in range(width)]
    finite = [x for x in xs if math.isfinite(x)]
    if len(finite) < 2:
        return Html("")
    lo, hi = min(finite), max(finite)
    span = (hi - lo) or 1.0
    step = (width - 2) / (len(xs) - 1)
    pts = " ".join(f"{1 + i * step:.1f},{height - 2 - (height - 4) * (x - lo) / span:.1f}"
                   for i, x in enumerate(xs) if math.isfinite(x))
    return Html(f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                f'viewBox="0 0 {width} {height}" aria-hidden="true"><polyline points="{pts}" fill="none" '
                f'stroke="#0969da" stroke-width="1"/></svg>')
