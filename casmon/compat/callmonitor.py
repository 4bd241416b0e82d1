"""callmonitor 0.3.x's documented API on the casmon store.

    from casmon.compat.callmonitor import intercept, load, REGISTRY, Handler, Settings

Differences that are fixes: calls go into a casmon store (default folder
``call-monitor``, or ``$CASMON_STORE``) instead of a folder and pickle files
per call; a repeated array is stored once; the log is written every few
seconds and at exit, so a killed process leaves a readable log; each run is a
new *session* in the same store instead of a ``call-monitor-1`` folder, and
threads and processes need no ``-tid=`` suffix. ``db.get(name, n)`` reads the
latest session; ``casmon.load`` gives the full API (sessions, results, replay).
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..calllog import CallLog
from ..calllog import intercept as _intercept
from ..serialize import ArrayHandler, register_handler
from ..store import Store, default_store

__all__ = ["intercept", "load", "DB", "Args", "REGISTRY", "Registry", "Handler", "DefaultHandler", "NPHandler",
           "Settings", "SETTINGS", "DEFAULT_ROOT"]

DEFAULT_ROOT = "call-monitor"


def _root() -> str:
    return os.environ.get("CASMON_STORE") or DEFAULT_ROOT


class Handler:
    """Base class of argument handlers: ``save(path)`` and ``load(path)`` use ``self.data`` and ``self.target``."""

    def __init__(self, data: Any, target: Any) -> None:
        self._data = data
        self._target = target

    @property
    def data(self) -> Any:
        return self._data

    @data.setter
    def data(self, val: Any) -> None:
        self._data = val

    @property
    def target(self) -> Any:
        return self._target

    @target.setter
    def target(self, val: Any) -> None:
        self._target = val

    def save(self, path: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def load(self, path: str) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    @classmethod
    def accumulator_done(cls) -> None:
        pass


class DefaultHandler(Handler):
    """Values without a handler are pickled with the call (casmon stores them by content)."""

    def load(self, path: str) -> None:
        pass

    def save(self, path: str) -> None:
        pass


class NPHandler(Handler):
    """callmonitor's numpy handler; casmon stores arrays natively (chunked, deduplicated), so it is not used."""

    def load(self, path: str) -> None:
        self.data = np.load(os.path.join(path, f"arg_{self.target}.npy"))

    def save(self, path: str) -> None:
        np.save(os.path.join(path, f"arg_{self.target}.npy"), self.data)


class _HandlerAdapter:
    """Runs a callmonitor ``Handler`` subclass as a casmon handler: its files become the value's buffers."""

    def __init__(self, handler_cls: type[Handler]) -> None:
        self.cls = handler_cls
        self.name = f"callmonitor:{handler_cls.__module__}.{handler_cls.__qualname__}"

    def encode(self, value: Any):
        with tempfile.TemporaryDirectory(prefix="casmon-handler-") as d:
            h = self.cls(value, 0)
            h.save(d)
            self.cls.accumulator_done()
            files = sorted(p.relative_to(d).as_posix() for p in Path(d).rglob("*") if p.is_file())
            if not files:
                return None  # the handler saved nothing: the value is pickled instead
            return {"files": files, "target": 0}, [(Path(d) / f).read_bytes() for f in files]

    def decode(self, meta: dict, buffers: list) -> Any:
        from ..runs import _safe_target

        with tempfile.TemporaryDirectory(prefix="casmon-handler-") as d:
            root = Path(d)
            for rel, buf in zip(meta["files"], buffers):
                target = _safe_target(root, rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(buf))
            h = self.cls(None, meta.get("target", 0))
            h.load(d)
            return h.data


class Registry:
    """``REGISTRY``: which ``Handler`` saves which type. ``REGISTRY.add(type, HandlerSubclass)``."""

    def __init__(self) -> None:
        self._registry: dict[type, type[Handler]] = {}

    def add(self, target: type, method: type[Handler]) -> None:
        self._registry[target] = method
        if target is np.ndarray and method is NPHandler:
            register_handler(np.ndarray, ArrayHandler())  # casmon's own: chunked, deduplicated, lazy-openable
        else:
            register_handler(target, _HandlerAdapter(method))

    def accumulator_done(self) -> None:
        for target in self:
            self[target].accumulator_done()

    def __getitem__(self, target: type) -> type[Handler]:
        return self._registry.get(target, DefaultHandler)

    def __contains__(self, target: object) -> bool:
        return target in self._registry

    def __iter__(self):
        return iter(dict(self._registry))

    def __str__(self) -> str:
        out = "{\n"
        for key in self:
            out += f"    {key}: {self[key]}\n"
        return out + "}"

    __repr__ = __str__


REGISTRY = Registry()
REGISTRY.add(np.ndarray, NPHandler)


class Settings:
    """Accepted for compatibility; casmon tells threads and processes apart by itself."""

    _instance: Settings | None = None
    _lock = threading.Lock()

    def __new__(cls) -> Settings:
        with cls._lock:
            if cls._instance is None:
                cls._instance = super().__new__(cls)
                cls._instance._multi_threading = False
                cls._instance._pid = None
                cls._instance._tident = None
        return cls._instance

    @property
    def multi_threading_enabled(self) -> bool:
        return self._multi_threading

    def enable_multi_threading(self, pid: Any, tident: Any = None) -> None:
        self._multi_threading = True
        self._pid = pid
        self._tident = tident


SETTINGS = Settings()


def intercept(func=None, spec=None):
    """Log every call of ``func`` (callmonitor's decorator; stores into ``call-monitor`` or ``$CASMON_STORE``)."""
    if func is None:
        return lambda f: intercept(f)
    return _intercept(func, store=_root())


class Args:
    """Each argument by name as an attribute, defaults filled in; prints like callmonitor's."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __str__(self) -> str:
        return str(self.__dict__.keys())

    def __repr__(self) -> str:
        return repr(self.__dict__.keys())


class DB:
    """callmonitor's database: ``get(name, n)``, ``get_args(name, n)``; reads the latest session."""

    def __init__(self, log: CallLog) -> None:
        self._log = log

    @property
    def root(self) -> str:
        return self._log.store.url

    @property
    def locked(self) -> bool:
        return True  # a loaded database is read-only, as callmonitor's is after saving

    @property
    def log(self) -> CallLog:
        """The full casmon call log (sessions, results, replay)."""
        return self._log

    def _latest(self, name: str) -> tuple[str, int]:
        full = self._log.resolve(name)
        sessions = self._log.functions[full].sessions
        return full, max(sessions)

    def get(self, name: str, call_seq: int) -> tuple[list, dict]:
        full, session = self._latest(name)
        return self._log.get(full, call_seq, session=session)

    def get_args(self, name: str, call_seq: int) -> Args:
        full, session = self._latest(name)
        return Args(self._log.get_args(full, call_seq, session=session)._asdict())

    @property
    def calls(self) -> dict[str, list]:
        out = {}
        for full, fi in self._log.functions.items():
            if fi.sessions:
                out[fi.short] = self._log.calls(full, session=max(fi.sessions))
        return out

    def __str__(self) -> str:
        out = "{\n"
        out += f"    Locked: {self.locked}\n"
        for full, fi in self._log.functions.items():
            if not fi.sessions:
                continue
            latest = fi.sessions[max(fi.sessions)]
            positional = [p[0] for p in fi.params if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
            defaults = [self._log.peek_cell(p[2]) for p in fi.params  # never unpickles what could run code
                        if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") and len(p) > 2]
            out += f"    {fi.short}: " + "{\n"
            out += f"        calls: {len(latest)}\n"
            out += f"        args: {positional}\n"
            out += f"        defaults: {tuple(defaults) if defaults else None}\n"
            out += "    }\n"
        return out + "}"

    __repr__ = __str__


def load(root: str | os.PathLike | Store | None = None) -> DB:
    """Load the database at ``root`` (default ``call-monitor``)."""
    store = default_store(root if root is not None else _root())
    store.flush()
    return DB(CallLog(store))
