"""A run while it goes on, seen from outside: heartbeats, its points and output written in batches.

Two threads per process look after every active run. ``casmon-run-live``
flushes the run's store every :func:`tick_seconds` when the run has points or
output waiting (a reader sees them within seconds, not at the run's end).
``casmon-run-heartbeat`` rewrites the run's ref every ``CASMON_HEARTBEAT_S``
seconds (default :data:`HEARTBEAT_S`) with a heartbeat: the time, the summary
of its metrics, and how long the last heartbeat took to write; apart from the
flushes, so a slow flush never delays a heartbeat. A reader that finds a
``running`` run whose last heartbeat is older than :data:`LOST_AFTER`
heartbeats (plus twice that write time) calls it ``lost`` (SIGKILL, out of
memory, a dead node): it says so from the heartbeat alone, so it holds across
hosts, given clocks that agree to well within a heartbeat.
A third, ``casmon-run-sysmetrics``, samples a run's system metrics
(:mod:`casmon.runs.sysmetrics`) when it asks for them.

Console output goes into records of kind ``runout`` keyed by the run's ref
(one per flush: the lines completed since the last), so a live or lost run's
output can be read up to its last batch; the whole output is still stored when
the run ends.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from casmon.errors import DamagedObjectError
from casmon.keys.fingerprint import fingerprint
from casmon.runs.capture import collapse_carriage_returns
from casmon.store.lock import HEARTBEAT_S, heartbeat_seconds

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["HEARTBEAT_S", "LOST_AFTER", "KIND_RUNOUT", "heartbeat_seconds", "tick_seconds", "watch", "unwatch",
           "output_key", "output_record", "read_output", "is_lost", "forget_in_child", "sample"]

#: A running run whose last heartbeat is older than this many heartbeats is ``lost``.
LOST_AFTER = 3
#: Longest wait between flushes of a run's waiting points and output.
LIVE_S = 2.0
KIND_RUNOUT = "runout"
#: Output batches up to this many characters stay in their record; longer ones are stored values.
INLINE_OUTPUT = 64 << 10


def tick_seconds(heartbeat: float) -> float:
    return min(LIVE_S, heartbeat)


def is_lost(heartbeat: Any, every: Any, now: float, lag: Any = 0.0) -> bool:
    """Whether a running run whose last heartbeat was at ``heartbeat`` (every ``every`` seconds, each taking
    ``lag`` seconds to write: a slow store delays them) is lost."""
    if not _finite(heartbeat) or not _finite(every) or every <= 0:
        return False  # a run from before heartbeats, or a crafted ref: no claim either way
    slack = 2 * lag if _finite(lag) and lag > 0 else 0.0
    return bool(now - heartbeat > LOST_AFTER * every + slack)


def _finite(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def output_key(ref: str) -> bytes:
    return fingerprint(("casmon.runout", ref))


class _Watcher:
    """One of the process's live threads, and the runs it looks after (each a ``tick`` callable)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.runs: dict[int, tuple[Callable[[], None], float]] = {}
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.wake = threading.Event()

    def forget_in_child(self) -> None:
        """In a forked child: the parent's thread is not here, and its lock may have been held at the fork."""
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.runs, self.thread, self.pid = {}, None, os.getpid()

    def watch(self, key: int, tick: Callable[[], None], every: float) -> None:
        from casmon.store import lifecycle

        with self.lock:
            self.runs[key] = (tick, every)
            if self.thread is None and not lifecycle.exiting():
                t = threading.Thread(target=self._loop, name=self.name, daemon=True)
                try:
                    t.start()
                except RuntimeError:  # the interpreter is exiting
                    return
                self.thread = t
        self.wake.set()

    def unwatch(self, key: int) -> None:
        with self.lock:
            self.runs.pop(key, None)

    def _loop(self) -> None:
        from casmon.store import lifecycle

        stop = lifecycle.stop_flushers
        while not stop.is_set():
            with self.lock:
                runs = list(self.runs.values())
            every = min((e for _t, e in runs), default=LIVE_S)
            self.wake.wait(every)
            self.wake.clear()
            if stop.is_set():
                return
            for tick, _e in runs:
                try:
                    tick()
                except Exception:  # noqa: BLE001 - a live view is best effort; the run's end is what counts
                    pass


#: Flushes live runs' points and output; writes their heartbeats (apart, so a slow flush never delays one).
_flusher = _Watcher("casmon-run-live")
_beater = _Watcher("casmon-run-heartbeat")
#: Samples live runs' system metrics (casmon.runs.sysmetrics): its own thread, so a slow flush never delays a sample.
_sampler = _Watcher("casmon-run-sysmetrics")


def watch(key: int, tick: Callable[[], None], every: float, beat: Callable[[], None], beat_every: float) -> None:
    """Call ``tick()`` about every ``every`` seconds and ``beat()`` every ``beat_every``, until :func:`unwatch`."""
    _flusher.watch(key, tick, every)
    _beater.watch(key, beat, beat_every)


def sample(key: int, tick: Callable[[], None], every: float) -> None:
    """Call ``tick()`` about every ``every`` seconds on the sampling thread, until :func:`unwatch`."""
    _sampler.watch(key, tick, every)


def unwatch(key: int) -> None:
    _flusher.unwatch(key)
    _beater.unwatch(key)
    _sampler.unwatch(key)


def forget_in_child() -> None:
    _flusher.forget_in_child()
    _beater.forget_in_child()
    _sampler.forget_in_child()


def output_record(store: Store, ref: str, seq: int, text: str) -> tuple[dict[str, Any], list[Any]]:
    """A batch of output as a record (and the values it names)."""
    if len(text) <= INLINE_OUTPUT:
        return {"run": ref, "seq": seq, "text": text}, []
    d = store.put(text.encode("utf-8", "surrogateescape"))
    return {"run": ref, "seq": seq, "$": d.hex()}, [d]


def read_output(store: Store, ref: str, where: str) -> str:
    """The output batches of the run behind ``ref``, in order, as one text."""
    from casmon.store.peek import load_data

    store.table(KIND_RUNOUT).refresh()
    parts: list[tuple[int, int, str]] = []
    for i, r in enumerate(store.lookup(KIND_RUNOUT, output_key(ref), refresh=False)):
        if r.get("run") != ref:
            continue
        seq = r.get("seq")
        if type(seq) is not int:
            raise DamagedObjectError(f"{where}: output batch {i}", "no sequence number")
        if isinstance(r.get("text"), str):
            text = r["text"]
        elif isinstance(r.get("$"), str):
            text = bytes(load_data(store, r["$"], f"{where}: output batch {seq}", (bytes, bytearray))).decode(
                "utf-8", "surrogateescape")
        else:
            raise DamagedObjectError(f"{where}: output batch {seq}", "holds no text")
        parts.append((seq, i, text))
    parts.sort()
    return collapse_carriage_returns("".join(t for _s, _i, t in parts))

