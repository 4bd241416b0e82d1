"""callmonitor 0.3.x's public API on the casmon store.

    from casmon.compat.callmonitor import intercept, load, rc, REGISTRY, Handler, Settings, CONTEXT

Every name callmonitor 0.3.7 exports is here (``intercept``, ``load``, ``rc``,
``CONTEXT``/``Context``, ``snapshot``, ``save_db``, ``DB``, ``new``, ``save``,
``Counter``, ``ArgsHandler``, ``Args``, ``Handler``, ``DefaultHandler``,
``NPHandler``, ``Registry``/``REGISTRY``, ``Settings``/``SETTINGS``,
``VERSION``/``__version__``), with callmonitor's behaviour or a clear error
naming what replaces it.

Differences that are fixes: calls go into a casmon store (default folder
``call-monitor``, or ``$CASMON_STORE``) instead of a folder and pickle files
per call; a repeated array is stored once; the log is written every few
seconds and at exit, so a killed process leaves a readable log; each run is a
new *session* in the same store instead of a ``call-monitor-1`` folder, and
threads and processes need no ``-tid=`` suffix. ``db.get(name, n)`` reads the
latest session and numbers calls per ``__name__`` as callmonitor does (casmon's
own API keeps qualified names); ``casmon.load`` gives the full API (sessions,
results, replay). ``load`` of a folder written by callmonitor itself reads it
(``casmon import`` keeps it for good).
"""

from __future__ import annotations

import os
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from casmon.calllog import CallLog, Call
from casmon.calllog import intercept as _intercept
from casmon.compat.importer import handler_value_name, import_path
from casmon.store.serialize import ArrayHandler, register_handler
from casmon.store.store import Store, default_store
from casmon.view.text import unqualified_name

__all__ = ["intercept", "load", "rc", "snapshot", "save_db", "new", "save", "DB", "Args", "ArgsHandler", "Counter",
           "REGISTRY", "Registry", "Handler", "DefaultHandler", "NPHandler", "Settings", "SETTINGS", "Context",
           "CONTEXT", "VERSION", "__version__", "DEFAULT_ROOT", "DBNotInitialized", "DBLocked", "CounterLocked",
           "CallNotLogged"]

#: The callmonitor release whose API this module follows.
VERSION = (0, 3, 7)
__version__ = "%d.%d.%d" % VERSION
DEFAULT_ROOT = "call-monitor"


def _root() -> str:
    """``$CASMON_STORE``, else ``call-monitor`` -- or, as callmonitor never overwrites a folder, the first
    ``call-monitor-N`` that does not hold callmonitor's own data (``casmon import`` brings that in)."""
    env = os.environ.get("CASMON_STORE")
    if env:
        return env
    root, n = DEFAULT_ROOT, 0
    while _is_callmonitor_folder(Path(root)):
        n += 1
        root = f"{DEFAULT_ROOT}-{n}"
    return root


class DBNotInitialized(Exception):
    """``CONTEXT.db`` before the first intercepted call (as in callmonitor)."""


class DBLocked(Exception):
    """Writing to a loaded (read-only) database."""


class CounterLocked(Exception):
    """Changing a locked :class:`Counter`."""


class CallNotLogged(LookupError):
    """``db.get(name, n)`` for a call that was not logged."""


class _Singleton(type):
    """callmonitor's singletons: ``Registry()``, ``Settings()`` and ``Context()`` return the one instance."""

    _instances: dict = {}
    _lock = threading.Lock()

    def __call__(cls, *args, **kwargs):
        inst = cls._instances.get(cls)
        if inst is None:
            with cls._lock:
                inst = cls._instances.get(cls)
                if inst is None:
                    inst = cls._instances[cls] = super().__call__(*args, **kwargs)
        return inst


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
        self._data = None


class _HandlerAdapter:
    """Runs a callmonitor ``Handler`` subclass as a casmon handler: its files become the value's buffers."""

    def __init__(self, handler_cls: type[Handler]) -> None:
        self.cls = handler_cls
        self.name = handler_value_name(handler_cls.__module__, handler_cls.__qualname__)

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
        from casmon.runs import safe_target

        with tempfile.TemporaryDirectory(prefix="casmon-handler-") as d:
            root = Path(d)
            for rel, buf in zip(meta["files"], buffers):
                target = safe_target(root, rel)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bytes(buf))
            h = self.cls(None, meta.get("target", 0))
            h.load(d)
            return h.data


class Registry(metaclass=_Singleton):
    """``REGISTRY``: which ``Handler`` saves which type. ``REGISTRY.add(type, HandlerSubclass)``.

    ``Registry()`` is ``REGISTRY`` (a singleton, as in callmonitor).
    """

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


class Settings(metaclass=_Singleton):
    """callmonitor's settings. casmon tells threads and processes apart by itself, so they change no folder name.

    ``enable_multi_threading(pid, tident)``: ``pid`` (an MPI rank, say) is
    recorded as the session's rank when MPI does not tell casmon one.
    """

    def __init__(self) -> None:
        self._multi_threading = False
        self._pid: Any = None
        self._tident: Any = None

    @property
    def multi_threading_enabled(self) -> bool:
        return self._multi_threading

    def enable_multi_threading(self, pid: Any, tident: Any = None) -> None:
        self._multi_threading = True
        self._pid = pid
        self._tident = tident

    def disable_multi_threading(self) -> None:
        self._multi_threading = False

    disbale_multi_threading = disable_multi_threading  # callmonitor's spelling

    @property
    def pid(self) -> Any:
        return self._pid

    @property
    def tident(self) -> Any:
        return self._tident

    @property
    def tid_tag(self) -> str:
        """callmonitor's folder suffix; casmon keeps one store, so it only informs."""
        if not self._multi_threading:
            return ""
        return f"-pid={self._pid}" if self._tident is None else f"-pid={self._pid}-tident={self._tident}"


SETTINGS = Settings()
SETTINGS.enable_multi_threading(os.getpid(), threading.get_ident())  # callmonitor 0.3.7 does this at import


def rc(multi_threading: bool | None = None, pid: Any = None, tident: Any = None) -> None:
    """callmonitor's run configuration: ``rc(multi_threading=True, pid=rank)`` before the first call.

    The rank is recorded with the session (when MPI does not give casmon one).
    """
    if multi_threading:
        pid = os.getpid() if pid is None else pid
        tident = threading.get_ident() if tident is None else tident
        SETTINGS.enable_multi_threading(pid, tident=tident)
        if type(pid) is int and pid != os.getpid():
            from casmon.calllog import recorder_for

            try:
                r = recorder_for(default_store(_root()))
            except Exception:  # noqa: BLE001 - the rank is a nicety; the calls are logged anyway
                return
            with r.lock:
                if r.rank is None and r.session is None:
                    r.rank = pid


class Counter:
    """callmonitor's call counter: ``increment(key)``, ``counter[key]`` (0 if never), ``lock()``."""

    def __init__(self) -> None:
        self._locked = False
        self.reset()

    def lock(self) -> None:
        self._locked = True

    @property
    def locked(self) -> bool:
        return self._locked

    def reset(self) -> None:
        if self._locked:
            raise CounterLocked
        self._count: dict = {}

    def reset_key(self, key: Any) -> None:
        if self._locked:
            raise CounterLocked
        self._count[key] = 0

    def __iter__(self):
        return (k for k, v in list(self._count.items()) if v > 0)

    def __contains__(self, key: object) -> bool:
        return self._count.get(key, 0) > 0

    def __getitem__(self, key: Any) -> int:
        return self._count.get(key, 0)

    def increment(self, key: Any) -> None:
        if self._locked:
            raise CounterLocked
        self._count[key] = self._count.get(key, 0) + 1

    def __str__(self) -> str:
        return "{\n" + "".join(f"    {k}: {self[k]}\n" for k in self) + "}"

    __repr__ = __str__


class ArgsHandler:
    """callmonitor's argument capture: ``ArgsHandler(name, argspec).save(args, kwargs)`` -> input descriptor.

    The descriptor holds one ``Handler`` per argument (``REGISTRY`` chooses); ``@intercept`` does not use it
    (casmon stores arguments itself) -- it is here for code that built descriptors by hand.
    """

    def __init__(self, name: str, argspec: Any) -> None:
        self._name = name
        self._argspec = argspec

    @property
    def name(self) -> str:
        return self._name

    @property
    def argspec(self) -> Any:
        return self._argspec

    @staticmethod
    def types(args, kwargs):
        return [type(a) for a in args], {k: type(v) for k, v in kwargs.items()}

    def save(self, args, kwargs) -> dict:
        registry = Registry()
        out_args = [registry[type(a)](a, i) for i, a in enumerate(args)]
        out_kwargs = {k: registry[type(v)](v, k) for k, v in kwargs.items()}
        registry.accumulator_done()
        return {"args": out_args, "kwargs": out_kwargs, "argspec": self._argspec}


class Args:
    """Each argument by name as an attribute, defaults filled in; prints like callmonitor's.

    ``Args(argspec, args, kwargs)`` as in callmonitor (``argspec`` from ``inspect.getfullargspec``).
    """

    def __init__(self, argspec: Any, args: Any = (), kwargs: Any = None) -> None:
        if isinstance(argspec, dict) and not args and kwargs is None:  # casmon's own: values by name
            self.__dict__.update(argspec)
            return
        kwargs = kwargs or {}
        names = list(argspec.args)
        defaults = tuple(argspec.defaults or ())
        for i, name in enumerate(names):
            if i < len(args):
                v = args[i]
            elif name in kwargs:
                v = kwargs[name]
            else:
                v = defaults[i - (len(names) - len(defaults))]
            setattr(self, name, v)

    def __str__(self) -> str:
        return str(self.__dict__.keys())

    def __repr__(self) -> str:
        return repr(self.__dict__.keys())


def intercept(func=None, spec=None):
    """Log every call of ``func`` (callmonitor's decorator; stores into ``call-monitor`` or ``$CASMON_STORE``)."""
    if func is None:
        return lambda f: intercept(f)
    return _intercept(func, store=_root())


class DB:
    """callmonitor's database: ``get(name, n)``, ``get_args(name, n)``, ``counter``, ``calls``; read-only.

    As in callmonitor, calls are numbered per ``__name__``: ``A.run`` and ``B.run`` share one sequence,
    in the order they were called, so ``db.get("run", 2)`` is the second call of either. The latest
    session is read (``session=`` picks another); ``db.log`` is the full casmon :class:`CallLog`.
    """

    def __init__(self, root: Any = DEFAULT_ROOT, session: int | None = None) -> None:
        if isinstance(root, CallLog):
            self._log = root
        else:
            store = default_store(root)
            store.flush()
            self._log = CallLog(store)
        self._session = session
        self._locked = True  # a database read back is read-only, as callmonitor's is once saved

    # -- callmonitor's properties ------------------------------------------------------
    @property
    def root(self) -> str:
        return self._log.store.url

    @property
    def locked(self) -> bool:
        return self._locked

    def lock(self) -> None:
        self._locked = True

    @property
    def version(self) -> tuple:
        return VERSION

    @property
    def log(self) -> CallLog:
        """The full casmon call log (sessions, results, replay)."""
        return self._log

    def _sequence(self, name: str) -> list[Call]:
        """Calls of every function named ``name`` (its ``__name__``), in call order, in one session."""
        fns = [fi for full, fi in self._log.functions.items() if unqualified_name(full) == name or full == name]
        if not fns:
            known = ", ".join(sorted({unqualified_name(f) for f in self._log.functions})) or "none"
            raise CallNotLogged(f"no logged function {name!r}; logged functions: {known}")
        session = self._session
        if session is None:
            session = max((s for fi in fns for s in fi.sessions), default=None)
        calls = [c for fi in fns for c in fi.sessions.get(session, [])] if session is not None else []
        calls.sort(key=lambda c: (c.start, c.name, c.n))
        return calls

    @property
    def counter(self) -> Counter:
        """Calls per ``__name__`` in the session read (a locked :class:`Counter`)."""
        out = Counter()
        for name in sorted({unqualified_name(f) for f in self._log.functions}):
            for _ in self._sequence(name):
                out.increment(name)
        out.lock()
        return out

    def call(self, name: str, call_seq: int) -> Call:
        """Call ``call_seq`` (from 1) of the functions named ``name``: a casmon :class:`~casmon.calllog.reader.Call`."""
        calls = self._sequence(name)
        if not 1 <= call_seq <= len(calls):
            raise CallNotLogged(f"{name} has {len(calls)} logged call(s); no call {call_seq} (calls count from 1)")
        return calls[call_seq - 1]

    def get(self, name: str, call_seq: int) -> tuple[list, dict]:
        return self.call(name, call_seq).inputs()

    def get_args(self, name: str, call_seq: int) -> Args:
        """The call's positional parameters by name, defaults filled in (callmonitor's ``Args``)."""
        c = self.call(name, call_seq)
        values = dict(vars(c.get_args()))
        keep = [p[0] for p in self._log.functions[c.name].params if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
        return Args({k: values[k] for k in keep if k in values})

    @property
    def calls(self) -> dict[str, list]:
        return {name: self._sequence(name) for name in sorted({unqualified_name(f) for f in self._log.functions})}

    @property
    def dirs(self):
        """The names with logged calls (callmonitor's per-function folders)."""
        yield from (name for name, calls in self.calls.items() if calls)

    def __str__(self) -> str:
        out = "{\n"
        out += f"    Locked: {self.locked}\n"
        for name, calls in self.calls.items():
            if not calls:
                continue
            fi = self._log.functions[calls[0].name]  # callmonitor shows the first call's argspec
            positional = [p[0] for p in fi.params if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
            defaults = [self._log.peek_cell(p[2]) for p in fi.params  # never unpickles what could run code
                        if p[1] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD") and len(p) > 2]
            out += f"    {name}: " + "{\n"
            out += f"        calls: {len(calls)}\n"
            out += f"        args: {positional}\n"
            out += f"        defaults: {tuple(defaults) if defaults else None}\n"
            out += "    }\n"
        return out + "}"

    __repr__ = __str__


def _is_callmonitor_folder(path: Path) -> bool:
    return path.is_dir() and not (path / "casmon.json").exists() and (
        (path / "db.pkl").is_file() or any(path.glob("*/*/input_descriptor.pkl")))


def load(root: str | os.PathLike | Store | None = None) -> DB:
    """Load the database at ``root`` (default ``call-monitor``).

    A folder written by callmonitor itself (``db.pkl`` and a folder per call)
    is read into memory -- its pickles are loaded, as callmonitor's ``load``
    loads them, so load only your own folders. ``casmon import`` keeps it in a
    store for good.
    """
    root = root if root is not None else _root()
    if isinstance(root, (str, os.PathLike)) and _is_callmonitor_folder(Path(root)):
        store = default_store(f"memory://callmonitor-{uuid.uuid4().hex}")
        import_path(root, store, trust=True)
        return DB(CallLog(store))
    store = default_store(root)
    store.flush()
    return DB(CallLog(store))


def save(db: DB) -> None:
    """callmonitor's ``save(db)``: write what is pending (casmon writes the log itself, every few seconds and at exit)."""
    db.log.store.flush()


def new(db: Any) -> None:
    """callmonitor's ``new(db)`` made a fresh ``call-monitor-N`` folder; casmon starts sessions by itself."""
    raise NotImplementedError(
        "callmonitor.new(db) is not needed with casmon: every process is a new session in the same store, "
        "and CONTEXT.new() (or snapshot()) starts a new session within a process")


class Context(metaclass=_Singleton):
    """callmonitor's ``CONTEXT``: the database of this process. ``CONTEXT.new()`` starts a new one.

    ``initialized`` is True once a session exists (after the first intercepted
    call, or ``init()``); ``db`` reads this process's session; ``new()`` writes
    what is pending and starts a new session, whose calls count from 1 again.
    """

    def _recorder(self, create: bool = False):
        from casmon.calllog import find_recorder, recorder_for
        from casmon.store.store import default_store_if_open

        if create:
            return recorder_for(default_store(_root()))
        store = default_store_if_open(_root())  # only look: asking whether a session exists creates no store
        return find_recorder(store) if store is not None else None

    @property
    def initialized(self) -> bool:
        r = self._recorder()
        return r is not None and r.session is not None

    @property
    def db(self) -> DB:
        r = self._recorder()
        if r is None or r.session is None:
            raise DBNotInitialized("no intercepted call has been logged in this process yet")
        r.store.flush()
        return DB(CallLog(r.store), session=r.session)

    def init(self) -> None:
        """Start this process's session now (the first intercepted call would)."""
        self._recorder(create=True).ensure_session()

    def new(self) -> None:
        """Write what is pending and start a new session; calls count from 1 again."""
        from casmon.calllog import restart_numbering

        r = self._recorder()
        if r is None or r.session is None:
            raise DBNotInitialized("no intercepted call has been logged in this process yet")
        r.store.flush()
        with r.lock:
            r.session = None
        restart_numbering(r)
        r.ensure_session()


CONTEXT = Context()


def save_db() -> None:
    """Write this process's pending calls now (callmonitor saves ``db.pkl`` at exit; casmon flushes at exit too)."""
    if CONTEXT.initialized:
        CONTEXT._recorder().store.flush()


def snapshot() -> None:
    """Close this process's database and start a new one (``CONTEXT.new()``)."""
    if CONTEXT.initialized:
        CONTEXT.new()
