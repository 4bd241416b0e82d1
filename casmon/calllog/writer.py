"""Writing the call log: ``@casmon.intercept``, sessions, and the recorder that batches calls.

Each process run is a *session*, numbered from 1 in the store (numbers are
claimed with create-if-absent refs ``calllog/sessions/{n}``, so two processes
never share one). A call records the function's name (``module.qualname``), its
invocation number (from 1, per function and session), its arguments, start
time, duration, thread, and its result or exception.

Arguments are captured *before* the call runs, so a function that mutates its
input does not change what was logged. Small JSON scalars (None, bool, int,
float, str up to 256 characters) are kept inline in the record; every other
value is stored in the store, deduplicated, and the record holds its digest
(200 calls passing the same 16 MiB array store it once). A value that cannot
be stored is replaced by a :class:`NotStored` marker, with one warning per
function and type; the call itself always runs normally.

Records are written in batches, one record per flush and session: at most one
small record per flush instead of a file per call. A flush happens every 5
seconds in a background thread, at ``casmon.flush()``, at ``store.close()``
and at interpreter exit (and, in a pool's or a Ray worker, before each call
returns). A process killed with SIGKILL loses at most the calls since its last
flush, and leaves the store valid.

Call numbers belong to the session: the recorder keeps one counter per function
name, so copies of an intercepted function -- unpickled by value for each Dask or
Ray task (cloudpickle ships a script's functions so), or defined again by a
notebook cell run twice -- number on instead of starting at 1 again. A logged
function pickles as "intercept this function with these options", never with the
state a call bound.

A replay (:func:`not_logged`) logs nothing: neither the replayed call nor the
calls it makes, in this thread or the asyncio tasks it starts.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import itertools
import json
import os
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from casmon.keys.names import keep_flat_names
from casmon.calllog import engines
from casmon.errors import stacklevel_outside
from casmon.calllog.records import INLINE_INT_BITS, INLINE_STR, KIND_CALLFN, KIND_CALLS, KIND_SESSION, NOT_RECORDED, SCALARS, SESSION_REFS, type_name
from casmon.keys.codeversion import function_name
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint
from casmon.scrub import scrub, scrub_argv

if TYPE_CHECKING:  # the store is loaded at the first call, not when a function is decorated
    from casmon.store.store import Store

__all__ = ["intercept", "flush", "CallLogWarning", "Recorder", "Intercepted", "recorder_for", "find_recorder",
           "restart_numbering", "registered_function", "main_origin", "recorders", "intercepted", "all_intercepted",
           "not_logged"]

#: Calls waiting in memory before a flush is forced.
PENDING_MAX = 200_000
#: Waiting rows are JSON-encoded in blocks of this many by a background thread while calls go
#: on, so a flush -- the one at exit above all -- encodes only the last, partial block.
ENCODE_BLOCK = 4096
#: How often (seconds) the encoding thread looks for a full block: often, so the rows left for
#: the exit flush are about one partial block (a look is a length check; blocks stay large).
ENCODE_POLL = 0.02
#: How long a flush waits for a block being encoded, rather than encode its rows again.
ENCODE_WAIT = 0.5


def main_origin() -> dict | None:
    """Where this process's ``__main__`` came from, for replaying functions logged as ``__main__.f``.

    ``{"script": "/abs/path/x.py"}`` for ``python x.py``, ``{"module": "pkg.mod", "script": path}`` for
    ``python -m pkg.mod``; None for an interactive interpreter (and whatever else has no file).
    ``casmon replay --import-main`` imports the recorded script -- only when the user asks.
    """
    m = sys.modules.get("__main__")
    f = getattr(m, "__file__", None)
    if not isinstance(f, str) or not f.endswith(".py"):
        return None
    out: dict = {"script": os.path.abspath(f)}
    spec = getattr(m, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        out["module"] = spec.name
    return out


class CallLogWarning(UserWarning):
    """An argument or result could not be stored; the call ran normally."""


_CASMON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


#: True while a replay runs: nothing is logged in this context (see :func:`not_logged`).
_not_logging: contextvars.ContextVar[bool] = contextvars.ContextVar("casmon_calllog_not_logging", default=False)
#: How many :func:`not_logged` blocks are open in the process: a call reads the context variable only then.
_not_logged_blocks = [0]
_not_logged_lock = threading.Lock()


@contextlib.contextmanager
def not_logged() -> Iterator[None]:
    """Log no intercepted call inside the block (this thread, and asyncio tasks started in it); claim no session.

    Replay runs its call inside one: a replay is a check, not a run, so neither the
    replayed call nor the calls it makes belong in the log (they would start a session
    and become the "latest" calls of their functions, and a function imported under its
    module's name would make a script's name ambiguous).
    """
    token = _not_logging.set(True)
    with _not_logged_lock:
        _not_logged_blocks[0] += 1
    try:
        yield
    finally:
        with _not_logged_lock:
            _not_logged_blocks[0] -= 1
        _not_logging.reset(token)


class _Ref(dict):
    """A stored value in a record: ``{"$": digest}`` (a dict, so JSON takes it as is)."""

    __slots__ = ()


def _mpi_rank() -> int | None:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK", "SLURM_PROCID"):
        v = os.environ.get(var)
        if v is not None and v.isdigit() and var != "SLURM_PROCID":
            return int(v)
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None:
        try:
            return int(mpi.COMM_WORLD.Get_rank())
        except Exception:  # noqa: BLE001
            return None
    return None


class Recorder:
    """One per store and process: the session, and the calls not flushed yet."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.pid = os.getpid()
        self.session: int | None = None
        self.rank = _mpi_rank()
        self.lock = threading.RLock()  # a durable store flushes (and calls back here) while a session is claimed
        self.pending: list[list] = []
        self.refs: set[str] = set()
        self.fns: dict[str, int] = {}  # name -> index in this batch
        self.fn_names: list[str] = []
        # Threads by a number of our own: the OS reuses thread idents once a thread ends.
        self._tls = threading.local()
        self._thread_seq = itertools.count()
        self.threads: dict[int, list] = {}  # our number -> [ident, name]
        self.warned: set = set()
        # Per session: each function's call counter, and the signature record written for it (as its params).
        self.numbers: dict[str, itertools.count] = {}
        self.signatures: dict[str, list] = {}
        self.engine: dict | None = None
        self.array: dict | None = None
        self.flush_each = False  # a Ray worker: ended without exit hooks, so every call is flushed
        # JSON (UTF-8) of the first ``encoded_rows`` rows of ``pending``, in blocks (see ENCODE_BLOCK);
        # ``batch_gen`` changes whenever rows are taken or put back, so a block encoded meanwhile is dropped.
        self.encoded: list[bytes] = []
        self.encoded_rows = 0
        self.batch_gen = 0
        self._inflight: int | None = None  # the batch_gen of the block being encoded, if one is
        self._encoder: threading.Thread | None = None
        store.add_flush_hook(self._flush_hook)

    # -- the session --------------------------------------------------------------
    def ensure_session(self) -> int:
        if self.session is not None:
            return self.session
        with self.lock:
            if self.session is None:
                self.session = self._claim_session()
                if self.store.autoflush:
                    self.store.start_flusher()
        return self.session

    def _claim_session(self) -> int:
        store = self.store
        taken = [int(name.rsplit("/", 1)[-1]) for name in store.refs(SESSION_REFS) if name.rsplit("/", 1)[-1].isdigit()]
        n = max(taken, default=0) + 1
        info = {
            "start": time.time(),
            "pid": self.pid,
            "host": socket.gethostname(),
            "argv": scrub_argv(sys.argv[:20]),  # the ref keeps it too: scrubbed before either is written
            "python": sys.version.split()[0],
            "rank": self.rank,
        }
        main = main_origin()
        if main:
            info["main"] = main
        self.engine, self.array = engines.engine(), engines.job_array()
        self.flush_each = engines.in_ray_worker(self.engine)
        if self.engine:
            info["engine"] = self.engine
        if self.array:
            info["array"] = self.array
        while not store.create_ref(f"{SESSION_REFS}/{n:06d}", None, info):
            n += 1
        store.append(KIND_SESSION, {"n": n, **info, "time": time.time(), "_ref": f"{SESSION_REFS}/{n:06d}"},
                     key=fingerprint(("casmon.session", n)))
        return n

    # -- capturing ----------------------------------------------------------------
    def cell(self, v: Any, what: str, fn: str, once: str | None = None) -> Any:
        """What a record holds for a value: the value itself if a small scalar, else a digest.

        ``what`` names the value in the warning for one that cannot be stored (``parameter 'cb'``), given once
        per function, ``once`` (the parameter; default ``what``) and type."""
        t = type(v)
        if t in SCALARS and (t is not str or len(v) <= INLINE_STR) and (t is not int or v.bit_length() <= INLINE_INT_BITS):
            return v
        try:
            d = self.store.put(v)
        except Exception as e:  # noqa: BLE001 - the call must run whatever we cannot store
            key = (fn, once or what, t)
            if key not in self.warned:
                self.warned.add(key)
                warnings.warn(f"casmon: {fn}: {what} ({type_name(v)}) is not logged, the call ran and its record "
                              f"holds a NotStored marker: {e}", CallLogWarning,
                              stacklevel=stacklevel_outside(_CASMON_DIR))
            return {"!": type_name(v), "why": scrub(str(e)[:200])}
        h = d.hex()
        self.refs.add(h)
        r = _Ref()
        r["$"] = h
        return r

    def bind(self, fi: Intercepted) -> itertools.count:
        """The session's call counter for ``fi``'s name; writes its signature record when the session lacks it."""
        with self.lock:
            params = fi.params_cells(self)
            if self.signatures.get(fi.name) != params:
                rec = {"fn": fi.name, "session": self.session, "params": params}
                refs = [Digest(e[2]["$"]) for e in params if len(e) > 2 and isinstance(e[2], dict) and "$" in e[2]]
                self.store.append(KIND_CALLFN, rec, key=fingerprint(("casmon.callfn", fi.name, self.session)), refs=refs)
                self.signatures[fi.name] = params
            c = self.numbers.get(fi.name)
            if c is None:
                c = self.numbers[fi.name] = itertools.count(1)
            return c

    def log(self, fi: Intercepted, n: int, t0: float, dt: float, args_cells, kwargs_cells, result_cell, exc) -> None:
        tid = getattr(self._tls, "tid", None)
        if tid is None:
            tid = self._tls.tid = next(self._thread_seq)
            self.threads[tid] = [threading.get_ident(), threading.current_thread().name]
        with self.lock:  # the index belongs to this batch: look it up under the lock a flush takes
            idx = self.fns.get(fi.name)
            if idx is None:
                idx = self.fns[fi.name] = len(self.fn_names)
                self.fn_names.append(fi.name)
            self.pending.append([idx, n, t0, dt, tid, args_cells, kwargs_cells, result_cell, exc])
            full = len(self.pending) >= PENDING_MAX
            block = len(self.pending) - self.encoded_rows >= ENCODE_BLOCK
        if block and self._encoder is None:
            self._start_encoder()
        if full:
            self.store.flush()
        elif self.store.flush_each_call or self.flush_each:  # durable, or a worker that may end right after this call
            self.store.flush_for_call()

    def _flush_hook(self, store: Store) -> None:
        gen = self._inflight
        if gen is not None and gen == self.batch_gen:
            # The encoder holds the GIL until its block is done: wait for it instead of encoding its rows
            # again (up to a block's worth, tens of milliseconds at exit). Sleeping takes no lock.
            deadline = time.monotonic() + ENCODE_WAIT
            while self._inflight == gen and time.monotonic() < deadline:
                time.sleep(0.0005)
        with self.lock:
            if not self.pending or self.session is None:
                return
            rows, self.pending = self.pending, []
            refs, self.refs = self.refs, set()
            names, self.fn_names = self.fn_names, []
            self.fns = {}
            blocks, done = self.encoded, self.encoded_rows
            self.encoded, self.encoded_rows = [], 0
            self.batch_gen += 1
            threads = {str(k): v for k, v in self.threads.items()}
        try:
            record = {"session": self.session, "pid": self.pid, "rank": self.rank, "fns": names, "threads": threads, "c": rows}
            encoded = None
            if blocks:  # the same JSON as encoding the record whole, most rows encoded already
                head = json.dumps({k: v for k, v in record.items() if k != "c"}, separators=(",", ":"))
                tail = json.dumps(rows[done:], separators=(",", ":"), allow_nan=True)[1:-1].encode()
                # Pieces, joined once by append (a record of 100,000 calls is about 8 MB).
                encoded = [head[:-1].encode() + b',"c":[']
                for i, b in enumerate(blocks + ([tail] if tail else [])):
                    encoded += (b",", b) if i else (b,)
                encoded.append(b"]}")
            store.append(KIND_CALLS, record, refs=[Digest(h) for h in refs], encoded=encoded)
        except BaseException as e:
            if not getattr(e, "record_added", False):  # added, and only its flush failed: it is written later
                self._put_back(rows, refs, names)  # Ctrl-C or a failed append: the rows wait for the next flush
            raise

    def _start_encoder(self) -> None:
        """Start (once) the thread that encodes full blocks of waiting rows."""
        with self.lock:
            if self._encoder is not None:
                return
            from casmon.store import lifecycle

            if lifecycle.exiting():
                return
            # A daemon that polls, and takes no lock the hot path or the exit flush could wait on:
            # a Ctrl-C in the main thread can leave a lock (an Event's, or the batch's) taken, and
            # the logged calls and the exit flush must still go on (the batch's lock is reentrant
            # for the main thread; this thread only ever tries it with a timeout).
            t = threading.Thread(target=self._encode_loop, name="casmon-calllog-encode", daemon=True)
            try:
                t.start()
            except RuntimeError:  # the interpreter is exiting: the flush encodes everything
                return
            self._encoder = t

    def _encode_loop(self) -> None:
        from casmon.store import lifecycle

        stop = lifecycle.stop_flushers
        pid = self.pid
        while not stop.is_set() and os.getpid() == pid:
            if len(self.pending) - self.encoded_rows < ENCODE_BLOCK:
                time.sleep(ENCODE_POLL)
                continue
            while not stop.is_set():
                if not self.lock.acquire(timeout=1.0):
                    break
                try:
                    start, gen = self.encoded_rows, self.batch_gen
                    if len(self.pending) - start < ENCODE_BLOCK:
                        break
                    rows = self.pending[start : start + ENCODE_BLOCK]
                    self._inflight = gen
                finally:
                    self.lock.release()
                try:
                    try:
                        text = json.dumps(rows, separators=(",", ":"), allow_nan=True)[1:-1].encode()
                    except Exception:  # noqa: BLE001 - the flush encodes these rows itself (and says what is wrong)
                        break
                    if not self.lock.acquire(timeout=1.0):
                        break
                    try:
                        if self.batch_gen != gen or self.encoded_rows != start:
                            continue  # taken or put back meanwhile
                        self.encoded.append(text)
                        self.encoded_rows = start + len(rows)
                    finally:
                        self.lock.release()
                finally:
                    self._inflight = None

    def _put_back(self, rows: list, refs: set, names: list) -> None:
        """Return taken rows to the front of the batch, renumbering the functions of rows logged since."""
        with self.lock:
            self.encoded, self.encoded_rows = [], 0  # encoded again (the newer rows' numbers change)
            self.batch_gen += 1
            newer_names, newer = self.fn_names, self.pending
            fns = {n: i for i, n in enumerate(names)}
            for n in newer_names:
                fns.setdefault(n, len(fns))
            for row in newer:
                row[0] = fns[newer_names[row[0]]]
            self.fn_names = list(fns)
            self.fns = fns
            self.pending = rows + newer
            self.refs = refs | self.refs


#: This process's recorders by ``id(store)`` (check ``r.store is store``: ids are reused); see :func:`find_recorder`.
recorders: dict[int, Recorder] = {}
_recorders_lock = threading.Lock()
#: Every function ``@casmon.intercept`` wrapped in this process, by full name: the original function, for replay.
intercepted: dict[str, Callable] = {}


def recorder_for(store: Store) -> Recorder:
    """This process's recorder for ``store`` (made on first use; its session is claimed by the first call)."""
    r = recorders.get(id(store))
    if r is None or r.store is not store:
        with _recorders_lock:
            r = recorders.get(id(store))
            if r is None or r.store is not store:
                r = recorders[id(store)] = Recorder(store)
    return r


def _forget_recorders_in_child() -> None:
    # A forked child is a new session; the parent flushes its own pending calls.
    recorders.clear()
    for fi in all_intercepted:
        fi.reset()


#: The state of every function intercepted in this process, in the order they were wrapped.
all_intercepted: list[Intercepted] = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_recorders_in_child)


def find_recorder(store: Store) -> Recorder | None:
    """This process's recorder for ``store`` if it has one; None makes none (asking creates nothing)."""
    r = recorders.get(id(store))
    return r if r is not None and r.store is store else None


def restart_numbering(r: Recorder) -> None:
    """Number the calls of every function logged through ``r`` from 1 again (for a new session)."""
    with r.lock:
        r.numbers.clear()
        r.signatures.clear()
    for fi in all_intercepted:
        if fi.bound_recorder is r:
            fi.reset()


def registered_function(name: str) -> Callable | None:
    """The original function ``@casmon.intercept`` registered under full name ``name`` in this process, or None."""
    return intercepted.get(name)


class Intercepted:
    """The state behind one intercepted function."""

    def __init__(self, fn: Callable, store, result: bool) -> None:
        self.fn = fn
        self.name = function_name(fn)
        self.sig = inspect.signature(fn)
        self._store_arg = store
        self.result = result
        # What a warning calls each argument: positional parameters by position, the rest by kind.
        ps = list(self.sig.parameters.values())
        self._positional = [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        self._keywords = {p.name for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        self._varargs = next((p.name for p in ps if p.kind is p.VAR_POSITIONAL), None)
        self._varkw = next((p.name for p in ps if p.kind is p.VAR_KEYWORD), None)
        self.reset()

    def __reduce__(self) -> tuple[Callable[..., Any], tuple[Any, ...]]:
        # As "intercept fn with these options": the recorder a call bound (a store, its lock) stays here, and the
        # copy a worker unpickles numbers its calls in that worker's session.
        return (_rebuild, (self.fn, _store_location(self._store_arg), self.result))

    def reset(self) -> None:
        self.counter: itertools.count | None = None
        self._recorder: Recorder | None = None

    @property
    def bound_recorder(self) -> Recorder | None:
        """The recorder this function's calls go to now; None before its first call (or after a fork)."""
        return self._recorder

    def recorder(self) -> Recorder:
        """The recorder for this function's store, its session claimed and the signature written (once a session)."""
        r = self._recorder
        if r is None or r.store.closed:
            from casmon.store.store import default_store

            store = default_store(self._store_arg)
            r = recorder_for(store)
            r.ensure_session()
            self.counter = r.bind(self)
            self._recorder = r
        return r

    def params_cells(self, r: Recorder) -> list[list[Any]]:
        """The signature as the ``callfn`` record holds it: ``[name, kind, default cell?]`` per parameter."""
        params: list[list[Any]] = []
        for p in self.sig.parameters.values():
            entry: list[Any] = [p.name, p.kind.name]
            if p.default is not inspect.Parameter.empty:
                entry.append(r.cell(p.default, f"the default of parameter {p.name!r}", self.name))
            params.append(entry)
        return params

    def arg_label(self, i: int) -> tuple[str, str]:
        """Positional argument ``i`` as a warning names it (``parameter 'x'``, ``parameter 'args' item 2``), and
        the parameter it belongs to (warned about once a type)."""
        if i < len(self._positional):
            return f"parameter {self._positional[i]!r}", self._positional[i]
        if self._varargs is not None:
            return f"parameter {self._varargs!r} item {i - len(self._positional)}", self._varargs
        return f"argument {i}", str(i)  # more arguments than the signature takes: the call itself raises

    def kwarg_label(self, k: str) -> tuple[str, str]:
        """Keyword argument ``k`` as a warning names it (``parameter 'k'``, ``parameter 'kwargs' key 'k'``), and the
        parameter it belongs to."""
        if k in self._keywords:
            return f"parameter {k!r}", k
        if self._varkw is not None:
            return f"parameter {self._varkw!r} key {k!r}", self._varkw
        return f"argument {k!r}", k

    def capture(self, r: Recorder, args: tuple, kwargs: dict):
        for a in args:
            if type(a) not in SCALARS or (type(a) is str and len(a) > INLINE_STR) or (
                    type(a) is int and a.bit_length() > INLINE_INT_BITS):
                break
        else:
            args_cells = list(args)
            if not kwargs:
                return args_cells, {}
            for v in kwargs.values():
                if type(v) not in SCALARS or (type(v) is str and len(v) > INLINE_STR) or (
                        type(v) is int and v.bit_length() > INLINE_INT_BITS):
                    break
            else:
                return args_cells, dict(kwargs)
        name = self.name
        args_out = []
        for i, a in enumerate(args):
            label, param = self.arg_label(i)
            args_out.append(r.cell(a, label, name, param))
        kwargs_out = {}
        for k, v in kwargs.items():
            label, param = self.kwarg_label(k)
            kwargs_out[k] = r.cell(v, label, name, param)
        return args_out, kwargs_out

    # -- the two halves of a call, around the function itself ---------------------
    def begin(self, args: tuple, kwargs: dict):
        """Everything logged before the call; None if the call is not logged (the call runs anyway): inside a
        replay, or when the log cannot be written."""
        if _not_logged_blocks[0] and _not_logging.get():
            return None
        try:
            r = self._recorder or self.recorder()
            n = next(self.counter)  # type: ignore[arg-type]  # bound with the recorder
            a, k = self.capture(r, args, kwargs)  # before the call: the function may mutate its inputs
        except Exception as e:  # noqa: BLE001 - a full disk or an unreachable store must not stop the call
            self._unavailable(e)
            return None
        return r, n, a, k, time.time(), time.perf_counter()

    def _unavailable(self, e: Exception) -> None:
        if not getattr(self, "_warned_unavailable", False):
            self._warned_unavailable = True
            warnings.warn(f"casmon: calls of {self.name} are not logged: {e}", CallLogWarning,
                              stacklevel=stacklevel_outside(_CASMON_DIR))

    def end(self, ctx, out: Any) -> None:
        r, n, a, k, t0, p0 = ctx
        dt = time.perf_counter() - p0
        try:
            rc = r.cell(out, "the result", self.name) if self.result else NOT_RECORDED
            r.log(self, n, t0, dt, a, k, rc, None)
        except Exception as e:  # noqa: BLE001
            self._unavailable(e)

    def fail(self, ctx, e: BaseException) -> None:
        r, n, a, k, t0, p0 = ctx
        try:
            r.log(self, n, t0, time.perf_counter() - p0, a, k, None, [type_name(e), scrub(str(e)[:1000])])
        except Exception as err:  # noqa: BLE001
            self._unavailable(err)


def _store_location(store: Any) -> Any:
    """Where a worker finds ``store``: a :class:`Store` as its URL, a local path made absolute, None as None (the
    worker's own ``$CASMON_STORE``), as cached functions travel."""
    from casmon.store.store import Store

    if isinstance(store, Store):
        return store.url
    if isinstance(store, (str, os.PathLike)) and "://" not in str(store):
        return os.path.abspath(os.fspath(store))
    return store


_rebuilt: dict[tuple, Intercepted] = {}


def _rebuild(fn: Callable, store: Any, result: bool) -> Intercepted:
    """Unpickle an intercepted function's state: one per name and options in a process, however many copies of
    the function arrive (Dask unpickles a task's function for each task)."""
    key = (function_name(fn), repr(store), result)
    fi = _rebuilt.get(key)
    if fi is None:
        with _recorders_lock:
            fi = _rebuilt.get(key)
            if fi is None:
                fi = Intercepted(fn, store, result)
                all_intercepted.append(fi)
                intercepted.setdefault(fi.name, fn)
                _rebuilt[key] = fi
    return fi


def intercept(fn: Callable | None = None, *, store: Store | str | None = None, result: bool = True):
    """Log every call of ``fn`` to a casmon store (see the module docstring).

    ``store``: a :class:`Store` or location (default ``$CASMON_STORE`` or ``./.casmon``).
    ``result``: also store each call's result (default True).
    """
    if fn is None:
        return functools.partial(intercept, store=store, result=result)
    if isinstance(fn, (staticmethod, classmethod)):
        return type(fn)(intercept(fn.__func__, store=store, result=result))
    if not callable(fn):
        raise TypeError(f"@intercept expects a function, got {type(fn).__name__}")
    fi = Intercepted(fn, store, result)
    all_intercepted.append(fi)
    intercepted[fi.name] = fn
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def async_wrapper(*args, **kwargs):
            ctx = fi.begin(args, kwargs)
            if ctx is None:
                return await fn(*args, **kwargs)
            try:
                out = await fn(*args, **kwargs)
            except BaseException as e:
                fi.fail(ctx, e)
                raise
            fi.end(ctx, out)
            return out

        wrapper = async_wrapper
    else:

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            ctx = fi.begin(args, kwargs)
            if ctx is None:
                return fn(*args, **kwargs)
            try:
                out = fn(*args, **kwargs)
            except BaseException as e:
                fi.fail(ctx, e)
                raise
            fi.end(ctx, out)
            return out

    out: Any = wrapper  # the state rides on the wrapper, for casmon replay and compat.callmonitor
    out.__casmon_intercept__ = fi
    return out


def flush() -> None:
    """Flush every open store (pending calls, cache entries, records)."""
    from casmon.store.lifecycle import open_stores

    for s in list(open_stores):
        s.flush()

# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([CallLogWarning])
