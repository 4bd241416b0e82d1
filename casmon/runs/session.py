"""Runs that span notebook cells: ``run = casmon.start_run(...)``, ``run.end()``, ``casmon.end_run()``.

``start_run`` takes ``record``'s options and starts a run that no block ends: it goes on, with its
heartbeats, metrics and output, until ``run.end(status)`` or ``casmon.end_run(status)`` (``ok``,
``failed`` or ``killed``; a second end does nothing; logging into an ended run is an error). It is also a
context manager (``with casmon.start_run() as run:``), ended by the block as ``record`` ends its run.

A second ``start_run`` while a run is active in this thread (or a ``start_run`` run anywhere in the
process) raises, as MLflow does, unless ``nested=True``: then the new run is the innermost one,
``casmon.log`` and ``end_run`` go to it, and its manifest names its parent's ref (``parent``). Two threads
starting at once are checked one after the other: one starts, the other raises. ``per_thread=True`` (what
``casmon.compat.mlflow`` starts, as MLflow's runs are per thread): only a run of this thread blocks it or is
its parent, and no other thread's ``end_run`` ends it.

A run left open ends with the process. At interpreter exit it is saved as ``ok`` when the script ended
normally (``sys.exit(n)`` too: no exit code reaches exit hooks), ``failed`` (with the traceback) when an uncaught exception ended it, ``killed`` after Ctrl-C;
in an interactive session (a notebook kernel being shut down or restarted, ``python -i``) it is saved
as ``killed`` with signal ``exit``, since the session ended, not the run. SIGTERM and SIGHUP save it as
``killed`` (by the handler: no block is there to raise into), then end the process by the signal; a
process killed outright (SIGKILL, a kernel killed by Jupyter) leaves it ``running`` until its
heartbeats stop and readers call it ``lost``.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

from casmon.errors import CasmonError
from casmon.runs import recorder
from casmon.runs.recorder import Run, record
from casmon.runs.metrics import NO_VALUE

__all__ = ["start_run", "end_run", "SessionRun", "STATUSES"]

#: What ``run.end`` and ``end_run`` take.
STATUSES = ("ok", "failed", "killed")

_lock = threading.Lock()
_start_lock = threading.Lock()  # the check for an active run and the new run's start are one step
_exit_hooked = False


def _fresh_locks_in_child() -> None:
    """A forked child's locks are free: another thread of the parent may have held one at the fork."""
    global _lock, _start_lock
    _lock, _start_lock = threading.Lock(), threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_locks_in_child)


class SessionRun(Run):
    """A run of :func:`start_run`: ended by :meth:`end` (or ``casmon.end_run``, or the process's end)."""

    _by_block = False
    _per_thread = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._end_called = False
        self._closed = False  # its end is done: logging now is an error

    def end(self, status: str = "ok") -> None:
        """End the run as ``ok``, ``failed`` or ``killed``, and save it; a second call does nothing. Called
        while an exception is being handled, ``failed`` keeps its traceback."""
        _end(self, status, sys.exc_info() if status != "ok" else (None, None, None))

    def log(self, metrics: Mapping[str, Any] | str | None = None, value: Any = NO_VALUE, /, *more: Any,
            step: int | None = None, **named: Any) -> None:
        if self._end_called:
            raise CasmonError(f"casmon: run {self.name} has ended ({self.manifest.get('status')}); log into a run "
                              f"while it goes on (casmon.start_run() starts another)")
        super().log(metrics, value, *more, step=step, **named)

    def __enter__(self) -> SessionRun:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        if exc_type is None:
            _end(self, None, (None, None, None))
        else:
            _end(self, None, (exc_type, exc, tb))  # the status the exception gives, as record's block
        return False


def _end(run: SessionRun, status: str | None, exc_info: tuple[Any, Any, Any]) -> None:
    if status is not None and status not in STATUSES:
        raise ValueError(f"casmon: run.end: status must be 'ok', 'failed' or 'killed', got {status!r:.80}")
    with _lock:
        if run._end_called or run._ending or run._ended:  # ended already (or by a signal): nothing to do
            return
        run._end_called = True
    rec = run._recorder
    if rec is None or not rec._stack:
        return
    try:
        rec._finish(*exc_info, status=status)
    finally:
        run._closed = True


def _session_runs() -> list[SessionRun]:
    with recorder._active_lock:
        return [r for r in recorder._active if isinstance(r, SessionRun)]


def start_run(*args: Any, nested: bool = False, per_thread: bool = False, **options: Any) -> SessionRun:
    """Start a run that goes on until ``run.end()`` or ``casmon.end_run()`` (or the process ends): for notebooks,
    where a run starts in one cell and ends in another. Takes :class:`~casmon.record`'s options (``comment``,
    ``params``, ``tags``, ``store``, ``capture_output``, ...). While a run is active, a second one raises unless
    ``nested=True``; ``per_thread=True``: only this thread's runs count (see the module's text)."""
    me = threading.get_ident()
    with _start_lock:
        with recorder._active_lock:
            active = [r for r in recorder._active if r._thread == me
                      or (not per_thread and isinstance(r, SessionRun) and not r._per_thread)]
        parent = active[-1] if active else None
        if parent is not None and not nested:
            raise CasmonError(f"casmon.start_run: run {parent.name} is active; end it first (run.end() or "
                              f"casmon.end_run()), or start this one inside it with nested=True")
        rec = record(*args, **options)
        rec.run_type = SessionRun
        _hook_exit()
        run = rec._start(function=None)
        assert isinstance(run, SessionRun)
        run._per_thread = per_thread
    if parent is not None:
        run.manifest.setdefault("parent", parent.ref or parent.name)  # a resumed run keeps the parent it had
    return run


def end_run(status: str = "ok") -> None:
    """End the innermost run :func:`start_run` started (this thread's first, else the process's, but not another
    thread's ``per_thread`` run) as ``status``; nothing to do when none is active (as MLflow's ``end_run``)."""
    if status not in STATUSES:
        raise ValueError(f"casmon.end_run: status must be 'ok', 'failed' or 'killed', got {status!r:.80}")
    runs = _session_runs()
    if not runs:
        return
    me = threading.get_ident()
    mine = [r for r in runs if r._thread == me]
    others = [r for r in runs if not r._per_thread]
    if mine or others:
        (mine or others)[-1].end(status)


def _hook_exit() -> None:
    global _exit_hooked
    with _lock:
        if _exit_hooked:
            return
        _exit_hooked = True
    from casmon.store import lifecycle

    lifecycle.before_exit_flush(_end_open_runs_at_exit)


def _interactive() -> bool:
    """A notebook kernel or an interactive interpreter: its end is the session's, not the run's."""
    if hasattr(sys, "ps1") or sys.flags.interactive or "ipykernel" in sys.modules:
        return True
    ipython = sys.modules.get("IPython")
    get = getattr(ipython, "get_ipython", None)
    try:
        return callable(get) and get() is not None
    except Exception:  # noqa: BLE001 - a half-imported IPython at exit
        return False


def _end_open_runs_at_exit() -> None:
    """At interpreter exit (before the stores' exit flush): end every run of ``start_run`` still open."""
    runs = _session_runs()
    if not runs:
        return
    if _interactive():
        why: tuple[str | None, tuple[Any, Any, Any]] = ("killed", (None, None, None))
    else:
        exc = getattr(sys, "last_value", None)  # what ended the script, where an uncaught exception did
        why = (None, (type(exc), exc, exc.__traceback__)) if isinstance(exc, BaseException) else ("ok", (None, None, None))
    for run in reversed(runs):  # the innermost first: a nested run ends before its parent
        if why[0] == "killed":
            run.manifest["signal"], run.manifest["signal_time"] = "exit", time.time()
        try:
            _end(run, why[0], why[1])
        except Exception as e:  # noqa: BLE001 - never stop the others, nor interpreter exit
            import warnings

            warnings.warn(f"casmon: at exit, could not end run {run.name}: {e}", recorder.RunWarning, stacklevel=1)
    recorder._save_unsaved_at_exit()  # one whose end the store refused: tried again for a while
