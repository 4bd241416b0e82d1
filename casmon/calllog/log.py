"""The call log: ``@casmon.intercept`` records every call; ``casmon.load`` reads them back.

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
and at interpreter exit. A process killed with SIGKILL loses at most the calls
since its last flush, and leaves the store valid.
"""

from __future__ import annotations

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
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from casmon.keys.codeversion import function_name
from casmon.view import display
from casmon.keys.digest import Digest
from casmon.errors import DamagedObjectError, UntrustedStoreError
from casmon.keys.fingerprint import fingerprint
from casmon.store.peek import as_digest, describe, peek
from casmon.scrub import scrub, scrub_argv
from casmon.store.store import Store, default_store

__all__ = ["intercept", "load", "CallLog", "Call", "Args", "NotStored", "Replay", "CallLogWarning"]

KIND_CALLS = "calls"
KIND_SESSION = "session"
KIND_CALLFN = "callfn"
SESSION_REFS = "calllog/sessions"
INLINE_STR = 256
SCALARS = frozenset((type(None), bool, int, float, str))
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


class _Ref(dict):
    """A stored value in a record: ``{"$": digest}`` (a dict, so JSON takes it as is)."""

    __slots__ = ()


class NotStored:
    """Stands in for an argument or result that could not be stored."""

    def __init__(self, type_name: str, reason: str = "") -> None:
        self.type_name = type_name
        self.reason = reason

    def __repr__(self) -> str:
        return f"<not stored: {self.type_name}{' (' + self.reason + ')' if self.reason else ''}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NotStored) and (other.type_name, other.reason) == (self.type_name, self.reason)

    def __hash__(self) -> int:
        return hash((self.type_name, self.reason))


def type_name(v: Any) -> str:
    t = type(v)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


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


class _Recorder:
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
                    self.store._start_flusher()
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
        while not store.create_ref(f"{SESSION_REFS}/{n:06d}", None, info):
            n += 1
        store.append(KIND_SESSION, {"n": n, **info, "time": time.time(), "_ref": f"{SESSION_REFS}/{n:06d}"},
                     key=fingerprint(("casmon.session", n)))
        return n

    # -- capturing ----------------------------------------------------------------
    def cell(self, v: Any, what: str, fn: str) -> Any:
        """What a record holds for a value: the value itself if a small scalar, else a digest."""
        t = type(v)
        if t in SCALARS and (t is not str or len(v) <= INLINE_STR):
            return v
        try:
            d = self.store.put(v)
        except Exception as e:  # noqa: BLE001 - the call must run whatever we cannot store
            key = (fn, t)
            if key not in self.warned:
                self.warned.add(key)
                warnings.warn(f"casmon: {fn}: {what} of type {type_name(v)} is not logged: {e}", CallLogWarning, stacklevel=4)
            return {"!": type_name(v), "why": scrub(str(e)[:200])}
        h = d.hex()
        self.refs.add(h)
        r = _Ref()
        r["$"] = h
        return r

    def log(self, fi: _Intercepted, n: int, t0: float, dt: float, args_cells, kwargs_cells, result_cell, exc) -> None:
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
        elif self.store._flush_each_call:  # durable, or a pool worker the pool may end right after this call
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
        except BaseException:
            self._put_back(rows, refs, names)  # Ctrl-C or a failed append: the rows wait for the next flush
            raise

    def _start_encoder(self) -> None:
        """Start (once) the thread that encodes full blocks of waiting rows."""
        with self.lock:
            if self._encoder is not None:
                return
            from casmon.store import store as store_mod

            if store_mod._exiting:
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
        from casmon.store import store as store_mod

        stop = store_mod._stop_flushers
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


recorders: dict[int, _Recorder] = {}
_recorders_lock = threading.Lock()
intercepted: dict[str, Callable] = {}  # name -> the original function, for replay


def _recorder(store: Store) -> _Recorder:
    r = recorders.get(id(store))
    if r is None or r.store is not store:
        with _recorders_lock:
            r = recorders.get(id(store))
            if r is None or r.store is not store:
                r = recorders[id(store)] = _Recorder(store)
    return r


def _forget_recorders_in_child() -> None:
    # A forked child is a new session; the parent flushes its own pending calls.
    recorders.clear()
    for fi in all_intercepted:
        fi.reset()


all_intercepted: list[_Intercepted] = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_recorders_in_child)


class _Intercepted:
    """The state behind one intercepted function."""

    def __init__(self, fn: Callable, store, result: bool) -> None:
        self.fn = fn
        self.name = function_name(fn)
        self.sig = inspect.signature(fn)
        self._store_arg = store
        self.result = result
        self.reset()

    def reset(self) -> None:
        self.counter = itertools.count(1)
        self._recorder: _Recorder | None = None

    def recorder(self) -> _Recorder:
        r = self._recorder
        if r is None or r.store._closed:
            store = default_store(self._store_arg)
            r = _recorder(store)
            r.ensure_session()
            self._write_signature(r)
            self._recorder = r
        return r

    def _write_signature(self, r: _Recorder) -> None:
        params = []
        for p in self.sig.parameters.values():
            entry = [p.name, p.kind.name]
            if p.default is not inspect.Parameter.empty:
                entry.append(r.cell(p.default, f"default of {p.name}", self.name))
            params.append(entry)
        rec = {"fn": self.name, "session": r.session, "params": params}
        refs = [Digest(e[2]["$"]) for e in params if len(e) > 2 and isinstance(e[2], dict) and "$" in e[2]]
        r.store.append(KIND_CALLFN, rec, key=fingerprint(("casmon.callfn", self.name, r.session)), refs=refs)

    def capture(self, r: _Recorder, args: tuple, kwargs: dict):
        for a in args:
            if type(a) not in SCALARS or (type(a) is str and len(a) > INLINE_STR):
                break
        else:
            args_cells = list(args)
            if not kwargs:
                return args_cells, {}
            for v in kwargs.values():
                if type(v) not in SCALARS or (type(v) is str and len(v) > INLINE_STR):
                    break
            else:
                return args_cells, dict(kwargs)
        name = self.name
        return ([r.cell(a, f"argument {i}", name) for i, a in enumerate(args)],
                {k: r.cell(v, f"argument {k!r}", name) for k, v in kwargs.items()})

    # -- the two halves of a call, around the function itself ---------------------
    def begin(self, args: tuple, kwargs: dict):
        """Everything logged before the call; None if the log cannot be written (the call runs anyway)."""
        try:
            r = self._recorder or self.recorder()
            n = next(self.counter)
            a, k = self.capture(r, args, kwargs)  # before the call: the function may mutate its inputs
        except Exception as e:  # noqa: BLE001 - a full disk or an unreachable store must not stop the call
            self._unavailable(e)
            return None
        return r, n, a, k, time.time(), time.perf_counter()

    def _unavailable(self, e: Exception) -> None:
        if not getattr(self, "_warned_unavailable", False):
            self._warned_unavailable = True
            warnings.warn(f"casmon: calls of {self.name} are not logged: {e}", CallLogWarning, stacklevel=4)

    def end(self, ctx, out: Any) -> None:
        r, n, a, k, t0, p0 = ctx
        dt = time.perf_counter() - p0
        try:
            rc = r.cell(out, "result", self.name) if self.result else NOT_RECORDED
            r.log(self, n, t0, dt, a, k, rc, None)
        except Exception as e:  # noqa: BLE001
            self._unavailable(e)

    def fail(self, ctx, e: BaseException) -> None:
        r, n, a, k, t0, p0 = ctx
        try:
            r.log(self, n, t0, time.perf_counter() - p0, a, k, None, [type_name(e), scrub(str(e)[:1000])])
        except Exception as err:  # noqa: BLE001
            self._unavailable(err)


NOT_RECORDED = {"-": "not recorded"}  # the result cell of intercept(result=False)


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
    fi = _Intercepted(fn, store, result)
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

    wrapper.__casmon_intercept__ = fi
    return wrapper


def flush() -> None:
    """Flush every open store (pending calls, cache entries, records)."""
    from casmon.store.store import open_stores

    for s in list(open_stores):
        s.flush()


# ---------------------------------------------------------------------------
# Reading
# ---------------------------------------------------------------------------


@dataclass
class Call:
    """One logged call. Values load on demand."""

    log: CallLog
    name: str
    n: int
    session: int
    pid: int
    rank: int | None
    thread: int
    thread_name: str
    start: float
    duration: float
    args_cells: list
    kwargs_cells: dict
    result_cell: Any
    exception: tuple[str, str] | None

    def inputs(self) -> tuple[list, dict]:
        """``(args, kwargs)`` with every stored value loaded (fresh copies)."""
        load = self.log._load_cell
        return [load(c) for c in self.args_cells], {k: load(v) for k, v in self.kwargs_cells.items()}

    def result(self) -> Any:
        if self.exception is not None:
            raise LookupError(f"{self.name} call {self.n} (session {self.session}) raised {self.exception[0]}: {self.exception[1]}")
        if not self.result_recorded:
            raise LookupError(f"{self.name} call {self.n}: its result was not recorded (intercept(result=False))")
        return self.log._load_cell(self.result_cell)

    @property
    def result_recorded(self) -> bool:
        return self.result_cell != NOT_RECORDED

    def get_args(self) -> Args:
        args, kwargs = self.inputs()
        return self.log._bind(self, args, kwargs)

    def __repr__(self) -> str:
        status = f"raised {self.exception[0]}" if self.exception else "ok"
        return f"<Call {self.name} #{self.n} session {self.session} thread {self.thread_name} {self.duration * 1e3:.3f} ms {status}>"


class Args:
    """A call's arguments by parameter name, defaults filled in for what the call left out."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        parts = [f"{k}={_short(v)}" for k, v in self.__dict__.items()]
        return f"Args({', '.join(parts)})"

    def _asdict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _short(v: Any, limit: int = 60) -> str:
    try:
        import numpy as np

        if isinstance(v, np.ndarray):
            return f"array(shape={v.shape}, dtype={v.dtype})"
    except ImportError:  # pragma: no cover
        pass
    try:
        r = repr(v)
    except Exception as e:  # noqa: BLE001 - a value whose repr fails (or recurses too deep) is still shown
        r = f"<{type_name(v)}: repr failed: {type(e).__name__}>"
    return r if len(r) <= limit else r[: limit - 1] + "…"


@dataclass
class Replay:
    """What happened when a logged call was run again."""

    name: str
    n: int
    session: int
    result: Any
    exception: BaseException | None
    recorded: str | None  # fingerprint of the recorded result (or "raised Type: msg")
    replayed: str | None
    matches: bool

    def __repr__(self) -> str:
        return f"<Replay {self.name} #{self.n}: {'matches' if self.matches else 'DIFFERS'} (recorded {self.recorded}, now {self.replayed})>"


@dataclass
class _FunctionInfo:
    name: str
    params: list = field(default_factory=list)  # [name, kind, default cell?]
    sessions: dict[int, list[Call]] = field(default_factory=lambda: defaultdict(list))

    @property
    def short(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def total(self) -> int:
        return sum(len(c) for c in self.sessions.values())


class CallLog:
    """All calls logged in a store, merged over every process and thread (callmonitor's ``DB``)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.sessions: dict[int, dict] = {}
        self.functions: dict[str, _FunctionInfo] = {}
        self.reload()

    def reload(self) -> None:
        """Read what has been flushed since (the log works while writers still run).

        Every record is checked before use: a malformed one raises
        :class:`DamagedObjectError` naming it, never another error. A damaged
        table file is skipped with a :class:`~casmon.StoreDamageWarning` (the
        calls it held are missing until ``casmon verify --repair``).
        """
        store = self.store
        sessions = {}
        for key, r in store.records(KIND_SESSION, strict=False):
            where = f"record {KIND_SESSION}/{key.hex()}"
            sessions[_int(r.get("n"), where, "n")] = r
        functions: dict[str, _FunctionInfo] = {}
        for key, r in store.records(KIND_CALLFN, strict=False):
            where = f"record {KIND_CALLFN}/{key.hex()}"
            name = _str(r.get("fn"), where, "fn")
            fi = functions.setdefault(name, _FunctionInfo(name))
            fi.params = _params(r.get("params", []), where)
        for key, batch in store.records(KIND_CALLS, strict=False):
            where = f"record {KIND_CALLS}/{key.hex()}"
            s = _int(batch.get("session"), where, "session")
            names = batch.get("fns")
            rows = batch.get("c")
            threads = batch.get("threads", {})
            pid, rank = batch.get("pid", 0), batch.get("rank")
            if (not isinstance(names, list) or not all(type(x) is str for x in names) or not isinstance(rows, list)
                    or not isinstance(threads, dict) or type(pid) is not int or not (rank is None or type(rank) is int)):
                raise DamagedObjectError(where, "not a valid batch of calls (fns, c, threads, pid, rank)")
            for row in rows:
                if not isinstance(row, list) or len(row) != 9:
                    raise DamagedObjectError(where, "a call is not a list of 9 fields")
                fi_idx, n, t0, dt, tid, a, k, res, exc = row
                if (type(fi_idx) is not int or not 0 <= fi_idx < len(names) or type(n) is not int
                        or type(t0) not in (int, float) or type(dt) not in (int, float) or not isinstance(a, list)
                        or not isinstance(k, dict) or not (exc is None or (isinstance(exc, list) and len(exc) == 2
                                                                           and all(type(x) is str for x in exc)))):
                    raise DamagedObjectError(where, "a call's fields have the wrong types")
                name = names[fi_idx]
                fi = functions.setdefault(name, _FunctionInfo(name))
                th = threads.get(str(tid))
                ident, tname = th if isinstance(th, list) and len(th) == 2 else (tid, str(tid))
                fi.sessions[s].append(Call(self, name, n, s, pid, rank, ident, str(tname), t0, dt, a, k, res,
                                           tuple(exc) if exc else None))
        for fi in functions.values():
            for calls in fi.sessions.values():
                calls.sort(key=lambda c: c.n)
        self.sessions = display.Sessions(sorted(sessions.items()))  # a dict that shows local dates
        self.functions = dict(sorted(functions.items()))

    # -- lookups -----------------------------------------------------------------
    def resolve(self, name: str) -> str:
        """A function's full name from its full name, qualified name or short name (if unambiguous)."""
        if name in self.functions:
            return name
        matches = [f for f in self.functions if f.endswith("." + name) or f.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            return matches[0]
        known = ", ".join(self.functions) or "none"
        if not matches:
            raise LookupError(f"no logged function {name!r}; logged functions: {known}")
        raise LookupError(f"{name!r} is ambiguous: {', '.join(matches)}; use the full name")

    def calls(self, name: str | None = None, *, session: int | None = None, process: int | None = None,
              thread: int | str | None = None, rank: int | None = None) -> list[Call]:
        """Calls, oldest session first, filtered by any of function, session, process, thread (id or name) and rank."""
        names = [self.resolve(name)] if name is not None else list(self.functions)
        out = []
        for nm in names:
            for s, calls in sorted(self.functions[nm].sessions.items()):
                if session is not None and s != session:
                    continue
                for c in calls:
                    if process is not None and c.pid != process:
                        continue
                    if thread is not None and thread not in (c.thread, c.thread_name):
                        continue
                    if rank is not None and c.rank != rank:
                        continue
                    out.append(c)
        return out

    def call(self, name: str, n: int, session: int | None = None) -> Call:
        full = self.resolve(name)
        fi = self.functions[full]
        if not fi.sessions:
            raise LookupError(f"{full} has no logged calls yet")
        if session is None:
            session = max(fi.sessions)
        calls = fi.sessions.get(session)
        if not calls:
            raise LookupError(f"{full} has no calls in session {session}; sessions with calls: {sorted(fi.sessions)}")
        for c in calls:
            if c.n == n:
                return c
        numbers = [c.n for c in calls]
        raise LookupError(f"{full} has no call {n} in session {session}; its calls there are {_ranges(numbers)}")

    def get(self, name: str, n: int, session: int | None = None) -> tuple[list, dict]:
        """Call ``n`` of ``name`` (latest session by default) as ``(args, kwargs)``, values loaded."""
        return self.call(name, n, session).inputs()

    def get_args(self, name: str, n: int, session: int | None = None) -> Args:
        """Like :meth:`get`, as an :class:`Args` with one attribute per parameter, defaults filled in."""
        return self.call(name, n, session).get_args()

    def result(self, name: str, n: int, session: int | None = None) -> Any:
        return self.call(name, n, session).result()

    def __iter__(self) -> Iterator[Call]:
        return iter(self.calls())

    def __len__(self) -> int:
        return sum(fi.total() for fi in self.functions.values())

    # -- replay ------------------------------------------------------------------
    def replay(self, name: str, n: int, session: int | None = None, fn: Callable | None = None) -> Replay:
        """Run call ``n`` again with its stored inputs and compare the result with the recorded one.

        Only code you vouch for runs: ``fn`` if given, else the function
        registered under the record's name by ``@casmon.intercept`` in this
        process (import your module first). A callable is never looked up, or a
        module imported, from the name a record holds. A store opened with
        ``trust=False`` replays only with ``fn`` given (its records choose which
        registered function would run, with which arguments). The comparison is
        by fingerprint (content), so it holds across processes.
        """
        c = self.call(name, n, session)
        if fn is not None:
            if not callable(fn):
                raise TypeError(f"replay: fn must be callable, got {type(fn).__name__}")
            target = fn
        else:
            if not self.store.trust:
                raise UntrustedStoreError(
                    f"not replaying {c.name}: the store {self.store.url} was opened with trust=False, and replay "
                    "would call code chosen by its records; pass fn= the function to call")
            target = _find_function(c.name)
        args, kwargs = c.inputs()
        if c.exception is not None:
            recorded = f"raised {c.exception[0]}: {c.exception[1]}"
        elif not c.result_recorded:
            recorded = None
        else:
            recorded = fingerprint(self._load_cell(c.result_cell)).hex()
        try:
            out = target(*args, **kwargs)
            exc = None
            replayed = fingerprint(out).hex()
        except Exception as e:  # noqa: BLE001 - a replay reports, it does not crash
            out, exc = None, e
            replayed = f"raised {type_name(e)}: {str(e)[:1000]}"
        return Replay(c.name, c.n, c.session, out, exc, recorded, replayed, recorded is not None and recorded == replayed)

    # -- helpers -------------------------------------------------------------------
    def _load_cell(self, cell: Any) -> Any:
        if isinstance(cell, dict):
            if "$" in cell:
                return self.store.get(as_digest(cell["$"], "a call record's value"))
            if "!" in cell:
                return NotStored(str(cell["!"]), str(cell.get("why", "")))
        return cell

    def peek_cell(self, cell: Any) -> Any:
        """Like loading a cell, but a pickle that could run code stays a :class:`~casmon.store.peek.Described`."""
        if isinstance(cell, dict) and "$" in cell:
            return peek(self.store, as_digest(cell["$"], "a call record's value"))
        return self._load_cell(cell)

    def describe_cell(self, cell: Any, limit: int = 40) -> str:
        """A cell as a short text, from the record and the value's manifest alone: nothing is unpickled."""
        if isinstance(cell, dict):
            if "$" in cell:
                return describe(self.store, cell["$"], limit)
            if "!" in cell:
                return f"<not stored: {str(cell['!'])[:80]}>"
            if cell == NOT_RECORDED:
                return "<not recorded>"
        return _short(cell, limit)

    def _bind(self, c: Call, args: list, kwargs: dict, load: Callable | None = None) -> Args:
        load = load or self._load_cell
        params = self.functions[c.name].params
        values: dict[str, Any] = {}
        rest = list(args)
        for p in params:
            pname, kind = p[0], p[1]
            if kind == "VAR_POSITIONAL":
                values[pname] = tuple(rest)
                rest = []
            elif kind == "VAR_KEYWORD":
                values[pname] = {k: v for k, v in kwargs.items() if k not in values}
            elif rest and kind != "KEYWORD_ONLY":
                values[pname] = rest.pop(0)
            elif pname in kwargs:
                values[pname] = kwargs[pname]
            elif len(p) > 2:
                values[pname] = load(p[2])
            else:
                values[pname] = NotStored("missing", "no value and no default")
        return Args(values)

    def signature(self, name: str) -> str:
        fi = self.functions[self.resolve(name)]
        parts = []
        for p in fi.params:
            prefix = "*" if p[1] == "VAR_POSITIONAL" else "**" if p[1] == "VAR_KEYWORD" else ""
            parts.append(prefix + p[0] + (f"={self.describe_cell(p[2], 30)}" if len(p) > 2 else ""))
        return f"{fi.name}({', '.join(parts)})"

    @display.guarded_text("call log")
    def __repr__(self) -> str:
        n = display.count
        lines = [f"CallLog({self.store.url!r}: {n(len(self.functions), 'function')}, {n(len(self), 'call')}, "
                 f"{n(len(self.sessions), 'session')})"]
        for name, fi in self.functions.items():
            sess = sorted(fi.sessions)
            latest = len(fi.sessions[sess[-1]]) if sess else 0
            args = [p[0] for p in fi.params]
            defaults = ", ".join(f"{p[0]}={self.describe_cell(p[2], 30)}" for p in fi.params if len(p) > 2)
            lines.append(f"  {name}: calls {latest} in session {sess[-1] if sess else '-'} ({fi.total()} in sessions {_ranges(sess)}); "
                         f"args {args}; defaults ({defaults})")
        return "\n".join(lines)

    @display.guarded_html("call log")
    def _repr_html_(self) -> str:
        return display.calllog_html(self, self.signature, _ranges)

    def to_pandas(self, name: str | None = None, **filters: Any):
        """Calls as a pandas DataFrame, one row each: function, session, n, start (local time), duration_s, pid,
        rank, thread, status. ``name`` and ``filters`` select calls as :meth:`calls` does. Needs pandas."""
        return display.calls_frame(self.calls(name, **filters))


def _ranges(ns: list[int]) -> str:
    if not ns:
        return "none"
    ns = sorted(set(ns))
    out, start, prev = [], ns[0], ns[0]
    for x in ns[1:] + [None]:
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ", ".join(out)


def _find_function(name: str) -> Callable:
    """The function ``@casmon.intercept`` registered under ``name`` in this process; never an import."""
    fn = intercepted.get(name)
    if fn is not None:
        return fn
    registered = ", ".join(sorted(intercepted)) or "none"
    raise LookupError(f"no function {name} is registered in this process, so there is nothing to replay: import the "
                      f"module that defines it (its @casmon.intercept registers it) or pass fn= (on the command line, "
                      f"--import module_or_script.py); registered: {registered}")


def _int(v: Any, where: str, field: str) -> int:
    if type(v) is not int:
        raise DamagedObjectError(where, f"{field} is not an integer")
    return v


def _str(v: Any, where: str, field: str) -> str:
    if type(v) is not str or not v or len(v) > 1000:
        raise DamagedObjectError(where, f"{field} is not a name")
    return v


_KINDS = {"POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY", "VAR_KEYWORD"}


def _params(v: Any, where: str) -> list:
    if not isinstance(v, list) or not all(isinstance(p, list) and len(p) in (2, 3) and type(p[0]) is str
                                          and p[1] in _KINDS for p in v):
        raise DamagedObjectError(where, "params is not a list of [name, kind, default?]")
    return v


def load(store: Store | str | None = None) -> CallLog:
    """The call log of a store (default ``$CASMON_STORE`` or ``./.casmon``)."""
    s = default_store(store, create=False) if not isinstance(store, Store) else store  # reading creates nothing
    s.flush()
    return CallLog(s)


# -- repair: keep the calls whose values are intact ------------------------------------------


def _salvage_calls(batch: dict, bad: set) -> dict | None:
    """A batch of calls without the calls that need a lost value (``bad``); None if none is left.

    ``verify --repair`` (and a flush that finds a value gone) use it, so one lost
    argument costs the calls that passed it, not the ~1,000 calls of its batch.
    """
    lost = {Digest(d).hex() for d in bad}

    def needs(cell: Any) -> bool:
        return isinstance(cell, dict) and cell.get("$") in lost

    def keep(row: Any) -> bool:
        if not isinstance(row, list) or len(row) != 9:
            return False
        a, k, res = row[5], row[6], row[7]
        cells = [*(a if isinstance(a, list) else [a]), *(k.values() if isinstance(k, dict) else [k]), res]
        return not any(needs(c) for c in cells)

    rows = batch.get("c")
    if not isinstance(rows, list):
        return None
    kept = [row for row in rows if keep(row)]
    if not kept:
        return None
    out = dict(batch, c=kept)
    refs = batch.get("_refs", [])
    out["_refs"] = [h for h in refs if h not in lost] if isinstance(refs, list) else []
    return out


def _register_salvager() -> None:
    from casmon.store.store import register_salvager

    register_salvager(KIND_CALLS, _salvage_calls)


_register_salvager()
