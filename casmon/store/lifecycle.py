"""The process around open stores: the exit flush, forks, pool workers, and signals during a flush.

A store keeps small writes in memory until a flush; this module makes sure
the process's end and its children do not lose or duplicate them:

* at interpreter exit every open store is flushed (closed, for a zip file),
  before Python stops the thread pools the I/O needs, and background flush
  threads are stopped first (:func:`exiting`, :data:`stop_flushers`);
* a forked child forgets its parent's pending writes and becomes a new writer;
* a pool's worker (:func:`in_worker_process`) flushes after every call, since
  its pool may end it at any moment;
* :func:`signals_deferred` holds Ctrl-C, SIGTERM and SIGHUP for a step that
  must not be cut in half.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import _thread  # threading's locks, without loading threading on a hit
import warnings
from _weakref import ref as weak_ref  # weakref's own, without loading weakref.py on a hit
from collections.abc import Callable, Iterator
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

if TYPE_CHECKING:
    import signal
    import threading

    from casmon.store.store import Store
else:  # signal.py's functions are _signal's, wrapped to give enums: building those cost a first flush ~0.5 ms
    import _signal as signal

__all__ = ["open_stores", "register", "forget", "exiting", "stop_flushers", "exit_hook_stops_threads",
           "exit_flush_before_threads", "signals_deferred", "watch_for_pool_child", "in_worker_process", "before_exit_flush",
           "flushes_each_call"]

if TYPE_CHECKING:
    from typing import Generic, TypeVar

    _T = TypeVar("_T")

    class _Typed(Generic[_T]):
        pass
else:
    _T = object

    class _Typed:  # Generic's subscript for the type checker, without importing typing on a hit
        def __class_getitem__(cls, item):
            return cls


class WeakObjects(_Typed[_T]):
    """Objects held weakly (one dropped leaves): a ``weakref.WeakSet``'s ``add``, ``discard``, iterating and
    truth, without loading ``_weakrefset`` (a module more on a fresh process's first hit). Held by identity."""

    def __init__(self) -> None:
        self._refs: dict[int, weak_ref[_T]] = {}

    def add(self, obj: _T) -> None:
        refs, key = self._refs, id(obj)

        def gone(r: weak_ref[_T]) -> None:  # the object was collected: its entry goes (unless a new one took it)
            if refs.get(key) is r:
                refs.pop(key, None)

        r = refs.get(key)
        if r is None or r() is not obj:
            refs[key] = weak_ref(obj, gone)

    def discard(self, obj: _T) -> None:
        r = self._refs.get(id(obj))
        if r is not None and r() is obj:
            self._refs.pop(id(obj), None)

    def __iter__(self) -> Iterator[_T]:
        for r in list(self._refs.values()):  # a copy: an object collected meanwhile leaves the dict
            o = r()
            if o is not None:
                yield o

    def __bool__(self) -> bool:
        return any(True for _ in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


#: Every store open in this process (flushed at exit, reset in a forked child).
open_stores: WeakObjects[Store] = WeakObjects()
_hooks_installed = False
_threading_hooked = False  # the exit flush is among threading's exit hooks
_hooks_lock = _thread.allocate_lock()
_exiting = False
_flushed_at_exit = False
#: True when the exit flush runs before Python joins threads (threading's exit hooks, Python 3.9 on), so
#: background flush threads can be ordinary threads that the hook stops (:func:`exit_flush_before_threads`).
exit_hook_stops_threads = sys.version_info >= (3, 9)
_stop: threading.Event | None = None


def _stop_flushers() -> threading.Event:
    """``stop_flushers``, made on first use: a process that starts no thread never loads ``threading``."""
    global _stop
    if _stop is None:
        import threading

        with _hooks_lock:
            if _stop is None:
                _stop = threading.Event()
    return _stop


def __getattr__(name: str) -> Any:
    # ``stop_flushers``: set when the process exits: background flush and encoder threads end (the exit flush
    # writes what they would).
    if name == "stop_flushers":
        return _stop_flushers()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Called at interpreter exit before the stores' exit flush, while their I/O still works (features that
#: still owe the store a write: a run whose end could not be saved yet).
_before_exit: list[Callable[[], None]] = []


def before_exit_flush(fn: Callable[[], None]) -> None:
    """Call ``fn()`` at interpreter exit, before the exit flush (once, however often it is added)."""
    if fn not in _before_exit:
        _before_exit.append(fn)


def register(store: Store) -> None:
    """Count ``store`` among the open stores: flushed at exit, reset in a forked child."""
    open_stores.add(store)
    _install_process_hooks()
    if _exiting:  # opened while the interpreter exits: no flush comes after its writes
        store._flush_each_call = True


def forget(store: Store) -> None:
    """``store`` is closed (or abandoned): nothing of it is flushed at exit any more."""
    open_stores.discard(store)


def exiting() -> bool:
    """True once the interpreter exits: start no thread (Python 3.12 refuses them at shutdown)."""
    return _exiting


#: The signals :func:`signals_deferred` holds (those this platform has).
_HELD_NAMES = ("SIGINT", "SIGTERM", "SIGHUP")
_defer_depth = 0


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT, SIGTERM and SIGHUP for a step that must not be cut in half; they arrive after it.

    Two layers, both in the main thread only (other threads never receive Python's signal handlers): the
    signals are blocked for this thread, and their Python handlers are swapped for one that only notes them,
    since the kernel may hand a process-directed signal to another thread, whose arrival Python then handles in
    the main thread all the same. After the step the handlers are put back and each noted signal is handled
    as it would have been.
    """
    global _defer_depth
    # Without threading loaded no thread but the main one runs Python's handlers, and importing it here (most of
    # a millisecond, in every process's exit flush) would only make this thread its main thread.
    threading = sys.modules.get("threading")
    if threading is not None and threading.current_thread() is not threading.main_thread():
        yield  # other threads never receive KeyboardInterrupt
        return
    if _defer_depth:
        _defer_depth += 1
        try:
            yield
        finally:
            _defer_depth -= 1
        return
    held: list[int] = []
    saved: dict[int, Callable[[int, Any], Any]] = {}
    sigs = tuple(getattr(signal, n) for n in _HELD_NAMES if hasattr(signal, n))

    def note(signum: int, frame: Any) -> None:
        held.append(signum)

    old = signal.pthread_sigmask(signal.SIG_BLOCK, set(sigs)) if hasattr(signal, "pthread_sigmask") else None
    _defer_depth = 1
    try:
        for sig in sigs:
            try:
                prev = signal.getsignal(sig)
                if callable(prev):  # SIG_DFL and SIG_IGN act in the kernel: blocking holds them
                    signal.signal(sig, note)
                    saved[sig] = prev
            except (ValueError, OSError):
                pass
        yield
    finally:
        for sig, handler in saved.items():
            try:
                if signal.getsignal(sig) is note:
                    signal.signal(sig, handler)
            except (ValueError, OSError):
                pass
        _defer_depth = 0
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a blocked signal is delivered here
        for sig in dict.fromkeys(held):
            if sig in saved:
                saved[sig](sig, None)  # Ctrl-C raises KeyboardInterrupt here, after the step


def _install_process_hooks() -> None:
    """At exit flush every open store; in a forked child forget the parent's pending writes."""
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        _hooks_installed = True
    _register_exit_flush()
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)


def _register_exit_flush() -> None:
    # Flush before the interpreter stops thread pools: zarr's stores do their I/O on casmon's event loop
    # and its executor, which refuse work once concurrent.futures has shut down. threading's exit hooks
    # run in reverse order of registration, so ours must come after concurrent.futures.thread's: it does
    # where that module was imported first, and exit_flush_before_pools registers ours again where it is
    # imported later. Fall back to atexit where the hook is missing.
    threading = sys.modules.get("threading")
    if threading is None:
        # No thread yet, casmon's or a pool's: atexit flushes. Before casmon starts a thread that the exit
        # flush stops, or its I/O loop, it registers the flush with threading too (exit_flush_before_threads).
        atexit.register(_flush_all_at_exit)
        return
    global _threading_hooked
    register_hook = getattr(threading, "_register_atexit", None)
    if register_hook is not None:
        try:
            register_hook(_flush_all_at_exit)
            _threading_hooked = True
        except RuntimeError:  # threading's exit hooks ran: a store opened now (a thread Python joins, an atexit handler)
            _exit_hooks_passed()
    else:  # pragma: no cover
        atexit.register(_flush_all_at_exit)


def _exit_hooks_passed() -> None:
    """The interpreter exits and no exit flush of ours is still to come for what is written now: start no thread
    (Python would wait for it at exit, or kill it mid-write) and flush each write as it is made; atexit still
    flushes where it has not run yet."""
    _mark_exiting()
    atexit.register(_flush_all_at_exit)


def _mark_exiting() -> None:
    """No thread of casmon's starts from here on (Python 3.12 refuses them at shutdown), and what is written
    from here on (a user's atexit handler, a thread Python joins after the exit hook) has no later flush to wait
    for: each open store flushes each call's writes, as :func:`flushes_each_call` makes new ones do."""
    global _exiting
    _exiting = True
    for s in list(open_stores):
        s._flush_each_call = True


def exit_flush_before_pools() -> None:
    """Call once ``concurrent.futures`` carries I/O the exit flush needs (casmon's event loop has started): the
    exit flush is registered again, so it runs before that module's exit hook stops every thread pool.

    A store that never started the loop (a local folder: plain system calls) needs no pool to flush, so
    opening one imports neither ``concurrent.futures`` nor ``logging``, which it imports."""
    with _hooks_lock:
        if not _hooks_installed:
            return  # the flush is registered after concurrent.futures' hook when the first store opens
    _register_exit_flush()


def exit_flush_before_threads() -> None:
    """Call before starting a thread that the exit flush stops (a store's background flusher): the flush is
    registered with threading's exit hooks, which run before Python waits for such threads (atexit, where a
    store opened before ``threading`` was loaded registered it, runs after)."""
    import threading  # noqa: F401 - loaded, so the flush registers with it

    with _hooks_lock:
        if not _hooks_installed or _threading_hooked:
            return
    _register_exit_flush()


def _flush_all_at_exit() -> None:
    global _flushed_at_exit
    with _hooks_lock:
        if _flushed_at_exit:
            return  # registered twice (exit_flush_before_pools): the later registration ran first
        _flushed_at_exit = True
    _mark_exiting()
    threading = sys.modules.get("threading")
    if threading is not None:  # without it no thread of casmon's runs, nor waits for this
        _stop_flushers().set()  # background flushers end; the flush below writes what they would have
    for s in list(open_stores):
        t = s._flusher
        if t is not None and threading is not None and t is not threading.current_thread():
            t.join(timeout=30)
    for fn in list(_before_exit):
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report, never crash interpreter exit
            warnings.warn(f"casmon: at exit: {e}", RuntimeWarning, stacklevel=1)
    for s in list(open_stores):
        try:
            if s.backend.needs_close:
                s.close()  # a zip file is only readable once its directory is written
            else:
                s.flush()
        except Exception as e:  # noqa: BLE001 - report, never crash interpreter exit
            warnings.warn(f"casmon: could not flush {s.url} at exit: {e}", RuntimeWarning, stacklevel=1)
    loop = sys.modules.get("casmon.store.backend.loop")  # None: no store of this process started it
    if loop is not None:
        loop.shutdown()


def _after_fork_in_child() -> None:
    for s in list(open_stores):
        s._reset_after_fork()


def watch_for_pool_child(store: Store) -> None:
    """Have multiprocessing tell ``store`` when a child it forks (a fork pool's worker) starts as its child.

    ``os.fork`` alone does not make a worker: a server that forks its workers after
    importing the app (or a test's zygote) runs them as main processes.
    multiprocessing calls its after-fork hooks once the child knows its parent.
    """
    if "multiprocessing" not in sys.modules:
        # 5-10 ms to import, and no pool can fork before it is imported: a fork made once it is registers then.
        _watched_before_multiprocessing.add(store)
        global _fork_hook_installed
        if not _fork_hook_installed and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_watch_in_forked_child)
            _fork_hook_installed = True
        return
    try:
        from multiprocessing import util
    except ImportError:  # pragma: no cover - a platform without multiprocessing
        return
    util.register_after_fork(store, _started_as_pool_child)


_watched_before_multiprocessing: WeakObjects[Store] = WeakObjects()
_fork_hook_installed = False


def _watch_in_forked_child() -> None:
    """Right after a fork, before a pool's worker runs multiprocessing's after-fork hooks: register them."""
    if "multiprocessing" not in sys.modules or not _watched_before_multiprocessing:
        return
    from multiprocessing import util

    for s in list(_watched_before_multiprocessing):
        util.register_after_fork(s, _started_as_pool_child)


def _started_as_pool_child(store: Store) -> None:
    store._flush_each_call = flushes_each_call(store.durable)


def flushes_each_call(durable: bool) -> bool:
    """Whether a store's writes are flushed before the call that made them returns: a durable store's, a worker
    process's (:func:`in_worker_process`), and any made once the interpreter exits (no flush comes after it)."""
    return durable or _exiting or in_worker_process()


def _in_ray_worker() -> bool:
    """A Ray worker process (a task's or an actor's), never the driver; Ray is not imported for this."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    try:
        return bool(ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE)
    except Exception:  # noqa: BLE001 - another Ray version's API: not a worker we know
        return False


def in_worker_process() -> bool:
    """Whether this process is a child that its parent may end at any moment: flush after every call here.

    A pool ends its workers when it is done with them -- ``with multiprocessing.Pool()``
    terminates them (SIGTERM), loky and Dask keep them for later tasks, any pool may kill
    them -- so what a decorated call wrote must be visible before the call returns, not
    at the next background flush. True in every multiprocessing child (fork, spawn,
    forkserver: ``multiprocessing.Pool``, ``ProcessPoolExecutor``, joblib's loky and
    multiprocessing backends, Dask's worker processes), also while a spawned child still
    imports its parent's main module; not in a child of a plain ``os.fork``. ``CASMON_FLUSH_EACH_CALL``
    (``1``/``0``) forces it either way, e.g. ``0`` for a worker that makes many tiny calls
    and is always ended cleanly (``close()`` and ``join()``).
    """
    forced = os.environ.get("CASMON_FLUSH_EACH_CALL", "").strip().lower()
    if forced in ("1", "true", "yes", "on"):
        return True
    if forced in ("0", "false", "no", "off"):
        return False
    if _in_ray_worker():
        return True  # Ray ends its workers without exit hooks
    mp = sys.modules.get("multiprocessing")  # a multiprocessing child has imported it before anything else
    if mp is None:
        return False
    try:
        if mp.parent_process() is not None:
            return True
        # A spawned (or loky, or forkserver) child importing the parent's main module, before it knows its parent.
        return bool(getattr(mp.current_process(), "_inheriting", False))
    except Exception:  # noqa: BLE001 - an odd multiprocessing (a stub, a frozen app): not a worker
        return False
