"""A cache for cluster sweeps (issue 27): what claims cost a small miss, and what they save a sweep.

Run:  python -m benchmarks.sweep_bench            (the sweep with 2 s calls; about a minute)
      python -m benchmarks.sweep_bench --quick    (1 s calls)

* Small misses with the default ``wait=True`` against ``wait=False`` (which never claims), interleaved blocks of
  fresh keys, median of per-block ratios. A function whose calls are quick never claims: after its first call
  both take the same path, so the ratio is the price of deciding that (target <= 1.1x).
* One claimed miss: claim, look the key up again, release (what a slow function's miss pays on top, once per
  computation), on a local folder.
* The sweep: 6 processes each calling the same 4 keys (each call sleeps ``--seconds``), each starting at another
  key, with claims and with ``wait=False``: wall time and computations.
* Takeover: a holder killed with SIGKILL (its process is gone: seen at once on its machine) and one stopped with
  SIGSTOP (alive, but its heartbeats stand still, as a lost node's do): time from the signal until a waiter starts
  computing, at ``CASMON_HEARTBEAT_S=1``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

import casmon
from casmon.caching import claims

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKER = textwrap.dedent(
    """
    import os, sys, time
    import casmon
    store, keys, wait = sys.argv[1], [int(k) for k in sys.argv[2].split(",")], sys.argv[3] == "wait"

    @casmon.cache(store=store, wait=wait)
    def slow(k):
        with open(os.environ["LOG"], "a") as f:
            f.write(f"{k} {time.time()}\\n")
        time.sleep(float(os.environ["SECONDS"]))
        return k * k

    for k in keys:
        assert slow(k) == k * k
    with open(os.environ["LOG"], "a") as f:
        f.write(f"end {time.time()}\\n")
    """
)


def _env(**extra: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


def small_misses(d: str, blocks: int = 21, n: int = 300) -> dict[str, float]:
    s = casmon.open(os.path.join(d, "small"))

    def body(x: int) -> int:
        return x + 1

    waiting = casmon.cache(store=s, version="w")(body)
    plain = casmon.cache(store=s, version="p", wait=False)(body)
    waiting(-1), plain(-1)  # the first call: the waiting one claims once, then knows it is quick
    ratios, w_times, p_times = [], [], []
    k = 0
    for b in range(blocks):
        pair = [plain, waiting] if b % 2 else [waiting, plain]  # either goes first as often: no order bias
        took = {}
        for f in pair:
            t0 = time.perf_counter()
            for i in range(n):
                f(k + i)
            took[f] = time.perf_counter() - t0
        k += n
        ratios.append(took[waiting] / took[plain])
        w_times.append(took[waiting] / n)
        p_times.append(took[plain] / n)
    s.close()
    return {"ratio": statistics.median(ratios), "wait_s": statistics.median(w_times),
            "nowait_s": statistics.median(p_times)}


def claimed_miss(d: str, n: int = 200) -> float:
    s = casmon.open(os.path.join(d, "claim"))
    times = []
    for i in range(n):
        key = casmon.Digest(os.urandom(16))
        t0 = time.perf_counter()
        out = claims.compute_once(s, key, "bench", lambda: False)
        assert out.claim is not None
        claims.claim_book(s).release(out.claim)
        times.append(time.perf_counter() - t0)
    s.close()
    return statistics.median(times)


def sweep(d: str, seconds: float, wait: bool) -> tuple[float, int]:
    """``(seconds from the first computation's start to the last worker's end, computations)``: interpreter
    start-up (seconds of it on a loaded 2-core machine) is left out."""
    loc = os.path.join(d, f"sweep-{wait}")
    casmon.open(loc).close()
    log = os.path.join(d, f"sweep-{wait}.log")
    env = _env(LOG=log, SECONDS=str(seconds))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, loc, ",".join(str((i + j) % 4) for j in range(4)),
                               "wait" if wait else "nowait"], env=env) for i in range(6)]
    for p in procs:
        assert p.wait() == 0
    with open(log) as f:
        rows = [line.split() for line in f]
    starts = [float(t) for k, t in rows if k != "end"]
    ends = [float(t) for k, t in rows if k == "end"]
    return max(ends) - min(starts), len(starts)


def takeover(d: str, how: str) -> float:
    loc = os.path.join(d, f"takeover-{how}")
    casmon.open(loc).close()
    log = os.path.join(d, f"takeover-{how}.log")
    holder = subprocess.Popen([sys.executable, "-c", WORKER, loc, "5", "wait"],
                              env=_env(LOG=log, SECONDS="60", CASMON_HEARTBEAT_S="1"))
    try:
        while not os.path.exists(log):
            time.sleep(0.02)
        waiter = subprocess.Popen([sys.executable, "-c", WORKER, loc, "5", "wait"],
                                  env=_env(LOG=log, SECONDS="0.1", CASMON_HEARTBEAT_S="1"))
        time.sleep(2.5)  # the waiter watches the claim beat
        t_signal = time.time()
        holder.send_signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        assert waiter.wait(timeout=120) == 0
        with open(log) as f:
            starts = [float(t) for k, t in (line.split() for line in f) if k != "end"]
        return starts[1] - t_signal
    finally:
        holder.send_signal(signal.SIGCONT)
        holder.kill()
        holder.wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seconds", type=float, default=None, help="each sweep call's time (default 2, --quick 1)")
    a = ap.parse_args()
    seconds = a.seconds or (1.0 if a.quick else 2.0)
    with tempfile.TemporaryDirectory() as d:
        m = small_misses(d)
        print(f"small miss, wait=True vs wait=False: {m['ratio']:.3f}x "
              f"({m['wait_s'] * 1e6:.1f} us vs {m['nowait_s'] * 1e6:.1f} us; target <= 1.1x)")
        print(f"a claimed miss's claim + fresh lookup + release, local folder: {claimed_miss(d) * 1e6:.0f} us")
        for wait in (False, True):
            wall, computed = sweep(d, seconds, wait)
            print(f"sweep, 6 processes x 4 keys x {seconds:g} s, wait={wait}: {wall:.2f} s from the first computation "
                  f"to the last worker's end, {computed} computations")
        for how in ("kill", "stop"):
            print(f"takeover after SIG{how.upper()} at a 1 s heartbeat: {takeover(d, how):.2f} s")


if __name__ == "__main__":
    main()
