"""How a recorded run meets SIGTERM and SIGHUP: saved as ``killed``, then the process ends as it would have.

SLURM, Kubernetes, ``timeout`` and a closed terminal end a process with SIGTERM
or SIGHUP, whose default action ends it at once: a run would stay ``running``
and lose its output. While a run is recorded, casmon's handler (installed from
the main thread only) raises :class:`~casmon.errors.RunSignal` in the main
thread, the way Ctrl-C raises ``KeyboardInterrupt``: the user's ``finally``
blocks run, the ``record`` block saves the run as ``killed`` with the signal,
its output and metrics, and once no run is left the handler that was there
before is put back and the signal sent again, so the process ends by the
signal (exit status and all). A handler the user installed before the run is
called instead of raising (the user decides); one ignored (``nohup``) stays
ignored. Ctrl-C (SIGINT) needs no handler: ``KeyboardInterrupt`` ends the
block, and the run is saved as ``killed`` too.

Python runs signal handlers in the main thread only, and only the main thread
may install one: a run recorded in another thread is saved as ``killed`` when
the signal comes while a run of the main thread is recorded too (after the
main thread's run is saved), but a process whose only runs are in other
threads has no handler, and its runs are ``lost`` when a signal ends it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any


__all__ = ["SIGNALS", "install", "uninstall", "redeliver", "signal_name", "forget_in_child"]

#: The signals a run is saved on (those present on this platform).
SIGNALS = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGHUP") if hasattr(signal, n))

_previous: dict[int, Any] = {}
_lock = threading.Lock()
#: Set by the recorder: ``on_signal(signum, name, t)`` ends the active runs as killed (raising
#: RunSignal in the main thread, or saving them and ending the process), or defers the signal.
on_signal: Callable[[int, str, float], None] | None = None
#: Set by the recorder: ``on_note(signum, name, t)`` notes the signal on the active runs (a user's handler runs).
on_note: Callable[[int, str, float], None] | None = None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _handler(signum: int, frame: FrameType | None) -> None:
    name = signal_name(signum)
    prev = _previous.get(signum)
    if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN):
        if on_note is not None:
            on_note(signum, name, time.time())
        prev(signum, frame)  # the user's own handler decides what the signal does
        return
    if on_signal is not None:
        on_signal(signum, name, time.time())
    else:
        redeliver(signum)


def install() -> None:
    """Install the handler for SIGTERM and SIGHUP (from the main thread; elsewhere Python refuses)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        for sig in SIGNALS:
            if sig in _previous:
                continue
            try:
                prev = signal.getsignal(sig)
            except (ValueError, OSError):
                continue
            if prev is signal.SIG_IGN or prev is None:  # ignored (nohup), or set outside Python: left alone
                continue
            try:
                signal.signal(sig, _handler)
            except (ValueError, OSError):
                continue
            _previous[sig] = prev


def uninstall() -> None:
    """Put the handlers back that were there before (unless someone replaced casmon's meanwhile)."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        _restore()


def _restore() -> None:
    for sig, prev in list(_previous.items()):
        try:
            if signal.getsignal(sig) is _handler:
                signal.signal(sig, prev)
        except (ValueError, OSError):
            pass
        del _previous[sig]


def forget_in_child() -> None:
    """In a forked child: put the handlers back that were there before casmon's."""
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by another thread at the fork
    _restore()


def redeliver(signum: int) -> None:
    """End the process by ``signum`` as it would have ended without casmon: the handler before casmon's is put
    back and the signal sent again (a Python handler there is called instead)."""
    prev = _previous.get(signum, signal.SIG_DFL)
    uninstall()
    if callable(prev) and prev not in (signal.SIG_DFL, signal.SIG_IGN):
        prev(signum, None)
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signum, signal.SIG_DFL)
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
    os.kill(os.getpid(), signum)
    for _ in range(100):  # the kernel ends the process; until it does, go no further
        time.sleep(0.05)
