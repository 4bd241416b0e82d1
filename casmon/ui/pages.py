"""The UI's pages as HTML: the layout every page shares, the runs table, calls, one call, store.

A run's page is ``runpage.py``, the compare page and the report file
``comparepage.py``, the cache pages ``cachepage.py``. Every string from a
store goes through :func:`casmon.view.display.esc` (or a display building
block that does); markup
built here is :class:`~casmon.view.display.Html`. Links and form fields are
built with ``urllib.parse.quote``/``urlencode`` and then escaped for the
attribute. The pages use no inline script and no ``style=`` attribute (the
server's Content-Security-Policy forbids both); ``static/`` holds the style
sheets and scripts (uPlot among them, vendored), which the report file inlines
under a policy of hashes. Data for a script travels in a
``<script type="application/json">`` block (``values.json_block``), never as code.

Why not Jinja2: the pages are tables and key-value lists built from the view's
own building blocks (``table``, ``kv_table``, ``patch_html``, which notebooks
use too), and those already escape everything they are given; templates would
hold little but loops over those blocks, and autoescaping would give the
guarantee ``esc`` gives now, for a new core dependency and a second way to
build the same markup. The tests check that no page holds an unescaped store
string, whichever way it is built.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import math
import time
from importlib import resources
from typing import Any
from urllib.parse import quote, urlencode

from casmon.view import display
from casmon.view.display import Html, code, esc, kv_table, seconds, table, when
from casmon.view.text import plural, size
from casmon.ui import charts, model
from casmon.ui.parcoords import parcoords_section
from casmon.ui.table import FIXED_COLUMNS, RunsView, cell_texts
from casmon.ui.values import cell_html, fmt, status_text

#: Every file the server serves from ``static/`` (nothing else is ever read), with its type.
STATIC = {"casmon-ui.css": "text/css; charset=utf-8", "casmon-ui.js": "text/javascript; charset=utf-8",
          "casmon-charts.js": "text/javascript; charset=utf-8", "casmon-parcoords.js": "text/javascript; charset=utf-8",
          "casmon-lineage.js": "text/javascript; charset=utf-8",
          "uPlot.iife.min.js": "text/javascript; charset=utf-8",
          "uPlot.min.css": "text/css; charset=utf-8", "uPlot.LICENSE": "text/plain; charset=utf-8"}
#: The scripts of a page with charts, in order (uPlot first: casmon-charts.js draws with it).
CHART_SCRIPTS = ["uPlot.iife.min.js", "casmon-charts.js"]
#: The vendored files of ``static/`` (every file not named ``casmon-*``), each with its library and licence file:
#: a page that inlines one carries that licence in full (MIT asks for the notice in every copy).
VENDORED = {"uPlot.iife.min.js": ("uPlot 1.6.32, https://github.com/leeoniya/uPlot", "uPlot.LICENSE"),
            "uPlot.min.css": ("uPlot 1.6.32, https://github.com/leeoniya/uPlot", "uPlot.LICENSE")}


def static_file(name: str) -> tuple[bytes, str] | None:
    """A file of ``static/`` (the fixed list); casmon's style sheet leads with display's. Each is read once: a
    page's style sheet and scripts are answered from memory."""
    return _static_file(name) if name in STATIC else None


@functools.lru_cache(maxsize=None)  # only names of the fixed list come here
def _static_file(name: str) -> tuple[bytes, str] | None:
    try:
        data = resources.files(__package__).joinpath("static", name).read_bytes()
    except FileNotFoundError:  # an install that left it out (package data): a 404, not a failure
        return None
    if name == "casmon-ui.css":
        data = display.CSS.encode() + data
    return data, STATIC[name]


def bundled(name: str) -> str:
    """A static file's text, for a page that inlines it (one of the fixed list, so it is there)."""
    got = static_file(name)
    if got is None:
        raise LookupError(f"no static file {name!r}")
    return got[0].decode()


def licence_notices(names: list[str]) -> str:
    """An HTML comment holding the full licence of every vendored library among ``names`` (each once)."""
    seen: dict[str, str] = {}
    for n in names:
        if n in VENDORED:
            library, licence = VENDORED[n]
            seen.setdefault(licence, library)
    if not seen:
        return ""
    # "--" may not appear inside an HTML comment; no licence text needs it, so a space keeps the comment whole.
    parts = [f"{library} is inlined in this file under this licence:\n\n{bundled(lic).strip()}".replace("--", "- -")
             for lic, library in seen.items()]
    return "<!--\n" + "\n\n".join(parts) + "\n-->"


def csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


#: display's views carry their own <style> (for notebooks); the policy allows exactly that one.
DISPLAY_STYLE = csp_hash(display.CSS)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self' " + DISPLAY_STYLE + "; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
#: Statuses with a colour of their own (a class from this list, never from the store).
STATUSES = frozenset({"ok", "failed", "running", "damaged", "killed", "lost", "claimed", "unreadable"})


class Ctx:
    """What every page needs: the store's name, trust, and whether links lead anywhere (not in a report file)."""

    def __init__(self, store_url: str, trust: bool = False, standalone: bool = False) -> None:
        self.store_url = store_url
        self.trust = trust
        self.standalone = standalone

    def link(self, href: str, text: Any, cls: str = "") -> Html:
        c = f' class="{esc(cls)}"' if cls else ""
        if self.standalone:
            return Html(f"<span{c}>{display.cell(text)}</span>")
        return Html(f'<a href="{esc(href)}"{c}>{display.cell(text)}</a>')


def url(path: str, **params: Any) -> str:
    """A URL of this UI; lists become repeated parameters, None is left out."""
    items = []
    for k, v in params.items():
        if v is None or v == "":
            continue
        for x in (v if isinstance(v, (list, tuple)) else [v]):
            items.append((k, str(x)))
    return path + ("?" + urlencode(items) if items else "")


def run_url(tail: str) -> str:
    return "/run/" + quote(tail, safe="")


def badge(status: Any, signal: Any = None) -> Html:
    """A coloured status label (killed, with its signal, and lost too)."""
    s = str(status)
    cls = f" casmon-status-{s}" if s in STATUSES else ""
    return Html(f'<span class="casmon-status{cls}">{esc(status_text(s, signal))}</span>')


ACTIVE, NUM = ' class="active"', ' class="num"'


def layout(ctx: Ctx, title: str, body: Any, active: str = "", charts_: bool = False,
           scripts: list[str] | None = None) -> bytes:
    """A page of the server: its style sheets and scripts from ``/static/`` (``charts_``: uPlot's too; ``scripts``:
    more of the fixed list, after casmon-ui.js)."""
    nav = "".join(
        f'<a href="{href}"{ACTIVE if name == active else ""}>{name}</a>'
        for name, href in (("Runs", "/"), ("Calls", "/calls"), ("Cache", "/cache"), ("Store", "/store")))
    trust = '<span class="badge warn">--trust: pickles are loaded</span>' if ctx.trust else ""
    styles = ["uPlot.min.css", "casmon-ui.css"] if charts_ else ["casmon-ui.css"]
    names = (CHART_SCRIPTS if charts_ else []) + ["casmon-ui.js"] + (scripts or [])
    head = "".join(f'<link rel="stylesheet" href="/static/{n}">' for n in styles) + "".join(
        f'<script src="/static/{n}" defer></script>' for n in names)
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)} · casmon</title><link rel="icon" href="data:,">{head}'
            f'</head><body><header class="top"><span class="brand">casmon</span><nav>{nav}</nav>'
            f'<span class="store">{esc(ctx.store_url)}</span>{trust}</header>'
            f'<main class="casmon-view">{display.cell(body)}</main></body></html>').encode("utf-8")


def standalone_file(ctx: Ctx, title: str, body: Html) -> bytes:
    """A page as one file (``casmon report``): style sheets and scripts inline, allowed by their hashes in the
    file's own policy; nothing is fetched, so it opens offline."""
    styles, script_names = ["uPlot.min.css", "casmon-ui.css"], CHART_SCRIPTS + ["casmon-ui.js"]
    css = "\n".join(bundled(n) for n in styles)
    scripts = [bundled(n) for n in script_names]
    policy = (f"default-src 'none'; style-src {csp_hash(css)} {DISPLAY_STYLE}; "
              f"script-src {' '.join(csp_hash(js) for js in scripts)}; img-src data:; form-action 'none'; base-uri 'none'")
    inline = "".join(f"<script>{js}</script>" for js in scripts)
    # The notices follow the charset, which must lie in a file's first 1024 bytes.
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8">\n{licence_notices(styles + script_names)}\n'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(policy)}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f'<title>{esc(title)}</title><link rel="icon" href="data:,"><style>{css}</style>'
            f'{inline}</head><body class="report"><header class="top"><span class="brand">casmon report</span>'
            f'<span class="store">{esc(ctx.store_url)}</span><span class="muted">written {esc(when(time.time()))}</span>'
            f'</header><main class="casmon-view">{display.cell(body)}</main></body></html>').encode("utf-8")


def error_page(ctx: Ctx, status: int, message: str) -> bytes:
    return layout(ctx, f"{status}", Html(f'<h1>{status}</h1><p class="casmon-error" id="error">{esc(message)}</p>'))


def heading(text: str, level: int = 2, id_: str = "") -> Html:
    i = f' id="{esc(id_)}"' if id_ else ""
    return Html(f"<h{level}{i}>{esc(text)}</h{level}>")


def scroll(markup: Any) -> Html:
    """A wide table in a box of its own that scrolls sideways: the page never does."""
    return Html(f'<div class="scroll">{display.cell(markup)}</div>')


def num_cell(v: Any) -> Html:
    """A value in a numeric column: numbers as they are, anything else summarised (never its full text)."""
    if v is None:
        return Html("")
    if isinstance(v, bool):
        return Html(esc("yes" if v else "no"))
    if isinstance(v, float):
        return Html(esc(fmt(v)))
    if isinstance(v, int):
        return Html(esc(f"{v}"))
    return cell_html(v)


# -- runs ---------------------------------------------------------------------------------------------


_LABELS = {"run": "run", "comment": "comment", "status": "status", "start": "started", "duration": "duration",
           "commit": "commit", "dirty": "dirty"}


def runs_parts(ctx: Ctx, view: RunsView, sort: str, desc: bool, q: str, per: int) -> dict[str, str]:
    """The parts of the runs page a sort, a filter or another page changes, as markup, by the id of the element
    that holds each (``runs``: the table itself): the whole page puts them in place, ``/api/runs/view`` sends
    them for the page's script to swap in (so both show the same)."""
    # Metrics right after the fixed columns: the numbers a reader looks for stay on screen beside many parameters.
    cols = FIXED_COLUMNS + view.metrics + view.params

    def group_of(col: str) -> str:
        return "params" if col in view.params else "metrics" if col in view.metrics else "fixed"

    def head(col: str) -> str:
        label = _LABELS.get(col) or (f"info {col[5:]}" if col.startswith("info.") else col.split(".", 1)[-1])
        new_desc = not desc if col == sort else col in ("start", "duration") or "." in col
        arrow = (" ▼" if desc else " ▲") if col == sort else ""
        href = url("/", sort=col, order="desc" if new_desc else "asc", q=q or None, per=per if per != 50 else None)
        group = group_of(col)
        cls = {"params": ' class="num param"', "metrics": ' class="num metric"', "fixed": ""}[group]
        return (f'<th data-col="{esc(col)}" data-label="{esc(label)}" data-in="{group}"{cls}>'
                f'<a href="{esc(href)}">{esc(label)}{arrow}</a></th>')

    rows = []
    for e, r, row in view.rows:
        text = cell_texts(row)
        cells = [f'<td><input type="checkbox" name="run" value="{esc(e.tail)}" aria-label="select {esc(e.name)}"></td>',
                 f'<td class="name" data-col="run">{ctx.link(run_url(e.tail), e.name)}</td>',
                 f'<td data-col="comment">{esc(text["comment"])}</td>',
                 f'<td data-col="status">{badge(row["status"], r.manifest.get("signal"))}</td>',
                 f'<td class="when" data-col="start" title="{esc(when(row["start"]))}">{esc(text["start"])}</td>',
                 f'<td class="num" data-col="duration">{esc(text["duration"])}</td>',
                 f'<td data-col="commit"><code>{esc(text["commit"])}</code></td>',
                 f'<td data-col="dirty">{esc(text["dirty"])}</td>']
        cells += [f'<td class="num" data-col="{esc(c)}">{num_cell(row.get(c))}</td>' for c in view.metrics]
        cells += [f'<td class="num param" data-col="{esc(c)}">{num_cell(row.get(c))}</td>' for c in view.params]
        rows.append(f'<tr data-run="{esc(e.tail)}" data-status="{esc(row["status"])}">' + "".join(cells) + "</tr>")
    # The first group spans the box column and the fixed ones; the script recomputes every span as columns hide.
    groups = f'<th data-group="fixed" colspan="{1 + len(FIXED_COLUMNS)}"></th>'
    if view.metrics:
        groups += f'<th data-group="metrics" colspan="{len(view.metrics)}" class="metric">metrics (last value)</th>'
    if view.params:
        groups += f'<th data-group="params" colspan="{len(view.params)}" class="param">parameters and info</th>'
    error = (f'<p class="casmon-error filter-error" id="filter-error" role="alert">{esc(view.error)}; '
             f'showing every run.</p>') if view.error else ""
    if view.sort_note:
        error += f'<p class="notice" id="sort-note">{esc(view.sort_note)}.</p>'
    shown = f"{view.total:,} of {view.all_runs:,} runs" if q and not view.error else plural(view.all_runs, "run")
    cut = f'<p class="muted">{view.cut:,} more columns are left out of this page.</p>' if view.cut else ""
    # Where the script puts a run that starts while the page is open: on top of the newest-first table's first
    # page (its last row then leaves: a page keeps its size), at the end of the oldest-first table's last while it
    # has room; elsewhere (sorted by another column, filtered, a full last page) the notice says how many there are.
    insert = ""
    if sort == "start" and not q:
        insert = "top" if desc and view.page == 1 else "bottom" if not desc and view.page == view.pages else ""
    show = url("/", sort=sort if sort != "start" else None, order=None if desc else "asc", q=q or None,
               per=per if per != 50 else None)
    notice = (f'<p class="notice" id="new-runs" hidden><span></span> since this page was made · '
              f'<a href="{esc(show)}">show them</a></p>')
    table_ = (f'<table class="runs" id="runs" data-serial="{view.serial}" data-insert="{insert}" data-per="{per}"'
              f' data-cut="{view.cut}"'
              f' data-total="{view.total}" data-all="{view.all_runs}"><thead>'
              f'<tr class="col-groups">{groups}</tr><tr><th data-in="fixed"></th>{"".join(head(c) for c in cols)}</tr>'
              f'</thead><tbody>{"".join(rows)}</tbody></table>')
    return {"runs-count": esc(shown), "runs-error": error, "runs-notice": notice, "runs": table_,
            "runs-after": f"{cut}{_pager(view, sort, desc, q, per)}{parcoords_section(view.rows)}"}


def runs_page(ctx: Ctx, view: RunsView, sort: str, desc: bool, q: str, per: int) -> bytes:
    """The runs page: :func:`runs_parts` in their places, the filter box and the compare form around them."""
    part = runs_parts(ctx, view, sort, desc, q, per)
    filt = (f'<form class="filter" id="runs-filter" method="get" action="/">'
            f'<input type="hidden" name="sort" value="{esc(sort)}">'
            f'<input type="hidden" name="order" value="{"desc" if desc else "asc"}">'
            + (f'<input type="hidden" name="per" value="{per}">' if per != 50 else "") +
            f'<input type="search" name="q" value="{esc(q)}" placeholder="filter: words, or loss&lt;0.3 status=ok" '
            f'size="40" aria-label="filter"><button type="submit">Filter</button></form>')
    body = Html(
        f'<h1>Runs <span class="muted" id="runs-count" data-n="{view.all_runs}">{part["runs-count"]}</span></h1>{filt}'
        f'<div id="runs-error">{part["runs-error"]}</div><div id="runs-notice">{part["runs-notice"]}</div>'
        f'<details class="columns-box" id="column-chooser" hidden><summary>columns</summary>'
        f'<div class="columns"></div></details>'
        f'<form id="compare-form" method="get" action="/compare">'
        f'<p><button type="submit" id="compare-button">Compare selected runs</button> '
        f'<span class="muted">select two or more (or one, to see it with its charts)</span></p>'
        f'<div class="scroll">{part["runs"]}</div></form>'
        f'<div id="runs-after">{part["runs-after"]}</div>')
    return layout(ctx, "Runs", body, "Runs", scripts=["casmon-parcoords.js"])


def _pager(view: RunsView, sort: str, desc: bool, q: str, per: int) -> str:
    if view.pages <= 1:
        return ""

    def go(p: int, text: str) -> str:
        href = url("/", sort=sort, order="desc" if desc else "asc", q=q or None, page=p, per=per if per != 50 else None)
        return f'<a href="{esc(href)}">{esc(text)}</a>'

    parts = []
    if view.page > 1:
        parts += [go(1, "« first"), go(view.page - 1, "‹ previous")]
    parts.append(f'<span class="current">page {view.page:,} of {view.pages:,}</span>')
    if view.page < view.pages:
        parts += [go(view.page + 1, "next ›"), go(view.pages, "last »")]
    return '<nav class="pager">' + " ".join(parts) + "</nav>"


# -- calls ---------------------------------------------------------------------------------------------


def calls_page(ctx: Ctx, log: Any, summary: model.CallsSummary, calls: list[Any], bins: list[tuple[float, float, int]],
               filters: dict[str, Any], page: int,
               per: int, read_at: float) -> bytes:
    fn_rows = [(ctx.link(url("/calls", fn=name), code(name)), f"{n:,}", f"{ns:,}", seconds(total),
                seconds(total / n) if n else "-") for name, n, ns, total in summary.functions]
    total_calls = sum(n for _, n, _, _ in summary.functions)
    out: list[Any] = [Html(f"<h1>Calls <span class=\"muted\">{esc(plural(total_calls, 'call'))} of "
                           f"{esc(plural(len(summary.functions), 'function'))} in "
                           f"{esc(plural(len(summary.sessions), 'session'))}</span></h1>"),
                      Html(f'<p class="muted">read {esc(when(read_at))} · '
                           f'{ctx.link(url("/calls", reload=1, **filters), "read again")}</p>'),
                      heading("Functions", 2), table(["function", "calls", "sessions", "total time", "mean"], fn_rows, num=[1, 2, 3, 4])]
    sel = []
    for key, label, options in (("fn", "function", [f[0] for f in summary.functions]),
                                ("session", "session", summary.sessions), ("process", "process", summary.processes),
                                ("rank", "rank", summary.ranks)):
        cur = filters.get(key)
        opts = '<option value="">any</option>' + "".join(
            f'<option value="{esc(o)}"{" selected" if str(o) == str(cur) else ""}>{esc(o)}</option>' for o in options[:2000])
        sel.append(f'<label>{esc(label)} <select name="{key}">{opts}</select></label>')
    sel.append(f'<label>thread <input type="text" name="thread" value="{esc(filters.get("thread") or "")}" size="12"></label>')
    out.append(Html(f'<form class="filter" id="calls-filter" method="get" action="/calls">{" ".join(sel)} '
                    f'<button type="submit">Filter</button></form>'))
    what = " · ".join(f"{k} {v}" for k, v in filters.items() if v not in (None, "")) or "all calls"
    out.append(heading(f"Durations ({what}: {len(calls):,} calls)", 2, "durations"))
    out.append(Html(f'<figure class="histogram">{charts.histogram(bins, "calls by duration (log scale)", _dur_label)}'
                    "</figure>") if bins else Html('<p class="muted">no calls</p>'))
    pages = max(1, math.ceil(len(calls) / per))
    page = min(max(page, 1), pages)
    shown = calls[(page - 1) * per: page * per]
    rows = []
    for c in shown:
        status = Html(f'<span class="casmon-error">raised {esc(c.exception[0])}</span>') if c.exception else "ok"
        rows.append((ctx.link(call_href(c), code(f"{c.name.rsplit('.', 1)[-1]} #{c.n}")), c.session, c.pid,
                     c.thread_name, "" if c.rank is None else c.rank, when(c.start), seconds(c.duration), status))
    out += [heading("Calls", 2, "list"), table(["call", "session", "process", "thread", "rank", "started", "duration", "status"],
                                          rows, num=[1, 2, 6])]
    if pages > 1:
        nav = []
        if page > 1:
            nav.append(f'<a href="{esc(url("/calls", page=page - 1, **filters))}">‹ previous</a>')
        nav.append(f'<span class="current">page {page:,} of {pages:,}</span>')
        if page < pages:
            nav.append(f'<a href="{esc(url("/calls", page=page + 1, **filters))}">next ›</a>')
        out.append(Html('<nav class="pager">' + " ".join(nav) + "</nav>"))
    return layout(ctx, "Calls", Html("".join(display.cell(x) for x in out)), "Calls")


def call_href(c: Any) -> str:
    return url("/call", fn=c.name, session=c.session, n=c.n)


def _dur_label(lo: float, hi: float) -> str:
    return seconds(lo) if lo == hi else f"{seconds(lo)} – {seconds(hi)}"


def call_page(ctx: Ctx, log: Any, c: Any) -> bytes:
    pairs = [("function", code(c.name)), ("signature", code(display.attempt(lambda: log.signature(c.name), c.name)[0])),
             ("call", f"#{c.n} in session {c.session}"), ("process", c.pid), ("thread", c.thread_name),
             ("rank", "-" if c.rank is None else c.rank), ("started", when(c.start)), ("took", seconds(c.duration)),
             ("status", Html(f'<span class="casmon-error">raised {esc(c.exception[0])}: {esc(c.exception[1])}</span>')
              if c.exception else "ok")]
    heads = ["name", "kind", "shape", "dtype", "size", "digest", "value" if ctx.trust else "described"]

    def row(name: str, cell: Any) -> tuple[Any, ...]:
        d = model.cell_details(log, cell, ctx.trust)
        return (code(name), d["kind"], d["shape"], d["dtype"], size(d["size"]) if d["size"] is not None else "",
                code(d["digest"]), code(d["text"]))

    inputs = [row(n, cell) for n, cell in model.call_inputs(log, c)]
    out: list[Any] = [Html(f"<h1>Call <code>{esc(c.name)}</code> #{c.n}</h1>"), kv_table(pairs),
                      heading("Inputs", 2, "inputs"), table(heads, inputs)]
    if c.exception is None:
        out += [heading("Result", 2, "result"), table(heads, [row("result", c.result_cell)])]
    if not ctx.trust:
        out.append(Html('<p class="muted">Values are described from their manifests; nothing was unpickled '
                        "(<code>casmon ui --trust</code> loads them).</p>"))
    return layout(ctx, f"{c.name} #{c.n}", Html("".join(display.cell(x) for x in out)), "Calls")


# -- store ---------------------------------------------------------------------------------------------


def store_page(ctx: Ctx, st: dict[str, Any]) -> bytes:
    g = st.get
    pairs = [("location", code(g("store"))),
             ("values", f"{g('values', 0):,} in {g('chunks', 0):,} chunks ({g('packs', 0):,} packs, "
                        f"{g('loose_objects', 0):,} loose objects)"),
             ("logical size", size(g("logical_bytes"))),
             ("after dedup", f"{size(g('chunk_bytes'))} (dedup ratio {display.ratio(g('dedup_ratio'))}, "
                             f"the chunks' compression ratio {display.ratio(g('compression_ratio'))})"),
             ("objects on disk", size(g("object_bytes"))),
             ("store on disk", display.on_disk(st)),
             ("refs", f"{g('refs', 0):,}"),
             ("damaged files", f"{g('damaged_files', 0):,}" + (" (casmon verify names them)" if g("damaged_files") else ""))]
    area = g("bytes_by_area") or {}
    files = g("files_by_area") or {}
    total = sum(area.values()) or 1
    arows = [(code(k), f"{files.get(k, 0):,}", size(v), f"{100 * v / total:.1f} %") for k, v in area.items()]
    recs = [(code(k), f"{v:,}") for k, v in (g("records") or {}).items()]
    bars = charts.bars(list(area), [float(v) / 2**20 for v in area.values()], "size by area (MiB)") if area else ""
    out = [Html("<h1>Store</h1>"), kv_table(pairs), heading("Size by area", 2, "areas"),
           table(["area", "files", "size", "share"], arows, num=[1, 2, 3]), Html(f"<figure>{bars}</figure>"),
           heading("Records", 2, "records"), table(["kind", "records"], recs, num=[1])]
    return layout(ctx, "Store", Html("".join(display.cell(x) for x in out)), "Store")
