"""One measurement of one tool, run in a fresh process by benchmarks/compare.py.

    python -m benchmarks._peers TOOL SCENARIO DIR [SIZE]

Prints one JSON object. Each tool runs in its own process because some
configure logging or global state when imported (FineCache sets the root
logger to DEBUG).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np


def _f_small(a, b, c):
    return a * b


def _f_array(arr):
    return float(arr[:16].sum())


SAME = None


def _f_same(i):
    return SAME


def make_decorator(tool: str, d: Path):
    if tool == "casmon":
        import casmon

        store = casmon.open(d / "store")
        return casmon.cache(store=store), store
    if tool == "joblib":
        import joblib

        return joblib.Memory(d / "joblib", verbose=0).cache, None
    if tool == "diskcache":
        import diskcache

        c = diskcache.Cache(str(d / "diskcache"))
        return c.memoize(), c
    if tool == "finecache":
        import logging

        # FineCache needs a git repository and logs every hit; measure it quietly.
        subprocess.run(["git", "init", "-q", str(d)], check=True)
        subprocess.run(["git", "-C", str(d), "-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x"], check=True)
        os.chdir(d)
        from FineCache import FineCache

        logging.disable(logging.CRITICAL)
        return FineCache(str(d / "finecache")).cache(), None
    raise SystemExit(f"unknown tool {tool}")


def files_and_bytes(d: Path) -> tuple[int, int]:
    n = b = 0
    for p in d.rglob("*"):
        if p.is_file() and ".git" not in p.parts:
            n += 1
            b += p.stat().st_size
    return n, b


def flush(store):
    if store is not None and hasattr(store, "flush"):
        store.flush()


def scenario_small(tool, d):
    deco, store = make_decorator(tool, d)
    f = deco(_f_small)
    f(1, 2.5, "abc")
    flush(store)
    n = 20_000
    times = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f(1, 2.5, "abc")
        times.append((time.perf_counter() - t) / n)
    hit = statistics.median(times)
    flush(store)
    before = files_and_bytes(d)
    t = time.perf_counter()
    for i in range(1000):
        f(i + 10, 2.5, "abc")
    miss = (time.perf_counter() - t) / 1000
    flush(store)
    after = files_and_bytes(d)
    return {"hit_s": hit, "miss_s": miss, "files_per_1000": after[0] - before[0]}


def scenario_array(tool, d, size):
    deco, store = make_decorator(tool, d)
    f = deco(_f_array)
    a = np.random.default_rng(0).random(size // 8)
    t = time.perf_counter()
    f(a)
    miss = time.perf_counter() - t
    flush(store)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        f(a)
        times.append(time.perf_counter() - t)
    return {"hit_s": statistics.median(times), "miss_s": miss}


def scenario_same(tool, d):
    global SAME
    SAME = np.random.default_rng(1).random(16 * 1024 * 1024 // 8)
    deco, store = make_decorator(tool, d)
    f = deco(_f_same)
    for i in range(200):
        f(i)
    flush(store)
    n, b = files_and_bytes(d)
    return {"files": n, "bytes": b}


def _g_small(a, b, c):
    return a


def _g_array(a, i):
    return i


def make_interceptor(tool: str, d: Path):
    if tool == "casmon":
        import casmon

        store = casmon.open(d / "store")
        return casmon.intercept(store=store), store
    if tool == "callmonitor":
        os.chdir(d)  # callmonitor writes ./call-monitor*
        import callmonitor

        return callmonitor.intercept, None
    raise SystemExit(f"unknown tool {tool}")


def scenario_log_small(tool, d):
    deco, store = make_interceptor(tool, d)
    f = deco(_g_small)
    n = 10_000
    f(0, 2.5, "abc")
    flush(store)
    before = files_and_bytes(d)
    t = time.perf_counter()
    for i in range(n):
        _g_small(i, 2.5, "abc")
    plain = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(n):
        f(i, 2.5, "abc")
    logged = time.perf_counter() - t
    t = time.perf_counter()
    flush(store)
    flushed = time.perf_counter() - t
    after = files_and_bytes(d)
    return {"overhead_s": (logged - plain) / n, "overhead_flushed_s": (logged + flushed - plain) / n,
            "files_per_10000": after[0] - before[0]}


def scenario_log_same(tool, d):
    deco, store = make_interceptor(tool, d)
    f = deco(_g_array)
    a = np.random.default_rng(1).random(16 * 1024 * 1024 // 8)
    for i in range(200):
        f(a, i)
    flush(store)
    n, b = files_and_bytes(d)
    return {"files": n, "bytes": b}


def main() -> None:
    tool, scenario, d = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    d.mkdir(parents=True, exist_ok=True)
    if scenario == "small":
        out = scenario_small(tool, d)
    elif scenario == "array":
        out = scenario_array(tool, d, int(sys.argv[4]))
    elif scenario == "same":
        out = scenario_same(tool, d)
    elif scenario == "log_small":
        out = scenario_log_small(tool, d)
    elif scenario == "log_same":
        out = scenario_log_same(tool, d)
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    sys.stdout.write(json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
