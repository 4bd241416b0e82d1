"""Runs at scale (issue 46): ``list_runs`` with latest metrics at 10k/100k runs, and a day-long run's metrics
before and after compaction.

    python -m benchmarks.runs_bench --runs 10000,100000

* **list_runs** — a store of N ended runs from :mod:`benchmarks.runs_store` (5 metrics each); ``list_runs``
  plus every run's latest ``loss`` in a fresh process, without the runs index (every ref and manifest read,
  as before the index) and with it (after the first listing built it). Median of ``--repeat``.
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
import time

import numpy as np

LIST = """
import sys, time, casmon
s = casmon.open(sys.argv[1], read_only=sys.argv[2] == "direct")
t = time.perf_counter()
runs = casmon.list_runs(s)
latest = [r.metric_summary().get("loss", {}).get("last") for r in runs]
print(time.perf_counter() - t)
assert all(v is not None for v in latest)
"""


def _list_time(path: str, how: str, repeat: int) -> float:
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    ts = []
    for _ in range(repeat):
        if how == "direct":
            shutil.rmtree(os.path.join(path, "runs-index"), ignore_errors=True)
        out = subprocess.run([sys.executable, "-c", LIST, path, how], env=env, capture_output=True, text=True,
                             check=True)
        ts.append(float(out.stdout.strip()))
    return statistics.median(ts)


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


def main() -> None:
    from benchmarks.runs_store import build

    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40_000)
    a = ap.parse_args()
    root = tempfile.mkdtemp(prefix="casmon-runsbench-")
    rows: list[tuple[str, str]] = []
    try:
        for n in (int(x) for x in a.runs.split(",")):
            path = os.path.join(root, f"r{n}")
            rows.append((f"build {n:,} runs (benchmarks.runs_store)", f"{build(path, n):.0f} s"))
            direct = _list_time(path, "direct", a.repeat)
            _list_time(path, "index", 1)  # builds the index
            indexed = _list_time(path, "index", a.repeat)
            rows.append((f"list_runs + latest metric, {n:,} runs: no index / index",
                         f"{direct:.2f} s / {indexed:.2f} s ({direct / indexed:.1f}x)"))
            shutil.rmtree(path, ignore_errors=True)
        rows.extend(day_run(root, a.batches))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
