"""The ML round's transposed-array row: ``fingerprint`` of a 4096² float64 array, its transpose and a
Fortran-ordered copy, interleaved, medians of 5, wall and CPU (both threads: on a loaded machine the
CPU ratios are the steadier figure); prints one JSON line.

``PYTHONPATH=TREE python -m benchmarks.transpose_bench [ROWSxCOLS [DTYPE]]`` measures the casmon at TREE
(4096x4096 float64 unless given: ``300x50000 u1`` times that shape and dtype of random bytes); run two trees
alternately, a few processes each, to compare them (docs/BENCHMARKS.md, "ML values").
"""

import json
import statistics
import sys
import time

import numpy as np

from casmon import fingerprint


def main() -> None:
    rows, cols = (int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "4096x4096").split("x"))
    dtype = np.dtype(sys.argv[2] if len(sys.argv) > 2 else "f8")
    a = np.random.default_rng(0).integers(0, 256, rows * cols * dtype.itemsize, dtype=np.uint8).view(dtype)
    a = a.reshape(rows, cols)
    values = {"c": a, "T": a.T, "F": np.asfortranarray(a)}
    for v in values.values():
        fingerprint(v)  # threads started, pages touched
    took: dict[str, list[float]] = {k: [] for k in values}
    cpu: dict[str, list[float]] = {k: [] for k in values}
    for _ in range(5):
        for k, v in values.items():
            t, c = time.perf_counter(), time.process_time()
            fingerprint(v)
            took[k].append(time.perf_counter() - t)
            cpu[k].append(time.process_time() - c)
    m = {k: statistics.median(v) for k, v in took.items()}
    mc = {k: statistics.median(v) for k, v in cpu.items()}
    print(json.dumps({"shape": f"{rows}x{cols}", "dtype": dtype.str,
                      "c_ms": m["c"] * 1e3, "T_ms": m["T"] * 1e3, "F_ms": m["F"] * 1e3,
                      "T/c": m["T"] / m["c"], "F/c": m["F"] / m["c"],
                      "cpu_c_ms": mc["c"] * 1e3, "cpu_T/c": mc["T"] / mc["c"], "cpu_F/c": mc["F"] / mc["c"]}))


if __name__ == "__main__":
    main()
