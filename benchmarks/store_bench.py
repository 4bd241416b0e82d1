"""Benchmarks of casmon's store, side by side with what people use today.

Run:  python -m benchmarks.store_bench            (about two minutes, 1 GiB arrays)
      python -m benchmarks.store_bench --quick    (smaller sizes, seconds)

Prints one table. Every figure is measured in this run; ratios compare casmon
with a baseline measured in the same run (joblib.hash, a memory copy, one
stored copy). Timings are medians of a few repetitions on warm memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import casmon  # noqa: E402
from casmon.store.objects import loose_key  # noqa: E402

GiB = 1 << 30
MiB = 1 << 20


def median_time(fn, repeat=3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def files_under(p: Path) -> int:
    return sum(1 for x in p.rglob("*") if x.is_file())


def bytes_under(p: Path) -> int:
    return sum(x.stat().st_size for x in p.rglob("*") if x.is_file())


def bench_fingerprint(rows, size):
    a = np.random.default_rng(0).random(size // 8)
    out = np.empty_like(a)
    np.copyto(out, a)  # warm both buffers
    casmon.fingerprint(a)
    t_fp = median_time(lambda: casmon.fingerprint(a))
    t_copy = median_time(lambda: np.copyto(out, a))
    gbs = lambda t: a.nbytes / t / 1e9  # noqa: E731
    rows.append(("fingerprint", f"{a.nbytes / GiB:.2f} GiB float64", f"{gbs(t_fp):.1f} GB/s", "memory copy", f"{gbs(t_copy):.1f} GB/s", t_copy / t_fp, ">= 0.7"))
    try:
        import joblib

        t_jl = median_time(lambda: joblib.hash(a), repeat=1)
        rows.append(("fingerprint", f"{a.nbytes / GiB:.2f} GiB float64", f"{gbs(t_fp):.1f} GB/s", "joblib.hash", f"{gbs(t_jl):.2f} GB/s", t_jl / t_fp, ">= 20"))
    except ImportError:
        rows.append(("fingerprint", "", "", "joblib.hash", "joblib not installed", None, ">= 20"))


def bench_put_get(rows, tmp: Path, size):
    a = np.random.default_rng(0).integers(0, 1000, size // 8).astype(np.float64)
    s = casmon.open(tmp / "putget", autoflush=None)
    t = time.perf_counter()
    d = s.put(a)
    s.flush()
    t_put = time.perf_counter() - t
    s2 = casmon.open(tmp / "putget")
    b = s2.get(d)  # first read: page faults of fresh memory included
    del b
    t_get = median_time(lambda: s2.get(d))
    out = np.empty_like(a)
    t_copy = median_time(lambda: np.copyto(out, a))
    rows.append(("put", f"{a.nbytes / GiB:.2f} GiB float64 (integer-valued)", f"{a.nbytes / t_put / 1e9:.2f} GB/s", "memory copy", f"{a.nbytes / t_copy / 1e9:.1f} GB/s", t_copy / t_put, ""))
    rows.append(("get", f"{a.nbytes / GiB:.2f} GiB float64 (integer-valued)", f"{a.nbytes / t_get / 1e9:.2f} GB/s", "memory copy", f"{a.nbytes / t_copy / 1e9:.1f} GB/s", t_copy / t_get, ""))
    stored = bytes_under(tmp / "putget" / "objects")
    rows.append(("compression", "the same array", f"{stored / MiB:.0f} MiB stored", "raw size", f"{a.nbytes / MiB:.0f} MiB", a.nbytes / stored, ""))
    # One element changed: how many new chunks?
    before = set(s.manifest(d).chunk_digests())
    a[len(a) // 3] = -1
    d2 = s.put(a)
    new = set(s.manifest(d2).chunk_digests()) - before
    rows.append(("edit", "change 1 element, put again", f"{len(new)} new chunks", "chunks in array", f"{len(before)}", None, "<= 2"))
    z = s2.open_array(d)
    z[len(a) // 2]
    rows.append(("open_array", "read one row", f"{z.store.chunks_read} chunks read", "chunks in array", f"{len(before)}", None, "<= 2"))
    s.close()
    shutil.rmtree(tmp / "putget")


def bench_dedup(rows, tmp: Path, n_puts=200):
    a = np.random.default_rng(1).random(16 * MiB // 8)
    one = casmon.open(tmp / "one", autoflush=None)
    one.put(a)
    one.close()
    one_bytes = bytes_under(tmp / "one")
    many = casmon.open(tmp / "many", autoflush=None)
    for _ in range(n_puts):
        many.put(a.copy())
    many.close()
    many_bytes = bytes_under(tmp / "many")
    rows.append(("dedup", f"{n_puts} puts of one 16 MiB array", f"{many_bytes / MiB:.1f} MiB", "one stored copy", f"{one_bytes / MiB:.1f} MiB", many_bytes / one_bytes, "<= 1.05"))
    try:
        import joblib

        mem = joblib.Memory(tmp / "joblib", verbose=0)

        @mem.cache
        def same_result(i):
            return a

        for i in range(n_puts):
            same_result(i)
        jb = bytes_under(tmp / "joblib")
        rows.append(("dedup", f"{n_puts} cached calls returning it", f"{many_bytes / MiB:.1f} MiB", "joblib.Memory", f"{jb / MiB:.0f} MiB", many_bytes / jb, ""))
    except ImportError:
        pass


def bench_small_records(rows, tmp: Path, n=100_000):
    s = casmon.open(tmp / "records", autoflush=None)
    t = time.perf_counter()
    for i in range(n):
        s.append("call", {"fn": "f", "i": i, "args": ["a", i]})
        if i % 10_000 == 9_999:
            s.flush()
    s.flush()
    dt = time.perf_counter() - t
    nfiles = files_under(tmp / "records")
    rows.append(("records", f"{n:,} small records", f"{nfiles} files", "one file each", f"{n:,} files", nfiles / n, "<= 100 files"))
    rows.append(("records", f"append + flush {n:,}", f"{dt / n * 1e6:.1f} µs each", "", "", None, ""))


_LOOKUP_CHILD = r"""
import json, os, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
t0 = time.perf_counter()
import casmon
base = rss()
t1 = time.perf_counter()
s = casmon.open(sys.argv[1], read_only=True)
key = bytes.fromhex(sys.argv[2])
t2 = time.perf_counter()
found = s.lookup("cache", key)
t3 = time.perf_counter()
miss = s.lookup("cache", b"\x00" * 16)
t4 = time.perf_counter()
assert found and not miss
print(json.dumps({"open": t2 - t1, "lookup": t3 - t2, "miss": t4 - t3, "rss": rss() - base}))
"""


def bench_growth(rows, tmp: Path, sizes):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    results = {}
    for n in sizes:
        path = tmp / f"grow{n}"
        s = casmon.open(path, autoflush=None)
        probe = None
        for i in range(n):
            k = s.append("cache", {"result": "0" * 32, "i": i}, key=os.urandom(16))
            if i == n // 2:
                probe = k
            if i % 50_000 == 49_999:
                s.flush()
        s.close()
        runs = []
        for _ in range(3):
            p = subprocess.run([sys.executable, "-c", _LOOKUP_CHILD, str(path), probe.hex()], capture_output=True, text=True, env=env, check=True)
            runs.append(json.loads(p.stdout))
        r = {k: statistics.median(x[k] for x in runs) for k in runs[0]}
        results[n] = r
        shutil.rmtree(path)
    base = results[sizes[0]]
    for n, r in results.items():
        total = r["open"] + r["lookup"]
        btotal = base["open"] + base["lookup"]
        rows.append(("growth", f"{n:,} records: open + find one", f"{total * 1000:.1f} ms (open {r['open'] * 1000:.1f}, find {r['lookup'] * 1000:.1f}, miss {r['miss'] * 1000:.1f}); memory +{r['rss'] / MiB:.1f} MiB",
                     f"{sizes[0]:,} records", f"{btotal * 1000:.1f} ms", total / btotal, "<= 10"))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (seconds, not minutes)")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    size = 64 * MiB if args.quick else GiB
    growth = [1_000, 10_000, 100_000] if args.quick else [1_000, 100_000, 1_000_000]
    rows: list[tuple] = []
    tmp = Path(tempfile.mkdtemp(prefix="casmon-bench-"))
    console = Console(width=max(Console().width, 170))
    try:
        with console.status("fingerprint"):
            bench_fingerprint(rows, size)
        with console.status("put / get"):
            bench_put_get(rows, tmp, size)
        with console.status("dedup"):
            bench_dedup(rows, tmp, 20 if args.quick else 200)
        with console.status("small records"):
            bench_small_records(rows, tmp, 10_000 if args.quick else 100_000)
        with console.status("growth"):
            bench_growth(rows, tmp, growth)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    t = Table(title=f"casmon store benchmarks (casmon {casmon.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} cores)")
    for col in ("what", "workload", "casmon", "baseline", "baseline figure", "ratio", "target"):
        t.add_column(col)
    for what, load, fig, base, bfig, ratio, target in rows:
        t.add_row(what, load, fig, base, bfig, "" if ratio is None else f"{ratio:.3g}x", target)
    console.print(t)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
