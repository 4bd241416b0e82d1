"""A comparison of runs: parameters, metrics and info side by side, outputs that are identical, code and
environment differences against the first run, and where their logged calls diverge.

Parameters (``r.flat_params()``) and info scalars are what runs were given;
*outputs* are what they produced: logged metrics (compared by the digest of
their steps and values that ``metric_summary()`` carries: equal digests, the
same points; a summary without one, from an older casmon, is never called
identical), info values that are not scalars (lists, arrays, stored values: by
digest or fingerprint) and the console output. Only outputs are grouped as identical, so a hyperparameter that every
run shares is never reported as one. Nothing is unpickled: stored values are
described, arrays read as data.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from casmon.view import display
from casmon.view.text import size
from casmon.calllog import NOT_RECORDED, Call, CallLog
from casmon.keys.fingerprint import fingerprint
from casmon.store.peek import Described, as_digest, describe
from casmon.runs import RunInfo, diff
from casmon.ui.model import is_number, is_scalar
from casmon.ui.series import flat_info, sequence_of

#: A tracked file larger than this is compared by size and digest only, not line by line.
TEXT_DIFF_MAX = 512 << 10
#: Sparklines of stored arrays are read up to this many per page (each a read of the array).
SPARK_READS = 200


@dataclass
class Row:
    """One key across runs: a cell per run (None where a run lacks it), whether they differ, sparkline data."""

    key: str
    cells: list[Any]
    differs: bool
    sparks: list[list[float] | None] = field(default_factory=list)


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
    tails: list[str]
    params: list[Row]  # flat parameters, sorted
    info: list[Row]  # the info, flattened (``cfg.lr``), sorted; scalars, lists and stored values
    metrics: list[Row]  # logged metrics: a summary dict per run (``metric_summary()``), sorted
    diffs: list[tuple[RunInfo, Any, str | None]]  # (other run, casmon.diff(ref, other) or None, why not)
    file_diffs: list[tuple[str, str, str, str]]  # (other run, path, kind, text diff or why none)
    groups: list[tuple[str, list[list[str]]]]  # (which output, groups of run names with identical values)
    divergences: list[Divergence]
    errors: list[str] = field(default_factory=list)

    @property
    def differing(self) -> int:
        return sum(1 for r in self.params + self.info + self.metrics if r.differs)

    @property
    def shown(self) -> int:
        return len(self.params) + len(self.info) + len(self.metrics)


_MISSING = object()


def _cell_key(v: Any) -> str:
    """What a value is, by content: a stored value by its digest, JSON by its fingerprint."""
    if isinstance(v, dict) and set(v) == {"$"}:
        return f"${v['$']}"
    try:
        return fingerprint(v).hex()
    except Exception:  # noqa: BLE001 - something JSON could not make; compare its text
        return json.dumps(v, sort_keys=True, default=str)


def _hexlike(h: Any) -> bool:
    return type(h) is str and len(h) == 32 and all(c in "0123456789abcdef" for c in h)


def _rows(runs: list[RunInfo], values: list[dict[str, Any]], store: Any, trust: bool, what: str) -> list[Row]:
    """A row per key of ``values`` (one dict per run), sorted; stored values described, sequences sparklined."""
    keys = sorted({k for v in values for k in v})
    out, reads = [], 0
    for k in keys:
        raw = [v.get(k, _MISSING) for v in values]
        cells: list[Any] = []
        sparks: list[list[float] | None] = []
        for r, v in zip(runs, raw):
            spark = None
            if v is _MISSING:
                cells.append(None)
            elif isinstance(v, dict) and set(v) == {"$"}:
                cells.append(Described(as_digest(v["$"], f"run {r.name}: {what} {k}") if _hexlike(v["$"]) else None,
                                       display.described(lambda v=v: describe(store, v["$"], 80))))
                if reads < SPARK_READS:
                    reads += 1
                    spark = sequence_of(store, v, trust)
            else:
                cells.append(v)
            sparks.append(spark)
        present = [_cell_key(v) for v in raw if v is not _MISSING]
        out.append(Row(k, cells, len(set(present)) > 1 or len(present) < len(raw), sparks))
    return out


def metric_digest(s: Any) -> str | None:
    """What a logged metric's points are, by content: the summary's digest of its steps and values (equal
    digests, equal points); None for a summary without one (a run logged before casmon kept it), which is
    then never called identical to anything."""
    d = s.get("digest") if isinstance(s, dict) else None
    return d if type(d) is str and d else None


def _metric_shown(s: dict[str, Any]) -> str:
    """A metric's row as the table shows it (points, last value, range, last step), and its digest."""
    return json.dumps([s.get(k) for k in ("n", "last", "min", "max", "step", "digest")])


def compare(runs: list[RunInfo], tails: list[str] | None = None, log: CallLog | None = None,
            trust: bool = False) -> Comparison:
    """Everything the compare page shows; the first run is the reference the others are diffed against."""
    store = runs[0].store
    tails = tails or [r.name for r in runs]
    params = _rows(runs, [_flat_params(r) for r in runs], store, trust, "param")
    info = _rows(runs, [flat_info(r) for r in runs], store, trust, "info")
    summaries = [r.metric_summary() for r in runs]
    metrics = []
    for k in sorted({k for s in summaries for k in s}):
        cells = [s.get(k) for s in summaries]
        present = [_metric_shown(c) for c in cells if c is not None]
        metrics.append(Row(k, cells, len(set(present)) > 1 or len(present) < len(cells)))
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
    groups = identical_groups(runs, summaries)
    divergences = []
    if log is not None and len([r for r in runs if (r.manifest.get("links") or {}).get("call_sessions")]) >= 2:
        for other in runs[1:]:
            dv, why = display.attempt(lambda other=other: divergence(log, ref, other))
            if why:
                errors.append(f"calls of {other.name}: {why}")
            else:
                divergences.append(dv)
    return Comparison(runs, tails, params, info, metrics, diffs, file_diffs, groups, divergences, errors)


def _flat_params(r: RunInfo) -> dict[str, Any]:
    """The run's parameters as stored (``{"$": digest}`` for a stored value), flattened."""
    from casmon.runs import flatten

    p = r.manifest.get("params")
    return flatten(p) if isinstance(p, dict) else {}


def identical_groups(runs: list[RunInfo], summaries: list[dict[str, Any]] | None = None
                     ) -> list[tuple[str, list[list[str]]]]:
    """Runs that produced the same outputs (module docstring): all outputs together, each one, the console output.

    Only groupings that say something are kept: at least two runs alike."""
    summaries = summaries if summaries is not None else [r.metric_summary() for r in runs]

    def group(keyed: list[tuple[str, str | None]]) -> list[list[str]]:
        by: dict[str, list[str]] = defaultdict(list)
        for name, k in keyed:
            if k is not None:
                by[k].append(name)
        return [g for g in by.values() if len(g) >= 2]

    outputs: list[dict[str, str | None]] = []
    for r, s in zip(runs, summaries):
        o: dict[str, str | None] = {f"metric {k}": metric_digest(v) for k, v in s.items()}
        o.update({f"info {k}": _cell_key(v) for k, v in flat_info(r).items() if not is_scalar(v)})
        if type(r.manifest.get("output")) is str:
            o["console output"] = str(r.manifest["output"])
        outputs.append(o)
    out = []
    # All outputs alike: every one of them known by content (a metric without a digest leaves its run out).
    everything = group([(r.name, fingerprint(sorted(o.items())).hex() if o and None not in o.values() else None)
                        for r, o in zip(runs, outputs)])
    if everything:
        out.append(("all outputs", everything))
    for k in sorted({k for o in outputs for k in o}):
        g = group([(r.name, o.get(k)) for r, o in zip(runs, outputs)])
        if g:
            out.append((k, g))
    return out


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


def _without_sessions(r: RunInfo) -> RunInfo:
    """The run without its call-log links, for :func:`casmon.diff`: it would read the whole call log for each
    pair (minutes on a million calls) and pair calls over whole sessions, which runs of one process share;
    the divergence section pairs each run's own calls, from one reading of the log."""
    links = r.manifest.get("links")
    if not isinstance(links, dict) or not links.get("call_sessions"):
        return r
    return dataclasses.replace(r, manifest={**r.manifest, "links": {**links, "call_sessions": []}})


