"""Lookups at scale: cache entries from a thousand to ten million, casmon beside diskcache and joblib.

    python -m benchmarks.scale_bench --sizes 1000,10000,100000,1000000 [--peers]
    python -m benchmarks.scale_bench --sizes 10000000          # by hand: about an hour, ~8 GiB of disk

For each size N and tool, in fresh processes:

* **build** — N misses of a trivial cached function in one process (what a
  sweep over N parameter values does), then the flush; cost per entry.
* **first hit** — a fresh process opens the store and calls the cached
  function once on a stored key (interpreter and ``import`` not counted: that
  is the import-time benchmark's business).
* **random hit** — in the same process, after the first hit, the median of
  ``--hits`` calls on distinct random stored keys (each key once: nothing of it
  is in memory yet). Repeated in ``--repeat`` fresh processes; the median.

Ratios, all from this run: casmon's random hit at N over the same at the
smallest N (flat lookups: the goal is <= 1.5x), casmon's random hit over
diskcache's at the same N (goal <= 2x), casmon's build cost per entry at N over
the same at 10k (goal <= 1.3x), and the first hit (goal <= 10 ms at 1M).

joblib writes a folder per entry; it is built only up to ``--joblib-max``
(100,000 by default) entries. Peers are used when importable
(``pip install -e '.[bench]'``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ("casmon", "diskcache", "joblib")


CALLS = [0]


def work(i):
    """The cached function: trivial, so the figures are the cache's own cost."""
    CALLS[0] += 1
    return i * 2 + 1


# -- the worker side: one tool, one store, in its own process ----------------------
def _import(tool: str) -> None:
    """Import the tool before the clock starts (import time is another benchmark's business)."""
    import importlib

    importlib.import_module({"casmon": "casmon", "diskcache": "diskcache", "joblib": "joblib"}[tool])
    if tool == "casmon":  # numcodecs is imported when a table block is first decoded: an import cost all the same
        importlib.import_module("numcodecs")


def _decorate(tool: str, d: Path):
    """``(cached work, closer)``. The function is this module's, found by name in every process."""
    from benchmarks import scale_bench as m

    if tool == "casmon":
        import casmon

        store = casmon.open(d / "store")
        return casmon.cache(store=store)(m.work), store.close
    if tool == "diskcache":
        import diskcache

        c = diskcache.Cache(str(d / "diskcache"))
        return c.memoize()(m.work), c.close
    if tool == "joblib":
        import joblib

        return joblib.Memory(d / "joblib", verbose=0).cache(m.work), lambda: None
    raise SystemExit(f"unknown tool {tool}")


def _build(tool: str, d: Path, n: int) -> dict:
    _import(tool)
    f, close = _decorate(tool, d)
    t = time.perf_counter()
    for i in range(n):
        f(i)
    close()  # the flush is part of the cost
    dt = time.perf_counter() - t
    files = sum(len(fs) for _, _, fs in os.walk(d))
    return {"build_s": dt, "per_entry_s": dt / n, "files": files}


def hit_times(f, keys) -> list[float]:
    """Seconds of each call ``f(k)`` of ``keys``, each checked to be work()'s answer."""
    times = []
    for k in keys:
        t = time.perf_counter()
        r = f(k)
        times.append(time.perf_counter() - t)
        assert r == k * 2 + 1
    return times


def _hit(tool: str, d: Path, n: int, hits: int, seed: int) -> dict:
    rng = random.Random(seed)
    keys = rng.sample(range(n), min(n, hits + 1))
    _import(tool)
    t = time.perf_counter()
    f, close = _decorate(tool, d)
    r = f(keys[0])
    first = time.perf_counter() - t
    assert r == keys[0] * 2 + 1
    times = hit_times(f, keys[1:])
    from benchmarks import scale_bench as m

    assert m.CALLS[0] == 0, f"{m.CALLS[0]} misses"  # every call above was a hit, or the figure means nothing
    close()
    return {"first_s": first, "hit_s": statistics.median(times) if times else first}


def _worker(argv: list[str]) -> None:
    what, tool, d, n = argv[0], argv[1], Path(argv[2]), int(argv[3])
    if what == "build":
        out = _build(tool, d, n)
    else:
        out = _hit(tool, d, n, int(argv[4]), int(argv[5]))
    print(json.dumps(out))


# -- the driver ---------------------------------------------------------------------
def run(what: str, tool: str, d: Path, n: int, *extra, timeout: float = 24 * 3600) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    # Compiled modules are cached (as pip does for installed packages), in a folder of this run: with
    # PYTHONDONTWRITEBYTECODE every process would compile casmon's lazily imported modules again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(d.parent / "pycache")
    p = subprocess.run([sys.executable, "-m", "benchmarks.scale_bench", "--worker", what, tool, str(d), str(n),
                        *map(str, extra)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{tool} {what} N={n} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def fmt(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.1f} s"


def ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or not b else f"{a / b:.2f}x"


def main(argv=None) -> None:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--worker":
        _worker(sys.argv[2:])
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000", help="comma-separated entry counts")
    ap.add_argument("--peers", action="store_true", help="also diskcache and joblib (when importable)")
    ap.add_argument("--joblib-max", type=int, default=100_000, help="largest N joblib is built at")
    ap.add_argument("--hits", type=int, default=300, help="random-key hits per process")
    ap.add_argument("--repeat", type=int, default=5, help="fresh processes per hit figure (median)")
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the stores")
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    args = ap.parse_args(argv)
    sizes = [int(x.replace("_", "")) for x in args.sizes.split(",")]
    tools = ["casmon"]
    if args.peers:
        import importlib.util

        tools += [t for t in TOOLS[1:] if importlib.util.find_spec(t) is not None]
    base = Path(tempfile.mkdtemp(prefix="casmon-scale-", dir=args.dir))
    res: dict[tuple[str, int], dict] = {}
    try:
        for n in sizes:
            for tool in tools:
                if tool == "joblib" and n > args.joblib_max:
                    continue
                d = base / f"{tool}-{n}"
                d.mkdir()
                b = run("build", tool, d, n)
                hs = [run("hit", tool, d, n, args.hits, seed) for seed in range(args.repeat)]
                r = dict(b, first_s=statistics.median(h["first_s"] for h in hs),
                         hit_s=statistics.median(h["hit_s"] for h in hs))
                res[(tool, n)] = r
                print(f"{tool:9} N={n:>9,}: build {fmt(r['per_entry_s'])}/entry ({fmt(r['build_s'])}, "
                      f"{r['files']} files), first hit {fmt(r['first_s'])}, random hit {fmt(r['hit_s'])}",
                      flush=True)
                if not args.keep:
                    shutil.rmtree(d, ignore_errors=True)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    report(res, sizes, tools)
    if args.json:
        Path(args.json).write_text(json.dumps([dict(tool=t, n=n, **r) for (t, n), r in res.items()], indent=1))


def report(res: dict, sizes: list[int], tools: list[str]) -> None:
    """The table of figures and the ratios the goals are stated in."""
    g = lambda t, n, k: res.get((t, n), {}).get(k)  # noqa: E731
    small = sizes[0]
    ref_build = 10_000 if ("casmon", 10_000) in res else small
    print()
    head = ["N", "tool", "build/entry", "first hit", "random hit"]
    print(" | ".join(head))
    for n in sizes:
        for t in tools:
            if (t, n) in res:
                print(f"{n:,} | {t} | {fmt(g(t, n, 'per_entry_s'))} | {fmt(g(t, n, 'first_s'))} | {fmt(g(t, n, 'hit_s'))}")
    print()
    print(f"N | casmon hit / hit at {small:,} | casmon hit / diskcache hit | casmon build / build at {ref_build:,} "
          f"| casmon build / diskcache build | casmon first hit")
    for n in sizes:
        print(f"{n:,} | {ratio(g('casmon', n, 'hit_s'), g('casmon', small, 'hit_s'))} | "
              f"{ratio(g('casmon', n, 'hit_s'), g('diskcache', n, 'hit_s'))} | "
              f"{ratio(g('casmon', n, 'per_entry_s'), g('casmon', ref_build, 'per_entry_s'))} | "
              f"{ratio(g('casmon', n, 'per_entry_s'), g('diskcache', n, 'per_entry_s'))} | {fmt(g('casmon', n, 'first_s'))}")


if __name__ == "__main__":
    main()
