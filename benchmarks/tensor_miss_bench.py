"""A cached call's miss on a 128 MiB float32 tensor result against ``torch.save`` of the same tensor (issue 46).

    PYTHONPATH=TREE python -m benchmarks.tensor_miss_bench [--mib 128] [--repeats 7]

``@casmon.cache`` of ``make(seed, n)`` (a key of small arguments; the function draws ``torch.randn`` from a seeded
generator) on a fresh seed each repeat; casmon's cost is the miss minus the bare call of the same function, the
peer's is ``torch.save`` of the same tensor to a new file in the same folder; wall time and the process's CPU
time (every thread's), each less the bare call's. Interleaved (bare, miss, save), the
median of per-repeat ratios. Run it with PYTHONPATH set to each tree in turn to compare trees.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import torch

import casmon


def make(seed: int, n: int) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    n = args.mib << 18
    root = tempfile.mkdtemp(prefix="casmon-tensormiss-")
    try:
        f = casmon.cache(store=casmon.open(os.path.join(root, "s")))(make)
        f(10**6, 1 << 10)  # the store and the code version, once
        rows = []
        for i in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            x = make(i, n)
            bare, bare_cpu = time.perf_counter() - t, time.process_time() - c
            t, c = time.perf_counter(), time.process_time()
            torch.save(x, os.path.join(root, f"t{i}.pt"))
            save, save_cpu = time.perf_counter() - t, time.process_time() - c
            del x
            t, c = time.perf_counter(), time.process_time()
            f(i, n)
            miss, miss_cpu = time.perf_counter() - t - bare, time.process_time() - c - bare_cpu
            rows.append((miss / save, miss, save, miss_cpu / save_cpu, miss_cpu, save_cpu))
        r = statistics.median(x[0] for x in rows)
        print(f"miss {args.mib} MiB tensor (minus the bare call) / torch.save: {r:.2f}x  "
              f"({statistics.median(x[1] for x in rows) * 1e3:.1f} ms vs {statistics.median(x[2] for x in rows) * 1e3:.1f} ms; "
              f"casmon {casmon.__file__})")
        print(f"  CPU, every thread's: {statistics.median(x[3] for x in rows):.2f}x  "
              f"({statistics.median(x[4] for x in rows) * 1e3:.1f} ms vs {statistics.median(x[5] for x in rows) * 1e3:.1f} ms)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
