"""What the UI's pages show, read from one store: a lazy index of runs, a comparison of runs, call statistics.

Nothing here renders HTML (``pages.py`` does) and nothing unpickles: run
manifests, patches, tracked files and package lists load through
:func:`casmon.store.peek.load_data`; stored values are described from their
manifests, and only arrays (which load without running code) are read, for
charts. A value is loaded by unpickling only on a store opened with ``--trust``.

The runs index is built for big stores. Listing 10,000 refs and loading 10,000
run manifests takes seconds, so the list of runs comes from the ``run`` record
table (one read: each run's name, status, first write -- its start -- and its
newest manifest digest) plus one listing of ``refs/runs``, refreshed in the
background; a page loads only the manifests it shows. Manifests are immutable
(named by digest), so once loaded they are kept. Sorting or filtering by a
column that only manifests hold waits for the rest to load (a background
thread starts on them when the server starts).
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
import json
import math
import operator
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from casmon.view import display
from casmon.view.text import short_repr, size
from casmon.store import serialize
from casmon.calllog import NOT_RECORDED, Call, CallLog
from casmon.errors import CasmonError, MissingObjectError
from casmon.keys.fingerprint import fingerprint
from casmon.store.peek import Described, as_digest, describe, load_data, peek
from casmon.runs import KIND_RUN, RUN_REFS, RunInfo, check_run_manifest, diff

#: A request re-lists the runs (in the background; it is served the last listing) when it is older than this.
REFRESH_SECONDS = 5.0
#: A tracked file larger than this is compared by size and digest only, not line by line.
TEXT_DIFF_MAX = 512 << 10
#: Sequences (loss curves) longer than this are drawn from evenly spaced samples.
PLOT_POINTS = 1000
#: A stored array larger than this is not read for a chart.
SEQUENCE_MAX_BYTES = 64 << 20


def is_scalar(v: Any) -> bool:
    """A JSON scalar that fits a table column (not a list, dict or stored value)."""
    return v is None or type(v) in (str, int, float, bool)


def is_number(v: object) -> TypeGuard[float]:
    """A finite int or float (not a bool): what a chart or a numeric comparison can use."""
    return (type(v) is int or type(v) is float) and math.isfinite(v)


@dataclass
class Entry:
    """One run as the record table lists it: enough to sort by start and to find its manifest."""

    ref: str  # runs/3
    tail: str  # 3: the run's address in the UI (/run/3)
    name: str
    status: str
    start: float  # the run's first write (its manifest holds the exact start)
    digest: str | None  # the newest manifest; None for a run that only claimed its number


class Listing(list):
    """One listing of the runs; ``serial`` tells listings apart (an ``id()`` is reused once a list is freed)."""

    _serials = itertools.count(1)

    def __init__(self, entries: list[Entry]) -> None:
        super().__init__(entries)
        self.serial = next(Listing._serials)


def _number(tail: str) -> tuple:
    m = re.match(r"^(.*?)(\d+)$", tail)
    return (m.group(1), int(m.group(2))) if m else (tail, -1)


class RunIndex:
    """The runs of a store, listed cheaply and read lazily (see the module docstring)."""

    def __init__(self, store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._entries: Listing | None = None
        self._listed = 0.0
        self._refreshing = False
        self._first = threading.Lock()  # the first listing is made once, whoever asks first
        self._manifests: dict[str, tuple[dict, CasmonError | None]] = {}
        self._rows: dict[tuple[str, str | None], dict] = {}
        #: Sorted and filtered runs by (listing, sort, order, filter): the last 8.
        self.views: dict[tuple, list] = {}
        #: The background loader reads a manifest only while this says no request is being answered.
        self.idle: Callable[[], bool] = lambda: True
        self._stop = threading.Event()
        self._loader: threading.Thread | None = None

    # -- listing -------------------------------------------------------------------------------------
    def _list(self, with_refs: bool = True) -> Listing:
        """The runs from the run records, checked against a listing of ``refs/runs`` (``with_refs``: a run
        whose ref is gone is left out, and a run that only claimed its number is added). Without it (the
        first listing, which a page waits for: listing 10,000 refs takes longer than reading their records),
        every run a record names is listed; the full listing follows in the background."""
        names = {n[len(RUN_REFS) + 1:] for n in self.store.refs(RUN_REFS)} if with_refs else None  # runs/3 -> 3
        newest: dict[str, tuple[float, dict]] = {}
        first: dict[str, float] = {}
        for _key, r in self.store.records(KIND_RUN, strict=False):
            ref, t = r.get("_ref"), r.get("time")
            if (type(ref) is not str or not ref.startswith(RUN_REFS + "/") or not is_number(t)
                    or names is not None and ref[len(RUN_REFS) + 1:] not in names):
                continue  # a run whose ref is gone (or a record that is not a run's): not listed
            first[ref] = min(first.get(ref, t), t)
            if ref not in newest or t >= newest[ref][0]:
                newest[ref] = (t, r)
        out = []
        if names is None:
            names = {ref[len(RUN_REFS) + 1:] for ref in newest}
        for tail in names:
            ref = f"{RUN_REFS}/{tail}"
            if ref in newest:
                r = newest[ref][1]
                h = r.get("manifest")
                out.append(Entry(ref, tail, str(r.get("name") or tail), str(r.get("status") or "?"), first[ref],
                                 h if type(h) is str else None))
            else:  # claimed, never written (or written by a tool without records): its ref says what it is
                try:
                    got = self.store.get_ref(ref)
                except CasmonError:
                    got = None
                if got is None:
                    continue
                data = got.data if isinstance(got.data, dict) else {}
                t = data.get("start", data.get("time"))
                out.append(Entry(ref, tail, str(data.get("name") or tail), str(data.get("status") or "claimed"),
                                 t if is_number(t) else 0.0, got.target.hex() if got.target else None))
        out.sort(key=lambda e: (e.start, _number(e.tail)))
        return Listing(out)

    def entries(self) -> Listing:
        """Every run, oldest first. Served from memory; re-listed in the background when older than REFRESH_SECONDS."""
        with self._lock:
            entries, age = self._entries, time.time() - self._listed
            stale = entries is not None and age > REFRESH_SECONDS and not self._refreshing
            if stale:
                self._refreshing = True
        if entries is None:
            with self._first:
                if self._entries is None:
                    fresh = self._list(with_refs=False)
                    with self._lock:
                        self._entries, self._listed = fresh, time.time()
                return self._entries
        if stale:
            threading.Thread(target=self._refresh, name="casmon-ui-runs", daemon=True).start()
        return entries

    def _refresh(self) -> None:
        try:
            fresh = self._list()
            with self._lock:
                self._entries, self._listed = fresh, time.time()
        except Exception:  # noqa: BLE001 - the page keeps the last listing; the next request tries again
            pass
        finally:
            with self._lock:
                self._refreshing = False

    def reload(self) -> list[Entry]:
        fresh = self._list()
        with self._lock:
            self._entries, self._listed = fresh, time.time()
        return fresh

    def find(self, which: str) -> Entry:
        """A run by its address (``3``, ``exp3``), name (``3-base``) or ``latest``."""
        entries = self.entries()
        if which == "latest" and entries:
            return entries[-1]
        for e in entries:
            if which in (e.tail, e.name, e.ref):
                return e
        for e in self.reload():  # a run that started since the last listing
            if which in (e.tail, e.name, e.ref):
                return e
        raise LookupError(f"no run {which!r} in {self.store.url}")

    # -- manifests -----------------------------------------------------------------------------------
    def run(self, e: Entry) -> RunInfo:
        """The run as :func:`casmon.list_runs` gives it (an unreadable manifest is a run that says why)."""
        if e.digest is None:
            return RunInfo(self.store, e.ref, {"name": e.name, "status": e.status, "start": e.start or None})
        got = self._manifests.get(e.digest)
        if got is None:
            try:
                m = load_data(self.store, e.digest, f"run {e.ref}: its manifest", dict)
                check_run_manifest(m, f"run {e.ref} (manifest {e.digest})")
                got = (m, None)
            except CasmonError as err:
                got = ({"name": e.name, "status": "unreadable", "error": " ".join(str(err).split())[:500],
                        "start": e.start or None}, err)
                if isinstance(err, MissingObjectError):  # written a moment ago, perhaps: read again next time
                    return RunInfo(self.store, e.ref, got[0], got[1])
            self._manifests[e.digest] = got  # immutable: a digest names one manifest forever
        return RunInfo(self.store, e.ref, got[0], got[1])

    def row(self, e: Entry) -> tuple[RunInfo, dict]:
        """The run and its table row (kept: a row depends only on the entry and its immutable manifest)."""
        r = self.run(e)
        key = (e.ref, e.digest)
        row = self._rows.get(key)
        if row is None:
            row = row_of(r, e)
            if e.digest in self._manifests:  # kept only for what is kept (not a manifest missing for now)
                self._rows[key] = row
        return r, row

    def complete(self, entries: list[Entry]) -> bool:
        """Every manifest of ``entries`` read and kept (none missing for the moment)."""
        return all(e.digest is None or e.digest in self._manifests for e in entries)

    def load_all(self, polite: bool = False) -> None:
        """Read every manifest (for sorting and filtering by their fields), newest first.

        ``polite``: the background loader, which waits while requests are being answered (Python runs
        one thread at a time: a page must not wait for the loader)."""
        for e in reversed(self.entries()):
            if polite and not self._wait_idle():
                return
            self.row(e)

    def _wait_idle(self) -> bool:
        """Wait until no page is being made; False if the index is being stopped."""
        while not self.idle():
            if self._stop.wait(0.02):
                return False
        return not self._stop.is_set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background loader (before the store closes under it)."""
        self._stop.set()
        if self._loader is not None:
            self._loader.join(timeout)

    def start_loading(self) -> None:
        self._loader = threading.Thread(target=self._load_quietly, name="casmon-ui-index", daemon=True)
        self._loader.start()

    def _load_quietly(self) -> None:
        try:
            self.entries()
            if self._wait_idle():
                self.reload()  # the full listing (the first one skipped refs/runs)
                self.load_all(polite=True)
        except Exception:  # noqa: BLE001 - a request that needs them loads them and reports the error
            pass


# -- the runs table ----------------------------------------------------------------------------------

FIXED_COLUMNS = ["run", "comment", "status", "start", "duration", "commit", "dirty"]
_FILTER_RE = re.compile(r"^([A-Za-z_][\w.\-]*)(<=|>=|!=|=|<|>)(.+)$")


def row_of(r: RunInfo, e: Entry) -> dict[str, Any]:
    """A run's cells by column: the fixed columns, then ``info.KEY`` for each scalar in its info."""
    m = r.manifest
    git = m.get("git")
    g: dict[str, Any] = git if isinstance(git, dict) else {}
    d = m.get("duration")
    if d is None and is_number(m.get("start")) and is_number(m.get("end")):
        d = m["end"] - m["start"]
    row: dict[str, Any] = {"run": e.name, "comment": m.get("comment") or "", "status": m.get("status", e.status),
                           "start": m.get("start", e.start), "duration": d, "commit": g.get("commit") or "",
                           "dirty": bool(g.get("dirty") or g.get("patch")) if g else None}
    info = m.get("info")
    if isinstance(info, dict):
        for k, v in info.items():
            if is_scalar(v):
                row[f"info.{k}"] = v
    return row


def sort_key(v: Any) -> tuple:
    """Numbers, then text, then empty cells (mixed types sort without errors)."""
    if type(v) is bool:
        return (0, float(v), "")
    if is_number(v):
        return (0, float(v), "")
    if v is None or v == "":
        return (2, 0.0, "")
    return (1, 0.0, str(v).lower())


def parse_filter(q: str) -> list[tuple[str, ...]]:
    """``loss<0.3 status=ok base``: comparisons of a column (``loss`` is ``info.loss``) and words to find."""
    out: list[tuple[str, ...]] = []
    for tok in q.split():
        m = _FILTER_RE.match(tok)
        if m:
            out.append(("cmp", m.group(1), m.group(2), m.group(3)))
        else:
            out.append(("word", tok.lower()))
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


def matches(row: dict[str, Any], terms: list[tuple[str, ...]]) -> bool:
    text = None
    for t in terms:
        if t[0] == "word":
            if text is None:
                text = " ".join(str(v) for v in row.values() if v is not None).lower()
            if t[1] not in text:
                return False
            continue
        _, col, op, want = t
        v = row.get(col, row.get(f"info.{col}"))
        if v is None:
            return False
        num = _as_number(want) if is_number(v) and type(v) is not bool else None
        a: float | str = str(v) if num is None else float(v)
        b: float | str = want if num is None else num
        ok = _COMPARISONS[op](a, b)
        if not ok:
            return False
    return True


def _sorted_rows(index: RunIndex, entries: list[Entry], sort: str, desc: bool, terms: list) -> list:
    rows = [(e, *index.row(e)) for e in entries]
    if terms:
        rows = [x for x in rows if matches(x[2], terms)]
    col = sort if sort in FIXED_COLUMNS or sort.startswith("info.") else "start"
    if col == "run":
        rows.sort(key=lambda x: _number(x[0].tail), reverse=desc)
        return rows
    present = [x for x in rows if x[2].get(col) not in (None, "")]
    missing = [x for x in rows if x[2].get(col) in (None, "")]
    present.sort(key=lambda x: sort_key(x[2].get(col)), reverse=desc)
    return present + missing  # empty cells last, either way


@dataclass
class RunsView:
    rows: list[tuple[Entry, RunInfo, dict]]
    columns: list[str]  # info.KEY columns, in first-seen order
    total: int  # runs that match
    all_runs: int
    page: int
    pages: int


def runs_view(index: RunIndex, sort: str = "start", desc: bool = True, q: str = "", page: int = 1,
              per: int = 50) -> RunsView:
    """One page of the runs table. Only the default order (by start) avoids reading every manifest."""
    entries = index.entries()
    terms = parse_filter(q)
    if sort == "start" and not terms:
        chosen = list(reversed(entries)) if desc else list(entries)
        total = len(chosen)
        pages = max(1, math.ceil(total / per))
        page = min(max(page, 1), pages)
        shown = chosen[(page - 1) * per: page * per]
        rows = [(e, *index.row(e)) for e in shown]
    else:
        key = (entries.serial, sort, desc, q)
        cached = index.views.get(key)
        if cached is None:
            cached = _sorted_rows(index, entries, sort, desc, terms)
            if index.complete(entries):  # valid while this listing is: rows depend on it and immutable manifests
                index.views[key] = cached
                while len(index.views) > 8:
                    index.views.pop(next(iter(index.views)))
        rows = cached
        total = len(rows)
        pages = max(1, math.ceil(total / per))
        page = min(max(page, 1), pages)
        rows = rows[(page - 1) * per: page * per]
    columns: list[str] = []
    for _e, _r, row in rows:
        for k in row:
            if k.startswith("info.") and k not in columns and len(columns) < 24:
                columns.append(k)
    return RunsView(rows, columns, total, len(entries), page, pages)


# -- comparing runs --------------------------------------------------------------------------------------


@dataclass
class Sequence:
    """One run's curve for an info key: values (sampled to PLOT_POINTS) and the true length."""

    run: str
    ys: list[float]
    xs: list[float]
    length: int


@dataclass
class Divergence:
    """Where run ``b``'s logged calls first part from the reference run's."""

    a: str
    b: str
    compared: int  # calls paired by function and number
    first: tuple[int, Call, Call] | None  # (k, a's k-th call, b's): same inputs, different result; earliest in b
    first_inputs: tuple[int, Call, Call] | None  # the first pair whose inputs already differ
    note: str = ""


@dataclass
class Comparison:
    runs: list[RunInfo]
    keys: list[str]  # every info key, in first-seen order
    cells: dict[str, list[Any]]  # key -> one cell per run (JSON as is, stored values Described, missing None)
    differs: dict[str, bool]
    metrics: list[str]  # keys with a number in at least two runs: charted
    sequences: dict[str, list[Sequence]]
    diffs: list[tuple[RunInfo, Any, str | None]]  # (other run, casmon.diff(ref, other) or None, why not)
    file_diffs: list[tuple[str, str, str, str]]  # (other run, path, kind, text diff or why none)
    groups: list[tuple[str, list[list[str]]]]  # (what, groups of run names with identical digests)
    divergences: list[Divergence]
    errors: list[str] = field(default_factory=list)


def _cell_key(v: Any) -> str:
    """What a stored output is, by content: a stored value by its digest, JSON by its fingerprint."""
    if isinstance(v, dict) and set(v) == {"$"}:
        return f"${v['$']}"
    try:
        return fingerprint(v).hex()
    except Exception:  # noqa: BLE001 - something JSON could not make; compare its text
        return json.dumps(v, sort_keys=True, default=str)


def _sequence(store, v: Any, trust: bool) -> list[float] | None:
    """The numbers of a loss curve: a JSON list of numbers, or a stored 1-D numeric array (read without unpickling)."""
    if isinstance(v, list):
        if len(v) >= 2 and all(is_number(x) or type(x) is int for x in v) and not any(type(x) is bool for x in v):
            return [float(x) for x in v]
        return None
    if isinstance(v, dict) and set(v) == {"$"}:
        try:
            m = store.manifest(as_digest(v["$"], "run info"))
            if m.tag != "array" or len(m.meta.get("shape", ())) != 1 or m.nbytes > SEQUENCE_MAX_BYTES:
                return None
            arr = peek(store, v["$"], trust=trust)
        except CasmonError:
            return None
        import numpy as np

        if not isinstance(arr, np.ndarray) or arr.ndim != 1 or arr.dtype.kind not in "iuf" or arr.size < 2:
            return None
        return [float(x) for x in arr.astype(np.float64)]
    return None


def _sample(ys: list[float]) -> tuple[list[float], list[float]]:
    n = len(ys)
    if n <= PLOT_POINTS:
        return [float(i) for i in range(n)], ys
    step = (n - 1) / (PLOT_POINTS - 1)
    idx = [round(i * step) for i in range(PLOT_POINTS)]
    return [float(i) for i in idx], [ys[i] for i in idx]


def _text_diff(ra: RunInfo, rb: RunInfo, path: str) -> tuple[str, str]:
    """``(kind, text)``: a unified diff of a tracked text file, or why there is none."""
    fa, fb = ra.manifest["files"][path], rb.manifest["files"][path]
    if max(fa.get("size", 0), fb.get("size", 0)) > TEXT_DIFF_MAX:
        return "large", f"{size(fa.get('size'))} → {size(fb.get('size'))}"
    try:
        a, b = ra.file(path).decode("utf-8"), rb.file(path).decode("utf-8")
    except UnicodeDecodeError:
        return "binary", f"{size(fa.get('size'))} → {size(fb.get('size'))}, " \
                         f"digest {fa['digest'][:12]} → {fb['digest'][:12]}"
    return "text", "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True),
                                                f"{ra.name}/{path}", f"{rb.name}/{path}"))


def _same_call(a: Call, b: Call) -> bool:
    return (json.dumps([a.args_cells, a.kwargs_cells], sort_keys=True)
            == json.dumps([b.args_cells, b.kwargs_cells], sort_keys=True))


def _outcome(c: Call) -> str:
    return json.dumps(["raised", *c.exception] if c.exception else c.result_cell, sort_keys=True)


def _window(r: RunInfo) -> tuple[set[int], float, float]:
    m = r.manifest
    links = m.get("links") or {}
    sessions = {s for s in links.get("call_sessions", []) if type(s) is int}
    start, end = m.get("start"), m.get("end")
    return sessions, start if is_number(start) else -math.inf, end if is_number(end) else math.inf


def in_run(c: Call, r: RunInfo) -> bool:
    """Call ``c`` was made during run ``r``: in a session the run links, between its start and end."""
    sessions, t0, t1 = _window(r)
    return c.session in sessions and t0 <= c.start <= t1


def run_calls(fi: Any, r: RunInfo) -> list[Call]:
    """A function's calls made during run ``r``: in the sessions it links, between its start and end.

    One process is one call-log session, so several runs recorded in one
    process share a session; the run's time window tells their calls apart.
    """
    sessions, t0, t1 = _window(r)
    out = [c for s in sorted(sessions) for c in fi.sessions.get(s, []) if t0 <= c.start <= t1]
    out.sort(key=lambda c: (c.start, c.session, c.n))
    return out


def divergence(log: CallLog, ra: RunInfo, rb: RunInfo) -> Divergence:
    """Pair the runs' logged calls by function and number (the k-th call of a function in one run with the
    k-th in the other); the first pair with the same inputs and a different result (or exception) is where
    the runs diverge."""
    def linked(r: RunInfo) -> bool:
        return bool((r.manifest.get("links") or {}).get("call_sessions"))

    d = Divergence(ra.name, rb.name, 0, None, None)
    if not linked(ra) or not linked(rb):
        d.note = "no linked call log" if not (linked(ra) or linked(rb)) else \
            f"only {(ra if linked(ra) else rb).name} has a linked call log"
        return d
    for fi in log.functions.values():
        for k, (x, y) in enumerate(zip(run_calls(fi, ra), run_calls(fi, rb)), 1):
            d.compared += 1
            if not _same_call(x, y):
                if d.first_inputs is None or y.start < d.first_inputs[2].start:
                    d.first_inputs = (k, x, y)
                continue
            if NOT_RECORDED in (x.result_cell, y.result_cell) and not (x.exception or y.exception):
                continue
            if _outcome(x) != _outcome(y) and (d.first is None or y.start < d.first[2].start):
                d.first = (k, x, y)
    return d


def compare(runs: list[RunInfo], log: CallLog | None = None, trust: bool = False) -> Comparison:
    """Everything the compare page shows; the first run is the reference the others are diffed against."""
    store = runs[0].store
    keys: list[str] = []
    for r in runs:
        for k in (r.manifest.get("info") or {}):
            if k not in keys:
                keys.append(k)
    cells: dict[str, list[Any]] = {}
    differs: dict[str, bool] = {}
    metrics, sequences = [], {}
    for k in keys:
        raw = [(r.manifest.get("info") or {}).get(k, _MISSING) for r in runs]
        shown: list[Any] = []
        for r, v in zip(runs, raw):
            if v is _MISSING:
                shown.append(None)
            elif isinstance(v, dict) and set(v) == {"$"}:
                shown.append(Described(as_digest(v["$"], f"run {r.name}: info {k}") if _hexlike(v["$"]) else None,
                                       display.described(lambda v=v: describe(store, v["$"], 80))))
            else:
                shown.append(v)
        cells[k] = shown
        present = [_cell_key(v) for v in raw if v is not _MISSING]
        differs[k] = len(set(present)) > 1 or len(present) < len(raw)
        if sum(1 for v in raw if is_number(v) and type(v) is not bool) >= 2:
            metrics.append(k)
        seqs = []
        for r, v in zip(runs, raw):
            ys = _sequence(store, v, trust) if v is not _MISSING else None
            if ys is not None:
                xs, sampled = _sample(ys)
                seqs.append(Sequence(r.name, sampled, xs, len(ys)))
        if seqs:
            sequences[k] = seqs
    diffs, file_diffs, errors = [], [], []
    ref = runs[0]
    for other in runs[1:]:
        d, why = display.attempt(lambda other=other: diff(_without_sessions(ref), _without_sessions(other)))
        diffs.append((other, d, why))
        if d is None:
            continue
        for path in d["files"]["changed"]:
            (kind, text), why = display.attempt(lambda path=path: _text_diff(ref, other, path), ("error", ""))
            file_diffs.append((other.name, path, kind, text if why is None else why))
    groups = identical_groups(runs)
    divergences = []
    if log is not None and len([r for r in runs if (r.manifest.get("links") or {}).get("call_sessions")]) >= 2:
        for other in runs[1:]:
            dv, why = display.attempt(lambda other=other: divergence(log, ref, other))
            if why:
                errors.append(f"calls of {other.name}: {why}")
            else:
                divergences.append(dv)
    return Comparison(runs, keys, cells, differs, metrics, sequences, diffs, file_diffs, groups, divergences, errors)


_MISSING = object()


def _without_sessions(r: RunInfo) -> RunInfo:
    """The run without its call-log links, for :func:`casmon.diff`: it would read the whole call log for each
    pair (minutes on a million calls) and pair calls over whole sessions, which runs of one process share;
    the divergence section pairs each run's own calls, from one reading of the log."""
    links = r.manifest.get("links")
    if not isinstance(links, dict) or not links.get("call_sessions"):
        return r
    return dataclasses.replace(r, manifest={**r.manifest, "links": {**links, "call_sessions": []}})


def _hexlike(h: Any) -> bool:
    return type(h) is str and len(h) == 32 and all(c in "0123456789abcdef" for c in h)


def identical_groups(runs: list[RunInfo]) -> list[tuple[str, list[list[str]]]]:
    """Runs that produced the same outputs, by digest: all info together, each info key, the console output.

    Only groupings that say something are kept: at least two runs alike. Stored values count by
    digest (equal content, equal digest); JSON values by fingerprint.
    """
    def group(keyed: list[tuple[str, str | None]]) -> list[list[str]]:
        by: dict[str, list[str]] = defaultdict(list)
        for name, k in keyed:
            if k is not None:
                by[k].append(name)
        return [g for g in by.values() if len(g) >= 2]

    out = []
    infos = [(r.name, r.manifest.get("info") or {}) for r in runs]
    everything = group([(n, fingerprint(sorted((k, _cell_key(v)) for k, v in i.items())).hex() if i else None)
                        for n, i in infos])
    if everything:
        out.append(("all info values", everything))
    keys = []
    for _n, i in infos:
        keys += [k for k in i if k not in keys]
    for k in keys:
        g = group([(n, _cell_key(i[k]) if k in i else None) for n, i in infos])
        if g:
            out.append((f"info {k}", g))
    g = group([(r.name, r.manifest.get("output") if type(r.manifest.get("output")) is str else None) for r in runs])
    if g:
        out.append(("console output", g))
    return out


# -- calls -----------------------------------------------------------------------------------------------


@dataclass
class CallsSummary:
    """What the calls page shows of the whole log (computed once per reading of the log)."""

    functions: list[tuple[str, int, int, float]]  # (name, calls, sessions, total seconds)
    sessions: list[int]
    processes: list[int]
    ranks: list[int]


def calls_summary(log: CallLog) -> CallsSummary:
    functions, pids, ranks = [], set(), set()
    for name, fi in log.functions.items():
        n, total = 0, 0.0
        for calls in fi.sessions.values():
            n += len(calls)
            total += sum(c.duration for c in calls if is_number(c.duration))
            if calls:  # a session is one process (and one rank)
                pids.add(calls[0].pid)
                if calls[0].rank is not None:
                    ranks.add(calls[0].rank)
        functions.append((name, n, len(fi.sessions), total))
    sessions = sorted(set(log.sessions) | {s for fi in log.functions.values() for s in fi.sessions})
    return CallsSummary(functions, sessions, sorted(pids), sorted(ranks))


def histogram(durations: list[float], bins: int = 24) -> list[tuple[float, float, int]]:
    """Counts of durations in bins evenly spaced on a log scale: ``[(low, high, count)]``."""
    xs = [d for d in durations if is_number(d) and d >= 0]
    if not xs:
        return []
    lo, hi = max(min(xs), 1e-7), max(max(xs), 1e-7)
    if hi <= lo * 1.0001:
        return [(lo, hi, len(xs))]
    a, b = math.log10(lo), math.log10(hi)
    width = (b - a) / bins
    counts = [0] * bins
    for x in xs:
        i = int((math.log10(max(x, 1e-7)) - a) / width)
        counts[min(max(i, 0), bins - 1)] += 1
    return [(10 ** (a + i * width), 10 ** (a + (i + 1) * width), c) for i, c in enumerate(counts)]


def cell_details(log: CallLog, cell: Any, trust: bool) -> dict[str, Any]:
    """A logged value for the call page: kind, shape, dtype, size, digest, and a description (nothing unpickled
    unless ``trust``)."""
    out: dict[str, Any] = {"kind": "inline", "shape": "", "dtype": "", "size": None, "digest": "", "text": ""}
    if isinstance(cell, dict) and "$" in cell:
        h = cell["$"]
        out["digest"] = h if type(h) is str else ""
        try:
            m = log.store.manifest(as_digest(h, "a call record's value"))
            out["kind"], out["size"] = m.tag, m.nbytes
            if m.tag == "array":
                out["shape"] = str(tuple(m.meta.get("shape", ())))
                dt, _why = display.attempt(lambda: serialize.dtype_from_meta(m.meta["dtype"]), "?")
                out["dtype"] = str(dt)
        except CasmonError as e:
            out["kind"] = "unreadable"
            out["text"] = str(e)
            return out
        if trust and log.store.trust:
            v, why = display.attempt(lambda: peek(log.store, h, trust=True))
            out["text"] = why or short_repr(v, 400)
        else:
            out["text"] = describe(log.store, h, 400)
        return out
    out["text"] = log.describe_cell(cell, 400)
    if isinstance(cell, dict) and "!" in cell:
        out["kind"] = "not stored"
    elif cell == NOT_RECORDED:
        out["kind"] = "not recorded"
    return out


def call_inputs(log: CallLog, c: Call) -> list[tuple[str, Any]]:
    """A call's arguments by parameter name (defaults filled in), as cells: nothing is loaded."""
    bound = log.bind(c, list(c.args_cells), dict(c.kwargs_cells), load=lambda cell: cell)
    args = dict(vars(bound))
    out = []
    for name, v in args.items():
        if isinstance(v, tuple):  # *args
            out += [(f"{name}[{i}]", x) for i, x in enumerate(v)]
        elif isinstance(v, dict) and not ("$" in v or "!" in v) and name in {p[0] for p in log.functions[c.name].params
                                                                               if p[1] == "VAR_KEYWORD"}:
            out += [(f"{name}[{k!r}]", x) for k, x in v.items()]
        else:
            out.append((name, v))
    return out
