"""Reading the call log: ``casmon.load`` -> :class:`CallLog`, its :class:`Call` s and their :class:`Args`.

Every process's and thread's calls, merged, with values loaded on demand (or
described without unpickling). Records are checked before use: a malformed one
raises :class:`~casmon.errors.DamagedObjectError` naming it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from casmon.keys.names import keep_flat_names
from casmon.calllog.records import KIND_CALLFN, KIND_CALLS, KIND_SESSION, NOT_RECORDED, NotStored
from casmon.calllog.replay import Replay, replay_call
from casmon.errors import DamagedObjectError, warn_damage
from casmon.store.peek import as_digest, describe, peek
from casmon.store.store import Store, default_store
from casmon.view import display
from casmon.view.text import did_you_mean, plural, short_repr

__all__ = ["load", "CallLog", "Call", "Args", "FunctionInfo", "ranges_text"]


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
        load = self.log.load_cell
        return [load(c) for c in self.args_cells], {k: load(v) for k, v in self.kwargs_cells.items()}

    def result(self) -> Any:
        if self.exception is not None:
            raise LookupError(f"{self.name} call {self.n} (session {self.session}) raised {self.exception[0]}: {self.exception[1]}")
        if not self.result_recorded:
            raise LookupError(f"{self.name} call {self.n}: its result was not recorded (intercept(result=False))")
        return self.log.load_cell(self.result_cell)

    @property
    def result_recorded(self) -> bool:
        return self.result_cell != NOT_RECORDED

    def get_args(self) -> Args:
        args, kwargs = self.inputs()
        return self.log.bind(self, args, kwargs)

    def __repr__(self) -> str:
        status = f"raised {self.exception[0]}" if self.exception else "ok"
        return f"<Call {self.name} #{self.n} session {self.session} thread {self.thread_name} {self.duration * 1e3:.3f} ms {status}>"


class Args:
    """A call's arguments by parameter name, defaults filled in for what the call left out."""

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)

    def __repr__(self) -> str:
        parts = [f"{k}={short_repr(v, 60, arrays=True, qualified=True)}" for k, v in self.__dict__.items()]
        return f"Args({', '.join(parts)})"

    def _asdict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class FunctionInfo:
    """One logged function in a :class:`CallLog`: its parameters and its calls by session."""

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
        self.functions: dict[str, FunctionInfo] = {}
        self.reload()

    def reload(self) -> None:
        """Read what has been flushed since (the log works while writers still run).

        Every record is checked before use: a malformed one (crafted or damaged) is left out with one
        :class:`~casmon.StoreDamageWarning` naming it, and hides no other call; a malformed call in a batch
        leaves out that call. A damaged table file is skipped the same way (the calls it held are missing
        until ``casmon verify --repair``).
        """
        store = self.store
        sessions = {}
        for key, r in store.records(KIND_SESSION, strict=False):
            where = f"record {KIND_SESSION}/{key.hex()}"
            try:
                sessions[_int(r.get("n"), where, "n")] = r
            except DamagedObjectError as e:
                warn_damage(store.url, where, e.reason)
        functions: dict[str, FunctionInfo] = {}
        for key, r in store.records(KIND_CALLFN, strict=False):
            where = f"record {KIND_CALLFN}/{key.hex()}"
            try:
                name, params = _str(r.get("fn"), where, "fn"), _params(r.get("params", []), where)
            except DamagedObjectError as e:
                warn_damage(store.url, where, e.reason)
                continue
            functions.setdefault(name, FunctionInfo(name)).params = params
        for key, batch in store.records(KIND_CALLS, strict=False):
            where = f"record {KIND_CALLS}/{key.hex()}"
            try:
                self._read_batch(batch, where, functions)
            except DamagedObjectError as e:
                warn_damage(store.url, where, e.reason)
        for fi in functions.values():
            for calls in fi.sessions.values():
                calls.sort(key=lambda c: c.n)
        self.sessions = display.Sessions(sorted(sessions.items()))  # a dict that shows local dates
        self.functions = dict(sorted(functions.items()))

    def _read_batch(self, batch: dict, where: str, functions: dict[str, FunctionInfo]) -> None:
        """Add the calls of ``batch`` to ``functions``; DamagedObjectError after adding the sound ones, if any
        is malformed."""
        s = _int(batch.get("session"), where, "session")
        names = batch.get("fns")
        rows = batch.get("c")
        threads = batch.get("threads", {})
        pid, rank = batch.get("pid", 0), batch.get("rank")
        if (not isinstance(names, list) or not all(type(x) is str for x in names) or not isinstance(rows, list)
                or not isinstance(threads, dict) or type(pid) is not int or not (rank is None or type(rank) is int)):
            raise DamagedObjectError(where, "not a valid batch of calls (fns, c, threads, pid, rank)")
        bad = ""
        for row in rows:
            if not isinstance(row, list) or len(row) != 9:
                bad = "a call is not a list of 9 fields"
                continue
            fi_idx, n, t0, dt, tid, a, k, res, exc = row
            if (type(fi_idx) is not int or not 0 <= fi_idx < len(names) or type(n) is not int
                    or type(t0) not in (int, float) or type(dt) not in (int, float) or not isinstance(a, list)
                    or not isinstance(k, dict) or not (exc is None or (isinstance(exc, list) and len(exc) == 2
                                                                       and all(type(x) is str for x in exc)))):
                bad = "a call's fields have the wrong types"
                continue
            if not (0 <= t0 < 1e11 and 0 <= dt < 1e11):  # NaN fails too: readers make dates of them
                bad = "a call's start or duration is not a time"
                continue
            name = names[fi_idx]
            fi = functions.setdefault(name, FunctionInfo(name))
            th = threads.get(str(tid))
            ident, tname = th if isinstance(th, list) and len(th) == 2 else (tid, str(tid))
            fi.sessions[s].append(Call(self, name, n, s, pid, rank, ident, str(tname), t0, dt, a, k, res,
                                       tuple(exc) if exc else None))
        if bad:
            raise DamagedObjectError(where, bad)

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
            hint = did_you_mean(name, self.functions)
            raise LookupError(f"no logged function {name!r}{f' ({hint})' if hint else ''}; logged functions: {known}")
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
        raise LookupError(f"{full} has no call {n} in session {session}; its calls there are {ranges_text(numbers)}")

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
        return replay_call(self, self.call(name, n, session), fn)

    # -- helpers -------------------------------------------------------------------
    def load_cell(self, cell: Any) -> Any:
        """A record's cell as its value: a stored value loaded (a fresh copy), a :class:`NotStored` marker, or
        the inline scalar itself."""
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
        return self.load_cell(cell)

    def describe_cell(self, cell: Any, limit: int = 40) -> str:
        """A cell as a short text, from the record and the value's manifest alone: nothing is unpickled."""
        if isinstance(cell, dict):
            if "$" in cell:
                return describe(self.store, cell["$"], limit)
            if "!" in cell:
                return f"<not stored: {str(cell['!'])[:80]}>"
            if cell == NOT_RECORDED:
                return "<not recorded>"
        return short_repr(cell, limit, arrays=True, qualified=True)

    def bind(self, c: Call, args: list, kwargs: dict, load: Callable[[Any], Any] | None = None) -> Args:
        """``c``'s arguments by parameter name, from its logged signature: defaults the call left out are filled in
        with ``load(default cell)`` (:meth:`load_cell` unless given; ``casmon show`` passes :meth:`peek_cell`)."""
        load = load or self.load_cell
        params = self.functions[c.name].params
        values: dict[str, Any] = {}
        rest = list(args)
        by_keyword: set[str] = set()  # names bound from kwargs: the rest of kwargs is what **kw received
        for p in params:
            pname, kind = p[0], p[1]
            if kind == "VAR_POSITIONAL":
                values[pname] = tuple(rest)
                rest = []
            elif kind == "VAR_KEYWORD":
                values[pname] = {k: v for k, v in kwargs.items() if k not in by_keyword}
            elif rest and kind != "KEYWORD_ONLY":
                values[pname] = rest.pop(0)
            elif pname in kwargs and kind != "POSITIONAL_ONLY":  # f(a=9) with f(a=1, /, **kw) passes a to **kw
                values[pname] = kwargs[pname]
                by_keyword.add(pname)
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
        n = plural
        lines = [f"CallLog({self.store.url!r}: {n(len(self.functions), 'function')}, {n(len(self), 'call')}, "
                 f"{n(len(self.sessions), 'session')})"]
        for name, fi in self.functions.items():
            sess = sorted(fi.sessions)
            latest = len(fi.sessions[sess[-1]]) if sess else 0
            args = [p[0] for p in fi.params]
            defaults = ", ".join(f"{p[0]}={self.describe_cell(p[2], 30)}" for p in fi.params if len(p) > 2)
            lines.append(f"  {name}: calls {latest} in session {sess[-1] if sess else '-'} ({fi.total()} in sessions {ranges_text(sess)}); "
                         f"args {args}; defaults ({defaults})")
        return "\n".join(lines)

    @display.guarded_html("call log")
    def _repr_html_(self) -> str:
        return display.calllog_html(self, self.signature, ranges_text)

    def to_pandas(self, name: str | None = None, **filters: Any):
        """Calls as a pandas DataFrame, one row each: function, session, n, start (local time), duration_s, pid,
        rank, thread, status. ``name`` and ``filters`` select calls as :meth:`calls` does. Needs pandas."""
        return display.calls_frame(self.calls(name, **filters))


def ranges_text(ns: list[int]) -> str:
    """Numbers as sorted ranges, ``"1-3, 7"`` (``"none"`` for no numbers): how call and session numbers are shown."""
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

# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([Call, Args, CallLog])
