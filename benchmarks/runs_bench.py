"""Runs at scale (issue 46): ``list_runs`` with latest metrics at 10k/100k runs, and a day-long run's metrics
before and after compaction.

    python -m benchmarks.runs_bench --runs 10000,100000
    python -m benchmarks.runs_bench --only list,page --store 10000=PATH --store 100000=PATH --before DIR

``--store N=PATH`` uses a store built once by :mod:`benchmarks.runs_store` (kept; its ``runs-index/`` is
derived data the rows rebuild as they need). ``--before DIR`` (a ``git archive`` of other code) measures
that code too, alternating with this tree, on a hard-linked copy of each store (``PATH.before``) with its own
runs index, so the two index formats never meet.

* **list_runs** — a store of N ended runs from :mod:`benchmarks.runs_store` (5 metrics each); ``list_runs``
  plus every run's latest ``loss`` in a fresh process, without the runs index (every ref and manifest read,
  as before the index) and with it (after the first listing built it). Median of ``--repeat``.
* **runs page** — Chromium (Playwright, ``/usr/bin/chromium``) on a fresh ``casmon ui`` server over the
  N-run store (with ``--before``: that tree's too, in turn, ``--rounds`` times): first paint (the table's rows
  on screen), then a click on a column's head (``started``, ``param.lr``) and a filter with ``or``,
  parentheses and ``tag:`` typed and entered, each timed from the click or the Enter to the new rows on
  screen (swapped in place, or, in code without that, a navigation's), first time and again.
* **first page in process** — ``RunIndex`` + ``runs_view`` in a fresh process, CPU: the first page (default
  order), then a sort by a metric, by a parameter, and the filter ``status:ok and (param.lr>0.01 or
  tag:baseline)``, each on a fresh ``RunIndex`` (no row made before).
* **compare** — ``/compare`` of 100 runs with 5 metrics of 10,000 points each in Chromium, over a fresh server
  of this tree (and of ``--before TREE``, in turn): the page's load event, every chart drawn, the server's CPU;
  ``--ragged``: runs of different lengths (``--compare-store``: keep the store, built there once).
* **24-hour run** — 40,000 metric batches of one run (what a day of live flushes every ~2 s writes), as
  records; ``metric("loss")`` and the records count before and after :func:`compact_run`.
"""

from __future__ import annotations

import argparse
import base64
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

LIST = """
import sys, time, casmon
s = casmon.open(sys.argv[1], read_only=sys.argv[2] == "direct")
t, c = time.perf_counter(), time.process_time()
runs = casmon.list_runs(s)
latest = [r.metric_summary().get("loss", {}).get("last") for r in runs]
print(time.perf_counter() - t, time.process_time() - c)
assert all(v is not None for v in latest)
"""


PAGE = """
import sys, time, casmon
from casmon.ui import model, table
s = casmon.open(sys.argv[1], read_only=True)
out = []
for how in ({}, {"sort": "metric.loss"}, {"sort": "param.lr"},
            {"q": "status:ok and (param.lr>0.01 or tag:baseline)"}):
    idx = model.RunIndex(s)
    c = time.process_time()
    v = table.runs_view(idx, **how)
    out.append(time.process_time() - c)
    assert v.rows and not v.error, v.error
    idx.stop()
print(*out)
"""


def _list_time(path: str, how: str, repeat: int, code: str = "") -> tuple[float, float]:
    """Median wall and CPU seconds of a listing in a fresh process (CPU time: the machine may be shared);
    ``code``: the tree whose code runs (this one by default)."""
    env = dict(os.environ, PYTHONPATH=code or os.getcwd())
    ts, cs = [], []
    for _ in range(repeat):
        if how == "direct":
            shutil.rmtree(os.path.join(path, "runs-index"), ignore_errors=True)
        out = subprocess.run([sys.executable, "-c", LIST, path, how], env=env, capture_output=True, text=True,
                             check=True, cwd=code or None)  # python -c imports from its folder first
        wall, cpu = map(float, out.stdout.split())
        ts.append(wall)
        cs.append(cpu)
    return statistics.median(ts), statistics.median(cs)


def page_times(path: str, code: str = "") -> list[float]:
    """CPU seconds of the first page, a metric sort, a parameter sort and a filter, each on a fresh RunIndex."""
    env = dict(os.environ, PYTHONPATH=code or os.getcwd())
    out = subprocess.run([sys.executable, "-c", PAGE, path], env=env, capture_output=True, text=True, check=True,
                         cwd=code or None)
    return [float(x) for x in out.stdout.split()]


def alternating(path: str, n: int, before: str, repeat: int, only: set[str]) -> list[tuple[str, str]]:
    """The listing (and the first page) of this tree and of the code at ``before``, alternating, each on its
    own hard-linked copy of the store with its own runs index; medians."""
    other = path.rstrip("/") + ".before"
    if not os.path.isdir(other):
        subprocess.run(["cp", "-al", path, other], check=True)
        shutil.rmtree(os.path.join(other, "runs-index"), ignore_errors=True)
    for where, code in ((other, before), (path, "")):
        _list_time(where, "index", 2, code)  # builds (then settles) each tree's index
    got: dict[str, list[Any]] = {"before": [], "after": [], "page before": [], "page after": []}
    for _ in range(repeat):
        for label, where, code in (("before", other, before), ("after", path, "")):
            if "list" in only:
                got[label].append(_list_time(where, "index", 1, code))
            if "page" in only:
                got["page " + label].append(page_times(where, code))
    rows = []
    if "list" in only:
        b = [statistics.median(x[i] for x in got["before"]) for i in (0, 1)]
        a = [statistics.median(x[i] for x in got["after"]) for i in (0, 1)]
        rows.append((f"list_runs + latest metric, {n:,} runs, CPU: before / after",
                     f"{b[1]:.2f} s / {a[1]:.2f} s ({b[1] / a[1]:.1f}x)"))
        rows.append((f"the same, wall: before / after", f"{b[0]:.2f} s / {a[0]:.2f} s"))
    if "page" in only:
        for i, what in enumerate(("first page", "sort by metric.loss", "sort by param.lr",
                                  "filter status:ok and (param.lr>0.01 or tag:baseline)")):
            b1 = statistics.median(x[i] for x in got["page before"])
            a1 = statistics.median(x[i] for x in got["page after"])
            rows.append((f"runs page in process, {n:,} runs, {what}, CPU: before / after",
                         f"{b1 * 1e3:.0f} ms / {a1 * 1e3:.0f} ms ({b1 / a1:.1f}x)"))
    return rows


def day_run(root: str, batches: int = 40_000) -> list[tuple[str, str]]:
    import casmon
    from casmon.runs.compaction import compact_run
    from casmon.runs.metrics import KIND_METRICS, batch_summary, metrics_key

    s = casmon.open(os.path.join(root, "day"), create=True, autoflush=None)
    ref = "runs/1"
    key = metrics_key(ref)
    t0 = time.time() - 86400
    for seq in range(batches):
        steps = np.arange(seq * 5, seq * 5 + 5, dtype="<i8")
        cells = {}
        for m in ("loss", "acc"):
            vals = np.random.default_rng(seq).random(5)
            times = t0 + steps * 0.4
            data = steps.tobytes() + vals.tobytes() + times.tobytes()
            cells[m] = {"n": 5, "sum": batch_summary(steps, vals, times), "b64": base64.b64encode(data).decode()}
        s.append(KIND_METRICS, {"run": ref, "seq": seq, "s": cells}, key=key)
        if seq % 2000 == 1999:
            s.flush()
    s.flush()
    from casmon.runs.metrics import read_series

    def timed() -> float:
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            got = read_series(s, ref, "bench", ["loss"])["loss"]
            ts.append(time.perf_counter() - t)
        assert len(got) == batches * 5
        return statistics.median(ts)

    before = timed()
    n_before = len(s.lookup(KIND_METRICS, key))
    t = time.perf_counter()
    compact_run(s, ref)
    took = time.perf_counter() - t
    after = timed()
    n_after = len(s.lookup(KIND_METRICS, key))
    return [(f"24-hour run ({batches:,} batches): records", f"{n_before:,} -> {n_after}"),
            ("24-hour run: metric('loss') before / after compaction",
             f"{before * 1e3:.0f} ms / {after * 1e3:.1f} ms ({before / after:.0f}x)"),
            ("24-hour run: compaction at its end", f"{took:.1f} s")]


#: The runs table on screen, made since the last one was marked old (swapped in, or a page loaded anew).
NEW_ROWS = """() => { const t = document.getElementById('runs');
    return !!t && !t.hasAttribute('data-old') && !!t.querySelector('tbody tr[data-run] td.name'); }"""
#: In every document: when the last click or Enter happened (kept across a navigation, in sessionStorage), and
#: the frame at which the new table's rows were first there to paint (``casmonRowsAt``), both in Unix ms.
MARKS = """(() => {
  const fresh = """ + NEW_ROWS + """;
  const act = ev => { if (ev.type === 'click' || ev.key === 'Enter')
    sessionStorage.setItem('casmonActAt', String(performance.timeOrigin + ev.timeStamp)); };
  addEventListener('click', act, true);
  addEventListener('keydown', act, true);
  window.casmonRowsAt = null;
  const tick = ts => { if (window.casmonRowsAt === null && fresh()) window.casmonRowsAt = performance.timeOrigin + ts;
    requestAnimationFrame(tick); };
  requestAnimationFrame(tick);
})();"""
FILTER = "status:ok and (param.lr>0.01 or tag:baseline)"


def _until_new_rows(page: Any, act: Any) -> tuple[float, float]:
    """``act()`` (a click, an Enter) until the new table's rows are on screen, swapped in place or (code without
    that) the page navigated and the new one's rows painted: ``(in the page, wall)`` in seconds; in the page:
    from the event to the animation frame that first has the rows (:data:`MARKS`), wall: as Playwright sees it,
    its own round trips included."""
    from playwright.sync_api import Error

    page.evaluate("document.getElementById('runs').setAttribute('data-old', '1'); window.casmonRowsAt = null")
    t = time.perf_counter()
    act()
    while True:
        try:
            page.wait_for_function(NEW_ROWS, polling="raf", timeout=120_000)
            wall = time.perf_counter() - t
            page.wait_for_function("() => window.casmonRowsAt !== null", polling="raf", timeout=120_000)
            got = page.evaluate("window.casmonRowsAt - Number(sessionStorage.getItem('casmonActAt'))")
            return got / 1e3, wall
        except Error:  # the old page went while it was watched (a navigation): watch the new one
            if time.perf_counter() - t > 120:
                raise


def ui_times(path: str, tree: str, browser: Any, again: int = 3) -> dict[str, tuple[float, ...]]:
    """The runs page in Chromium over a fresh ``casmon ui`` server of ``tree`` (its code, a process of its own,
    started as the page is asked for): first paint (the table's rows on screen: in the page, from the
    navigation's start; wall, to Playwright's load event and the rows), then from the first page a click on
    started's head, on param.lr's head, and a filter typed and entered, each timed from the click or the Enter
    to the new rows on screen (:func:`_until_new_rows`); first time, and the median of ``again`` more (each from
    the first page, loaded anew). ``{row: (first in page, again in page, first wall, again wall)}``, seconds."""
    env = dict(os.environ, PYTHONPATH=tree)
    p = subprocess.Popen([sys.executable, "-c", SERVE, path], env=env, cwd=tree, stdout=subprocess.PIPE, text=True)
    try:
        base = f"http://127.0.0.1:{int(p.stdout.readline())}"  # type: ignore[union-attr]
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        context.add_init_script(MARKS)
        page = context.new_page()
        t = time.perf_counter()
        page.goto(base + "/")
        page.wait_for_selector("#runs tbody tr[data-run]")
        wall = time.perf_counter() - t
        page.wait_for_function("() => window.casmonRowsAt !== null", polling="raf", timeout=120_000)
        shown = page.evaluate("window.casmonRowsAt - performance.timeOrigin") / 1e3
        nan = float("nan")
        out = {"first paint": (shown, nan, wall, nan)}

        def head(col: str) -> Any:
            return lambda: page.locator(f"#runs thead th[data-col='{col}'] a").click()

        def typed() -> None:
            page.locator("form.filter input[name=q]").press("Enter")

        for label, act, ready in (("sort by started (asc)", head("start"), None),
                                  ("sort by param.lr", head("param.lr"), None),
                                  (f"filter {FILTER}", typed,
                                   lambda: page.locator("form.filter input[name=q]").fill(FILTER))):
            times = []
            for _ in range(1 + again):
                page.goto(base + "/")
                page.wait_for_selector("#runs tbody tr[data-run]")
                if ready is not None:
                    ready()
                times.append(_until_new_rows(page, act))
            out[label] = (times[0][0], statistics.median(x[0] for x in times[1:]), times[0][1],
                          statistics.median(x[1] for x in times[1:]))
        context.close()
        return out
    finally:
        p.terminate()
        p.wait()


def in_turn(trees: list[tuple[str, str]], rounds: int, measure: Any) -> dict[str, list[Any]]:
    """``measure(tree, browser)`` for each ``(label, tree)`` in turn, ``rounds`` times, in one Chromium: label ->
    what each round measured."""
    from playwright.sync_api import sync_playwright

    got: dict[str, list[Any]] = {label: [] for label, _t in trees}
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                               args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            for _ in range(rounds):
                for label, tree in trees:
                    got[label].append(measure(tree, b))
        finally:
            b.close()
    return got


def ui_rows(path: str, n: int, before: str = "", rounds: int = 1) -> list[tuple[str, str]]:
    """The runs page in Chromium (Playwright, /usr/bin/chromium) over a fresh server of this tree, and of the
    code at ``before`` (a tree), in turn, ``rounds`` times (medians): :func:`ui_times`. Each cell: in the page
    (first / again), then Playwright's wall time in brackets."""
    trees = ([("before", before)] if before else []) + [("after" if before else "this tree", os.getcwd())]
    got = in_turn(trees, rounds, lambda tree, b: ui_times(path, tree, b))

    def ms(xs: list[float]) -> str:
        return " / ".join(f"{x * 1e3:.0f}" for x in xs if x == x) + " ms"

    rows = []
    for what in got[trees[0][0]][0]:
        cells = []
        for label, _t in trees:
            med = [statistics.median(g[what][k] for g in got[label]) for k in range(4)]
            cells.append(f"{label} {ms(med[:2])} ({ms(med[2:])} wall)")
        rows.append((f"runs page, {n:,} runs, {what}" + (": first / again" if what != "first paint" else ""),
                     "; ".join(cells)))
    return rows


SERVE = """
import sys, casmon
from casmon.ui.server import make_server
s = casmon.open(sys.argv[1], read_only=True, create=False, autoflush=None)
srv = make_server(s, "127.0.0.1", 0)
print(srv.server_address[1], flush=True)
srv.serve_forever()
"""
#: Every panel of the compare page drawn (a canvas each) and the dashboard ready.
DRAWN = """(k) => document.querySelectorAll('#charts figure.chart-box .chart-area canvas').length >= k
    && document.querySelector('#charts[data-ready]') !== null"""


def _cpu(pid: int) -> float:
    """A process's user + system CPU seconds (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare_page_times(path: str, tree: str, runs: int, metrics: int, browser: Any) -> list[tuple[float, ...]]:
    """The compare page of ``runs`` runs in Chromium over a fresh ``casmon ui`` server of ``tree`` (its code, in a
    process of its own), twice: ``(shell, charts, server CPU, KiB)`` each; shell: the page's load event, charts:
    every panel drawn."""
    env = dict(os.environ, PYTHONPATH=tree)
    p = subprocess.Popen([sys.executable, "-c", SERVE, path], env=env, cwd=tree, stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())  # type: ignore[union-attr]
        page = browser.new_context(viewport={"width": 1400, "height": 2400}).new_page()  # every panel in view
        got: list[int] = [0]
        page.on("response", lambda r: got.__setitem__(0, got[0] + int(r.headers.get("content-length") or 0)))
        out = []
        which = "&".join(f"run={i}" for i in range(1, runs + 1))
        for _ in range(2):
            got[0] = 0
            c, t = _cpu(p.pid), time.perf_counter()
            page.goto(f"http://127.0.0.1:{port}/compare?{which}")
            shell = time.perf_counter() - t
            page.wait_for_function(DRAWN, arg=metrics, timeout=120_000, polling=20)
            out.append((shell, time.perf_counter() - t, _cpu(p.pid) - c, got[0] / 1024))
        page.context.close()
        return out
    finally:
        p.terminate()
        p.wait()


def build_ragged(path: str, runs: int, metrics: int, points: int) -> None:
    """``runs`` ended runs, each of its own length (``points - 37 i``) and so its own bucket steps: what comparing
    runs cut short, resumed or run longer looks like, through the real importer (``write_run``)."""
    import casmon
    from casmon.runs.imported import write_run

    s = casmon.open(path, create=True)
    rng = np.random.default_rng(0)
    names = ("loss", "acc", "val_loss", "val_acc", "lr", "grad_norm", "tokens_s", "epoch")
    for i in range(1, runs + 1):
        k = max(2, points - 37 * i)
        steps = np.arange(k)
        write_run(s, start=1.7e9 + i, end=1.7e9 + i + 100, params={"lr": 10.0 ** -(1 + i % 5), "seed": i},
                  metrics={names[m % 8]: (steps, rng.random(k) / (1 + steps * 0.01), 1.7e9 + i + steps * 0.01)
                           for m in range(metrics)})
    s.close()


def compare_rows(root: str, runs: int = 100, metrics: int = 5, points: int = 10_000, store: str | None = None,
                 before: str | None = None, rounds: int = 3, ragged: bool = False) -> list[tuple[str, str]]:
    """The compare page of ``runs`` runs with ``metrics`` metrics of ``points`` points in Chromium, fresh server,
    first and again; with ``before`` (a tree: ``git archive`` of another commit) that tree's too, the two served
    in turn, round after round. Medians of ``rounds``."""
    import casmon
    from benchmarks.runs_store import build

    path = store or os.path.join(root, "cmp")
    if not os.path.exists(os.path.join(path, "refs")):
        if ragged:
            build_ragged(path, runs, metrics, points)
        else:
            build(path, runs, metrics=metrics, points=points, chunk=20)
        casmon.list_runs(casmon.open(path))  # the runs index
    trees = ([("before", before)] if before else []) + [("this tree", os.getcwd())]
    times = in_turn(trees, rounds, lambda tree, b: compare_page_times(path, tree, runs, metrics, b))
    rows = []
    what = f"{runs} runs x {metrics} metrics x {points:,} points" + (" (each its own length)" if ragged else "")
    for label, got in times.items():
        med = [[statistics.median(g[k][j] for g in got) for j in range(4)] for k in range(2)]
        rows.append((f"compare page, {what}, {label}: charts drawn, first / again",
                     f"{med[0][1]:.2f} s / {med[1][1]:.2f} s (page shell {med[0][0]:.2f} / {med[1][0]:.2f} s; "
                     f"server CPU {med[0][2]:.2f} / {med[1][2]:.2f} s; {med[0][3]:,.0f} KiB)"))
    return rows


def main() -> None:
    from benchmarks.runs_store import build

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40_000)
    ap.add_argument("--only", default="list,ui,compare,day")
    ap.add_argument("--store", action="append", default=[], help="N=PATH: a store of N runs built already")
    ap.add_argument("--before", default="", help="a tree of other code (git archive) to measure too, alternating")
    ap.add_argument("--compare-store", help="compare: the store of 100 runs to use (built there if missing)")
    ap.add_argument("--rounds", type=int, default=3, help="compare: rounds of the trees in turn")
    ap.add_argument("--ragged", action="store_true", help="compare: runs of different lengths (a store built so)")
    a = ap.parse_args()
    only = set(a.only.split(","))
    root = tempfile.mkdtemp(prefix="casmon-runsbench-")
    stores = {int(n): p for n, p in (x.split("=", 1) for x in a.store)}

    class Rows(list):  # each row printed as it is measured (a long run cut short keeps what it had)
        def append(self, row: tuple[str, str]) -> None:
            super().append(row)
            print(f"{row[0]:<66}  {row[1]}", flush=True)

        def extend(self, rows: Any) -> None:
            for r in rows:
                self.append(r)

    rows: list[tuple[str, str]] = Rows()
    try:
        sizes = sorted(stores) if stores else [int(x) for x in a.runs.split(",")]
        for n in (sizes if only & {"list", "ui", "page"} else []):
            path = stores.get(n) or os.path.join(root, f"r{n}")
            if n not in stores:
                rows.append((f"build {n:,} runs (benchmarks.runs_store)", f"{build(path, n):.0f} s"))
            if a.before and only & {"list", "page"}:
                rows.extend(alternating(path, n, a.before, a.repeat, only))
            elif "list" in only and not a.before:
                direct = _list_time(path, "direct", a.repeat)
                _list_time(path, "index", 1)  # builds the index
                indexed = _list_time(path, "index", a.repeat)
                rows.append((f"list_runs + latest metric, {n:,} runs: no index / index (wall)",
                             f"{direct[0]:.2f} s / {indexed[0]:.2f} s ({direct[0] / indexed[0]:.1f}x)"))
                rows.append((f"list_runs + latest metric, {n:,} runs: no index / index (CPU)",
                             f"{direct[1]:.2f} s / {indexed[1]:.2f} s ({direct[1] / indexed[1]:.1f}x)"))
            elif not a.before:
                _list_time(path, "index", 1)
            if "page" in only and not a.before:
                times = page_times(path)
                rows.append((f"runs page in process, {n:,} runs: first page / metric sort / param sort / filter "
                             "(CPU)", " / ".join(f"{t * 1e3:.0f} ms" for t in times)))
            if "ui" in only:
                rows.extend(ui_rows(path, n, a.before, a.rounds))
            if n not in stores:
                shutil.rmtree(path, ignore_errors=True)
        if "compare" in only:
            rows.extend(compare_rows(root, store=a.compare_store, before=a.before or None, rounds=a.rounds, ragged=a.ragged))
        if "day" in only:
            rows.extend(day_run(root, a.batches))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
