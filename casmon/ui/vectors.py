"""The runs table's sort and filter over the runs index's columns, with numpy: each column the terms and the
sort name made once for every run of a listing (the index's columns gathered; a run they do not hold, from its
row), then each term a mask and the sort an argsort. The filter language's meaning is :mod:`casmon.ui.table`'s,
term for term; a term that cannot be applied falls back to the row path, which says what is wrong."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np

from casmon.ui import table as tb
from casmon.ui.model import LIVE_STATUSES, Entry, RunIndex

_CMP: dict[str, Callable[[Any, Any], Any]] = {
    "=": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


class _GiveUp(Exception):
    """A cell or a term this path does not evaluate: the row path does."""


class Cells:
    """One column over every run of a listing: ``kind`` (-1 no cell, 0 float, 1 int, 2 yes/no, 3 text, 4
    empty), ``num`` (numbers, yes/no as 0/1) and ``text`` (an object array, "" where not text)."""

    def __init__(self, n: int) -> None:
        self.kind = np.full(n, -1, "i1")
        self.num = np.zeros(n, "<f8")
        self.text = np.full(n, "", object)

    def put(self, i: int, v: Any) -> None:
        """Run ``i``'s cell is ``v`` (a value as its row holds it)."""
        if v is None:
            self.kind[i] = 4
        elif type(v) is bool:
            self.kind[i], self.num[i] = 2, float(v)
        elif type(v) is int:
            try:
                self.kind[i], self.num[i] = 1, float(v)
            except OverflowError:
                raise _GiveUp from None
        elif type(v) is float:
            self.kind[i], self.num[i] = 0, v
        elif type(v) is str:
            self.kind[i], self.text[i] = 3, v
        else:
            raise _GiveUp


class Frame:
    """Where each run of a listing is in the runs index's column files: ``src`` (the file's position in
    ``files``, -1 for a run they do not hold) and ``row``."""

    def __init__(self, index: RunIndex, entries: list[Entry]) -> None:
        self.entries = entries
        n = len(entries)
        self.files: list[Any] = []
        ids: dict[int, int] = {}
        src, row = np.full(n, -1, "<i8"), np.zeros(n, "<i8")
        for j, e in enumerate(entries):
            ie = None if e.status in LIVE_STATUSES else index.indexed(e)
            if ie is not None and type(ie[4]) is tuple:
                cols, i = ie[4]
                k = ids.get(id(cols))
                if k is None:
                    k = ids[id(cols)] = len(self.files)
                    self.files.append(cols)
                src[j], row[j] = k, i
        self.src, self.row = src, row
        self.columns: dict[str, Cells] = {}


def frame(index: RunIndex, entries: list[Entry]) -> Frame:
    """The listing's frame, kept while the listing stands."""
    key = ("frame", getattr(entries, "serial", None))
    got = index.cells.get(key)
    if got is None or got[0].entries is not entries:
        got = [Frame(index, entries)]
        if key[1] is not None:
            index.cells[key] = got
    return got[0]


def column(index: RunIndex, f: Frame, col: str) -> Cells:
    """Column ``col`` of every run of frame ``f`` as the runs' rows hold it."""
    got = f.columns.get(col)
    if got is not None:
        return got
    n = len(f.entries)
    c = Cells(n)
    ask = np.zeros(n, bool)
    if col == "run":
        for i, e in enumerate(f.entries):
            c.put(i, e.name)
    elif col in ("start", "status"):
        ask = f.src < 0
        for i, e in enumerate(f.entries):
            if f.src[i] >= 0:
                c.put(i, e.start if col == "start" else e.status)
    else:
        ask = f.src < 0
        for k, cols in enumerate(f.files):
            at = np.flatnonzero(f.src == k)
            rows = f.row[at]
            if col.startswith("metric."):
                vals, present = cols.metric(col[len("metric."):])
                hit = present[rows]
                c.kind[at[hit]], c.num[at[hit]] = 0, vals[rows][hit]
            else:
                kind, num, code = cols.dense(col)
                kd = kind[rows]
                c.kind[at], c.num[at] = np.maximum(kd, -1), num[rows]
                t = kd == 3
                if t.any():
                    c.text[at[t]] = np.array(cols.texts, object)[code[rows][t]]
                ask[at[kd == -2]] = True
    for i in np.flatnonzero(ask).tolist():
        row = index.row(f.entries[i], tb.row_of)[1]
        c.kind[i] = -1
        if col in row:
            c.put(i, row[col])
    f.columns[col] = c
    return c


def _kind(c: Cells) -> str:
    """:func:`casmon.ui.table._kind` of the column's non-empty cells."""
    finite = np.isfinite(c.num)
    kinds = set()
    if (c.kind == 2).any():
        kinds.add("bool")
    if (((c.kind == 0) | (c.kind == 1)) & finite).any():
        kinds.add("number")
    if (((c.kind == 0) & ~finite) | ((c.kind == 3) & (c.text != ""))).any():
        kinds.add("text")
    return kinds.pop() if len(kinds) == 1 else "mixed" if kinds else "none"


def _mask(t: tb.Term, c: Cells) -> Any:
    """Term ``t`` (resolved) of every run, as :func:`casmon.ui.table._compile` tests a row."""
    col, op, value = t.column, t.op, t.value
    kind = _kind(c)
    isnum = ((c.kind == 0) | (c.kind == 1)) & np.isfinite(c.num)
    if col == "start":
        lo, hi = tb._as_time(t)
        v = c.num
        if hi <= lo:
            return isnum & _CMP[op](v, lo)
        span = {"=": (v >= lo) & (v < hi), "!=": ~((v >= lo) & (v < hi)), "<": v < lo, "<=": v < hi, ">": v >= hi,
                ">=": v >= lo}[op]
        return isnum & span
    if col in tb.FIXED_COLUMNS and col not in ("run", "status"):
        raise _GiveUp
    if kind == "bool":
        want = tb.BOOL_WORDS.get(value.lower())
        if op not in ("=", "!=") or want is None:
            raise _GiveUp
        return (c.kind == 2) & ((c.num == float(want)) == (op == "="))
    if col == "status" and op in ("=", "!=") and value not in tb.STATUSES and not (c.text == value).any():
        raise _GiveUp
    num = tb._as_number(value)
    if kind == "number" or kind == "mixed" and num is not None:
        if num is None:
            raise _GiveUp
        return isnum & _CMP[op](c.num, num)
    if kind == "mixed" and op not in ("=", "!="):
        raise _GiveUp
    return (c.kind == 3) & np.asarray(_CMP[op](c.text, value), bool)


def _tags(index: RunIndex, f: Frame, tag: str, edits: dict[str, Any]) -> Any:
    """Which runs are tagged ``tag`` now (each's manifest's tags with every edit applied)."""
    from casmon.runs import tags as run_tags

    out = np.zeros(len(f.entries), bool)
    for k, cols in enumerate(f.files):
        at = np.flatnonzero(f.src == k)
        out[at] = cols.tagged(tag)[f.row[at]]
    ask = f.src < 0
    for k, cols in enumerate(f.files):
        from casmon.runs.index import FLAT_ROW

        at = np.flatnonzero(f.src == k)
        ask[at[(cols.a["flag"][f.row[at]] & FLAT_ROW).astype(bool)]] = True
    if edits:
        ask |= np.fromiter((e.ref in edits for e in f.entries), bool, len(f.entries))
    for i in np.flatnonzero(ask).tolist():
        e = f.entries[i]
        out[i] = tag in run_tags.merged(index.run(e).manifest, edits.get(e.ref, []))[0]
    return out


def order(index: RunIndex, f: Frame, picked: Any, sort: str, desc: bool) -> list[Entry]:
    """The runs at positions ``picked`` in the table's order by column ``sort`` (:func:`casmon.ui.table._order`)."""
    es = f.entries
    if sort == "run":
        sub = [es[i] for i in picked.tolist()]
        return [sub[i] for i in tb._order(sub, None, sort, desc)]
    c = column(index, f, sort)
    kind, num, text = c.kind[picked], c.num[picked], c.text[picked]
    number = (kind == 0) | (kind == 1) | (kind == 2)
    nan = number & np.isnan(num)
    number &= ~nan
    words = (kind == 3) & (text != "")
    empty = ~(number | nan | words)
    nums = picked[number][np.argsort(-num[number] if desc else num[number], kind="stable")]
    wi = picked[words].tolist()
    lows = [str(x).lower() for x in text[words].tolist()]
    by = sorted(range(len(wi)), key=lows.__getitem__, reverse=desc)
    texts = [wi[j] for j in by]
    head = texts + nums.tolist() if desc else nums.tolist() + texts
    return [es[i] for i in head + picked[nan].tolist() + picked[empty].tolist()]


def view(index: RunIndex, entries: list[Entry], query: tb.Expr | None, sort: str, desc: bool,
         tagged: bool) -> list[Entry] | None:
    """The runs that pass ``query`` in the table's order by ``sort``; None where the row path must say (a word,
    a column the columns do not hold, a term that cannot be applied: its error is the row path's)."""
    terms = tb.leaves(query) if query is not None else []
    if any(t.word for t in terms):
        return None
    names = [tb.ALIASES.get(t.column, t.column) for t in terms if t.op != ":"] + [sort]
    if any(n in tb.FIXED_COLUMNS and n not in tb._LISTED for n in names):
        return None
    try:
        f = frame(index, entries)
        wanted: list[str] = []
        for name in names[:-1]:
            wanted += [name] if name in tb.FIXED_COLUMNS or tb.is_column(name) else [p + name for p, _ in tb.GROUPS]
        cells = {c: column(index, f, c) for c in dict.fromkeys(wanted)}
        known = {c for c, x in cells.items() if (x.kind != -1).any()}
        plain = [t for t in terms if t.op != ":"]
        try:
            resolved = dict(zip(map(id, plain), tb.resolve(plain, known)))
        except tb.AmbiguousColumn:
            raise
        except tb.FilterError:
            return None
        edits = None
        if tagged:
            from casmon.runs import tags as run_tags

            edits = run_tags.edits_by_run(index.store)

        def mask(x: Any) -> Any:
            if isinstance(x, tb.Expr):
                parts = [mask(i) for i in x.items]
                if not parts:
                    return np.ones(len(entries), bool)
                out = parts[0]
                for p in parts[1:]:
                    out = out | p if x.op == "or" else out & p
                return out
            if x.op == ":":
                found = _tags(index, f, x.value, edits or {})
                return ~found if x.negated else found
            r = resolved[id(x)]
            return _mask(r, column(index, f, r.column))

        picked = np.flatnonzero(mask(query)) if query is not None and terms else np.arange(len(entries))
        return order(index, f, picked, sort, desc)
    except tb.AmbiguousColumn:
        raise
    except (_GiveUp, tb.FilterError):
        return None
