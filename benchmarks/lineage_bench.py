"""Lineage: what recording edges costs a call, and how fast the queries answer over a big store.

    python -m benchmarks.lineage_bench [--entries 100000] [--runs 100] [--calls 2000]
    python -m benchmarks.lineage_bench --queries-only --store PATH [--build] [--entries N --runs N] \
        [--before TREE] [--rounds 3]
    python benchmarks/lineage_bench.py --worker hooks 300 TREE

* **small miss** / **warm hit** -- a cached function of a small array (a miss: a fresh argument each call; a hit:
  one stored call, again and again), with the edge recording on and off (``casmon.caching.edges``' hooks replaced
  by no-ops), in 21 alternating rounds in one process; per call, the calling thread's CPU time (the store's
  flush thread and the neighbours on a shared machine left out): the best round and the median.
  ``--worker hooks CALLS TREE``: the small miss with no hooks, TREE's hooks and this tree's, in one process,
  in a random order each of 40 rounds (what each tree's hooks add, without the between-process noise).
* **queries** -- a synthetic store of ``--entries`` cache entries (pipelines of four stages, written as records
  directly: a miss each would take an hour at 1M) and ``--runs`` runs recorded with ``casmon.record``, each using
  one pipeline; then ``lineage`` of the newest run, ``used_by`` of one function version and ``stale`` of the whole
  store, each in a fresh process, the medians of three; the first query of a fresh store reads every record and
  writes the derived lineage index (``casmon.lineage.derived``), timed on its own. ``--store PATH``: the store
  at PATH (built there first with ``--build``), kept for another run; ``--before TREE``: each query also with the
  casmon of TREE (a ``git archive`` of another commit), alternating, in the same rounds. A query's answer is
  counted with ``len(g)`` where the graph has it (its nodes made when read); ``used_by (all nodes)`` makes them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _per_call(f, args_list) -> float:
    # CPU time of this thread: on a shared machine, wall time measures the neighbours (and the store's flush thread)
    t = time.thread_time()
    for a in args_list:
        f(a)
    return (time.thread_time() - t) / len(args_list)


def call_costs(calls: int, rounds: int = 21) -> dict:
    import numpy as np

    import casmon
    from casmon.caching import edges, memoize

    d = tempfile.mkdtemp(prefix="casmon-lineage-bench-")

    @casmon.cache(store=os.path.join(d, "s"))
    def small(a):
        return a * 2

    on = {"annotate": edges.annotate, "produced": edges.produced, "served": edges.served}
    off = {k: (lambda *a, **k: None) for k in on}
    seq = iter(range(10**9))
    out: dict[str, list[float]] = {"miss on": [], "miss off": [], "hit on": [], "hit off": []}
    warm = np.arange(16.0)
    small(warm)
    for _ in range(rounds):
        for state, hooks in (("on", on), ("off", off)):
            for k, v in hooks.items():
                setattr(memoize.edges, k, v)
            out[f"miss {state}"].append(_per_call(small, [np.arange(16.0) + next(seq) for _ in range(calls)]))
            out[f"hit {state}"].append(_per_call(small, [warm] * calls * 5))
    for k, v in on.items():
        setattr(memoize.edges, k, v)
    # the best round of each: on a shared, loaded machine the other rounds measure the neighbours
    return {**{k: min(v) for k, v in out.items()}, **{k + " median": statistics.median(v) for k, v in out.items()}}


def hook_costs(calls: int, before: str, rounds: int = 40) -> dict:
    """The small miss with the hooks off, with ``before``'s (a casmon tree: its ``edges`` and small-array digest
    loaded beside this one's) and with this tree's, in one process, in a random order each round: the extra
    CPU time per call of each, as medians and best rounds."""
    import importlib.util
    import random

    import numpy as np

    import casmon
    from casmon.caching import edges, memoize

    def load(name: str, path: str):
        spec = importlib.util.spec_from_file_location(name, path)
        m = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(m)
        return m

    old_fp = load("casmon.keys.fingerprint_before", os.path.join(before, "casmon/keys/fingerprint.py"))
    old = load("casmon.caching.edges_before", os.path.join(before, "casmon/caching/edges.py"))
    old.small_array_digest = old_fp.small_array_digest
    d = tempfile.mkdtemp(prefix="casmon-lineage-bench-")

    @casmon.cache(store=os.path.join(d, "s"))
    def small(a):
        return a * 2

    small(np.arange(16.0))
    noop = lambda *a, **k: None  # noqa: E731
    modes = {"off": (noop, noop), "before": (old.annotate, old.produced), "now": (edges.annotate, edges.produced)}
    seq = iter(range(10**9))
    out: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        order = list(modes.items())
        random.shuffle(order)
        for m, (ann, prod) in order:
            memoize.edges.annotate, memoize.edges.produced = ann, prod
            out[m].append(_per_call(small, [np.arange(16.0) + next(seq) for _ in range(calls)]))
    memoize.edges.annotate, memoize.edges.produced = edges.annotate, edges.produced
    return {**{m: min(v) for m, v in out.items()}, **{m + " median": statistics.median(v) for m, v in out.items()}}


def build(path: str, entries: int, runs: int) -> dict:
    """``entries`` cache records in pipelines of four stages (as the cache writes them), ``runs`` runs each using
    one pipeline."""
    import casmon
    from casmon.caching import KIND, KIND_FN, name_digest
    from casmon.keys.digest import Digest

    t0 = time.perf_counter()
    s = casmon.open(path, create=True)
    fns = [f"bench.stage{i}" for i in range(4)]
    version = {fn: os.urandom(16).hex() for fn in fns}
    for fn in fns:
        s.append(KIND_FN, {"fn": fn, "version": version[fn], "time": time.time(), "parts": {"code": {fn: "x"}}},
                 key=name_digest(fn))
    pipelines = entries // 4
    now = time.time()
    last = None
    for p in range(pipelines):
        prev_key = prev_rf = None
        keys = []
        for i, fn in enumerate(fns):
            key = os.urandom(16)
            rf = os.urandom(16).hex()
            rec = {"fn": fn, "result": os.urandom(16).hex(), "time": now, "seconds": 0.001, "size": 64,
                   "v": version[fn], "a": {"x": "0" * 16}, "rf": rf}
            if prev_rf is not None:
                rec["pc"] = {"x": prev_rf}
                rec["up"] = {"x": [prev_key.hex()]}
            s.append(KIND, rec, key=Digest.from_raw(key))
            keys.append(key.hex())
            prev_key, prev_rf = key, rf
        last = keys
        if p % 20000 == 0:
            s.flush()
    s.flush()
    from casmon.caching import observers

    for r in range(runs):
        with casmon.record(store=s, capture_output=False) as run:
            for fn, k in zip(fns, last):
                run._cache_observer(s, fn, Digest(bytes.fromhex(k)), Digest(bytes(16)), True)
    s.close()
    return {"build_s": time.perf_counter() - t0, "version": version["bench.stage1"], "observers": len(observers)}


def _count(g) -> int:
    return len(g) if hasattr(type(g), "__len__") else len(g.nodes)


def query(path: str, what: str, arg: str) -> float:
    import casmon
    from casmon import lineage as lin

    s = casmon.open(path)
    t = time.perf_counter()
    if what == "lineage":
        g = lin.lineage(casmon.load_run("latest", s), s)
        assert _count(g) >= 5, g
    elif what == "used_by":
        g = lin.used_by(arg, s)
        assert _count(g) > 1
    elif what == "used_by_all":
        g = lin.used_by(arg, s)
        assert len(g.nodes) > 1 and g.edges
    else:
        lin.stale(s)
    return time.perf_counter() - t


def _worker(argv: list[str]) -> None:
    what = argv[0]
    if what == "calls":
        print(json.dumps(call_costs(int(argv[1]))))
    elif what == "hooks":
        print(json.dumps(hook_costs(int(argv[1]), argv[2])))
    elif what == "build":
        print(json.dumps(build(argv[1], int(argv[2]), int(argv[3]))))
    else:
        print(json.dumps(query(argv[1], what, argv[2])))


def run(*args: str, tree: str | None = None) -> object:
    env = dict(os.environ, PYTHONPATH=tree or str(ROOT))
    p = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", *args], env=env,
                       capture_output=True, text=True, timeout=4 * 3600)
    if p.returncode:
        raise SystemExit(p.stderr[-3000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return _worker(argv[1:])
    ap = argparse.ArgumentParser()
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--queries-only", action="store_true")
    ap.add_argument("--store", help="the store to query (built there with --build), kept after")
    ap.add_argument("--build", action="store_true")
    ap.add_argument("--before", help="a casmon tree to time alternately with this one")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    c = run("calls", str(a.calls)) if not a.queries_only else {}
    us = {k: v * 1e6 for k, v in c.items()}
    for what in ("miss", "hit") if c else ():
        on, off = us[f"{what} on"], us[f"{what} off"]
        mon, moff = us[f"{what} on median"], us[f"{what} off median"]
        print(f"small {what}: best round {on:.1f} µs with edges, {off:.1f} µs without ({(on / off - 1) * 100:+.1f}%); "
              f"medians {mon:.1f} / {moff:.1f} µs ({(mon / moff - 1) * 100:+.1f}%)")
    if a.store is None:
        path = os.path.join(tempfile.mkdtemp(prefix="casmon-lineage-store-"), "s")
    else:
        path = a.store
    if a.store is None or a.build:
        b = run("build", path, str(a.entries), str(a.runs))
        with open(path + ".json", "w") as f:
            json.dump(b, f)
        print(f"store: {a.entries:,} entries, {a.runs:,} runs, built in {b['build_s']:.1f} s")
        vb = f"bench.stage1@{b['version'][:12]}"
        print(f"first query (used_by, reads every record, writes the index): {float(run('used_by', path, vb)):.2f} s")
    with open(path + ".json") as f:
        b = json.load(f)
    vb = f"bench.stage1@{b['version'][:12]}"
    trees = [("now", None)] + ([("before", a.before)] if a.before else [])
    for _tree, where in trees:  # each tree's index made (or checked) once before the timed rounds
        run("used_by", path, vb, tree=where)
    goals = {"lineage": 1.0, "used_by": 2.0, "used_by_all": None, "stale": 10.0}
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(a.rounds):
        for what in goals:
            for tree, where in trees:
                if what == "used_by_all" and tree == "before":
                    continue  # before, used_by made every node: its used_by row is this one
                arg = vb if what.startswith("used_by") else "-"
                times.setdefault((what, tree), []).append(float(run(what, path, arg, tree=where)))  # type: ignore[arg-type]
    for what, goal in goals.items():
        cells = [f"{tree} {statistics.median(times[(what, tree)]):.2f} s (runs {', '.join(f'{x:.2f}' for x in times[(what, tree)])})"
                 for tree, _w in trees if (what, tree) in times]
        print(f"{what}: " + "; ".join(cells) + (f" (goal <= {goal:g} s)" if goal else ""))

if __name__ == "__main__":
    main()
