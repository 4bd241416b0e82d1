"""Run tracking (issue 26): what ``run.log`` costs beside ``json.dumps`` and MLflow, and reading at scale.

Run:  python -m benchmarks.tracking_bench           (10,000 runs, 10 million points; a few minutes)
      python -m benchmarks.tracking_bench --quick   (1,000 runs, 1 million points)

* ``run.log(loss=x, step=i)`` against ``json.dumps({"loss": x, "step": i})`` (the floor: serialising the
  point once), interleaved blocks, median of per-block ratios; the same for three metrics a call; and
  ``mlflow.log_metric`` on its file store when mlflow is installed (a few hundred points: it is slow).
* One run with a million points: reading the series back (``load_run(...).metric``) and downsampling it for a
  chart (2,000 buckets), as the UI's chart endpoint does.
* A store of many runs holding millions of points in all: ``list_runs`` with every run's latest metrics
  (what ``casmon runs`` and the UI's runs page read).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import warnings

import numpy as np

import casmon
from casmon.runs.imported import write_run
from casmon.runs.metrics import downsample


def _log_vs_json(run: casmon.Run, n: int, blocks: int, three: bool) -> tuple[float, float, float]:
    rs, ls, js = [], [], []
    for b in range(blocks):
        t0 = time.perf_counter()
        if three:
            for i in range(n):
                json.dumps({"loss": 0.5, "acc": 0.25, "lr": 1e-3})
        else:
            for i in range(n):
                json.dumps({"loss": 0.5, "step": i})
        t1 = time.perf_counter()
        if three:
            for i in range(n):
                run.log(loss=0.5, acc=0.25, lr=1e-3)
        else:
            for i in range(n):
                run.log(loss=0.5, step=i)
        t2 = time.perf_counter()
        rs.append((t2 - t1) / (t1 - t0))
        ls.append((t2 - t1) / n)
        js.append((t1 - t0) / n)
    return statistics.median(rs), statistics.median(ls), statistics.median(js)


def _mlflow(root: str, n: int) -> float | None:
    try:
        import mlflow
    except ImportError:
        return None
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
    mlflow.set_tracking_uri("file://" + os.path.join(root, "mlruns"))
    with mlflow.start_run():
        t = time.perf_counter()
        for i in range(n):
            mlflow.log_metric("loss", 0.5, step=i)
        return (time.perf_counter() - t) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    runs_n = 1_000 if args.quick else 10_000
    points = 1_000_000 if args.quick else 10_000_000
    root = tempfile.mkdtemp(prefix="casmon-trackbench-")
    warnings.simplefilter("ignore")
    rows: list[tuple[str, str]] = []
    try:
        store = casmon.open(os.path.join(root, "s"), create=True)
        with casmon.record(store=store, capture_output=False) as run:
            r1, l1, j1 = _log_vs_json(run, 100_000, 7, three=False)
            r3, l3, j3 = _log_vs_json(run, 100_000, 7, three=True)
        rows.append(("run.log(loss=x, step=i) / json.dumps", f"{r1:.2f}x   ({l1 * 1e6:.2f} us vs {j1 * 1e6:.2f} us)"))
        rows.append(("run.log(3 metrics) / json.dumps", f"{r3:.2f}x   ({l3 * 1e6:.2f} us vs {j3 * 1e6:.2f} us)"))
        ml = _mlflow(root, 300)
        if ml is not None:
            rows.append(("mlflow.log_metric (file store) / run.log", f"{ml / l1:.0f}x   ({ml * 1e6:.0f} us a point)"))

        # One run, a million points, logged through run.log with the live thread flushing as it goes.
        t = time.perf_counter()
        with casmon.record(store=store, capture_output=False, comment="million") as run:
            for i in range(1_000_000):
                run.log(loss=1.0 / (i + 1), step=i)
        rows.append(("log 1M points, end the run", f"{time.perf_counter() - t:.2f} s"))
        reader = casmon.open(os.path.join(root, "s"), create=False, read_only=True)
        r = casmon.load_run("latest", reader)
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            s = r.metric("loss")
            d = downsample(s, 2000)
            ts.append(time.perf_counter() - t)
        assert len(s) == 1_000_000 and len(d["value"]) == 2000
        rows.append(("read 1M points + downsample to 2,000", f"{statistics.median(ts) * 1e3:.0f} ms"))

        # Many runs, millions of points in all (written as imported runs: recording each would time git).
        many = casmon.open(os.path.join(root, "many"), create=True, autoflush=None)
        per = points // runs_n
        t = time.perf_counter()
        steps = np.arange(per)
        for k in range(runs_n):
            vals = np.random.default_rng(k).random(per)
            write_run(many, start=time.time(), end=time.time() + 1, params={"lr": 10.0 ** -(k % 5), "seed": k},
                      metrics={"loss": (steps, vals, np.zeros(per)), "acc": (steps, 1 - vals, np.zeros(per))})
        many.close()
        rows.append((f"write {runs_n:,} runs x {per:,} points x 2 metrics", f"{time.perf_counter() - t:.1f} s"))
        many = casmon.open(os.path.join(root, "many"), create=False, read_only=True)
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            listed = casmon.list_runs(many)
            latest = [x.metric_summary().get("loss", {}).get("last") for x in listed]
            ts.append(time.perf_counter() - t)
        assert len(listed) == runs_n and all(v is not None for v in latest)
        rows.append((f"list {runs_n:,} runs with latest metrics", f"{statistics.median(ts):.2f} s"))
        t = time.perf_counter()
        one = listed[runs_n // 2].metric("loss")
        rows.append((f"read one run's series among {runs_n:,}", f"{(time.perf_counter() - t) * 1e3:.0f} ms ({len(one):,} points)"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
