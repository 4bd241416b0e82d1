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
  N-run store: first paint (the table's rows on screen), a sort by ``started`` and a filter with ``or``,
  parentheses and ``tag:`` (server-side: each a navigation), first time and again.
* **first page in process** — ``RunIndex`` + ``runs_view`` in a fresh process, CPU: the first page (default
  order), then a sort by a metric, by a parameter, and the filter ``status:ok and (param.lr>0.01 or
  tag:baseline)``, each on a fresh ``RunIndex`` (no row made before).
* **compare** — ``/compare`` of 100 runs with 5 metrics of 10,000 points each (charts downsampled).
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


def ui_rows(path: str, n: int) -> list[tuple[str, str]]:
    """The runs page in Chromium (Playwright, /usr/bin/chromium) over a fresh server: first paint (the table's
    rows on screen), then a sort by started and a filter with or, parentheses and tag:, each a navigation."""
    import casmon
    from casmon.ui.server import make_server
    from playwright.sync_api import sync_playwright

    store = casmon.open(path, read_only=True, create=False, autoflush=None)
    server = make_server(store, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    rows = []
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                   args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = b.new_page()

            def shown(url: str) -> float:
                t = time.perf_counter()
                page.goto(base + url)
                page.wait_for_selector("#runs tbody tr[data-run]")
                return time.perf_counter() - t

            rows.append((f"runs page first paint, {n:,} runs (fresh server)", f"{shown('/') * 1e3:.0f} ms"))
            for label, url in (("sort by started", "/?sort=started&order=asc"),
                               ("filter status:ok and (lr>0.01 or tag:baseline)",
                                "/?q=status%3Aok%20and%20(lr%3E0.01%20or%20tag%3Abaseline)")):
                first = shown(url)
                again = statistics.median(shown(url) for _ in range(3))
                rows.append((f"{label}, {n:,} runs: first / again", f"{first * 1e3:.0f} ms / {again * 1e3:.0f} ms"))
            b.close()
    finally:
        server.shutdown()
        server.close()
        store.close()
    return rows


def compare_rows(root: str, runs: int = 100, metrics: int = 5, points: int = 10_000) -> list[tuple[str, str]]:
    """The compare page of ``runs`` runs with ``metrics`` metrics of ``points`` points, fresh server."""
    import http.client

    import casmon
    from benchmarks.runs_store import build
    from casmon.ui.server import make_server

    path = os.path.join(root, "cmp")
    build(path, runs, metrics=metrics, points=points, chunk=20)
    casmon.list_runs(casmon.open(path))
    store = casmon.open(path, read_only=True, create=False, autoflush=None)
    server = make_server(store, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        which = "&".join(f"run={i}" for i in range(1, runs + 1))
        names = ("acc", "loss", "lr", "val_acc", "val_loss")[:metrics]
        urls = [f"/compare?{which}"] + [f"/api/metric?{which}&name={m}" for m in names]  # the page, its charts' data
        ts = []
        for _ in range(2):
            t = time.perf_counter()
            size = 0
            for url in urls:
                c = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=600)
                c.request("GET", url)
                r = c.getresponse()
                body = r.read()
                assert r.status == 200, (url, body[:500])
                size += len(body)
            ts.append(time.perf_counter() - t)
    finally:
        server.shutdown()
        server.close()
        store.close()
    return [(f"compare page, {runs} runs x {metrics} metrics x {points:,} points: first / again",
             f"{ts[0]:.2f} s / {ts[1]:.2f} s ({size / 1024:.0f} KiB: the page and {len(names)} charts' data)")]


def main() -> None:
    from benchmarks.runs_store import build

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40_000)
    ap.add_argument("--only", default="list,ui,compare,day")
    ap.add_argument("--store", action="append", default=[], help="N=PATH: a store of N runs built already")
    ap.add_argument("--before", default="", help="a tree of other code (git archive) to measure too, alternating")
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
        for n in (sorted(stores) if stores else [int(x) for x in a.runs.split(",")]):
            path = stores.get(n) or os.path.join(root, f"r{n}")
            if n not in stores:
                rows.append((f"build {n:,} runs (benchmarks.runs_store)", f"{build(path, n):.0f} s"))
            if a.before:
                rows.extend(alternating(path, n, a.before, a.repeat, only))
            elif "list" in only:
                direct = _list_time(path, "direct", a.repeat)
                _list_time(path, "index", 1)  # builds the index
                indexed = _list_time(path, "index", a.repeat)
                rows.append((f"list_runs + latest metric, {n:,} runs: no index / index (wall)",
                             f"{direct[0]:.2f} s / {indexed[0]:.2f} s ({direct[0] / indexed[0]:.1f}x)"))
                rows.append((f"list_runs + latest metric, {n:,} runs: no index / index (CPU)",
                             f"{direct[1]:.2f} s / {indexed[1]:.2f} s ({direct[1] / indexed[1]:.1f}x)"))
            else:
                _list_time(path, "index", 1)
            if "page" in only and not a.before:
                times = page_times(path)
                rows.append((f"runs page in process, {n:,} runs: first page / metric sort / param sort / filter "
                             "(CPU)", " / ".join(f"{t * 1e3:.0f} ms" for t in times)))
            if "ui" in only:
                rows.extend(ui_rows(path, n))
            if n not in stores:
                shutil.rmtree(path, ignore_errors=True)
        if "compare" in only:
            rows.extend(compare_rows(root))
        if "day" in only:
            rows.extend(day_run(root, a.batches))
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
