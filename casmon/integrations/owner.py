"""The run a framework integration logs into, and the framework's values made fit for it.

The run is the one passed as ``run=``, else the run active when training starts (``casmon.record`` or
``start_run`` around it), else one of the integration's own (``casmon.record(**record_options)``), which it ends
when training ends: ``failed`` when training raised. A framework that calls nothing when training raises
(Hugging Face, Keras) is watched: a thread sees the training loop's frame leave its thread's stack before the
framework said the training ended, and ends the run ``failed`` (with the exception, when the interpreter kept it),
or ``killed`` when Ctrl-C came meanwhile (a KeyboardInterrupt the user caught to stop training by hand).
Storage errors while logging are warnings (:class:`casmon.RunWarning`): they never stop the training.

A run's steps never go back: a training that starts at or below the highest step a run already holds from the
same integration (a second ``fit`` in one ``record``, a trainer made anew) is shifted past it, as a whole, so no
two of its points share a step (:meth:`RunOwner.step`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import enum
import importlib
import math
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from pathlib import PurePath
from types import FrameType, ModuleType, TracebackType
from typing import Any

from casmon.errors import CasmonError
from casmon.runs.metrics import check_name
from casmon.runs.recorder import Run, RunWarning, active_run, record

__all__ = ["RunOwner", "TrainingRaised", "plain", "number", "numbers", "training_frame", "framework", "WATCH_S"]

#: How often (seconds) a watched training loop is looked for on its thread's stack.
WATCH_S = 0.2

# Each run's highest step per series of steps (an integration's), whichever integration object logged it: a
# callback made anew for a second fit in one run continues after the first's.
_HIGHS: weakref.WeakKeyDictionary[Run, dict[str, int]] = weakref.WeakKeyDictionary()
_HIGHS_LOCK = threading.Lock()


def framework(names: tuple[str, ...], who: str, what: str, pip: str) -> ModuleType:
    """The first of ``names`` that imports (a module already imported first), for ``who`` (the integration's
    module); else one ImportError line saying ``what`` is not installed, or naming the package it needs that cannot
    be imported (torch under Lightning, say): never a framework's traceback or a wrong "not installed"."""
    ordered = sorted(names, key=lambda n: sys.modules.get(n) is None)  # one the user imported wins
    first: ImportError | None = None
    for name in ordered:
        try:
            return importlib.import_module(name)
        except ImportError as e:
            first = first or e
    missing = getattr(first, "name", None) or ""
    if not missing or any(missing == n or n.startswith(missing + ".") for n in names):
        raise ImportError(f"{who}: {what} is not installed (pip install {pip})") from None
    raise ImportError(f"{who}: {what} is installed but needs {missing!r}, which cannot be imported ({first}); "
                      f"pip install {missing.split('.')[0]}") from None


class TrainingRaised(RuntimeError):
    """The run's end when training raised and the exception itself was no longer to be had."""


class RunOwner:
    """Which run an integration logs into, and, when it is its own, its start and end."""

    def __init__(self, run: Run | None, record_options: Mapping[str, Any] | None, who: str,
                 one_run: bool = True) -> None:
        if run is not None and not isinstance(run, Run):
            raise TypeError(f"casmon: {who}: run must be a casmon Run (from casmon.record or casmon.start_run), "
                            f"got {type(run).__name__}")
        if record_options is not None and not isinstance(record_options, Mapping):
            raise TypeError(f"casmon: {who}: record_options must be a dict of casmon.record's options, got "
                            f"{type(record_options).__name__}")
        self.who = who
        self.given = run
        self.options = dict(record_options or {})
        record(**self.options)  # bad options fail here, where the integration is made, not mid-training
        self.run: Run | None = None
        self._record: record | None = None
        self._lock = threading.Lock()
        self._watch: _Watch | None = None
        self._warned: set[str] = set()
        # The shift of each series of steps in the run logged into, decided by its first step since the run was
        # resolved (a training's start): that run (weakly), {series: shift}, and whether a training started.
        self._shift_run: weakref.ref[Run] | None = None
        self._shifts: dict[str, int] = {}
        self._starting = False
        self._pid = os.getpid()
        #: Each training continues the integration's own run of the one before (one logger or callback, one run,
        #: as Lightning's loggers are one version across fit, validate and test): its name and highest steps.
        self.one_run = one_run
        self._own_before: tuple[str, dict[str, int], Any] | None = None

    @property
    def owns(self) -> bool:
        """Whether the current run is the integration's own (ended by it)."""
        return self._record is not None

    def get(self) -> Run:
        """The run to log into now, opening the integration's own if there is none."""
        self._forked()
        with self._lock:
            if self.run is None:
                if self.given is not None and _ended(self.given):
                    warnings.warn(f"casmon: {self.who}: run {self.given.name} has ended "
                                  f"({self.given.manifest.get('status')}); this training logs into "
                                  f"{'the active run' if active_run() else 'a run of its own'}", RunWarning,
                                  stacklevel=3)
                    self.given = None
                if self.given is not None:
                    self.run = self.given
                elif (active := active_run()) is not None:
                    self.run = active
                else:
                    self._record, self.run = self._open_own()
                self._shift_run, self._starting = None, True  # a training starts: after what the run holds
            return self.run

    @contextlib.contextmanager
    def outside(self) -> Iterator[Run | None]:
        """The run to log into outside a training (an evaluation after it): :meth:`current`; else the
        integration's own run of the training before, continued for this and ended again (nothing is left
        running); else None."""
        run = self.current()
        if run is not None or not self.one_run or self._own_before is None:
            yield run
            return
        run = self.get()
        self._starting = False  # an evaluation logs at its training's last step, not after it
        try:
            yield run
        finally:
            self.end()

    def _open_own(self) -> tuple[record, Run]:
        """The integration's own run: the one it ended before, continued (``resume``), if it keeps one run."""
        if self._own_before is not None:
            name, highs, store = self._own_before
            if store is not None:  # its end, if the store was away then, is written before it is read back
                with contextlib.suppress(CasmonError, OSError):
                    store.flush()
            rec = record(**{**self.options, "resume": name, "resume_ok": True})
            try:
                run = rec.__enter__()
            except (CasmonError, LookupError, OSError) as e:  # deleted, resumed elsewhere, the store away: a new run
                warnings.warn(f"casmon: {self.who}: cannot continue run {name} ({e}); logging into a new run",
                              RunWarning, stacklevel=4)
            else:
                with _HIGHS_LOCK:
                    _HIGHS.setdefault(run, {}).update(highs)  # its next training goes on after the last one's steps
                return rec, run
        rec = record(**self.options)
        return rec, rec.__enter__()

    def step(self, run: Run, series: str, step: int) -> int:
        """The step to log the framework's ``step`` of ``series`` at in ``run``: shifted, with the rest of its
        training, past the highest step ``run`` holds of ``series`` when the training's first step is not above it
        (at or below it for a training's start; below it for an evaluation after one, which logs at its last
        step)."""
        step = int(step)
        with _HIGHS_LOCK:
            highs = _HIGHS.setdefault(run, {})
            high = highs.get(series)
            if self._shift_run is None or self._shift_run() is not run:
                self._shift_run, self._shifts = weakref.ref(run), {}
            shift = self._shifts.get(series)
            if shift is None:
                shift = 0 if high is None else max(0, high + (1 if self._starting else 0) - step)
                self._shifts[series] = shift
            at = step + shift
            highs[series] = at if high is None else max(high, at)
            return at

    def current(self) -> Run | None:
        """The run to log into outside a training (an evaluation after it): the one resolved at the training's
        start if it goes on, else the given or the active run; None rather than a run of its own that nothing
        would end."""
        self._forked()
        with self._lock:
            if self.run is not None and not _ended(self.run):
                return self.run
            return self.given if self.given is not None and not _ended(self.given) else active_run()

    def end(self, exc_type: type[BaseException] | None = None, exc: BaseException | None = None,
            tb: TracebackType | None = None, *, watched: _Watch | None = None) -> None:
        """Training ended (raising ``exc``, if given): end the run if it is the integration's own, and forget it.
        ``watched``: only if that watch is still the current one (a new training may have begun meanwhile)."""
        self._forked()
        with self._lock:
            if watched is not None and self._watch is not watched:
                return
            if self.one_run and self._record is not None and self.run is not None:
                with _HIGHS_LOCK:
                    self._own_before = (self.run.name, dict(_HIGHS.get(self.run, {})), self.run.store)
            rec, self._record, self.run = self._record, None, None
            watch, self._watch = self._watch, None
            self._starting = False
        if watch is not None:
            watch.stop()
            _note_ctrl_c(False)
        if rec is not None:
            rec.__exit__(exc_type, exc, tb)

    def watch(self, frame: FrameType | None) -> None:
        """End the integration's own run ``failed`` if ``frame`` (the training loop's) leaves its thread before
        :meth:`end` is called. Nothing is watched for a run that is not the integration's own."""
        if frame is None or not self.owns:
            return
        w = _Watch(self, frame)
        with self._lock:
            old, self._watch = self._watch, w
        if old is not None:
            old.stop()
        _note_ctrl_c(True)
        w.start()

    def _raised(self, w: _Watch) -> None:
        exc = w.reported() or (KeyboardInterrupt() if _ctrl_c_at >= w.started else None) or TrainingRaised(
            f"casmon: {self.who}: training raised before it ended (its exception was caught outside casmon's sight)")
        self.end(type(exc), exc, exc.__traceback__, watched=w)

    def _forked(self) -> None:
        """In a forked child (a fork-started worker), become a copy as a spawned worker's is: the parent's run is
        the parent's to log (and to end)."""
        if self._pid != os.getpid():
            self.__setstate__(self.__getstate__())

    def __getstate__(self) -> dict[str, Any]:
        """A run is logged by the process that records it: a copy (a trainer pickled to spawned workers) keeps
        the options, not the run, and opens its own where it logs: in the store of the run this one logs into
        (else of ``record_options``), a store object by its location, never the copy's default store."""
        options = dict(self.options)
        run = self.run or self.given or active_run()
        store = options.get("store")
        if store is None and run is not None:
            store = run.store
        if store is not None and not isinstance(store, (str, os.PathLike)):
            store = getattr(store, "url", None)  # a Store holds locks and files: it is opened again by its location
        if store is not None:
            options["store"] = store
        return {"who": self.who, "given": None, "options": options, "one_run": self.one_run}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["given"], state["options"], state["who"], state.get("one_run", True))  # type: ignore[misc]

    def guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; a storage error is a warning (once per ``what``), never the training's end."""
        try:
            return fn(*args, **kwargs)
        except (CasmonError, OSError) as e:
            if what not in self._warned:
                self._warned.add(what)
                warnings.warn(f"casmon: {self.who}: could not {what} ({e}); training goes on", RunWarning,
                              stacklevel=3)
            return None


class _Watch(threading.Thread):
    """Looks, every :data:`WATCH_S`, for the training loop's frame on its thread's stack. Not a daemon (for
    training on a thread that is not one): at exit after an uncaught exception the run is ended before the
    process goes."""

    def __init__(self, owner: RunOwner, frame: FrameType) -> None:
        # A daemon only if the training's thread is one: the process never waits on training it would not wait on.
        super().__init__(name="casmon-training-watch", daemon=threading.current_thread().daemon)
        self.owner, self.ident_watched = owner, threading.get_ident()
        self.frame: FrameType | None = frame
        self.stopped = threading.Event()
        self.before = _reported()
        self.started = time.monotonic()

    def reported(self) -> BaseException | None:
        """The exception reported since the training began (a frame filtered out of its traceback, as Keras
        does, still finds it): looked for over one more interval, as the interpreter reports it just after the
        loop's frame is gone."""
        for _ in range(2):
            exc = _reported()
            if exc is not None and exc is not self.before:
                return exc
            if self.stopped.wait(WATCH_S):
                return None
        return None

    def stop(self) -> None:
        self.stopped.set()
        if threading.current_thread() is not self:
            self.frame = None  # the loop's locals (model, data) are not kept alive

    def run(self) -> None:
        try:
            while not self.stopped.wait(WATCH_S):
                frame = self.frame
                if frame is None:
                    return
                if not self.stopped.is_set() and self._gone(frame):
                    self.owner._raised(self)
                    return
        finally:
            self.frame = None

    def _gone(self, frame: FrameType) -> bool:
        f = sys._current_frames().get(self.ident_watched)
        while f is not None:
            if f is frame:
                return False
            f = f.f_back
        return True


_ctrl_c_at = -math.inf  # when Ctrl-C last came while a watched training ran (time.monotonic())


def _on_ctrl_c(signum: int, frame: FrameType | None) -> None:
    """Python's own Ctrl-C (a KeyboardInterrupt), noted first, and put back: the note is needed once."""
    global _ctrl_c_at
    _ctrl_c_at = time.monotonic()
    _note_ctrl_c(False)
    signal.default_int_handler(signum, frame)


def _note_ctrl_c(on: bool) -> None:
    """While a watched training runs in the main thread, Ctrl-C is noted before it raises as ever (only where
    Python's own handler is the one installed; a user's or a framework's is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set a handler; the training's next start or end there puts it back
    try:
        now = signal.getsignal(signal.SIGINT)
        if on and now is signal.default_int_handler:
            signal.signal(signal.SIGINT, _on_ctrl_c)
        elif not on and now is _on_ctrl_c:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except (ValueError, OSError):  # an embedded interpreter without signals
        pass


def _ended(run: Run) -> bool:
    """Whether ``run`` has ended (a ``with`` block left, ``end()`` called): it logs nothing more."""
    return run.manifest.get("status", "running") != "running"


def _reported() -> BaseException | None:
    """The exception the interpreter last reported: an uncaught one (set before the process waits for its
    threads), or one IPython showed."""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return exc if isinstance(exc, BaseException) else None


def training_frame(names: tuple[str, ...], owner_type: type | None = None) -> FrameType | None:
    """The nearest frame up this thread's stack running a function named one of ``names`` (a method of an
    ``owner_type`` when given): the framework's training loop, which lasts exactly as long as the training."""
    f: FrameType | None = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name in names:
            if owner_type is None:
                return f
            first = f.f_code.co_varnames[:1]
            if first and isinstance(f.f_locals.get(first[0]), owner_type):
                return f
        f = f.f_back
    return None


# -- values ------------------------------------------------------------------------------------------


def number(v: Any) -> float | None:
    """``v`` as a float if it is a number (a Python, numpy or torch scalar, a one-element array); else None."""
    if isinstance(v, bool) or v is None or isinstance(v, (str, bytes)):
        return None
    try:
        if isinstance(v, (int, float)):
            return float(v)
        numel = getattr(v, "numel", None)
        size = numel() if callable(numel) else getattr(v, "size", None)
        if size is not None and size != 1:
            return None
        item = getattr(v, "item", None)  # float() of a torch tensor that needs grad warns; item() does not
        return float(item() if callable(item) else v)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None


def numbers(logs: Mapping[str, Any] | None, prefix: str = "") -> dict[str, float]:
    """The numeric entries of a framework's logs, named ``prefix + name`` (strings and the like left out; a name
    a run cannot keep is left out with a warning, not raised into the training)."""
    out: dict[str, float] = {}
    for k, v in dict(logs or {}).items():
        x = number(v)
        if x is None:
            continue
        try:
            out[check_name(prefix + k if isinstance(k, str) else k, "casmon")] = x
        except (TypeError, ValueError) as e:
            warnings.warn(f"{e}; it is not logged", RunWarning, stacklevel=3)
    return out


def public_name(v: Any) -> str:
    """``module.qualname`` of a class or function as users import it: the shortest enclosing package that
    exports it under that name (``pathlib.Path``, not Python 3.13's ``pathlib._local.Path``)."""
    mod, q = str(getattr(v, "__module__", None) or "?"), str(v.__qualname__)
    parts = mod.split(".")
    for i in range(1, len(parts)):
        head = ".".join(parts[:i])
        if getattr(sys.modules.get(head), q, None) is v:
            return f"{head}.{q}"
    return f"{mod}.{q}"


def plain(v: Any, depth: int = 0) -> Any:
    """``v`` as plain JSON for a run's params: dicts with string keys, lists, strings, numbers, booleans, None.
    A dataclass or pydantic model is a dict of its fields, an Enum its value, a path its text, a numpy or torch scalar its number, a class or function its name, and
    anything else its short ``repr``: a framework's configuration never pickles a model or a tensor into the run."""
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v) if math.isfinite(v) else repr(float(v))
    if depth > 8:
        return _short(v)
    if isinstance(v, enum.Enum):
        return plain(v.value, depth + 1)
    if isinstance(v, (PurePath, os.PathLike)):
        return os.fspath(v) if isinstance(os.fspath(v), str) else _short(v)
    try:
        if isinstance(v, argparse.Namespace):
            v = vars(v)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):  # a config: its fields, not its repr
            v = {f.name: getattr(v, f.name, None) for f in dataclasses.fields(v)}
        elif (pydantic := sys.modules.get("pydantic")) is not None and isinstance(v, pydantic.BaseModel):
            v = v.model_dump()
        if isinstance(v, Mapping):
            return {_key(k): plain(x, depth + 1) for k, x in list(v.items())[:1000]}
        if isinstance(v, (list, tuple, set, frozenset)):
            return [plain(x, depth + 1) for x in list(v)[:1000]]
    except Exception:  # noqa: BLE001 - a container's own items() or iteration: described, never raised into training
        return _short(v)
    if isinstance(v, type) or callable(v) and hasattr(v, "__qualname__"):
        return public_name(v)
    x = number(v) if hasattr(v, "dtype") and getattr(v, "ndim", 0) == 0 else None
    if x is not None:
        return int(x) if x.is_integer() and "int" in str(getattr(v, "dtype", "")) else x
    return _short(v)


def _key(k: Any) -> str:
    return k if isinstance(k, str) else _short(k) if not isinstance(k, (int, float, bool)) else str(k)


def _short(v: Any) -> str:
    from casmon.view.text import short_repr

    return short_repr(v, 200)
