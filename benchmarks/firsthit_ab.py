"""Row 7's first hit, two (or more) casmon trees alternating on one kept store, in wall and CPU time.

    python -m benchmarks.firsthit_ab --trees /tmp/before,. --store STORE [--rounds 15] [--numpy]

Each round runs, for each tree in turn, a fresh ``python -c`` process in that tree (``PYTHONPATH`` and the
working folder set to it, bytecode cached) that does what :mod:`benchmarks.firsthit` does -- import casmon,
open the store, decorate ``benchmarks.firsthit.work``, make one call that must hit -- timing each step by the
wall clock and by the process's CPU time (on a loaded machine the steadier figure). STORE is a store of
``work(i)`` for ``i < --n`` (``python -m benchmarks.speed_bench --worker build casmon STORE 1000000`` builds
one: 2-3 minutes at 1M here, ~850 s under heavy load). Prints each tree's medians and minimums.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

#: What runs in each fresh process: only ``sys`` and ``time`` (and numpy with ``numpy``) before the clock.
DRIVER = """
import sys, time
if sys.argv[3:] == ["numpy"]:
    import numpy  # noqa: F401 - as an ML script has it
t0, c0 = time.perf_counter(), time.process_time()
import casmon
t1, c1 = time.perf_counter(), time.process_time()
from benchmarks.firsthit import CALLS, work
f = casmon.cache(store=casmon.open(sys.argv[1], create=False))(work)
t2, c2 = time.perf_counter(), time.process_time()
k = int(sys.argv[2])
r = f(k)
t3, c3 = time.perf_counter(), time.process_time()
import json
assert r == k * 2 + 1 and CALLS[0] == 0, "the first call missed"
print(json.dumps({"span_s": t3 - t1, "span_cpu_s": c3 - c1, "call_s": t3 - t2, "call_cpu_s": c3 - c2,
                  "total_s": t3 - t0, "total_cpu_s": c3 - c0, "modules": len(sys.modules)}))
"""


def run(tree: Path, store: str, key: int, numpy: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # byte code cached, as for an installed package
    p = subprocess.run([sys.executable, "-c", DRIVER, store, str(key), *(["numpy"] if numpy else [])],
                       capture_output=True, text=True, env=env, cwd=tree, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{tree}: {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trees", required=True, help="comma-separated casmon source trees")
    ap.add_argument("--store", required=True, help="a kept store of benchmarks.firsthit.work")
    ap.add_argument("--n", type=int, default=1_000_000, help="entries in the store (keys are drawn below it)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--numpy", action="store_true", help="numpy imported before the clock starts")
    args = ap.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    res: dict[Path, list[dict]] = {t: [] for t in trees}
    for i in range(args.rounds):
        for t in trees:
            res[t].append(run(t, args.store, (i * 7919 + 13) % args.n, args.numpy))
    for t, rs in res.items():
        def ms(k: str, f=statistics.median) -> str:
            return f"{f(r[k] for r in rs) * 1e3:.1f}"
        print(f"{t}: open + decorate + first call: wall {ms('span_s')} ms (min {ms('span_s', min)}), CPU "
              f"{ms('span_cpu_s')} ms (min {ms('span_cpu_s', min)}); the call alone: wall {ms('call_s')} ms, CPU "
              f"{ms('call_cpu_s')} ms; import through the call: wall {ms('total_s')} ms, CPU {ms('total_cpu_s')} ms; "
              f"{rs[0]['modules']} modules")


if __name__ == "__main__":
    main()
