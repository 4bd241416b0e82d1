"""A live run's system metrics: CPU, memory, disk and network through psutil, GPUs through nvidia-ml-py.

Every ``system_metrics_s`` seconds (default :data:`INTERVAL_S`) the
``casmon-run-sysmetrics`` thread (:func:`casmon.runs.live.sample`) logs into
the run:

* ``sys/cpu_percent`` (this process, percent of one core: above 100 on several),
  ``sys/rss_bytes`` (this process), ``sys/host_mem_percent``;
* ``sys/disk_read_bytes_per_s``, ``sys/disk_write_bytes_per_s``,
  ``sys/net_sent_bytes_per_s``, ``sys/net_recv_bytes_per_s`` (the host's, over
  the last interval);
* per GPU that NVML sees (its NVML index, not CUDA's): ``sys/gpu{i}/util_percent``,
  ``sys/gpu{i}/mem_bytes``, ``sys/gpu{i}/power_w``, ``sys/gpu{i}/temp_c``.

They are keyed by time, not by the user's step: their step is the sample's
number (0, 1, 2, ...; a resumed run's go on after its last), counted apart from
the run's own counter, and each point carries its wall time, which is the axis
to read them on. The first sample only primes the rates, so the first points
land one interval after the start.

psutil missing, or NVML missing or failing where a GPU is present, is one
:class:`~casmon.runs.recorder.RunWarning` line at the run's start; a reading
that fails mid-run skips that metric for that sample, said once per run; the
run never sees an error. nvidia-ml-py is imported only where a GPU is present
(``/dev/nvidia*``) or the user has imported it already.
"""

from __future__ import annotations

import glob
import math
import numbers
import os
import sys
import threading
import time
import warnings
from typing import Any

__all__ = ["INTERVAL_S", "PREFIX", "interval", "start", "Sampler", "gpu_present", "users_first"]

#: Seconds between two samples by default.
INTERVAL_S = 10.0
#: The shortest interval accepted: faster sampling would cost the run more than it tells.
MIN_INTERVAL_S = 0.01
#: The longest: a day (the sampling thread's wait must stay within what a timeout can be).
MAX_INTERVAL_S = 86400.0
PREFIX = "sys/"
#: A sample is taken when the sampling thread comes within this share of an interval of its time.
_SLACK = 0.1


def interval(enabled: Any, every: Any, where: str) -> float | None:
    """The sampling interval ``record(system_metrics=, system_metrics_s=)`` asks for (None: off); a clear error
    for anything else."""
    if type(enabled) is not bool:
        raise TypeError(f"{where}: system_metrics must be True or False, got {type(enabled).__name__} {enabled!r:.80}")
    seconds = None
    if isinstance(every, numbers.Real) and not isinstance(every, bool):  # numpy's numbers, a Fraction: their value
        try:
            seconds = float(every)
        except (OverflowError, ValueError, TypeError):  # an int beyond any float
            pass
    if seconds is None or not MIN_INTERVAL_S <= seconds <= MAX_INTERVAL_S:  # NaN fails too
        raise ValueError(f"{where}: system_metrics_s must be a number of seconds from {MIN_INTERVAL_S:g} to "
                         f"{MAX_INTERVAL_S:g}, got {every!r:.80}")
    return seconds if enabled else None


def users_first(names: Any, group: str = "") -> list[str]:
    """``names`` sorted with the user's metrics before the ``sys/`` ones (``group``: a prefix such as
    ``"metric."`` the names carry): where only the first few are shown, the sampled ones never crowd them out."""
    return sorted(names, key=lambda n: (n.startswith(group + PREFIX), n))


def gpu_present() -> bool:
    """Whether this machine shows an NVIDIA GPU (its device files), without loading NVML."""
    return bool(glob.glob("/dev/nvidia[0-9]*"))


class _Host:
    """The readings psutil gives: this process's CPU and memory, the host's memory, disk and network rates."""

    def __init__(self, psutil: Any) -> None:
        self.psutil = psutil
        self.proc = psutil.Process()
        self.last: dict[str, tuple[float, float]] = {}  # counter name -> (its value, when read)

    def _rate(self, out: dict[str, float], name: str, value: float, now: float) -> None:
        prev = self.last.get(name)
        self.last[name] = (value, now)
        if prev is not None and now > prev[1] and value >= prev[0]:  # a counter reset (or wrap) gives no rate
            out[name] = (value - prev[0]) / (now - prev[1])

    def read(self, out: dict[str, float], failed: list[str]) -> None:
        now = time.monotonic()
        for what, read in (("cpu_percent", self._cpu), ("rss_bytes", self._rss), ("host_mem_percent", self._mem),
                           ("disk", self._disk), ("net", self._net)):
            try:
                read(out, now)
            except Exception as e:  # noqa: BLE001 - psutil can fail on any reading (containers, races); go on
                failed.append(f"psutil {what}: {type(e).__name__}: {e}")

    def _cpu(self, out: dict[str, float], now: float) -> None:
        out["cpu_percent"] = float(self.proc.cpu_percent(None))

    def _rss(self, out: dict[str, float], now: float) -> None:
        out["rss_bytes"] = float(self.proc.memory_info().rss)

    def _mem(self, out: dict[str, float], now: float) -> None:
        out["host_mem_percent"] = float(self.psutil.virtual_memory().percent)

    def _disk(self, out: dict[str, float], now: float) -> None:
        io = self.psutil.disk_io_counters()
        if io is not None:  # None where the host shows no disks (some containers)
            self._rate(out, "disk_read_bytes_per_s", float(io.read_bytes), now)
            self._rate(out, "disk_write_bytes_per_s", float(io.write_bytes), now)

    def _net(self, out: dict[str, float], now: float) -> None:
        io = self.psutil.net_io_counters()
        if io is not None:
            self._rate(out, "net_sent_bytes_per_s", float(io.bytes_sent), now)
            self._rate(out, "net_recv_bytes_per_s", float(io.bytes_recv), now)


class _Gpus:
    """The readings NVML gives, per device; a reading a device does not support is not asked again."""

    def __init__(self, nvml: Any, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles
        self.unsupported: set[tuple[int, str]] = set()

    def read(self, out: dict[str, float], failed: list[str]) -> None:
        nv = self.nvml
        reads = (("util_percent", lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu),
                 ("mem_bytes", lambda h: nv.nvmlDeviceGetMemoryInfo(h).used),
                 ("power_w", lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),  # milliwatts
                 ("temp_c", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)))
        not_supported = getattr(nv, "NVMLError_NotSupported", None)
        for i, h in enumerate(self.handles):
            for what, read in reads:
                if (i, what) in self.unsupported:
                    continue
                try:
                    out[f"gpu{i}/{what}"] = float(read(h))
                except Exception as e:  # noqa: BLE001 - a lost GPU, a driver update: the run goes on
                    if not_supported is not None and isinstance(e, not_supported):
                        self.unsupported.add((i, what))  # e.g. power on some boards: not an error
                    else:
                        failed.append(f"NVML gpu{i} {what}: {type(e).__name__}: {e}")


#: NVML per process: initialised once (it counts its users), its device handles kept.
_nvml: dict[str, Any] = {}
_nvml_lock = (os.getpid(), threading.Lock())


def _lock() -> threading.Lock:
    """The NVML lock of this process: a forked child makes its own (the parent's may have been held at the fork)."""
    global _nvml_lock
    if _nvml_lock[0] != os.getpid():
        _nvml_lock = (os.getpid(), threading.Lock())
    return _nvml_lock[1]


def _open_gpus() -> tuple[_Gpus | None, str | None]:
    """The GPUs NVML sees, or why there are none to sample (None: no GPU here, nothing to say)."""
    if "pynvml" not in sys.modules and not gpu_present():
        return None, None
    with _lock():
        if _nvml.get("pid") != os.getpid():
            _nvml.clear()
            _nvml["pid"] = os.getpid()
            try:
                import pynvml
            except ImportError:
                _nvml["why"] = "nvidia-ml-py is not installed (pip install 'casmon[system]'): no GPU metrics"
            except Exception as e:  # noqa: BLE001 - its import warned under -W error, or found no library: GPUs only
                _nvml["why"] = f"nvidia-ml-py cannot be imported ({type(e).__name__}: {e}): no GPU metrics"
            else:
                try:
                    pynvml.nvmlInit()
                    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
                except Exception as e:  # noqa: BLE001 - no driver, a driver/library mismatch, ...
                    # pynvml imported by another library (torch does) on a machine with no GPU: nothing to say
                    if gpu_present():
                        _nvml["why"] = f"NVML cannot be used ({type(e).__name__}: {e}): no GPU metrics"
                else:
                    _nvml["nvml"], _nvml["handles"] = pynvml, handles
        if "why" in _nvml:
            return None, _nvml["why"]
        if not _nvml.get("handles"):  # none, or an init cut short (Ctrl-C): tried again in a new process only
            return None, None
        return _Gpus(_nvml["nvml"], _nvml["handles"]), None


class Sampler:
    """One run's sampling: its sources, its own step counter, and whether a failure was said yet."""

    def __init__(self, run: Any, every: float, host: _Host | None, gpus: _Gpus | None) -> None:
        self.run = run
        self.every = every
        self.host = host
        self.gpus = gpus
        floors = [s for n, s in run._metrics.floor.items() if n.startswith(PREFIX)]  # a resumed run's samples
        self.step = max(floors, default=-1) + 1
        self.next_at = time.monotonic() + every
        self.warned = False

    def read(self) -> dict[str, float]:
        out: dict[str, float] = {}
        failed: list[str] = []
        for source in (self.host, self.gpus):
            if source is not None:
                source.read(out, failed)
        if failed and not self.warned:
            self.warned = True
            _say(f"casmon.record: run {self.run.name}: a system metric could not be read ({failed[0]}); it is "
                 "skipped while that lasts (said once per run)")
        return {PREFIX + k: v for k, v in out.items() if math.isfinite(v)}

    def tick(self) -> None:
        """From the sampling thread: take a sample when one is due and log it at this sampler's step."""
        run = self.run
        now = time.monotonic()
        if run._ended or run._pid != os.getpid() or now < self.next_at - _SLACK * self.every:
            return
        self.next_at = max(self.next_at + self.every, now + (1 - _SLACK) * self.every)  # late: no burst to catch up
        values = self.read()
        if values:
            run._metrics.log(values, self.step, {}, counted=False)
            self.step += 1


def start(run: Any, every: float) -> Sampler | None:
    """Begin sampling ``run``'s system metrics every ``every`` seconds (the first reading only primes the rates);
    what cannot be sampled is one RunWarning line now. None when there is nothing to sample. Never raises: the
    run has started, and an error here would leave it without an end."""
    notes: list[str] = []
    try:
        return _start(run, every, notes)
    except Exception as e:  # noqa: BLE001 - a psutil or NVML broken in a way not foreseen: the run goes on
        notes.append(f"cannot be sampled ({type(e).__name__}: {e})")
        return None
    finally:
        if notes:
            _say(f"casmon.record: system metrics: {'; '.join(notes)}")


def _say(message: str) -> None:
    from casmon.runs.recorder import RunWarning

    try:
        warnings.warn(message, RunWarning, stacklevel=5)
    except Exception:  # noqa: BLE001 - warnings made errors (-W error): still one line, and the run goes on
        try:
            sys.stderr.write(f"RunWarning: {message}\n")
        except Exception:  # noqa: BLE001 - no stderr (pythonw)
            pass


def _start(run: Any, every: float, notes: list[str]) -> Sampler | None:
    host = None
    try:
        import psutil
    except ImportError:
        notes.append("psutil is not installed (pip install 'casmon[system]'): no CPU, memory, disk or network "
                     "metrics")
    except Exception as e:  # noqa: BLE001 - its import warned under -W error: the GPUs are still sampled
        notes.append(f"psutil cannot be imported ({type(e).__name__}: {e}): no CPU, memory, disk or network metrics")
    else:
        try:
            host = _Host(psutil)
        except Exception as e:  # noqa: BLE001 - a psutil that cannot see this process
            notes.append(f"psutil cannot read this process ({type(e).__name__}: {e}): no CPU, memory, disk or "
                         "network metrics")
    gpus, why = _open_gpus()
    if why:
        notes.append(why)
    if host is None and gpus is None:
        return None
    sampler = Sampler(run, every, host, gpus)
    sampler.read()  # primes cpu_percent and the counters the rates need; nothing is logged
    from casmon.runs import live

    live.sample(id(run), sampler.tick, every)
    return sampler
