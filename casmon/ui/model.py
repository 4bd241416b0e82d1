"""What the UI's pages show of runs and calls, read from one store: the index of runs, call statistics.

Nothing here renders HTML (the page modules do) and nothing unpickles: run
manifests, patches, tracked files and package lists load through
:func:`casmon.store.peek.load_data`; stored values are described from their
manifests. A value is loaded by unpickling only on a store opened with ``--trust``.

The runs index is built for big stores and live runs. The first listing reads
the store's runs index (:mod:`casmon.runs.index`: each ended run's name,
status, start and manifest digest in binary columns) and one stamped listing
of ``refs/runs``: a run whose ref is unchanged since its entry was made is
listed from the entry, any other from its ref (or, when many are missing from
the index, from the ``run`` record table, one read). After that every request revalidates it
cheaply, at most once a second: one listing of ``refs/runs`` (runs added or
removed) and a read of the ref of each run that is still going (``running`` or
``claimed``), which carries its status, heartbeat and latest metrics. A run
that ended is read again only when its ref is written again (resumed, or
deleted and its number taken by a new run): where the medium gives stamps
(:meth:`~casmon.store.backend.base.Backend.list_stamped`), the listing of
``refs/runs`` carries them, and a ref whose stamp changed, or is not yet
settled, is read. Its manifest is immutable (named by digest) and kept once
read. So a page never shows a run that ended as ``running``, nor misses one
that just started, and a store of 10,000 ended runs costs one listing a
request. An ended run whose runs index entry names the manifest its ref names
(as list_runs takes one) is read from there: its row needs no manifest read. Sorting or filtering by a column the index does not hold makes
every run's row (a background thread starts on them after the first page, once no request has
come for a second).
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from casmon.view import display
from casmon.view.text import did_you_mean, short_repr
from casmon.store import serialize
from casmon.calllog import NOT_RECORDED, Call, CallLog
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError
from casmon.store.peek import as_digest, describe, load_data, peek
from casmon.runs import KIND_RUN, RUN_REFS, RunInfo, check_run_manifest
from casmon.runs import index as runs_index
from casmon.runs.listing import indexed_run, ref_names

#: A listing younger than this is served as it is (a page and the polls of its script share one).
FRESH_SECONDS = 1.0
#: The longest a listing stands on its refs' folder's unchanged stamp before every ref's stamp is looked at again.
FULL_LOOK_SECONDS = 30.0
#: Statuses a run leaves: its ref is read again at every revalidation. Any other status is final.
LIVE_STATUSES = frozenset({"running", "claimed"})
#: More runs than this missing from the store's runs index: the first listing reads the run record table (one
#: read) instead of each one's ref.
RECORDS_FROM = 256
#: Downsampled metrics of ended runs kept in memory (each at most about 100 KB): a compare page of 100
#: runs with 5 metrics draws 500.
SERIES_KEPT = 600


def is_scalar(v: Any) -> bool:
    """A JSON scalar that fits a table column (not a list, dict or stored value)."""
    return v is None or type(v) in (str, int, float, bool)


def is_number(v: object) -> TypeGuard[float]:
    """A finite int or float (not a bool): what a chart or a numeric comparison can use."""
    return (type(v) is int or type(v) is float) and math.isfinite(v)


@dataclass
class Entry:
    """One run as the index lists it: enough to sort by start, find its manifest and tell a live run."""

    ref: str  # runs/3
    tail: str  # 3: the run's address in the UI (/run/3)
    name: str
    status: str  # as written (a lost run is still "running" here; RunInfo.status says "lost")
    start: float  # the run's start (or its first write)
    digest: str | None  # the newest manifest; None for a run that only claimed its number
    ref_data: dict[str, Any] = field(default_factory=dict)  # a live run's heartbeat and latest metrics
    serial: int = 0  # the index's change counter when this entry last changed
    born: int = 0  # ... when the index first listed it
    stamp: str | None = None  # the ref's stamp, taken (at time ``stamped``) before what the entry says was read
    stamped: float = 0.0
    #: Why the ref could not be read (the run is listed as unreadable, as list_runs lists it); None if it was.
    error: CasmonError | None = None
    #: False for an entry made from the run record table: its ref is read (damaged? written since?) before
    #: the run is shown from it.
    checked: bool = True
    settled: bool = False  # ``stamp`` was found settled (the ref written well before it was taken): it stays so

    def same(self, other: Entry) -> bool:
        return (self.status, self.digest, self.name, self.ref_data) == (other.status, other.digest, other.name,
                                                                       other.ref_data)


class Listing(list[Entry]):
    """One listing of the runs; ``serial`` tells listings apart (an ``id()`` is reused once a list is freed)."""

    _serials = itertools.count(1)

    def __init__(self, entries: list[Entry], changes: int = 0) -> None:
        super().__init__(entries)
        self.serial = next(Listing._serials)
        #: The index's change counter this listing is up to date with (a page made from it polls from there).
        self.changes = changes


def run_number(tail: str) -> tuple[str, int]:
    """``exp12`` -> ``("exp", 12)``: runs sort by number, not as text."""
    m = re.match(r"^(.*?)(\d+)$", tail)
    return (m.group(1), int(m.group(2))) if m else (tail, -1)


def _in_order(entries: list[Entry]) -> list[Entry]:
    """``entries`` oldest first, runs that started at once by number (read off their names only then)."""
    entries.sort(key=lambda e: e.start)
    if len({e.start for e in entries}) != len(entries):
        entries.sort(key=lambda e: (e.start, run_number(e.tail)))
    return entries


def _as_float(v: Any) -> float | None:
    return float(v) if is_number(v) else None


class RunIndex:
    """The runs of a store, listed cheaply, revalidated at each request and read lazily (module docstring)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self._lock = threading.Lock()  # one listing or revalidation at a time: the others then use it
        self._entries: Listing | None = None
        self._checked = -math.inf  # time.monotonic() of the last revalidation
        self._changes = itertools.count(1)
        #: The index's change counter: an entry changed at serial S is newer than a page made at S - 1.
        self.serial = 0
        self._manifests: dict[str, tuple[dict[str, Any], CasmonError | None]] = {}
        #: Entries of the store's runs index by run (casmon.runs.index), read with the first listing.
        self._by_ref: dict[str, list[Any]] | None = None
        #: A metric's last values in every row of an index file's columns, by (file, metric).
        self._metric_columns: dict[tuple[int, str], tuple[Any, list[Any]]] = {}
        self._summaries: dict[str, dict[str, Any]] = {}
        self._rows: dict[tuple[str, str | None, str], dict[str, Any]] = {}
        #: Sorted and filtered rows by (listing, sort, order, filter): the last 8.
        self.views: dict[tuple[Any, ...], list[Any]] = {}
        #: The cells a filter through the runs index made, by (listing, columns, manifests parsed): the last 4.
        self.cells: dict[tuple[Any, ...], list[Any]] = {}
        #: What the runs table makes of a run (``table.row_of``): the background loader makes each ended run's
        #: row too, so the first sort or filter of a big store finds them made.
        self.make_row: Callable[[RunInfo, Entry], dict[str, Any]] | None = None
        #: The background loader reads a manifest only while this says no request is being answered.
        self.idle: Callable[[], bool] = lambda: True
        self._stop = threading.Event()
        self._loader: threading.Thread | None = None
        self._folder: tuple[str, bool, float] | None = None  # the refs' folder's stamp, settled, when looked at
        self._series: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._series_lock = threading.Lock()

    def is_kept(self, key: tuple[Any, ...]) -> bool:
        with self._series_lock:
            return key in self._series

    def kept(self, key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        """``make()``, kept for ``key`` (the last SERIES_KEPT): what an ended run's immutable data gives, such
        as a metric downsampled for a chart (a reload then reads no series again)."""
        with self._series_lock:
            if key in self._series:
                self._series.move_to_end(key)
                return self._series[key]
        value = make()
        with self._series_lock:
            self._series[key] = value
            while len(self._series) > SERIES_KEPT:
                self._series.popitem(last=False)
        return value

    # -- listing -------------------------------------------------------------------------------------
    def _tails(self) -> set[str]:
        return {n[len(RUN_REFS) + 1:] for n in self.store.refs(RUN_REFS)}  # runs/3 -> 3

    def _stamps(self) -> tuple[dict[str, str] | None, float]:
        """The run refs' stamps by ref name (None where the medium gives none), and when they were taken."""
        at = time.time()
        try:
            got = self.store.backend.list_stamped(f"refs/{RUN_REFS}/")
        except OSError:
            got = None
        return ({k[len("refs/"):]: v for k, v in got.items()} if got is not None else None), at

    def _changed(self, e: Entry, stamps: dict[str, str] | None, now: float) -> bool:
        """True if ended entry ``e``'s ref may have been written since the entry was made."""
        if stamps is None or e.stamp is None:
            return False  # no stamps: an ended run is taken as final
        if stamps.get(e.ref) != e.stamp:
            return True
        if e.settled and e.stamped <= now:
            return False
        ok = self.store.backend.stamp_settled(e.stamp, min(e.stamped, now))
        e.settled = ok and e.stamped <= now  # a stamp taken by a clock ahead of this one is checked again
        return not ok

    def _stamp(self) -> int:
        self.serial = next(self._changes)
        return self.serial

    def _from_ref(self, tail: str) -> Entry | None:
        """The run as its ref says it is now (None if the ref is gone)."""
        ref = f"{RUN_REFS}/{tail}"
        try:
            got = self.store.get_ref(ref)
        except DamagedObjectError as err:  # one unreadable run, as list_runs lists it: never hidden
            return Entry(ref, tail, tail, "unreadable", 0.0, None, error=err)
        if got is None:
            return None
        data = got.data if isinstance(got.data, dict) else {}
        t = data.get("start", data.get("time"))
        status = data.get("status")
        return Entry(ref, tail, str(data.get("name") or tail),
                     str(status) if type(status) is str else ("claimed" if got.target is None else "?"),
                     t if is_number(t) else 0.0, got.target.hex() if got.target else None, dict(data))

    def _look_at_folder(self) -> tuple[str, bool, float] | None:
        """The refs' folder's stamp, whether it is settled, and when (monotonic) it was taken; kept as the last
        full look's (taken before the look's listing, so a ref written meanwhile changes it)."""
        at = time.time()
        try:
            folder = self.store.backend.folder_stamp(f"refs/{RUN_REFS}")
        except OSError:
            folder = None
        self._folder = None if folder is None else (folder, self.store.backend.stamp_settled(folder, at),
                                                    time.monotonic())
        return self._folder

    def _first_listing(self) -> Listing:
        """Every run under ``refs/runs``: an ended run whose ref is unchanged since the store's runs index
        entry for it was made, from that entry (no read); the others from their refs, or, when many are not
        in the index (deleted, never built), from their newest run record (one read of the table for all)."""
        self._look_at_folder()
        stamps, at = self._stamps()  # before anything is read: a ref written meanwhile is read again
        # One listing of the refs gives both their names and their stamps, where the medium gives stamps.
        refs = [f"{RUN_REFS}/{t}" for t in self._tails()] if stamps is None else ref_names(
            {"refs/" + k: v for k, v in stamps.items()})
        by_ref = self._index_entries()
        serial = self._stamp()
        out = []
        rest = []
        settled, store, get, cut = runs_index.settled, self.store, by_ref.get, len(RUN_REFS) + 1
        for ref in refs:
            tail = ref[cut:]
            ie = get(ref)
            stamp = stamps.get(ref) if stamps is not None else None
            if ie is not None and stamp is not None and ie[0] == stamp and settled(store, ie, at):
                out.append(Entry(ref, tail, ie[6], ie[7], ie[5], ie[1], dict(ie[3]), serial, serial, stamp, at,
                                 settled=True))  # settled() found the stamp settled by now
            else:
                rest.append(tail)
        newest: dict[str, tuple[float, dict[str, Any]]] = {}
        first: dict[str, float] = {}
        if len(rest) > RECORDS_FROM:
            for _key, r in self.store.records(KIND_RUN, strict=False):
                ref, t = r.get("_ref"), r.get("time")
                if type(ref) is not str or not ref.startswith(RUN_REFS + "/") or not is_number(t):
                    continue
                first[ref] = min(first.get(ref, t), t)
                if ref not in newest or t >= newest[ref][0]:
                    newest[ref] = (t, r)
        for tail in rest:
            ref = f"{RUN_REFS}/{tail}"
            rec = newest.get(ref, (0.0, {}))[1]
            h, status = rec.get("manifest"), rec.get("status")
            e: Entry | None
            if type(h) is str and type(status) is str and status not in LIVE_STATUSES:
                e = Entry(ref, tail, str(rec.get("name") or tail), status, first[ref], h, checked=False)
            else:
                e = self._from_ref(tail)
            if e is not None:
                e.serial = e.born = serial
                e.stamp, e.stamped = stamps.get(ref) if stamps is not None else None, at
                out.append(e)
        return Listing(_in_order(out), serial)

    def _index_entries(self) -> dict[str, list[Any]]:
        """The store's runs index by run (read once; derived data: without it every run is read)."""
        if self._by_ref is None:
            try:
                self._by_ref = runs_index.load(self.store)[0]
            except Exception:  # noqa: BLE001 - derived data: without it every run is read
                self._by_ref = {}
        return self._by_ref

    def indexed(self, e: Entry) -> list[Any] | None:
        """The runs index entry of ended run ``e``'s manifest, if the index holds it: the entry of that run
        naming the manifest its ref names, as list_runs takes it (an entry of another name that claims the
        digest, as a crafted one can, stands for no run)."""
        if e.digest is None or e.status in LIVE_STATUSES or not (e.checked or self._check(e)):
            return None
        ie = self._index_entries().get(e.ref)
        return ie if ie is not None and ie[1] == e.digest and ie[7] == e.status else None

    def _revalidate(self) -> Listing:
        """The listing brought up to date: runs added and removed, live runs read again from their refs. Where
        the refs' folder has a settled stamp that has not changed since the last full look (no ref written,
        added or removed since), the listing stands as it is, for up to ``FULL_LOOK_SECONDS``."""
        assert self._entries is not None
        seen = self._folder
        look = self._look_at_folder()
        if (look is not None and seen is not None and seen[0] == look[0] and seen[1]
                and look[2] - seen[2] < FULL_LOOK_SECONDS):
            self._folder = seen  # the time of the last full look stands
            return self._entries
        stamps, at = self._stamps()
        # One listing of the refs gives both their names and their stamps, where the medium gives stamps.
        tails = self._tails() if stamps is None else {n[len(RUN_REFS) + 1:] for n in ref_names(
            {"refs/" + k: v for k, v in stamps.items()})}
        out: list[Entry] = []
        changed = False
        for e in self._entries:
            if e.tail not in tails:
                changed = True
                continue
            live = e.status in LIVE_STATUSES or e.digest is None
            if live or self._changed(e, stamps, at):
                now = self._from_ref(e.tail)
                if now is None:
                    changed = True
                    continue
                now.stamp, now.stamped = stamps.get(e.ref) if stamps is not None else None, at
                if live and not now.same(e) or not live and (now.digest, now.status) != (e.digest, e.status):
                    now.serial, now.born = self._stamp(), e.born
                    e, changed = now, True
                else:
                    e.stamp, e.stamped, e.settled = now.stamp, at, False
            out.append(e)
        for tail in sorted(tails - {e.tail for e in self._entries}, key=run_number):
            new = self._from_ref(tail)
            if new is not None:
                new.serial = new.born = self._stamp()
                new.stamp, new.stamped = stamps.get(new.ref) if stamps is not None else None, at
                out.append(new)
                changed = True
        if not changed:
            return self._entries
        return Listing(_in_order(out), self.serial)

    def entries(self, fresh: bool = False) -> Listing:
        """Every run, oldest first, revalidated when the listing is older than FRESH_SECONDS (or ``fresh``)."""
        with self._lock:
            if self._entries is None:
                self._entries = self._first_listing()
            elif fresh or time.monotonic() - self._checked >= FRESH_SECONDS:
                self._entries = self._revalidate()
            else:
                return self._entries
            self._checked = time.monotonic()
            return self._entries

    def find(self, which: str) -> Entry:
        """A run by its address (``3``, ``exp3``), name (``3-base``) or ``latest``."""
        for fresh in (False, True):  # a run that started since the last look: looked for again at once
            entries = self.entries(fresh)
            if which == "latest" and entries:
                return entries[-1]
            for e in entries:
                if which in (e.tail, e.name, e.ref):
                    return e
        hint = did_you_mean(which, ["latest", *(e.name for e in entries), *(e.tail for e in entries)])
        raise LookupError(f"no run {which!r} in {self.store.url}" + (f" ({hint})" if hint else ""))

    # -- manifests -----------------------------------------------------------------------------------
    def run(self, e: Entry) -> RunInfo:
        """The run as :func:`casmon.list_runs` gives it (an unreadable manifest is a run that says why)."""
        if not e.checked and not self._check(e):
            return self.run(self._from_ref(e.tail) or Entry(e.ref, e.tail, e.name, "unreadable", 0.0, None,
                                                            error=MissingObjectError(f"refs/{e.ref}")))
        if e.digest is None:
            m = {"name": e.name, "status": e.status, "start": e.start or None}
            if e.error is not None:
                m["error"] = " ".join(str(e.error).split())[:500]
            return RunInfo(self.store, e.ref, m, e.error, e.ref_data)
        got = self._manifests.get(e.digest)
        ie = self.indexed(e) if got is None else None
        if ie is not None:
            r = indexed_run(self.store, e.ref, ie, e.ref_data)
            self._manifests[e.digest] = got = (r.manifest, None)
            self._summaries[e.digest] = r.metric_summary()
        if got is None:
            try:
                m = load_data(self.store, e.digest, f"run {e.ref}: its manifest", dict)
                check_run_manifest(m, f"run {e.ref} (manifest {e.digest})")
                got = (m, None)
            except CasmonError as err:
                got = ({"name": e.name, "status": "unreadable", "error": " ".join(str(err).split())[:500],
                        "start": e.start or None}, err)
                if isinstance(err, MissingObjectError):  # written a moment ago, perhaps: read again next time
                    return RunInfo(self.store, e.ref, got[0], got[1], e.ref_data)
            self._manifests[e.digest] = got  # immutable: a digest names one manifest forever
        r = RunInfo(self.store, e.ref, got[0], got[1], e.ref_data)
        if e.digest in self._summaries:
            r.keep_summary(self._summaries[e.digest])
        return r

    def _check(self, e: Entry) -> bool:
        """True (and ``e`` checked from then on) if the ref of ``e``, an entry made from the run record table,
        names the manifest ``e`` does; False if the ref is damaged, gone or names another."""
        try:
            got = self.store.get_ref(e.ref)
        except CasmonError:
            return False
        if got is None or got.target is None or got.target.hex() != e.digest:
            return False
        e.ref_data = dict(got.data) if isinstance(got.data, dict) else {}
        e.checked = True
        return True

    def use_index(self) -> None:
        """Read the store's runs index once (the first listing does)."""
        self._index_entries()

    def indexed_cell(self, e: Entry, metric: str) -> tuple[Any] | None:
        """``(last value,)`` of ``metric`` for ended run ``e`` from the runs index's columns (``(None,)`` if the
        run did not log it); None if the index does not hold the run (or holds it as a run just read)."""
        ie = self.indexed(e)
        if ie is None or type(ie[4]) is not tuple:
            return None
        cols, i = ie[4]
        key = (id(cols), metric)
        got = self._metric_columns.get(key)
        if got is None or got[0] is not cols:
            vals, present = cols.metric(metric)
            got = (cols, [v if p else None for v, p in zip(vals.tolist(), present.tolist())])
            self._metric_columns[key] = got
            while len(self._metric_columns) > 64:
                self._metric_columns.pop(next(iter(self._metric_columns)))
        return (got[1][i],)

    def row(self, e: Entry, make: Callable[[RunInfo, Entry], dict[str, Any]]) -> tuple[RunInfo, dict[str, Any]]:
        """The run and its table row (``make`` builds it); kept for a run that ended (a row then depends only
        on the entry and its immutable manifest), made again for a live one."""
        r = self.run(e)
        key = (e.ref, e.digest, e.status)
        row = self._rows.get(key)
        if row is None:
            row = make(r, e)
            if e.digest in self._manifests and e.status not in LIVE_STATUSES and e.checked:
                self._rows[key] = row
        return r, row

    def complete(self, entries: list[Entry]) -> bool:
        """Every manifest of ``entries`` read and kept (none missing for the moment)."""
        return all(e.digest is None or e.digest in self._manifests for e in entries)

    def load_all(self, polite: bool = False) -> None:
        """Read every manifest (for sorting and filtering by their fields), newest first.

        ``polite``: the background loader, which waits while requests are being answered (Python runs
        one thread at a time: a page must not wait for the loader)."""
        self.use_index()
        for e in reversed(self.entries()):
            if polite and not self._wait_idle():
                return
            if self.make_row is not None:
                self.row(e, self.make_row)
            else:
                self.run(e)

    def _wait_idle(self) -> bool:
        """Wait until no page is being made; False if the index is being stopped."""
        while not self.idle():
            if self._stop.wait(0.02):
                return False
        return not self._stop.is_set()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the background loader (before the store closes under it)."""
        self._stop.set()
        if self._loader is not None:
            self._loader.join(timeout)

    def start_loading(self) -> None:
        self._loader = threading.Thread(target=self._load_quietly, name="casmon-ui-index", daemon=True)
        self._loader.start()

    def _load_quietly(self) -> None:
        try:
            if self._wait_idle():
                self.load_all(polite=True)
        except Exception:  # noqa: BLE001 - a request that needs them loads them and reports the error
            pass


# -- calls -----------------------------------------------------------------------------------------------


@dataclass
class CallsSummary:
    """What the calls page shows of the whole log (computed once per reading of the log)."""

    functions: list[tuple[str, int, int, float]]  # (name, calls, sessions, total seconds)
    sessions: list[int]
    processes: list[int]
    ranks: list[int]


def calls_summary(log: CallLog) -> CallsSummary:
    functions, pids, ranks = [], set(), set()
    for name, fi in log.functions.items():
        n, total = 0, 0.0
        for calls in fi.sessions.values():
            n += len(calls)
            total += sum(c.duration for c in calls if is_number(c.duration))
            if calls:  # a session is one process (and one rank)
                pids.add(calls[0].pid)
                if calls[0].rank is not None:
                    ranks.add(calls[0].rank)
        functions.append((name, n, len(fi.sessions), total))
    sessions = sorted(set(log.sessions) | {s for fi in log.functions.values() for s in fi.sessions})
    return CallsSummary(functions, sessions, sorted(pids), sorted(ranks))


def histogram(durations: list[float], bins: int = 24) -> list[tuple[float, float, int]]:
    """Counts of durations in bins evenly spaced on a log scale: ``[(low, high, count)]``."""
    xs = [d for d in durations if is_number(d) and d >= 0]
    if not xs:
        return []
    lo, hi = max(min(xs), 1e-7), max(max(xs), 1e-7)
    if hi <= lo * 1.0001:
        return [(lo, hi, len(xs))]
    a, b = math.log10(lo), math.log10(hi)
    width = (b - a) / bins
    counts = [0] * bins
    for x in xs:
        i = int((math.log10(max(x, 1e-7)) - a) / width)
        counts[min(max(i, 0), bins - 1)] += 1
    return [(10 ** (a + i * width), 10 ** (a + (i + 1) * width), c) for i, c in enumerate(counts)]


def cell_details(log: CallLog, cell: Any, trust: bool) -> dict[str, Any]:
    """A logged value for the call page: kind, shape, dtype, size, digest, and a description (nothing unpickled
    unless ``trust``)."""
    out: dict[str, Any] = {"kind": "inline", "shape": "", "dtype": "", "size": None, "digest": "", "text": ""}
    if isinstance(cell, dict) and "$" in cell:
        h = cell["$"]
        out["digest"] = h if type(h) is str else ""
        try:
            m = log.store.manifest(as_digest(h, "a call record's value"))
            out["kind"], out["size"] = m.tag, m.nbytes
            if m.tag == "array":
                out["shape"] = str(tuple(m.meta.get("shape", ())))
                dt, _why = display.attempt(lambda: serialize.dtype_from_meta(m.meta["dtype"]), "?")
                out["dtype"] = str(dt)
        except CasmonError as e:
            out["kind"] = "unreadable"
            out["text"] = str(e)
            return out
        if trust and log.store.trust:
            v, why = display.attempt(lambda: peek(log.store, h, trust=True))
            out["text"] = why or short_repr(v, 400)
        else:
            out["text"] = describe(log.store, h, 400)
        return out
    out["text"] = log.describe_cell(cell, 400)
    if isinstance(cell, dict) and "!" in cell:
        out["kind"] = "not stored"
    elif cell == NOT_RECORDED:
        out["kind"] = "not recorded"
    return out


def call_inputs(log: CallLog, c: Call) -> list[tuple[str, Any]]:
    """A call's arguments by parameter name (defaults filled in), as cells: nothing is loaded."""
    bound = log.bind(c, list(c.args_cells), dict(c.kwargs_cells), load=lambda cell: cell)
    args = dict(vars(bound))
    out = []
    for name, v in args.items():
        if isinstance(v, tuple):  # *args
            out += [(f"{name}[{i}]", x) for i, x in enumerate(v)]
        elif isinstance(v, dict) and not ("$" in v or "!" in v) and name in {p[0] for p in log.functions[c.name].params
                                                                               if p[1] == "VAR_KEYWORD"}:
            out += [(f"{name}[{k!r}]", x) for k, x in v.items()]
        else:
            out.append((name, v))
    return out
