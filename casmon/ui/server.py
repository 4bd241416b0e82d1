"""``casmon ui``: a read-only web app over one store, on the standard library's HTTP server.

Routes (GET only; anything else is 405)::

    /                     runs: sortable, filterable, paginated        ?sort= &order= &q= &page= &per=
    /compare              runs side by side, their metrics charted     ?run=A[&run=B...]
    /run/NAME             one run: status, metrics and charts, params, info, output, patch, files, links
    /api/runs             runs changed since a serial, and live ones   ?since=
    /api/runs/view        the runs page's table, count, pager and      ?sort= &order= &q= &page= &per=
                          parallel coordinates as markup (JSON; the
                          page's script swaps them in on a sort, filter or page)
    /api/run/NAME         one run's status, elapsed, metrics, output tail (JSON)
    /api/metric           a metric of runs, downsampled (JSON)         ?run=A[&run=B...] &name= &n= &enc= &from= &to=
    /api/run/NAME/metrics one run's metrics grouped, those named       ?name=A[&name=B...] &n= &enc= &from= &to=
                          downsampled (JSON; the dashboards')
    /api/runs/metrics     the same for several runs at once (the       ?run=A[&run=B...] &name=A[&name=B...] &n=
                          compare page's), the names each run logged     &enc= &from= &to=
    /calls                functions, a histogram of durations, calls   ?fn= &session= &process= &thread= &rank= &run=
                                                                       &page= &reload=
    /call                 one call's inputs and result, described      ?fn= &session= &n=
    /cache                cached functions; one function's code        ?fn= &entry=
                          versions and entries; one entry and what
                          differs from its nearest entries
    /store                sizes by area, dedup and compression ratios
    /file                 a file cached calls read: its contents recorded, ?path= [&digest=]
                          what used it
    /api/lineage/run/NAME a run's upstream graph, laid out (JSON; the run page's lineage panel)
    /api/lineage/entry/KEY  an entry's (the entry page's panel)
    /api/used-by/entry/KEY  entries, runs and logged calls downstream, a page ?page=
    /api/used-by/file     of a file (that content of it)                ?path= [&digest=] &page=
    /static/NAME          the fixed list in ``pages.STATIC``: casmon's style sheet and scripts, uPlot's

Requests are parsed strictly: an unknown path or parameter, a repeated
parameter that takes one value, a malformed number or a filter that cannot be
applied is a 400 naming it (the JSON endpoints answer ``{"error": ...}``). On a
loopback address the ``Host`` header must name the server itself (a page on
another site cannot reach it by DNS rebinding). Every response carries a
Content-Security-Policy (scripts and styles only from the server itself, no
inline script, no frames, nothing fetched elsewhere) and ``no-store``.
"""

from __future__ import annotations

import gc
import ipaddress
import json
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Set as AbstractSet
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from casmon.view import display
from casmon.caching import KIND as KIND_CACHE, KIND_CLEAR, KIND_FN, KIND_USE, newest_per_key, cache_entries, resolve_function
from casmon.caching.explain import code_versions, explain_entry
from casmon.calllog import CallLog
from casmon.errors import CasmonError, DamagedObjectError
from casmon.maintenance import stats
from casmon.runs.metrics import json_safe
from casmon.keys.digest import Digest
from casmon.store.peek import describe
from casmon.lineage import Index
from casmon.ui import api, artifactview, cachepage, comparepage, lineageview, model, pages, runpage
from casmon.ui.snapshot import Snapshot
from casmon.ui.compare import compare, in_run
from casmon.ui.series import MAX_POINTS, POINTS
from casmon.ui.table import ALIASES, FIXED_COLUMNS, is_column, row_of, runs_view


class BadRequest(ValueError):
    """A request this server does not answer: says what is wrong with it (400)."""


class NotFound(LookupError):
    """404, with what was not found."""


_PATH_RE = re.compile(r"^/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*$")
_INT_RE = re.compile(r"^[0-9]{1,12}$")
_STEP_RE = re.compile(r"^-?[0-9]{1,19}$")
_KEY_RE = re.compile(r"^[0-9a-fA-F]{32}$")
_HEX_RE = re.compile(r"^[0-9a-fA-F]{8,128}$")
MAX_URL = 8192
MAX_RUNS = 100  # runs on one compare page
MAX_METRICS = 100  # series one dashboard request asks for
HTML = "text/html; charset=utf-8"
#: The background loader starts on its rows only once no request has come for this long: the first page's
#: style sheet and scripts, and a reader's first sorts, do not share the processor with it.
LOADER_QUIET = 1.0
#: A first listing of at least this many runs is frozen out of Python's cycle collector (``gc.freeze``):
#: long-lived, it would be walked again by every full collection.
FREEZE_FROM = 5000
JSON = "application/json; charset=utf-8"


class App:
    """The state the pages share: the store, its run index, the call log (read once, again on request)."""

    def __init__(self, store: Any, trust: bool = False) -> None:
        self.store = store
        self.trust = trust
        self.runs = model.RunIndex(store)
        self.runs.make_row = row_of
        self.ctx = pages.Ctx(store.url, trust)
        self.snapshot = Snapshot(store)
        self._log: CallLog | None = None
        self._log_time = 0.0
        self._log_lock = threading.Lock()
        self._summary: model.CallsSummary | None = None
        self._selections: OrderedDict[tuple[Any, ...], tuple[list[Any], list[Any]]] = OrderedDict()  # filters -> (calls, histogram)
        self._busy = 0
        self._busy_lock = threading.Lock()
        self._last = 0.0  # time.monotonic() of the last answer
        self._loading = False
        self._listed = False
        self._listing_lock = threading.Lock()
        self.index_in_background = True
        #: The server has the process to itself (``casmon ui``): the first listing may pause and freeze Python's
        #: cycle collector, which in a user's own process (a notebook) would reach the user's objects too.
        self.own_process = False
        self.runs.idle = lambda: self._busy == 0 and time.monotonic() - self._last >= LOADER_QUIET

    def enter(self) -> None:
        with self._busy_lock:
            self._busy += 1

    def leave(self) -> None:
        with self._busy_lock:
            self._busy -= 1
            self._last = time.monotonic()
            start = self.index_in_background and not self._loading
            self._loading = True
        if start:  # after the first page, which does not wait for the loader; it waits for a quiet second
            self.runs.start_loading()

    def first_listing(self) -> None:
        """List the runs the first time, in ``casmon ui``'s own process with Python's cycle collector paused:
        building 100,000 runs' entries, none of them garbage, it would walk them all again and again (a fifth of
        the listing's time). Where the collector was on, it is on again after, whatever happens; a big listing is
        then frozen out of it."""
        if self._listed:
            return
        with self._listing_lock:
            if self._listed:
                return
            pause = self.own_process and gc.isenabled()
            if pause:
                gc.disable()
            try:
                n = len(self.runs.entries())
            finally:
                if pause:
                    gc.enable()
            self._listed = True
        if pause and n >= FREEZE_FROM:
            gc.freeze()

    def calllog(self, reload: bool = False) -> tuple[CallLog, float]:
        """The call log, read once (a million calls take a while) and again when the page asks."""
        with self._log_lock:
            if self._log is None or reload:
                self._log = CallLog(self.store)
                self._log_time = time.time()
                self._summary = None
                self._selections.clear()
            return self._log, self._log_time

    def selection(self, log: CallLog, filters: dict[str, Any], thread: Any,
                  run: Any = None) -> tuple[model.CallsSummary, list[Any], list[Any]]:
        """The calls one set of filters selects, by start, with their histogram (the last 16 sets kept)."""
        key = tuple(sorted((k, str(v)) for k, v in filters.items()))
        with self._log_lock:
            if self._summary is None:
                self._summary = model.calls_summary(log)
            summary = self._summary
            got = self._selections.get(key)
            if got is not None:
                self._selections.move_to_end(key)
                return summary, *got
        calls = log.calls(filters["fn"], session=filters["session"], process=filters["process"], thread=thread,
                          rank=filters["rank"])
        if run is not None:  # the calls made during one run (its sessions, its time)
            calls = [c for c in calls if in_run(c, run)]
        calls.sort(key=lambda c: c.start)
        got = (calls, model.histogram([c.duration for c in calls]))
        with self._log_lock:
            if log is self._log:
                self._selections[key] = got
                while len(self._selections) > 16:
                    self._selections.popitem(last=False)
        return summary, *got

    # -- routing -------------------------------------------------------------------------------------
    def handle(self, target: str) -> tuple[int, bytes, str]:
        """``(status, body, content type)`` for a GET of ``target`` (the request line's path and query)."""
        if len(target) > MAX_URL:
            raise BadRequest(f"the URL is longer than {MAX_URL} characters")
        parts = urlsplit(target)
        if parts.scheme or parts.netloc or parts.fragment or not _PATH_RE.match(parts.path):
            raise BadRequest("the path has characters a casmon ui path never has")
        try:
            path = unquote(parts.path, errors="strict")
        except UnicodeDecodeError:
            raise BadRequest("the path is not UTF-8") from None
        try:
            query = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query),
                              max_num_fields=200, errors="strict")
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequest(f"the query is malformed: {e}") from None
        if path.startswith("/static/"):
            got = pages.static_file(path[len("/static/"):])
            if got is None:
                raise NotFound(f"no file {path}")
            return 200, got[0], got[1]
        if path in ("/", "/runs", "/api/runs/view"):
            self.first_listing()
        if path in ("/", "/runs"):
            return self.runs_page(Params(query, {"sort", "order", "q", "page", "per"}))
        if path == "/compare":
            return self.compare_page(Params(query, {"run"}, multi={"run"}))
        if parts.path.startswith("/run/") and len(parts.path) > 5 and "/" not in parts.path[5:]:
            p = Params(query, {"shared"})  # the name is one segment of the raw path, decoded alone: it may hold '/'
            if p.one("shared") not in (None, "1"):
                raise BadRequest("shared= is 1 (count the share other runs hold) or absent")
            return self.run_page(path[5:], shared=p.one("shared") == "1")
        if path == "/api/runs/view":
            return self.runs_parts(Params(query, {"sort", "order", "q", "page", "per"}))
        if path == "/api/runs":
            p = Params(query, {"since"})
            return 200, _json(api.runs_since(self.runs, p.integer("since", 0))), JSON
        if parts.path.startswith("/api/run/") and parts.path.endswith("/metrics") and len(parts.path) > 17 \
                and "/" not in parts.path[9:-8]:
            return self.run_metrics(unquote(parts.path[9:-8], errors="strict"),
                                    Params(query, {"name", "n", "enc", "from", "to"}, multi={"name"}))
        if parts.path.startswith("/api/run/") and len(parts.path) > 9 and "/" not in parts.path[9:]:
            Params(query, set())
            return 200, _json(api.run_state(self.runs, self._entry(path[9:]))), JSON
        if path == "/api/runs/metrics":
            return self.runs_metrics(Params(query, {"run", "name", "n", "enc", "from", "to"}, multi={"run", "name"}))
        if path == "/api/metric":
            return self.metric_points(Params(query, {"run", "name", "n", "enc", "from", "to"}, multi={"run"}))
        if path == "/calls":
            return self.calls_page(Params(query, {"fn", "session", "process", "thread", "rank", "run", "page", "reload"}))
        if path == "/call":
            return self.call_page(Params(query, {"fn", "session", "n"}))
        if path == "/cache":
            return self.cache_page(Params(query, {"fn", "entry"}))
        if path == "/artifact":
            return self.artifact(Params(query, {"run", "name"}))
        if path.startswith("/api/lineage/") or path.startswith("/api/used-by/") or path == "/file":
            return self.lineage(parts.path, query)
        if path == "/store":
            Params(query, set())
            return 200, pages.store_page(self.ctx, stats(self.store)), HTML
        raise NotFound(f"no page {path}")

    def _runs_view(self, p: Params) -> tuple[Any, str, bool, str, int]:
        """The runs table a runs page's query asks for: ``(view, sort, desc, q, per)``; a bad parameter is a
        :class:`BadRequest` (a filter that cannot be applied is not: the view says why)."""
        sort = p.one("sort") or "start"
        sort = ALIASES.get(sort, sort)  # a column by its header too (started)
        if not is_column(sort):
            raise BadRequest(f"sort: no column {sort[:100]!r} (one of {', '.join(FIXED_COLUMNS)}, or param.KEY, "
                             "info.KEY, metric.KEY)")
        order = p.one("order") or "desc"
        if order not in ("asc", "desc"):
            raise BadRequest("order: asc or desc")
        q = p.one("q") or ""
        per = p.integer("per", 50)
        if not 1 <= per <= 1000:
            raise BadRequest("per: 1 to 1000 runs a page")
        view = runs_view(self.runs, sort, order == "desc", q, p.integer("page", 1), per)
        return view, sort, order == "desc", q, per

    def runs_page(self, p: Params) -> tuple[int, bytes, str]:
        view, sort, desc, q, per = self._runs_view(p)
        # A filter that cannot be applied: 400, and the page says which term and why (and lists every run).
        return 400 if view.error else 200, pages.runs_page(self.ctx, view, sort, desc, q, per), HTML

    def runs_parts(self, p: Params) -> tuple[int, bytes, str]:
        """The parts of the runs page that a sort, a filter or a page changes (JSON, for the page's script to
        swap in): the same markup the whole page holds, the page's own URL, and a filter's error (then 400)."""
        view, sort, desc, q, per = self._runs_view(p)
        own = pages.url("/", sort=sort if sort != "start" else None, order=None if desc else "asc", q=q or None,
                        page=view.page if view.page > 1 else None, per=per if per != 50 else None)
        got = {"url": own, "sort": sort, "order": "desc" if desc else "asc", "q": q, "per": per, "page": view.page,
               "total": view.total, "all": view.all_runs, "serial": view.serial,
               "parts": pages.runs_parts(self.ctx, view, sort, desc, q, per)}
        if view.error:
            got["error"] = view.error
        return 400 if view.error else 200, _json(got), JSON

    def compare_page(self, p: Params) -> tuple[int, bytes, str]:
        tails = p.many("run")
        if not tails:
            raise BadRequest("compare needs one or more runs: /compare?run=A&run=B")
        if len(tails) > MAX_RUNS:
            raise BadRequest(f"compare takes at most {MAX_RUNS} runs")
        if len(set(tails)) != len(tails):
            raise BadRequest("a run is named twice")
        serial = self.runs.entries().changes  # before the runs are read: a change after it is polled for
        entries = [self._entry(t) for t in tails]
        runs = [self.runs.run(e) for e in entries]
        log = self.calllog()[0] if sum(1 for r in runs if (r.manifest.get("links") or {}).get("call_sessions")) >= 2 else None
        cmp = compare(runs, [e.tail for e in entries], log, self.trust)
        return 200, comparepage.compare_page(self.ctx, cmp, serial, lineageview.first_differences(self.store, runs)), HTML

    def lineage(self, raw: str, query: list[tuple[str, str]]) -> tuple[int, bytes, str]:
        """The lineage endpoints and the file page (``raw``: the undecoded path, a run's name one segment)."""
        ix = Index(self.store)
        try:
            if raw.startswith("/api/lineage/run/") and len(raw) > 17 and "/" not in raw[17:]:
                Params(query, set())
                r = self.runs.run(self._entry(unquote(raw[17:], errors="strict")))
                return 200, _json(lineageview.run_lineage(ix, r)), JSON
            if raw.startswith("/api/lineage/entry/"):
                Params(query, set())
                return 200, _json(lineageview.entry_lineage(ix, _key(raw[19:]))), JSON
            if raw.startswith("/api/used-by/entry/"):
                p = Params(query, {"page"})
                items = lineageview.entry_used_by(ix, _key(raw[19:]))
                return 200, _json(lineageview.used_by_json(items, _page(p))), JSON
            if raw == "/api/used-by/file" or raw == "/file":
                p = Params(query, {"path", "digest"} | ({"page"} if raw != "/file" else set()))
                path, digest = p.one("path"), p.one("digest") or None
                if not path:
                    raise BadRequest("a file is named by ?path=PATH[&digest=HEX]")
                if digest is not None and not _HEX_RE.match(digest):
                    raise BadRequest(f"digest: hex digits, not {digest[:40]!r}")
                if raw == "/file":
                    versions = lineageview.file_versions(ix, path)
                    if not versions:
                        raise NotFound(f"no cache entry read a file {path!r}")
                    if digest is not None and digest.lower() not in versions:
                        raise NotFound(f"no cache entry read {path!r} with content {digest}")
                    return 200, lineageview.file_page(self.ctx, path, digest and digest.lower(), versions,
                                                      ix.file_now(path)), HTML
                items = lineageview.file_used_by(ix, path, digest and digest.lower())
                return 200, _json(lineageview.used_by_json(items, _page(p))), JSON
        except LookupError as e:
            raise NotFound(str(e.args[0]) if e.args else str(e)) from None
        raise NotFound(f"no page {unquote(raw)}")

    def metric_points(self, p: Params) -> tuple[int, bytes, str]:
        tails, name = p.many("run"), p.one("name")
        if not tails or not name:
            raise BadRequest("a metric is /api/metric?run=A[&run=B...]&name=NAME[&n=2000]")
        if len(tails) > MAX_RUNS:
            raise BadRequest(f"a metric of at most {MAX_RUNS} runs at once")
        n, packed, steps = _chart_query(p)
        return 200, _json(api.metric_points(self.runs, [self._entry(t) for t in tails], name, n, packed, steps)), JSON

    def run_metrics(self, which: str, p: Params) -> tuple[int, bytes, str]:
        names = p.many("name")
        if len(names) > MAX_METRICS:
            raise BadRequest(f"name: at most {MAX_METRICS} metrics at once")
        n, packed, steps = _chart_query(p)
        e = self._entry(which)
        try:
            got = api.run_metrics(self.runs, e, names, n, packed, steps)
        except LookupError as err:
            raise NotFound(str(err.args[0]) if err.args else str(err)) from None
        return 200, _json(got), JSON

    def runs_metrics(self, p: Params) -> tuple[int, bytes, str]:
        tails, names = p.many("run"), p.many("name")
        if not tails or not names:
            raise BadRequest("runs' metrics are /api/runs/metrics?run=A[&run=B...]&name=NAME[&name=...]")
        if len(tails) > MAX_RUNS or len(names) > MAX_METRICS:
            raise BadRequest(f"at most {MAX_RUNS} runs and {MAX_METRICS} metrics at once")
        n, packed, steps = _chart_query(p)
        got = api.runs_metrics(self.runs, tails, names, n, packed, steps)
        return 200, _json(got), JSON

    def _entry(self, which: str) -> model.Entry:
        try:
            return self.runs.find(which)
        except LookupError as e:
            raise NotFound(str(e)) from None

    def run_page(self, which: str, shared: bool = False) -> tuple[int, bytes, str]:
        e = self._entry(which)
        return 200, runpage.run_page(self.ctx, e, self.runs.run(e), shared), HTML

    def artifact(self, p: Params) -> tuple[int, Any, str]:
        tail, name = p.one("run"), p.one("name")
        if not tail or not name:
            raise BadRequest("an artifact is /artifact?run=RUN&name=NAME")
        r = self.runs.run(self._entry(tail))
        return 200, artifactview.download(self.store, r, name), "download"

    def calls_page(self, p: Params) -> tuple[int, bytes, str]:
        log, read_at = self.calllog(reload=p.one("reload") not in (None, "", "0"))
        filters = {"fn": p.one("fn") or None, "session": p.integer("session", None), "process": p.integer("process", None),
                   "thread": p.one("thread") or None, "rank": p.integer("rank", None), "run": None}
        run = None
        run_tail = p.one("run")
        if run_tail:
            e = self._entry(run_tail)
            run, filters["run"] = self.runs.run(e), e.tail
        thread: Any = filters["thread"]
        if thread is not None and _INT_RE.match(thread):
            thread = int(thread)
        try:
            if filters["fn"]:
                filters["fn"] = log.resolve(filters["fn"])
            summary, calls, bins = self.selection(log, filters, thread, run)
        except LookupError as e:
            raise NotFound(str(e)) from None
        shown = {k: v for k, v in filters.items() if v is not None}
        return 200, pages.calls_page(self.ctx, log, summary, calls, bins, shown, p.integer("page", 1), 100, read_at), \
            "text/html; charset=utf-8"

    def call_page(self, p: Params) -> tuple[int, bytes, str]:
        fn, session, n = p.one("fn"), p.integer("session", None), p.integer("n", None)
        if not fn or n is None:
            raise BadRequest("a call is /call?fn=NAME&n=N[&session=S]")
        log = self.calllog()[0]
        try:
            c = log.call(fn, n, session)
        except LookupError:
            try:
                c = self.calllog(reload=True)[0].call(fn, n, session)  # a call logged since the log was read
            except LookupError as e:
                raise NotFound(str(e)) from None
        return 200, pages.call_page(self.ctx, log, c), "text/html; charset=utf-8"

    def cache_page(self, p: Params) -> tuple[int, bytes, str]:
        store: Any = self.snapshot  # stands for the store: the cache table's records decoded once while unchanged
        summary = store.kept("summary", (KIND_CACHE, KIND_CLEAR, KIND_USE), lambda: cache_entries(store))
        fn, entry = p.one("fn"), p.one("entry")
        if entry is not None and not fn:
            raise BadRequest("an entry is /cache?fn=NAME&entry=KEY: name its function too")
        if entry is not None and not _KEY_RE.match(entry):
            raise BadRequest(f"entry: a cache entry is named by its key, 32 hex digits; {entry[:40]!r} is not one")
        now = time.time()

        def described(h: Any) -> str:
            return display.described(lambda: describe(self.store, h, 80))

        if not fn:
            return 200, cachepage.functions_page(self.ctx, summary, None, [], [], described, now), HTML
        # A function whose entries were all cleared still has its code versions to show.
        names = set(summary) | {str(r.get("fn")) for _k, r in store.records(KIND_FN) if r.get("fn")}
        try:
            fn = resolve_function(names, fn)
        except LookupError as e:
            raise NotFound(str(e)) from None
        cleared = max((r.get("time", 0.0) for _k, r in store.records(KIND_CLEAR) if r.get("fn") == fn), default=0.0)

        def live_entries() -> tuple[dict[bytes, tuple[Digest, dict]], list[tuple[Digest, dict]]]:
            live = newest_per_key((k, r) for k, r in store.records(KIND_CACHE)
                                  if r.get("fn") == fn and r.get("time", 0) > cleared)
            return live, sorted(live.values(), key=lambda kr: kr[1].get("time", 0), reverse=True)

        live, entries = store.kept(("live", fn, cleared), (KIND_CACHE,), live_entries)
        versions = code_versions(store, fn)
        if entry is None:
            return 200, cachepage.functions_page(self.ctx, summary, fn, entries, versions, described, now), HTML
        key = Digest(entry.lower())
        got = live.get(bytes(key))
        if got is None:
            raise NotFound(self._not_live(fn, key, cleared))
        ex = explain_entry(store, fn, key)
        others = {k.hex(): r for k, r in entries}
        panels = [lineageview.panel(self.ctx, f"/api/lineage/entry/{key.hex()}", "this entry's arguments"),
                  lineageview.used_by_list(self.ctx, f"/api/used-by/entry/{key.hex()}", "this entry's result")]
        return 200, cachepage.entry_page(self.ctx, fn, key.hex(), got[1], ex, versions, others, described, now,
                                         panels, [lineageview.SCRIPT]), HTML

    def _not_live(self, fn: str, key: Digest, cleared: float) -> str:
        """Why ``key`` is no live entry of ``fn``: cleared, another function's, or none at all."""
        records = self.store.lookup(KIND_CACHE, key)
        if any(r.get("fn") == fn for r in records):
            return (f"no live entry {key.hex()} of {fn}: it was cleared (casmon cache clear, "
                    f"{display.when(cleared)})")
        others = sorted({str(r.get("fn")) for r in records if r.get("fn")})
        if others:
            return f"no live entry {key.hex()} of {fn}: that key is an entry of {', '.join(others)}"
        return f"no live entry {key.hex()} of {fn}: no entry has that key (never stored, or dropped by gc)"


def _key(text: str) -> str:
    if not _KEY_RE.match(text):
        raise BadRequest(f"a cache entry is named by its key, 32 hex digits; {text[:40]!r} is not one")
    return text.lower()


def _page(p: Params) -> int:
    page = p.integer("page", 1)
    if page < 1:
        raise BadRequest("page: 1 or more")
    return int(page)


def _chart_query(p: Params) -> tuple[int, bool, tuple[int, int] | None]:
    """What a chart asks for: ``n`` buckets, ``enc=f64`` (lists packed, :func:`casmon.ui.series.metric_json`),
    ``from`` and ``to`` (the steps in view of a zoomed chart, both or neither)."""
    n = p.integer("n", POINTS)
    if not 1 <= n <= MAX_POINTS:
        raise BadRequest(f"n: 1 to {MAX_POINTS:,} points")
    enc = p.one("enc")
    if enc not in (None, "", "f64"):
        raise BadRequest(f"enc: f64 (packed floats) or absent, not {enc[:40]!r}")
    lo, hi = p.one("from"), p.one("to")
    if lo is None and hi is None:
        return n, enc == "f64", None
    if lo is None or hi is None or not _STEP_RE.match(lo) or not _STEP_RE.match(hi) \
            or not -(1 << 63) <= int(lo) <= int(hi) < (1 << 63):
        raise BadRequest("from and to: the first and last step of a zoomed chart, both, whole numbers, from <= to")
    return n, enc == "f64", (int(lo), int(hi))


def _json(data: Any) -> bytes:
    """A JSON answer, never HTML: NaN and infinities (which JSON has not) as "NaN", "Infinity", "-Infinity"
    (:func:`casmon.runs.metrics.json_safe`; a chart's points are null gaps with ``marks`` instead)."""
    text = json.dumps(json_safe(data), separators=(",", ":"), allow_nan=False, default=str)
    # Store strings hold markup at times: escaped as JSON allows, so no browser ever sniffs this as a page.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").encode("utf-8")


class Params:
    """A request's query parameters, checked against what the page takes."""

    def __init__(self, query: list[tuple[str, str]], allowed: set[str], multi: AbstractSet[str] = frozenset()) -> None:
        self.values: dict[str, list[str]] = {}
        for k, v in query:
            if k not in allowed:
                raise BadRequest(f"unknown parameter {k!r}" + (f" (this page takes {', '.join(sorted(allowed))})"
                                                                  if allowed else " (this page takes none)"))
            if k in self.values and k not in multi:
                raise BadRequest(f"parameter {k!r} is given twice")
            if len(v) > 2000:
                raise BadRequest(f"parameter {k!r} is too long")
            self.values.setdefault(k, []).append(v)

    def one(self, k: str) -> str | None:
        v = self.values.get(k)
        return v[0] if v else None

    def many(self, k: str) -> list[str]:
        return list(self.values.get(k, []))

    def integer(self, k: str, default: Any) -> Any:
        v = self.one(k)
        if v is None or v == "":
            return default
        if not _INT_RE.match(v):
            raise BadRequest(f"parameter {k!r} must be a whole number, not {v[:40]!r}")
        return int(v)


class Handler(BaseHTTPRequestHandler):
    server_version = "casmon-ui"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    timeout = 120  # seconds a connection may sit idle (a stalled client does not hold a thread for ever)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        app: App = self.server.app  # type: ignore[attr-defined]
        if not self._host_ok():
            return self._send(403, pages.error_page(app.ctx, 403, "this server answers only requests addressed to "
                                                                  "it by its own address (Host header)"))
        app.enter()  # the background index loader waits while a page is being made
        api_path = self.path.startswith("/api/")
        try:
            status, body, ctype = app.handle(self.path)
        except BadRequest as e:
            status, body, ctype = self._error(app, 400, str(e), api_path)
        except (NotFound, LookupError) as e:
            status, body, ctype = self._error(app, 404, str(e.args[0]) if e.args else str(e), api_path)
        except CasmonError as e:
            status, body, ctype = self._error(app, 500, f"{type(e).__name__}: {e}", api_path)
        except Exception as e:  # noqa: BLE001 - one page's failure is reported, the server goes on
            self.log_error("%s on %s: %s", type(e).__name__, self.path[:200], e)
            status, body, ctype = self._error(app, 500, f"{type(e).__name__}: {e}", api_path)
        finally:
            app.leave()
        if isinstance(body, artifactview.Download):
            return self._stream(body)
        self._send(status, body, ctype)

    def _stream(self, d: artifactview.Download) -> None:
        """A download, a piece at a time. Its length, when known, is sent first: a piece found damaged midway
        ends the connection short of it, so the client sees an incomplete file, never a wrong one."""
        self.send_response(200)
        self.send_header("Content-Type", d.ctype)
        self.send_header("Content-Disposition", d.disposition())
        if d.length is not None:
            self.send_header("Content-Length", str(d.length))
        else:
            self.send_header("Connection", "close")  # a zip's length is known only at its end
            self.close_connection = True
        self.send_header("Content-Security-Policy", pages.CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        sent = 0
        try:
            for b in d.chunks:
                if d.length is not None and sent + len(b) > d.length:  # never past the length announced
                    raise DamagedObjectError(self.path[:200], f"more than the {d.length:,} bytes announced")
                if b:
                    self.wfile.write(b)
                    sent += len(b)
            if d.length is not None and sent != d.length:
                raise DamagedObjectError(self.path[:200], f"{sent:,} bytes of the {d.length:,} announced")
        except Exception as e:  # noqa: BLE001 - headers are sent: the only answer left is a short body
            self.log_error("download %s cut short: %s: %s", self.path[:200], type(e).__name__, e)
            self.close_connection = True  # the client sees a short file, and no later answer out of step

    @staticmethod
    def _error(app: App, status: int, message: str, as_json: bool) -> tuple[int, bytes, str]:
        if as_json:
            return status, _json({"error": message}), JSON
        return status, pages.error_page(app.ctx, status, message), HTML

    def _reject(self) -> None:
        app: App = self.server.app  # type: ignore[attr-defined]
        self._send(405, pages.error_page(app.ctx, 405, f"{self.command} is not allowed: this server is read-only"),
                   extra={"Allow": "GET"}, body_allowed=self.command != "HEAD")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = do_TRACE = do_CONNECT = _reject

    def _host_ok(self) -> bool:
        allowed = self.server.allowed_hosts  # type: ignore[attr-defined]
        return allowed is None or (self.headers.get("Host") or "").lower() in allowed

    def _send(self, status: int, body: bytes, ctype: str = "text/html; charset=utf-8", extra: dict[str, str] | None = None,
              body_allowed: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body) if body_allowed else 0))
        self.send_header("Content-Security-Policy", pages.CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cross-Origin-Resource-Policy", "same-origin")
        # Pages and data are read fresh; the static files change only with casmon itself.
        self.send_header("Cache-Control", "private, max-age=600" if ctype_static(self.path, status) else "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body_allowed:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        if self.server.verbose:  # type: ignore[attr-defined]
            sys.stderr.write(f"casmon ui: {self.address_string()} {format % args}\n")

    def log_error(self, format: str, *args: Any) -> None:  # noqa: A002
        sys.stderr.write(f"casmon ui: {format % args}\n")


class UIServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, app: App, host: str = "127.0.0.1", port: int = 0, verbose: bool = False) -> None:
        if ":" in host:
            self.address_family = __import__("socket").AF_INET6
        super().__init__((host, port), Handler)
        self.app = app
        self.verbose = verbose
        self.allowed_hosts = _allowed_hosts(host, self.server_address[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A browser that closes a tab or cancels a fetch mid-answer is no error of the server's: say nothing.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)

    def close(self) -> None:
        """Close the socket and stop the background index loader (call before closing the store)."""
        self.server_close()
        self.app.runs.stop()

    @property
    def url(self) -> str:
        address, port = self.server_address[:2]
        host = address if isinstance(address, str) else bytes(address).decode()
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def ctype_static(path: str, status: int) -> bool:
    """A static file's answer, which a browser may keep for a while."""
    return status == 200 and path.startswith("/static/")


def _allowed_hosts(host: str, port: int) -> set[str] | None:
    """The Host headers a loopback server answers; None (any) when it was asked to listen elsewhere."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        return None
    names = {host, "localhost", "127.0.0.1", "[::1]"}
    return {f"{n}:{port}" for n in names} | ({n for n in names} if port == 80 else set())


def make_server(store: Any, host: str = "127.0.0.1", port: int = 0, trust: bool = False, verbose: bool = False,
                index: bool = True, own_process: bool = False) -> UIServer:
    """A server ready to ``serve_forever()`` (port 0: any free port; ``server.url`` says which). ``own_process``:
    nothing else runs in this process (``casmon ui``), so the first listing may tune the cycle collector."""
    app = App(store, trust)
    app.own_process = own_process
    app.index_in_background = index  # rows made in the background (after the first page, in a quiet second): any sort
    return UIServer(app, host, port, verbose)
