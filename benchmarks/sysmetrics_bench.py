"""System metrics (issue 43): what sampling a live run's sys/... metrics costs, as a share of one core.

Run:  python -m benchmarks.sysmetrics_bench           (2,000 timed samples; the live thread for 20 s)
      python -m benchmarks.sysmetrics_bench --quick   (500 samples; 5 s)

* Per sample: the CPU time (``time.thread_time``: this thread's, so other load on the machine does not count)
  of one sample of a live run -- the psutil readings (and NVML's where a GPU is), and logging the points into
  the run -- times the default rate (one sample every 10 s): the goal is at most 1% of one core.
* The same from the sampling thread itself: a run sampled every 0.1 s, the ``casmon-run-sysmetrics``
  thread's CPU time (psutil's per-thread times) over the samples it took, wake-ups included.
* MLflow's ``SystemMetricsMonitor`` monitors (CPU, disk, network; GPU where one is) when mlflow is
  installed: one ``collect_metrics`` of each, and their ``aggregate_metrics``, per sample. MLflow's logging
  of the sample to its tracking store is not counted (a casmon sample's logging is).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import warnings

import casmon
from casmon.runs import live, sysmetrics


def _per_sample(fn, n: int, blocks: int = 5) -> float:
    """Median over blocks of the CPU seconds one call of ``fn`` takes in this thread."""
    out = []
    for _ in range(blocks):
        t0 = time.thread_time()
        for _ in range(n // blocks):
            fn()
        out.append((time.thread_time() - t0) / (n // blocks))
    return statistics.median(out)


def casmon_sample(store: str, n: int) -> tuple[float, int]:
    """(CPU seconds per sample, metrics per sample) of a live run's sampler, timed in this thread."""
    with casmon.record(store=store, system_metrics=False, capture_output=False) as run:
        sampler = sysmetrics.start(run, 3600.0)  # its own, never due on the sampling thread: ticked here
        if sampler is None:
            raise SystemExit("psutil is not installed: nothing to sample")

        def one() -> None:
            sampler.next_at = 0.0
            sampler.tick()

        one()
        cost = _per_sample(one, n)
        names = len([k for k in run._metrics.names if k.startswith(sysmetrics.PREFIX)])
        live.unwatch(id(run))
    return cost, names


def casmon_thread(store: str, seconds: float) -> tuple[float, int] | None:
    """(CPU seconds per sample, samples) of the sampling thread itself, sampling every 0.1 s for ``seconds``."""
    import psutil

    proc = psutil.Process()
    with casmon.record(store=store, system_metrics_s=0.1, capture_output=False) as run:
        t = next((t for t in threading.enumerate() if t.name == "casmon-run-sysmetrics"), None)
        if t is None or t.native_id is None:
            return None

        def cpu() -> float:
            for th in proc.threads():
                if th.id == t.native_id:
                    return th.user_time + th.system_time
            return 0.0

        def samples() -> int:
            with run._metrics.lock:
                p = run._metrics.pending.get("sys/rss_bytes")
                return (len(p.steps) if p else 0) + run._metrics.summary.get("sys/rss_bytes", {}).get("n", 0)

        c0, s0 = cpu(), samples()
        time.sleep(seconds)
        c1, s1 = cpu(), samples()
    return ((c1 - c0) / (s1 - s0), s1 - s0) if s1 > s0 else None


def mlflow_sample(n: int) -> float | None:
    try:
        from mlflow.system_metrics.metrics.cpu_monitor import CPUMonitor
        from mlflow.system_metrics.metrics.disk_monitor import DiskMonitor
        from mlflow.system_metrics.metrics.network_monitor import NetworkMonitor
    except ImportError:
        return None
    monitors = [CPUMonitor(), DiskMonitor(), NetworkMonitor()]
    try:
        from mlflow.system_metrics.metrics.gpu_monitor import GPUMonitor

        monitors.append(GPUMonitor())
    except Exception:  # noqa: BLE001 - no pynvml or no GPU: MLflow samples none either
        pass

    def one() -> None:
        for m in monitors:
            m.collect_metrics()
        for m in monitors:
            m.aggregate_metrics()
            m.clear_metrics()

    one()
    return _per_sample(one, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n, seconds = (500, 5.0) if args.quick else (2000, 20.0)
    rate = 1.0 / sysmetrics.INTERVAL_S
    warnings.simplefilter("ignore")
    with tempfile.TemporaryDirectory() as tmp:
        ours, names = casmon_sample(os.path.join(tmp, "a"), n)
        thread = casmon_thread(os.path.join(tmp, "b"), seconds)
    theirs = mlflow_sample(n)
    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores, {platform.machine()}, "
          f"load {os.getloadavg()[0]:.2f}; default interval {sysmetrics.INTERVAL_S:g} s")
    print("| what | CPU per sample | share of one core at the default interval | goal |")
    print("|---|---|---|---|")
    print(f"| casmon sampler, {names} sys/ metrics, timed in the caller | {ours * 1e6:.0f} µs | "
          f"{ours * rate * 100:.4f}% | <= 1% |")
    if thread is not None:
        print(f"| casmon sampling thread, {thread[1]} samples at 0.1 s | {thread[0] * 1e6:.0f} µs | "
              f"{thread[0] * rate * 100:.4f}% | <= 1% |")
    if theirs is None:
        print("| MLflow SystemMetricsMonitor | not installed | | |")
    else:
        print(f"| MLflow SystemMetricsMonitor monitors (collect + aggregate, no logging) | {theirs * 1e6:.0f} µs | "
              f"{theirs * rate * 100:.4f}% | |")


if __name__ == "__main__":
    main()
