"""A synthetic store of many ended runs, written through the real record format in one process.

    python -m benchmarks.runs_store PATH --runs 10000 [--metrics 5 --points 100]

Each run gets what ``casmon.record`` leaves behind when it ends: its metric batches (one record, each
metric's points inline, or a stored value past 2,048 points, as a compacted run's), a manifest (params flattened to a nested config, tags, a metric summary with digests),
its ``run`` record and its ref ``runs/{n}``. Records and values are flushed every thousand runs and then the
refs are written, so 10k runs take well under a minute and 100k a few minutes (no process per run, no
claim per run). The runs index is not written: the first ``list_runs`` builds it, as it would in a store
whose index was deleted.
"""

from __future__ import annotations

import argparse
import base64
import time
from typing import Any

import numpy as np
import xxhash

import casmon
from casmon.keys.fingerprint import fingerprint
from casmon.runs.manifest import KIND_RUN
from casmon.runs.metrics import INLINE_POINTS, KIND_METRICS, batch_summary, json_safe, metrics_key, points_summary, series_digest

TAGS = ("baseline", "ablation", "sweep", "best", "debug")
STATUSES = ("ok",) * 8 + ("failed", "killed")


def _run(store: casmon.Store, n: int, metrics: int, points: int, t0: float) -> tuple[str, Any, dict[str, Any]]:
    rng = np.random.default_rng(n)
    ref = f"runs/{n}"
    steps = np.arange(points, dtype="<i8")
    times = (t0 + n + steps * 0.01).astype("<f8")
    series: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    refs: list[Any] = []
    for m in range(metrics):
        name = ("loss", "acc", "val_loss", "val_acc", "lr", "grad_norm", "tokens_s", "epoch")[m % 8] + (
            f"_{m // 8}" if m >= 8 else "")
        vals = (rng.random(points) / (1 + steps * 0.01)).astype("<f8")
        data = steps.tobytes() + vals.tobytes() + times.tobytes()
        series[name] = {"n": points, "sum": batch_summary(steps, vals, times)}
        if points <= INLINE_POINTS:
            series[name]["b64"] = base64.b64encode(data).decode("ascii")
        else:  # as a run's compacted record holds a long series: a stored value
            d = store.put(data)
            refs.append(d)
            series[name]["$"] = d.hex()
        summary[name] = {**json_safe(points_summary(steps, vals, times)),
                         "digest": series_digest(xxhash.xxh3_128(steps.tobytes()).digest(),
                                                 xxhash.xxh3_128(vals.tobytes()).digest())}
    store.append(KIND_METRICS, {"run": ref, "seq": 0, "s": series}, key=metrics_key(ref), refs=refs)
    start = t0 + n
    status = STATUSES[n % len(STATUSES)]
    manifest: dict[str, Any] = {
        "casmon_run": 1, "name": str(n), "n": n, "prefix": "", "comment": "", "status": status,
        "function": None, "start": start, "patch_time": start,
        "git": {"root": "/work/project", "in_git": True, "commit": f"{n % 97:040x}", "branch": "main",
                "dirty": False, "untracked": [], "skipped": [], "notes": [], "patch": None},
        "files": {}, "tracking_records": {}, "host": "bench", "user": "bench", "pid": 1000 + n % 30000,
        "python": "3.11", "executable": "python", "argv": ["train.py"], "cwd": "/work/project", "env": {},
        "heartbeat_s": 15.0, "info": {},
        "params": {"lr": float(10.0 ** -(1 + n % 5)), "batch": int(2 ** (4 + n % 4)), "seed": n,
                   "model": {"depth": 2 + n % 10, "width": 64 * (1 + n % 4), "act": ("relu", "gelu")[n % 2]}},
        "tags": [TAGS[n % len(TAGS)]] + (["best"] if n % 97 == 0 else []),
        "end": start + 60 + n % 600, "duration": 60.0 + n % 600, "traceback": None,
        "metrics": dict(sorted(summary.items())), "links": {"call_sessions": [], "cache": []},
    }
    d = store.put(manifest)
    store.append(KIND_RUN, {"name": str(n), "manifest": d.hex(), "status": status, "time": start, "_ref": ref,
                            "_ref_target": d.hex()}, key=fingerprint(("casmon.run", ref)), refs=[d])
    return ref, d, {"name": str(n), "status": status, "start": start, "heartbeat": manifest["end"],
                    "heartbeat_s": 15.0, "heartbeat_lag": 0.0, "metrics": {}}


def build(path: str, runs: int, metrics: int = 5, points: int = 100, chunk: int = 1000) -> float:
    """Write ``runs`` ended runs into a new store at ``path``; the seconds it took."""
    t = time.perf_counter()
    store = casmon.open(path, create=True, autoflush=None)
    t0 = time.time() - runs - 86400
    for lo in range(1, runs + 1, chunk):
        made = [_run(store, n, metrics, points, t0) for n in range(lo, min(runs, lo + chunk - 1) + 1)]
        store.flush()  # the records first: they name what the manifests need
        for ref, d, data in made:
            store.set_ref(ref, d, data)
    store.close()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--metrics", type=int, default=5)
    ap.add_argument("--points", type=int, default=100)
    a = ap.parse_args()
    print(f"{a.runs:,} runs in {build(a.path, a.runs, a.metrics, a.points):.1f} s")


if __name__ == "__main__":
    main()
