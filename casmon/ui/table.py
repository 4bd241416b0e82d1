"""The runs table: a row per run, its columns in groups, the filter (which says what is wrong) and the sort.

Columns: the fixed ones (run, comment, status, start, duration, commit, dirty);
*parameters* -- ``param.NAME`` for each of ``r.flat_params()`` and ``info.NAME``
for each scalar of the run's info, nested dicts flattened (``info.cfg.lr``); and
*metrics* -- ``metric.NAME``, the last value of each logged series, from
``r.metric_summary()`` (no series is read). Each group's columns are in sorted
order, so a table keeps its layout from one reload to the next.

A filter is words (found in any cell) and comparisons (``loss<0.3 status=ok``);
a bare name is looked for as a fixed column, then ``param.``, ``info.`` and
``metric.``. A comparison with nothing on one side, or naming a column no run
has, is a :class:`FilterError` naming the term, never an empty table.
"""

from __future__ import annotations

import difflib
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from casmon.runs import RunInfo, flatten
from casmon.ui.model import Entry, RunIndex, is_number, is_scalar, run_number
from casmon.ui.values import summary_text

FIXED_COLUMNS = ["run", "comment", "status", "start", "duration", "commit", "dirty"]
#: Column groups by prefix, in table order; the label each group's header shows.
GROUPS = [("param.", "parameters"), ("info.", "parameters"), ("metric.", "metrics (last value)")]
#: At most this many parameter (and info) columns, and metric columns, on one page of the table.
MAX_PARAM_COLUMNS = 60
MAX_METRIC_COLUMNS = 40
_OPS = ("<=", ">=", "!=", "=", "<", ">")
_TERM_RE = re.compile(r"^([^<>=!]*)(<=|>=|!=|=|<|>)(.*)$")
_NAME_RE = re.compile(r"^[A-Za-z_][\w.\-]*$")


class FilterError(ValueError):
    """A filter term that cannot be applied; the message names the term and says why."""


def is_column(col: str) -> bool:
    """A column a table can have (the server refuses to sort by anything else)."""
    return col in FIXED_COLUMNS or any(col.startswith(p) and len(col) > len(p) for p, _ in GROUPS)


def row_of(r: RunInfo, e: Entry) -> dict[str, Any]:
    """A run's cells by column (see the module docstring)."""
    m = r.manifest
    git = m.get("git")
    g: dict[str, Any] = git if isinstance(git, dict) else {}
    elapsed = r.elapsed
    if elapsed is None and is_number(m.get("start")) and is_number(m.get("end")):
        elapsed = m["end"] - m["start"]
    row: dict[str, Any] = {"run": e.name, "comment": m.get("comment") or "", "status": r.status,
                           "start": m.get("start", e.start), "duration": elapsed, "commit": g.get("commit") or "",
                           "dirty": bool(g.get("dirty") or g.get("patch")) if g else None}
    try:
        params = r.flat_params()
    except Exception:  # noqa: BLE001 - a crafted manifest: the row shows what it can
        params = {}
    for k, v in params.items():
        row[f"param.{k}"] = v if is_scalar(v) else summary_text(v)
    info = m.get("info")
    if isinstance(info, dict):
        for k, v in flatten(info).items():
            if is_scalar(v):
                row[f"info.{k}"] = v
    for k, s in r.metric_summary().items():
        row[f"metric.{k}"] = s.get("last")
    return row


def sort_key(v: Any) -> tuple[int, float, str]:
    """Numbers, then text, then empty cells (mixed types sort without errors)."""
    if type(v) is bool:
        return (0, float(v), "")
    if is_number(v):
        return (0, float(v), "")
    if v is None or v == "":
        return (2, 0.0, "")
    return (1, 0.0, str(v).lower())


@dataclass
class Term:
    """One filter term: a word to find, or ``column op value``."""

    text: str  # as typed
    word: str = ""
    column: str = ""
    op: str = ""
    value: str = ""


def parse_filter(q: str) -> list[Term]:
    """``loss<0.3 status=ok base``: comparisons and words; a malformed comparison is a :class:`FilterError`."""
    out = []
    for tok in q.split():
        m = _TERM_RE.match(tok)
        if not m:
            out.append(Term(tok, word=tok.lower()))
            continue
        name, op, value = m.groups()
        if not name:
            raise FilterError(f"filter term {tok!r}: a comparison needs a column name before {op!r} "
                              f"(for example loss{op}0.3)")
        if not value:
            raise FilterError(f"filter term {tok!r}: a comparison needs a value after {op!r} (for example {name}{op}0.3)")
        if not _NAME_RE.match(name):
            raise FilterError(f"filter term {tok!r}: {name!r} is not a column name (letters, digits, '_', '.', '-')")
        if any(value.startswith(o) for o in _OPS):
            raise FilterError(f"filter term {tok!r}: one comparison a term (<, <=, >, >=, = or !=)")
        out.append(Term(tok, column=name, op=op, value=value))
    return out


def resolve(terms: list[Term], known: set[str]) -> list[Term]:
    """Each comparison's column as the rows name it (``loss`` -> ``metric.loss``); an unknown one is an error."""
    out = []
    for t in terms:
        if t.word:
            out.append(t)
            continue
        for col in (t.column, *(p + t.column for p, _ in GROUPS)):
            if col in known or col in FIXED_COLUMNS:
                out.append(Term(t.text, column=col, op=t.op, value=t.value))
                break
        else:
            names = sorted({c.split(".", 1)[1] if "." in c and any(c.startswith(p) for p, _ in GROUPS) else c
                            for c in known | set(FIXED_COLUMNS)})
            close = difflib.get_close_matches(t.column, names, 3)
            raise FilterError(f"filter term {t.text!r}: no run has a column {t.column!r}"
                              + (f" (did you mean {', '.join(close)}?)" if close else
                                 f" (columns: {', '.join(names[:30])}{', …' if len(names) > 30 else ''})"))
    return out


def _as_number(s: str) -> float | None:
    try:
        x = float(s)
    except ValueError:
        return None
    return x if math.isfinite(x) else None


#: A filter's comparisons; both sides are numbers, or both text.
_COMPARISONS: dict[str, Callable[[Any, Any], bool]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def matches(row: dict[str, Any], terms: list[Term]) -> bool:
    """The row passes every term (``terms`` resolved: see :func:`resolve`)."""
    text = None
    for t in terms:
        if t.word:
            if text is None:
                text = " ".join(str(v) for v in row.values() if v is not None).lower()
            if t.word not in text:
                return False
            continue
        v = row.get(t.column)
        if v is None:
            return False
        num = _as_number(t.value) if is_number(v) and type(v) is not bool else None
        a: float | str = str(v) if num is None else float(v)
        b: float | str = t.value if num is None else num
        if not _COMPARISONS[t.op](a, b):
            return False
    return True


@dataclass
class RunsView:
    rows: list[tuple[Entry, RunInfo, dict[str, Any]]]
    params: list[str]  # param.KEY then info.KEY columns, each sorted
    metrics: list[str]  # metric.KEY columns, sorted
    total: int  # runs that match
    all_runs: int
    page: int
    pages: int
    serial: int  # the index's change counter when the view was made (the page's live updates start there)
    error: str = ""  # what is wrong with the filter (the table then shows every run)
    cut: int = 0  # columns left out past the limits


def _sorted_rows(rows: list[tuple[Entry, RunInfo, dict[str, Any]]], sort: str,
                 desc: bool) -> list[tuple[Entry, RunInfo, dict[str, Any]]]:
    if sort == "run":
        return sorted(rows, key=lambda x: run_number(x[0].tail), reverse=desc)
    present = [x for x in rows if x[2].get(sort) not in (None, "")]
    missing = [x for x in rows if x[2].get(sort) in (None, "")]
    present.sort(key=lambda x: sort_key(x[2].get(sort)), reverse=desc)
    return present + missing  # empty cells last, either way


def runs_view(index: RunIndex, sort: str = "start", desc: bool = True, q: str = "", page: int = 1,
              per: int = 50) -> RunsView:
    """One page of the runs table. Only the default order (by start) without a filter avoids reading every
    manifest. A bad filter gives every run, and ``error`` says what is wrong with it."""
    entries = index.entries()
    serial = entries.changes
    error = ""
    try:
        terms = parse_filter(q)
    except FilterError as e:
        terms, error = [], str(e)
    if sort == "start" and not terms:
        chosen = list(reversed(entries)) if desc else list(entries)
        total = len(chosen)
        pages = max(1, math.ceil(total / per))
        page = min(max(page, 1), pages)
        rows = [(e, *index.row(e, row_of)) for e in chosen[(page - 1) * per: page * per]]
    else:
        key = (entries.serial, sort, desc, q)
        cached = index.views.get(key)
        if cached is None:
            every = [(e, *index.row(e, row_of)) for e in entries]
            if terms:
                known = {c for _e, _r, row in every for c in row}
                try:
                    resolved = resolve(terms, known)
                except FilterError as e:
                    resolved, error = [], str(e)
                every = [x for x in every if matches(x[2], resolved)]
            cached = _sorted_rows(every, sort if is_column(sort) else "start", desc)
            if index.complete(entries) and not error:  # valid while this listing is
                index.views[key] = cached
                while len(index.views) > 8:
                    index.views.pop(next(iter(index.views)))
        total = len(cached)
        pages = max(1, math.ceil(total / per))
        page = min(max(page, 1), pages)
        rows = cached[(page - 1) * per: page * per]
    seen = {k for _e, _r, row in rows for k in row}
    params = sorted(k for k in seen if k.startswith("param.")) + sorted(k for k in seen if k.startswith("info."))
    metrics = sorted(k for k in seen if k.startswith("metric."))
    cut = max(0, len(params) - MAX_PARAM_COLUMNS) + max(0, len(metrics) - MAX_METRIC_COLUMNS)
    return RunsView(rows, params[:MAX_PARAM_COLUMNS], metrics[:MAX_METRIC_COLUMNS], total, len(entries), page, pages,
                    serial, error, cut)
