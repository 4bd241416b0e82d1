"""Large values, import weight and the exit flush (issue 14), side by side with the floors.

Run:  python -m benchmarks.large_bench                 (256 MiB arrays, a few minutes)
      python -m benchmarks.large_bench --quick         (64 MiB, fewer repeats)
      python -m benchmarks.large_bench --casmon PATH   (measure another casmon tree, e.g. a
                                                        `git worktree` of an older commit)

Prints one table. Every ratio compares casmon with a baseline measured in the
same run, interleaved with it (baseline, casmon, baseline, casmon, ...), and is
the median of the per-repeat ratios: the machines this runs on are shared, so
absolute times move a lot between runs and even between repeats.

Floors: writing to a *new* file with ``np.save`` (casmon writes new files;
rewriting one file in place skips the page-cache allocation and is not a fair
floor), ``np.load`` of it, ``pickle`` to a new file and back, ``a.copy()`` (a
cache hit must hand back a fresh copy), the plain function call (a miss), and
the import of joblib and diskcache and the exit of callmonitor 0.3.7.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def _setup_path(casmon_tree: str | None) -> str:
    tree = os.path.abspath(casmon_tree) if casmon_tree else str(ROOT)
    sys.path.insert(0, tree)
    return tree


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def med(xs) -> float:
    return statistics.median(xs)


def bytes_under(p: Path, subs=("objects", "packs")) -> int:
    return sum(f.stat().st_size for s in subs for f in (p / s).rglob("*") if f.is_file())


# -- put / get -----------------------------------------------------------------------------------------------


def bench_put_get(rows, tmp: Path, nbytes: int, repeat: int, label: str, a) -> None:
    import numpy as np

    import casmon

    put_r, get_r, pput_r, pget_r, times = [], [], [], [], []
    stored = 0
    for r in range(repeat):
        npy = tmp / f"a{r}.npy"
        t_save = timed(lambda: np.save(npy, a))
        s = casmon.open(tmp / f"s{r}", autoflush=None)
        t0 = time.perf_counter()
        d = s.put(a)
        s.flush()
        t_put = time.perf_counter() - t0
        pk = tmp / f"a{r}.pkl"

        def pdump():
            with open(pk, "wb") as f:
                pickle.dump(a, f, protocol=5)

        t_pdump = timed(pdump)
        # Reads: the better of two, so both read from the page cache (a first read may meet the
        # neighbours' writeback and measure the disk, 0.1 GB/s here, for np.load and get alike).
        t_load = min(timed(lambda: np.load(npy)) for _ in range(2))
        s2 = casmon.open(tmp / f"s{r}")
        t_get = min(timed(lambda: s2.get(d)) for _ in range(2))

        def pload():
            with open(pk, "rb") as f:
                pickle.load(f)

        t_pload = timed(pload)
        assert np.array_equal(s2.get(d), a)
        stored = bytes_under(tmp / f"s{r}")
        s.close()
        shutil.rmtree(tmp / f"s{r}")
        npy.unlink()
        pk.unlink()
        put_r.append(t_save / t_put)
        get_r.append(t_load / t_get)
        pput_r.append(t_pdump / t_put)
        pget_r.append(t_pload / t_get)
        times.append((t_save, t_put, t_load, t_get, t_pdump, t_pload))
    t_save, t_put, t_load, t_get, t_pdump, t_pload = (med(x) for x in zip(*times))
    gbs = lambda t: f"{nbytes / t / 1e9:.2f} GB/s"  # noqa: E731
    size = f"{nbytes / MiB:.0f} MiB {label}"
    rows.append(("put + flush", size, gbs(t_put), "np.save (new file)", gbs(t_save), med(put_r), ">= 0.5" if "random" in label else ""))
    rows.append(("put + flush", size, gbs(t_put), "pickle.dump (new file)", gbs(t_pdump), med(pput_r), ""))
    rows.append(("get", size, gbs(t_get), "np.load", gbs(t_load), med(get_r), ">= 0.6" if "random" in label else ""))
    rows.append(("get", size, gbs(t_get), "pickle.load", gbs(t_pload), med(pget_r), ""))
    rows.append(("stored", size, f"{stored / MiB:.0f} MiB", "raw size", f"{nbytes / MiB:.0f} MiB", nbytes / stored, ""))


# -- cache hit / miss --------------------------------------------------------------------------------------


def _double(x):
    return x * 2


def bench_cache(rows, tmp: Path, nbytes: int, repeat: int) -> None:
    import numpy as np

    import casmon

    a = np.random.default_rng(3).random(nbytes // 8)
    hit_r, miss_r, th, tc, tm, tp = [], [], [], [], [], []
    for r in range(repeat):
        s = casmon.open(tmp / f"c{r}", autoflush=None)
        f = casmon.cache(store=s)(_double)
        t_plain = timed(lambda: _double(a))
        t_miss = timed(lambda: f(a))
        t_copy = timed(lambda: a.copy())
        t_hit = timed(lambda: f(a))
        s.close()
        shutil.rmtree(tmp / f"c{r}")
        hit_r.append(t_hit / t_copy)
        miss_r.append(t_miss / t_plain)
        th.append(t_hit), tc.append(t_copy), tm.append(t_miss), tp.append(t_plain)
    size = f"{nbytes / MiB:.0f} MiB float64 arg and result"
    rows.append(("cache hit", size, f"{med(th) * 1e3:.0f} ms", "a.copy()", f"{med(tc) * 1e3:.0f} ms", med(hit_r), "<= 1.5"))
    rows.append(("cache miss", size, f"{med(tm) * 1e3:.0f} ms", "the plain call (x * 2)", f"{med(tp) * 1e3:.0f} ms", med(miss_r), ""))


# -- arrays inside objects -----------------------------------------------------------------------------------


def bench_nested(rows, tmp: Path) -> None:
    import numpy as np

    import casmon

    a = np.random.default_rng(4).integers(0, 1000, 32 * MiB // 8).astype(np.float64)
    out = {}
    for name, v in (("bare", a), ("dict", {"x": a}), ("list", [a, "label"])):
        s = casmon.open(tmp / f"n-{name}", autoflush=None)
        s.put(v)
        s.close()
        out[name] = bytes_under(tmp / f"n-{name}")
        shutil.rmtree(tmp / f"n-{name}")
    for name in ("dict", "list"):
        what = '{"x": a}' if name == "dict" else "[a, 'label']"
        rows.append(("nested array", f"{what}, a = 32 MiB integer-valued float64", f"{out[name] / MiB:.1f} MiB",
                     "the bare array", f"{out['bare'] / MiB:.1f} MiB", out[name] / out["bare"], "<= 1.05"))


# -- import --------------------------------------------------------------------------------------------------


def _import_ms(py: str, mod: str, env: dict, cwd: str) -> float:
    r = subprocess.run([py, "-X", "importtime", "-c", f"import {mod}"], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=120)
    line = [ln for ln in r.stderr.splitlines() if ln.rstrip().endswith(f"| {mod}")][-1]
    return int(line.split("|")[1]) / 1e3


def bench_import(rows, tmp: Path, tree: str, repeat: int) -> None:
    """Cumulative import time of the top module (-X importtime): net of the interpreter's own start.

    Byte code is cached (in a temporary PYTHONPYCACHEPREFIX), as it is in any installed package.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")
    env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    cwd = str(tmp)
    peers = [m for m in ("joblib", "diskcache") if subprocess.run([sys.executable, "-c", f"import {m}"], env=env, cwd=cwd,
                                                                  capture_output=True).returncode == 0]
    subprocess.run([sys.executable, "-c", "import casmon"], env=env, cwd=cwd, check=True)  # write the byte code
    times = {m: [] for m in ["casmon", *peers]}
    for _ in range(repeat):
        for m in times:
            times[m].append(_import_ms(sys.executable, m, env, cwd))
    c = med(times["casmon"])
    for m in peers:
        p = med(times[m])
        rows.append(("import", "net of the interpreter", f"{c:.0f} ms", m, f"{p:.0f} ms", c / p, "<= 1" if m == "joblib" else ""))
    if not peers:
        rows.append(("import", "net of the interpreter", f"{c:.0f} ms", "joblib", "not installed", None, "<= 1"))


# -- the exit flush after 100k logged calls ------------------------------------------------------------------

_EXIT_CHILD = r"""
import os, sys, time
tool, where, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.chdir(where)
if tool == "casmon":
    import casmon
    s = casmon.open(os.path.join(where, "s"))
    deco = casmon.intercept(store=s)
else:
    import callmonitor
    deco = callmonitor.intercept

@deco
def f(a, b=2):
    return a + b

t0 = time.perf_counter()
for i in range(n):
    f(i)
loop = time.perf_counter() - t0
sys.stdout.write(f"{loop} {time.time()}\n")
sys.stdout.flush()
"""


def _exit_run(tool: str, tmp: Path, tree: str, n: int) -> tuple[float, float]:
    where = tmp / f"exit-{tool}"
    where.mkdir()
    env = dict(os.environ)
    env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.Popen([sys.executable, "-c", _EXIT_CHILD, tool, str(where), str(n)], stdout=subprocess.PIPE, text=True,
                         env=env, cwd=str(where))
    line = p.stdout.readline()
    p.wait()
    end = time.time()
    shutil.rmtree(where)
    if p.returncode != 0 or not line:
        raise RuntimeError(f"{tool} exit run failed ({p.returncode})")
    loop, last = (float(x) for x in line.split())
    return loop, end - last


def bench_exit(rows, tmp: Path, tree: str, repeat: int, n: int, cm_calls: int) -> None:
    """casmon after ``n`` calls; callmonitor after ``cm_calls`` (it writes a folder per call as the call
    happens, about 0.3-0.7 ms each, so its exit does not grow with the count while its loop does)."""
    try:
        import callmonitor  # noqa: F401

        has_cm = True
    except ImportError:
        has_cm = False
    res = {"casmon": [], "callmonitor": []}
    for r in range(repeat):
        res["casmon"].append(_exit_run("casmon", tmp, tree, n))
        if has_cm and r < 2:
            res["callmonitor"].append(_exit_run("callmonitor", tmp, tree, cm_calls))
    c_loop, c_exit = (med(x) for x in zip(*res["casmon"]))
    rows.append(("loop", f"{n:,} logged calls, before the exit", f"{c_loop * 1e3:.0f} ms", "", "", None, ""))
    if has_cm:
        m_loop, m_exit = (med(x) for x in zip(*res["callmonitor"]))
        rows.append(("exit", f"after {n:,} logged calls (flush + exit)", f"{c_exit * 1e3:.0f} ms",
                     f"callmonitor, after {cm_calls:,} calls", f"{m_exit * 1e3:.0f} ms", c_exit / m_exit, "<= 150 ms"))
        rows.append(("loop + exit", f"per logged call, {n:,} calls", f"{(c_loop + c_exit) / n * 1e6:.1f} µs",
                     "callmonitor", f"{(m_loop + m_exit) / cm_calls * 1e6:.1f} µs",
                     ((c_loop + c_exit) / n) / ((m_loop + m_exit) / cm_calls), ""))
    else:
        rows.append(("exit", f"after {n:,} logged calls (flush + exit)", f"{c_exit * 1e3:.0f} ms", "callmonitor",
                     "not installed", None, "<= 150 ms"))


# -- main ------------------------------------------------------------------------------------------------------


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="64 MiB arrays, fewer repeats")
    ap.add_argument("--casmon", metavar="PATH", help="the casmon source tree to measure (default: this checkout)")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--only", default="putget,cache,nested,import,exit", help="comma-separated parts to run")
    ap.add_argument("--cm-calls", type=int, default=10_000, help="calls for callmonitor's exit run (slow: a folder each)")
    args = ap.parse_args(argv)
    tree = _setup_path(args.casmon)
    import numpy as np

    import casmon

    nbytes = (64 if args.quick else 256) * MiB
    repeat = args.repeat or (3 if args.quick else 5)
    only = set(args.only.split(","))
    rows: list = []
    tmp = Path(tempfile.mkdtemp(prefix="casmon-large-"))
    try:
        if "putget" in only:
            bench_put_get(rows, tmp, nbytes, repeat, "random float64", np.random.default_rng(1).random(nbytes // 8))
            ints = np.random.default_rng(2).integers(0, 1000, nbytes // 8).astype(np.float64)
            bench_put_get(rows, tmp, nbytes, repeat, "integer-valued float64", ints)
            del ints
        if "cache" in only:
            bench_cache(rows, tmp, nbytes, repeat)
        if "nested" in only:
            bench_nested(rows, tmp)
        if "import" in only:
            bench_import(rows, tmp, tree, max(repeat, 7))
        if "exit" in only:
            bench_exit(rows, tmp, tree, repeat, 100_000, args.cm_calls)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"casmon from {Path(casmon.__file__).parent}; Python {sys.version.split()[0]}; "
          f"medians of {repeat} interleaved repeats\n")
    print("| what | workload | casmon | baseline | baseline figure | ratio | target |")
    print("|---|---|---|---|---|---|---|")
    for what, work, c, base, bfig, ratio, target in rows:
        r = f"{ratio:.2f}x" if ratio is not None else ""
        print(f"| {what} | {work} | {c} | {base} | {bfig} | {r} | {target} |")


if __name__ == "__main__":
    main()
