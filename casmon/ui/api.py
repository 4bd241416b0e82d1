"""The UI's JSON endpoints: what the pages' script polls while runs go on, and the points charts draw.

``/api/runs?since=S``   the runs that changed after the index's change counter ``S`` (every run with ``S=0``),
                        and every live one (its elapsed time moves); ``serial`` is the counter to ask with next
``/api/run/NAME``       one run: status, elapsed, heartbeat, latest metric values, the tail of its output, the
                        traceback once it failed
``/api/metric?run=A&run=B&name=loss&n=2000``   a metric of runs, downsampled to a min/max envelope
``/api/run/NAME/metrics?name=A&name=B&n=2000``  one run's metrics grouped for the dashboard (``train``, ``val``,
                        ..., the ungrouped, ``sys``), and the series of those named, downsampled

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


def metric_points(index: RunIndex, entries: list[Entry], name: str, n: int) -> dict[str, Any]:
    """The metric ``name`` of each run that logged it, downsampled; runs without it are named in ``missing``."""
    out, missing = [], []
    n = min(n, max(MIN_POINTS, CHART_POINTS // max(1, len(entries))))  # 100 runs on a chart: 400 buckets each
    for e in entries:
        r = index.run(e)
        try:
            if e.status in LIVE_STATUSES or e.digest is None:
                s = metric_json(e.tail, name, r.metric(name), n)
            else:  # an ended run's series never change: downsampled once
                s = index.kept(("metric", e.ref, e.digest, name, n), lambda: metric_json(e.tail, name, r.metric(name), n))
        except LookupError:
            missing.append(e.tail)
            continue
        except CasmonError as err:
            missing.append(e.tail)
            out.append({"run": e.tail, "name": name, "error": str(err), "n": 0, "step": [], "time": [], "value": []})
            continue
        out.append(s)
    return {"name": name, "series": out, "missing": missing}


def run_metrics(index: RunIndex, e: Entry, names: list[str], n: int) -> dict[str, Any]:
    """One run's metrics for its dashboard: ``groups`` (every metric it logged, grouped by prefix) and ``series``,
    each named metric downsampled to at most ``n`` buckets. A name the run has not logged is a LookupError (404),
    naming it: a dashboard only asks for what the run's summary lists."""
    r = index.run(e)
    summary = r.metric_summary()
    live = e.status in LIVE_STATUSES or e.digest is None  # a live run's series grow: read each time
    wanted = list(dict.fromkeys(names))
    # The run's points are a record per flush (a long sampled run: thousands): read them once for all the names
    # not kept yet, not once per name.
    read = read_together(r, [m for m in wanted if live or not index.is_kept(("metric", e.ref, e.digest, m, n))],
                         summary)
    series: dict[str, Any] = {}
    for name in wanted:
        try:
            if live:
                series[name] = metric_json(e.tail, name, _series(r, read, name), n)
            else:  # an ended run's series never change: downsampled once
                series[name] = index.kept(("metric", e.ref, e.digest, name, n), _downsampled(e.tail, r, read, name, n))
        except CasmonError as err:  # one damaged series: its panel says so, the others draw
            series[name] = {"run": e.tail, "name": name, "error": str(err), "n": 0, "step": [], "time": [], "value": []}
    return {"run": e.tail, "name": r.name, "status": r.status, "groups": metric_groups(list(summary)),
            "series": series}


def _series(r: RunInfo, read: dict[str, Any], name: str) -> Any:
    got = read.get(name)
    return got if got is not None else r.metric(name)  # not read together: r.metric reads it or says why not


def _downsampled(tail: str, r: RunInfo, read: dict[str, Any], name: str, n: int) -> Any:
    """What computes one metric's chart series when the index has not kept it."""
    return lambda: metric_json(tail, name, _series(r, read, name), n)
