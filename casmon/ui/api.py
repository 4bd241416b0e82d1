"""The UI's JSON endpoints: what the pages' script polls while runs go on, and the points charts draw.

``/api/runs?since=S``   the runs that changed after the index's change counter ``S`` (every run with ``S=0``),
                        and every live one (its elapsed time moves); ``serial`` is the counter to ask with next
``/api/run/NAME``       one run: status, elapsed, heartbeat, latest metric values, the tail of its output, the
                        traceback once it failed
``/api/metric?run=A&run=B&name=loss&n=2000``   a metric of runs, downsampled to a min/max envelope
``/api/run/NAME/metrics?name=A&name=B&n=2000``  one run's metrics grouped for the dashboard (``train``, ``val``,
                        ..., the ungrouped, ``sys``), and the series of those named, downsampled (``enc=f64``:
                        packed; ``from=S&to=S``: the steps in view of a zoomed chart)
``/api/runs/metrics?run=A&run=B&name=A``  the same for several runs (a compare page's)

Polling, not server-sent events: the server is the standard library's
threading HTTP server, where an event stream holds a thread (and the index's
"a request is being answered" gate, which the background loader waits on) for
as long as a tab stays open; a poll every two seconds costs one
revalidation of the index, which the runs' refs make cheap, and stops when
no run on the page is live. A report file has no server at all.
"""

from __future__ import annotations

from typing import Any

from casmon.errors import CasmonError
from casmon.runs import RunInfo
from casmon.ui.model import LIVE_STATUSES, Entry, RunIndex
from casmon.ui.series import metric_groups, metric_json, read_together
from casmon.ui.table import cell_texts, row_of
from casmon.ui.values import console_text, fmt, status_text
from casmon.view.display import seconds

#: Runs one answer of ``/api/runs`` carries at most (the newest changes first); ``more`` says there were more.
MAX_RUNS = 500
#: Characters of a live run's output its page shows (and polls).
OUTPUT_TAIL = 4000
#: The end of a traceback a run's page shows (the frames nearest the error).
TRACEBACK_CHARS = 20_000


def _num_text(v: Any) -> str:
    if type(v) is int:
        return f"{v:,}"
    return fmt(v) if type(v) is float else ("-" if v is None else str(v))


def summary_json(r: RunInfo) -> dict[str, dict[str, Any]]:
    """``metric_summary()`` with each field also as the text a table shows (``last_text``, ...)."""
    out = {}
    for name, s in r.metric_summary().items():
        out[name] = {**s, **{f"{k}_text": _num_text(s.get(k)) for k in ("last", "step", "n", "min", "max")}}
    return out


def run_row(e: Entry, r: RunInfo, row: dict[str, Any], since: int = 0) -> dict[str, Any]:
    """One run as ``/api/runs`` lists it: ``cells``, its row of the runs table as text (info values and all)."""
    signal = r.manifest.get("signal")
    return {"tail": e.tail, "name": r.name, "status": r.status, "status_text": status_text(r.status, signal),
            "signal": signal if type(signal) is str else None, "elapsed": r.elapsed,
            "elapsed_text": seconds(r.elapsed) if r.elapsed is not None else "-", "heartbeat": r.heartbeat,
            "metrics": summary_json(r), "cells": cell_texts(row), "new": e.born > since}


def runs_since(index: RunIndex, since: int) -> dict[str, Any]:
    entries = index.entries()
    serial = entries.changes
    changed = [e for e in entries if e.serial > since or e.status in LIVE_STATUSES]
    changed.sort(key=lambda e: e.serial, reverse=True)
    return {"serial": serial, "runs": [run_row(e, *index.row(e, row_of), since) for e in changed[:MAX_RUNS]],
            "more": len(changed) > MAX_RUNS}


def run_state(index: RunIndex, e: Entry) -> dict[str, Any]:
    """One run for its page: the row, start and end, the traceback of a run that failed, the output's tail as a
    terminal shows it (a progress bar's last state; the line being written included)."""
    r, row = index.row(e, row_of)
    m = r.manifest
    try:
        tail = console_text(r.output_tail(OUTPUT_TAIL))
    except CasmonError as err:
        tail = f"(the output cannot be read: {err})"
    tb = m.get("traceback")
    return {**run_row(e, r, row), "start": m.get("start"), "end": m.get("end"), "output_tail": tail,
            "error": m.get("error") if isinstance(m.get("error"), str) else None,
            "traceback": tb[-TRACEBACK_CHARS:] if isinstance(tb, str) and tb else None}


#: The points one chart of many runs carries in all (each run's buckets keep their min and max: spikes stay).
CHART_POINTS = 40_000
#: ... but never fewer than this a run.
MIN_POINTS = 200


def metric_points(index: RunIndex, entries: list[Entry], name: str, n: int, packed: bool = False,
                  steps: tuple[int, int] | None = None) -> dict[str, Any]:
    """The metric ``name`` of each run that logged it, downsampled; runs without it are named in ``missing``."""
    out, missing = [], []
    n = min(n, max(MIN_POINTS, CHART_POINTS // max(1, len(entries))))  # 100 runs on a chart: 400 buckets each
    for e in entries:
        r = index.run(e)
        try:
            s = _chart(index, e, r, {}, name, n, packed, steps)
        except LookupError:
            missing.append(e.tail)
            continue
        except CasmonError as err:
            missing.append(e.tail)
            out.append(_damaged(e.tail, name, err))
            continue
        out.append(s)
    return {"name": name, "series": out, "missing": missing}


def run_metrics(index: RunIndex, e: Entry, names: list[str], n: int, packed: bool = False,
                steps: tuple[int, int] | None = None, strict: bool = True) -> dict[str, Any]:
    """One run's metrics for its dashboard: ``groups`` (every metric it logged, grouped by prefix) and ``series``,
    each named metric downsampled to at most ``n`` buckets (of the points from ``steps[0]`` to ``steps[1]``
    only, for a zoomed chart). A name the run has not logged is a LookupError (404), naming it: a dashboard
    only asks for what the run's summary lists; not ``strict``, its series says so instead (a summary listing
    a metric whose points are gone)."""
    r = index.run(e)
    summary = r.metric_summary()
    wanted = list(dict.fromkeys(names))
    # The run's points are a record per flush (a long sampled run: thousands), or one once compacted: read once
    # for all the names not kept yet, not once per name.
    read = read_together(r, [m for m in wanted if not index.is_kept(_key(e, m, n, packed, steps))], summary)
    series: dict[str, Any] = {}
    for name in wanted:
        try:
            series[name] = _chart(index, e, r, read, name, n, packed, steps)
        except CasmonError as err:  # one damaged series: its panel says so, the others draw
            series[name] = _damaged(e.tail, name, err)
        except LookupError as err:
            if strict:
                raise
            series[name] = _damaged(e.tail, name, err)
    return {"run": e.tail, "name": r.name, "status": r.status, "groups": metric_groups(list(summary)),
            "series": series}


def runs_metrics(index: RunIndex, tails: list[str], names: list[str], n: int, packed: bool = False,
                 steps: tuple[int, int] | None = None) -> dict[str, Any]:
    """:func:`run_metrics` of several runs (a compare page's panels in one request, not one a run), each for the
    names of ``names`` it logged; a run not found (deleted since the page was made) is ``{"run", "error"}``,
    the others are answered."""
    out: list[dict[str, Any]] = []
    for tail in tails:
        try:
            e = index.find(tail)
        except LookupError as err:
            out.append({"run": tail, "error": str(err.args[0]) if err.args else str(err), "series": {}})
            continue
        logged = index.run(e).metric_summary()
        out.append(run_metrics(index, e, [m for m in names if m in logged], n, packed, steps, strict=False))
    return {"runs": out}


def _damaged(tail: str, name: str, err: Exception) -> dict[str, Any]:
    return {"run": tail, "name": name, "error": str(err), "n": 0, "step": [], "time": [], "value": []}


def _key(e: Entry, name: str, n: int, packed: bool, steps: tuple[int, int] | None) -> tuple[Any, ...]:
    """What an ended run's chart series is kept by: the run's manifest (its stamp: an ended run's points never
    change), the metric and how it was asked for; a live run's (no stamp yet, or still written) by nothing."""
    if e.status in LIVE_STATUSES or e.digest is None:
        return ("live",)  # never kept
    return ("metric", e.ref, e.digest, name, n, packed, steps)


def _chart(index: RunIndex, e: Entry, r: RunInfo, read: dict[str, Any], name: str, n: int, packed: bool,
           steps: tuple[int, int] | None) -> dict[str, Any]:
    """One metric of one run for a chart (:func:`metric_json`): read each time for a live run (its series grow),
    kept for an ended one; from ``read`` where it was read with others."""
    def make() -> dict[str, Any]:
        got = read.get(name)
        return metric_json(e.tail, name, got if got is not None else r.metric(name), n, packed, steps)

    key = _key(e, name, n, packed, steps)
    if key == ("live",) or steps is not None:  # a zoom's many ranges would push the whole views out
        return make()
    return index.kept(key, make)
