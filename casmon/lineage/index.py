"""One read of the records a lineage query joins: cache entries, code versions, clears and runs.

Nothing here is a second store: every answer is rebuilt from the records casmon writes anyway (an entry's
``rf``/``pc``/``up`` fields, :mod:`casmon.caching.edges`; a run's ``cache`` links), read in bulk through
:mod:`casmon.lineage.derived`'s index, derived from them. Records are read as data, through their field checks;
no stored value is loaded or unpickled.
"""

from __future__ import annotations

import functools
import gc
import os
import stat
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from casmon.caching import KIND, KIND_CLEAR, KIND_FN
from casmon.errors import CasmonError

if TYPE_CHECKING:
    from casmon.lineage.columns import Columns
    from casmon.runs import RunInfo
    from casmon.store.store import Store

__all__ = ["Index", "LIVE", "CLEARED", "EXPIRED", "MISSING", "bulk"]

LIVE, CLEARED, EXPIRED, MISSING = "live", "cleared", "expired", "missing"
#: What :meth:`Index.file_now` answers for a path it cannot or will not read: no change is judged from it.
UNKNOWN = "unknown"


def bulk(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run a query with the cyclic garbage collector paused: it builds a dict per entry and none is garbage
    until it returns (at 300,000 entries, the collector's passes took a third of the time or more)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        was = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if was:
                gc.enable()

    return run


class Index:
    """The store's entries by key, by result fingerprint and by function; versions; runs (read when asked)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.cleared: dict[str, float] = {}
        for _k, r in store.records(KIND_CLEAR, strict=False):
            fn = r.get("fn")
            if isinstance(fn, str):
                self.cleared[fn] = max(self.cleared.get(fn, 0.0), float(r.get("time", 0.0)))
        # key -> newest record (None: no record), read one key at a time until a query needs them all
        self._entries: dict[str, dict[str, Any] | None] = {}
        self._all = False
        self._relisted = False  # listed the entries again after a miss (once a query)
        self._cols: Columns | None = None
        self._by_rf: dict[str, list[str]] | None = None
        self._by_fn: dict[str, list[str]] | None = None
        self._by_result: dict[str, list[str]] | None = None
        # fn -> (time, version) of the newest version record: the code as it last ran
        self.current: dict[str, tuple[float, str]] = {}
        self.parts: dict[tuple[str, str], dict[str, Any]] = {}
        for _k, r in store.records(KIND_FN, strict=False):
            fn, v = r.get("fn"), r.get("version")
            if not isinstance(fn, str) or not isinstance(v, str):
                continue
            t = float(r.get("time", 0.0))
            if fn not in self.current or t >= self.current[fn][0]:
                self.current[fn] = (t, v)
            if isinstance(r.get("parts"), dict):
                self.parts[(fn, v)] = r["parts"]
        self._status: dict[str, str] = {}
        self._groups: dict[str, list[tuple[str, list[str]]]] = {}
        self._runs: list[RunInfo] | None = None
        self._now = time.time()
        self._files: dict[str, str | None] = {}
        self._links: dict[str, list[dict[str, Any]]] | None = None
        self._links_new = 0

    # -- entries -----------------------------------------------------------------------------------------------
    def entry(self, key: str) -> dict[str, Any] | None:
        """The newest record of entry ``key`` (hex), or None: a lookup of its key, not a read of every entry."""
        if key in self._entries or self._all:
            return self._entries.get(key)
        if self._cols is not None:
            i = self._cols.row(key)
            r = self._cols.record(i) if i >= 0 else None
            self._entries[key] = r
            return r
        r = None
        try:
            recs = self.store.lookup(KIND, bytes.fromhex(key))
            if not recs and not self._relisted:
                # A store held open (casmon ui, a notebook) lists again on a miss at most once a second: a key
                # another process wrote a moment ago would read as no entry. A query lists once.
                self._relisted = True
                self.store.table(KIND).refresh()
                recs = self.store.lookup(KIND, bytes.fromhex(key), refresh=False)
            for rec in recs:
                if r is None or rec.get("time", 0) >= r.get("time", 0):
                    r = rec
        except (CasmonError, ValueError):
            r = None
        self._entries[key] = r
        return r

    @property
    def cols(self) -> Columns:
        """Every entry's lineage fields as columns (:mod:`casmon.lineage.columns`), read once, through the derived
        index."""
        if self._cols is None:
            from casmon.lineage.derived import read_columns

            self._cols = read_columns(self.store)
            # the keys looked up one at a time before are answered by the columns now: one view of the store
            self._entries, self._status, self._groups = {}, {}, {}
        return self._cols

    def _load_all(self) -> None:
        if self._all:
            return
        self._entries = dict(self.cols.records())
        self._all = True

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        """Every entry's newest record, by key (a dict per entry: the queries join :attr:`cols` instead)."""
        self._load_all()
        return self._entries  # type: ignore[return-value]

    def _grouped(self, col: Any, rows: Any) -> dict[str, list[str]]:
        from casmon.lineage.columns import hexes

        out: dict[str, list[str]] = {}
        for d, k in zip(hexes(col[rows]), hexes(self.cols.key[rows])):
            out.setdefault(d, []).append(k)
        return out

    @property
    def by_rf(self) -> dict[str, list[str]]:
        from casmon.lineage.columns import HAS_RF

        if self._by_rf is None:
            c = self.cols
            self._by_rf = self._grouped(c.rf, np.flatnonzero(c.has & HAS_RF))
        return self._by_rf

    @property
    def by_fn(self) -> dict[str, list[str]]:
        if self._by_fn is None:
            from casmon.lineage.columns import hexes

            c = self.cols
            self._by_fn = {}
            for f, k in zip(c.fn.tolist(), hexes(c.key)):
                self._by_fn.setdefault(c.strings[f], []).append(k)
        return self._by_fn

    @property
    def by_result(self) -> dict[str, list[str]]:
        from casmon.lineage.columns import HAS_RESULT

        if self._by_result is None:
            c = self.cols
            self._by_result = self._grouped(c.result, np.flatnonzero(c.has & HAS_RESULT))
        return self._by_result

    def rf_keys(self, rf: str) -> list[str]:
        """The keys of the entries whose result fingerprint is ``rf`` (hex)."""
        from casmon.lineage.columns import hexes

        c = self.cols
        try:
            d = np.array([bytes.fromhex(rf)], "S16")
        except ValueError:
            return []
        _which, rows = c.with_rf(d)
        return hexes(c.key[rows])

    def status(self, key: str) -> str:
        st = self._status.get(key)
        if st is None:
            st = self._status[key] = self._status_of(key)
        return st

    def _status_of(self, key: str) -> str:
        r = self.entry(key)
        if r is None:
            return MISSING
        if float(r.get("time", 0.0)) <= self.cleared.get(str(r.get("fn", "?")), 0.0):
            return CLEARED
        exp = r.get("expires")
        if isinstance(exp, (int, float)) and exp <= self._now:
            return EXPIRED
        return LIVE

    def upstream(self, key: str) -> list[tuple[str, str]]:
        """``(parameter, upstream entry key)`` of an entry: by identity (``up``) and, for a parameter without an
        identity edge, by content (``pc`` -- of it or its items -- equal to an entry's ``rf``); an entry never
        links to itself."""
        if self.entry(key) is None:
            return []
        out: list[tuple[str, str]] = []
        seen: set[tuple[str, str]] = set()
        for name, group in self.upstream_groups(key):
            for h in group:
                if (name, h) not in seen:
                    seen.add((name, h))
                    out.append((name, h))
        return out

    def upstream_groups(self, key: str) -> list[tuple[str, list[str]]]:
        """The entry's inputs, each as ``(parameter, entries any of which made it)``: an object passed on (one
        entry), or a value equal to the results of several (each of them made it)."""
        got = self._groups.get(key)
        if got is not None:
            return got
        r = self.entry(key)
        if r is None:
            return []
        out: list[tuple[str, list[str]]] = []
        up = r.get("up") or {}
        for name, ks in up.items():
            out.extend((name, [h]) for h in ks if h != key)
        for name, d in (r.get("pc") or {}).items():
            base = name.split("[", 1)[0]
            if base in up:
                continue  # its producer is known by identity: an equal value elsewhere is chance
            group = [h for h in self.rf_keys(d) if h != key]
            if group:
                out.append((base, group))
        self._groups[key] = out
        return out

    def downstream(self, key: str) -> list[tuple[str, str]]:
        """``(parameter, entry key)`` of the entries that took this entry's result."""
        from casmon.lineage.columns import hexes
        from casmon.lineage.joins import downstream

        c = self.cols
        i = c.row(key)
        if i < 0:
            return []
        dn = downstream(c)
        a, b = int(dn.ptr[i]), int(dn.ptr[i + 1])
        return list(zip((c.strings[j] for j in dn.name[a:b].tolist()), hexes(c.key[dn.dst[a:b]])))

    def files(self, key: str) -> list[tuple[str, str, str]]:
        """``(parameter, path, digest hex)`` of the files an entry read (``files=``)."""
        out = []
        for f in (self.entry(key) or {}).get("files") or ():
            if isinstance(f, list) and len(f) >= 3 and all(isinstance(x, str) for x in f[:3]):
                out.append((f[0], f[1], f[2]))
        return out

    def file_now(self, path: str) -> str | None:
        """The digest hex of the file (or folder) at ``path`` now; None: it is gone; :data:`UNKNOWN`: it cannot be
        read, or is no regular file or folder. Relative paths are read from this process's directory, as the call
        that recorded them saw them from its own; one not found here is unknown, not gone."""
        if path not in self._files:
            from casmon.caching.files import path_digest

            try:
                mode = os.stat(path).st_mode
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    self._files[path] = UNKNOWN  # a device or a pipe (a crafted record's /dev/zero): never read
                else:
                    kind, d, _n = path_digest(path)
                    self._files[path] = d.hex() if d is not None and kind != "missing" else None
            except FileNotFoundError:
                # gone; or, for a relative path, never here: it was recorded from another folder; or the path is
                # there and a link inside its folder points nowhere (no digest can be made: nothing is judged)
                self._files[path] = None if os.path.isabs(path) and not os.path.exists(path) else UNKNOWN
            except (OSError, CasmonError):
                self._files[path] = UNKNOWN
        return self._files[path]

    def version_parts(self, fn: str, version: str | None) -> dict[str, Any] | None:
        return self.parts.get((fn, version)) if version else None

    def calls_taking(self, digests: set[str] | None) -> list[tuple[Any, str, str]]:
        """``(logged call, argument, result digest hex)`` of the intercepted calls that took one of ``digests``
        (None: any stored value) as an argument: a value is stored once by content, so an argument's cell names
        the digest of an entry's result when it is that value."""
        if digests is not None and not digests:
            return []
        from casmon.calllog import CallLog

        try:
            log = CallLog(self.store)
            calls = log.calls()
        except (CasmonError, LookupError):
            return []
        out = []
        for c in calls:
            cells = [(f"[{i}]", v) for i, v in enumerate(c.args_cells)] + list(c.kwargs_cells.items())
            for name, cell in cells:
                d = cell.get("$") if isinstance(cell, dict) else None
                if isinstance(d, str) and (digests is None or d in digests):
                    out.append((c, name, d))
        return out

    # -- runs --------------------------------------------------------------------------------------------------
    def runs(self) -> list[RunInfo]:
        if self._runs is None:
            from casmon.runs import list_runs

            self._runs = [r for r in list_runs(self.store) if r.error is None]
        return self._runs

    def run_links(self, run: RunInfo) -> list[dict[str, Any]]:
        """The run's cache links that can be read: ``{"fn", "key", "result", "hit"}`` (``result`` where the
        manifest is read). A run the runs index lists is known by its manifest's digest: its links are kept by
        it (:func:`casmon.lineage.derived.load_links`), so a query over every run reads no manifest twice."""
        d = run.manifest_digest if hasattr(run, "manifest_digest") else None
        if d is not None:
            if self._links is None:
                from casmon.lineage.derived import load_links

                self._links = load_links(self.store)
            got = self._links.get(d)
            if got is not None:
                return got
        out = links_of(run)
        if d is not None and run.error is None and self._links is not None:
            self._links[d] = [{"key": x["key"], "fn": x["fn"], "hit": bool(x.get("hit"))} for x in out]
            self._links_new += 1
        return out

    def keep_links(self) -> None:
        """Write the runs' links read since they were loaded (where any were, and the store can be written)."""
        if self._links_new and self._links is not None:
            from casmon.lineage.derived import save_links

            save_links(self.store, self._links)
            self._links_new = 0


def links_of(run: RunInfo) -> list[dict[str, Any]]:
    """The cache links of a run's manifest that can be read."""
    links = run.manifest.get("links")
    cache = links.get("cache") if isinstance(links, dict) else None
    out = []
    for e in cache if isinstance(cache, list) else ():
        if isinstance(e, dict) and isinstance(e.get("key"), str) and isinstance(e.get("fn"), str):
            out.append(e)
    return out


def short_hex(h: str) -> str:
    return h[:12]
