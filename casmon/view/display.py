"""Objects that show themselves: text and HTML views of casmon's results, and tables for pandas.

A leaf module like ``errors.py``: it imports only the standard library (pandas
inside ``to_pandas()``, which is optional), so every layer's objects may use it
for their ``repr``, ``_repr_html_`` (Jupyter) and ``to_pandas()``. Objects are
read by duck typing, never imported.

Rules every view follows, because what it shows comes from a store that anyone
with write access may have crafted (see docs/SECURITY.md):

* every string from a store goes through :func:`esc` (``html.escape``); markup
  built here is marked :class:`Html` so that nothing else is ever inserted raw;
* nothing is unpickled: stored values are shown by their description;
* a view never raises: a part that cannot be read shows why, the rest shows;
* no external resources (no CDN, no scripts): a small inline style sheet,
  scoped to ``.casmon-view``.

Times are local dates, sizes KiB/MiB/GiB (``text.size``), ratios rounded.
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Callable, Iterable
from typing import Any

from casmon.view.guards import guarded_html, guarded_text  # noqa: F401 - the views use them as display.*
from casmon.view.text import cut, plural, short_error, size
from casmon.view.text import short_repr as short  # display.short: the name views have always used

__all__ = [
    "Html", "esc", "when", "size", "ratio", "seconds", "short", "table", "text_table", "frame", "patch_html",
    "RunList", "RunDiff", "StoreStats", "on_disk", "Sessions", "CacheEntries", "session_where",
]

#: Scoped to the view's own element; nothing outside it changes (a notebook keeps its style).
CSS = """
.casmon-view{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;font-size:13px;line-height:1.4;margin:4px 0}
.casmon-view .casmon-title{font-weight:600;margin:2px 0 6px}
.casmon-view table{border-collapse:collapse;margin:2px 0 8px}
.casmon-view th,.casmon-view td{border:1px solid #d0d7de;padding:2px 8px;text-align:left;vertical-align:top}
.casmon-view th{background:#f6f8fa;font-weight:600}
.casmon-view td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.casmon-view code,.casmon-view pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
.casmon-view pre.casmon-patch{background:#f6f8fa;border:1px solid #d0d7de;padding:6px;overflow:auto;max-height:32em}
.casmon-view .casmon-add{color:#116329;background:#dafbe1;display:block}
.casmon-view .casmon-del{color:#82071e;background:#ffebe9;display:block}
.casmon-view .casmon-hunk{color:#0550ae;display:block}
.casmon-view .casmon-meta{color:#57606a;font-weight:600;display:block}
.casmon-view .casmon-status{border-radius:8px;padding:0 6px;font-size:12px;color:#fff;background:#6e7781}
.casmon-view .casmon-status-ok{background:#1a7f37}
.casmon-view .casmon-status-failed,.casmon-view .casmon-status-damaged{background:#cf222e}
.casmon-view .casmon-status-running{background:#9a6700}
.casmon-view .casmon-error{color:#cf222e}
.casmon-view .casmon-muted{color:#57606a}
"""

_STATUS_CLASSES = frozenset({"ok", "failed", "running", "damaged"})
_MAX_ROWS = 200  # rows a view shows before "… and N more"
_MAX_PATCH_LINES = 2000


class Html(str):
    """Markup built here from escaped parts: inserted as it is (anything else is escaped)."""


def esc(x: Any) -> str:
    """``x`` as text that HTML shows as text (quotes escaped too: safe in attributes)."""
    import html  # imported here: the cache decorator loads this module, and html.entities is slow to load

    return html.escape(x if isinstance(x, str) else short(x, 10_000), quote=True)


def cell(x: Any) -> str:
    """A table cell's markup: :class:`Html` as it is, anything else escaped."""
    return str(x) if isinstance(x, Html) else esc(x)


def code(x: Any) -> Html:
    return Html(f"<code>{esc(x)}</code>")


def when(t: Any) -> str:
    """An epoch timestamp as a local date and time (``-`` for none, ``?`` for nonsense)."""
    if t is None:
        return "-"
    try:
        if type(t) is bool or not math.isfinite(float(t)):
            return "?"
        return _dt.datetime.fromtimestamp(float(t)).astimezone().strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def local_datetime(t: Any) -> _dt.datetime | None:
    """An epoch timestamp as a naive local ``datetime`` (for pandas), or None."""
    try:
        if t is None or type(t) is bool or not math.isfinite(float(t)):
            return None
        return _dt.datetime.fromtimestamp(float(t))
    except (TypeError, ValueError, OverflowError, OSError):
        return None


def ratio(x: Any) -> str:
    """A ratio rounded to two decimals (``11.17×``)."""
    try:
        return f"{float(x):.2f}×" if type(x) is not bool and math.isfinite(float(x)) else "?"
    except (TypeError, ValueError):
        return "?"


def seconds(s: Any) -> str:
    """A duration: ``0.42 ms``, ``1.20 s``, ``3 min 4 s``, ``2 h 5 min``."""
    if s is None:
        return "-"
    try:
        if type(s) is bool:
            return "?"
        s = float(s)
        if not math.isfinite(s) or s < 0:
            return "?"
    except (TypeError, ValueError):
        return "?"
    if s < 1e-3:
        return f"{s * 1e6:.0f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    if s < 60:
        return f"{s:.2f} s"
    if s < 3600:
        return f"{int(s // 60)} min {int(s % 60)} s"
    return f"{int(s // 3600)} h {int(s % 3600 // 60)} min"


def hexshort(h: Any, n: int = 12) -> str:
    return h[:n] if isinstance(h, str) else short(h, n + 2)


# -- building blocks -----------------------------------------------------------------------------------


def table(headers: Iterable[str], rows: Iterable[Iterable[Any]], num: Iterable[int] = (), more: int = 0) -> Html:
    """An HTML table; cells are escaped unless :class:`Html`. ``num``: columns aligned right; ``more``: rows left out."""
    num = set(num)
    out = ["<table><tr>", "".join(f"<th>{esc(h)}</th>" for h in headers), "</tr>"]
    rows = list(rows)
    for row in rows[:_MAX_ROWS]:
        out.append("<tr>" + "".join(f"<td class=\"num\">{cell(c)}</td>" if i in num else f"<td>{cell(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    out.append("</table>")
    more += max(0, len(rows) - _MAX_ROWS)
    if more:
        out.append(f"<p class=\"casmon-muted\">… and {more:,} more</p>")
    return Html("".join(out))


def kv_table(pairs: Iterable[tuple[str, Any]]) -> Html:
    """A two-column table: what, value."""
    return Html("<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{cell(v)}</td></tr>" for k, v in pairs) + "</table>")


def text_table(headers: list[str], rows: Iterable[Iterable[Any]], width: int = 40, indent: str = "  ") -> str:
    """A plain-text table with aligned columns (cells cut to ``width`` characters)."""
    cells = [[cut(str(c), width, flatten=True) for c in row] for row in list(rows)[:_MAX_ROWS]]
    widths = [max([len(h)] + [len(r[i]) for r in cells if i < len(r)]) for i, h in enumerate(headers)]
    lines = [indent + "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    for r in cells:
        lines.append(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def status_badge(status: Any) -> Html:
    """A coloured status label; the class comes from a fixed list, never from the store."""
    s = str(status)
    cls = f" casmon-status-{s}" if s in _STATUS_CLASSES else ""
    return Html(f"<span class=\"casmon-status{cls}\">{esc(s)}</span>")


def frame(title: Any, *parts: Any) -> Html:
    """A whole view: the style sheet, a title (escaped unless Html) and the parts."""
    return Html(f"<div class=\"casmon-view\"><style>{CSS}</style><div class=\"casmon-title\">{cell(title)}</div>"
                + "".join(cell(p) for p in parts) + "</div>")


def heading(text: str) -> Html:
    return Html(f"<div class=\"casmon-title\">{esc(text)}</div>")


def error_line(text: str) -> Html:
    return Html(f"<p class=\"casmon-error\">{esc(text)}</p>")


def patch_html(text: str, max_lines: int = _MAX_PATCH_LINES) -> Html:
    """A patch (unified diff) with added lines green, removed lines red, hunks blue."""
    lines = text.splitlines()
    out = []
    for line in lines[:max_lines]:
        if line.startswith(("+++", "---", "diff ", "index ", "new file", "deleted file", "similarity", "rename ", "Binary")):
            cls = "casmon-meta"
        elif line.startswith("+"):
            cls = "casmon-add"
        elif line.startswith("-"):
            cls = "casmon-del"
        elif line.startswith("@@"):
            cls = "casmon-hunk"
        else:
            out.append(esc(line) + "\n")
            continue
        out.append(f"<span class=\"{cls}\">{esc(line)}</span>")
    if len(lines) > max_lines:
        out.append(f"<span class=\"casmon-meta\">… {len(lines) - max_lines:,} more lines</span>")
    return Html("<pre class=\"casmon-patch\">" + "".join(out) + "</pre>")


def attempt(fn: Callable[..., Any], default: Any = None) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(default, why)`` if it raised: one damaged part does not hide the rest."""
    try:
        return fn(), None
    except Exception as e:  # noqa: BLE001
        return default, short_error(e, 300, typed=True)


def pandas():
    """pandas, or an ImportError that says how to get it (pandas is optional)."""
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("to_pandas() needs pandas, which casmon does not install: pip install pandas") from None
    return pd


# -- runs ----------------------------------------------------------------------------------------------


def _git(r: Any) -> dict:
    g = r.manifest.get("git") if isinstance(getattr(r, "manifest", None), dict) else None
    return g if isinstance(g, dict) else {}


def code_state(r: Any) -> str:
    """``commit 1a2b3c4d on main, uncommitted changes`` (or why there is none)."""
    g = _git(r)
    if not g:
        return "-"
    if g.get("in_git") is False or (not g.get("commit") and not g.get("root")):
        return "not in a git repository"
    commit = g.get("commit")
    parts = [f"commit {hexshort(commit, 10)}" if commit else "no commit yet"]
    if g.get("branch"):
        parts[0] += f" on {g['branch']}"
    elif commit:
        parts[0] += " (detached)"
    parts.append("uncommitted changes" if g.get("dirty") or g.get("patch") else "clean")
    return ", ".join(parts)


def run_info_cells(r: Any) -> tuple[dict, str | None]:
    """A run's info for display: JSON values as they are, stored values described (nothing loaded)."""
    fn = getattr(r, "info_cells", None)
    if fn is not None:
        return attempt(fn, {})
    info = getattr(r, "info", None)  # a live Run: its info is the user's own dict, in memory
    return (dict(info) if isinstance(info, dict) else {}), None


def _duration(m: dict) -> Any:
    d = m.get("duration")
    if d is None and isinstance(m.get("start"), (int, float)) and isinstance(m.get("end"), (int, float)):
        d = m["end"] - m["start"]
    return d


def run_status(r: Any) -> str:
    """A run's status as every view shows it: a read-back run's own (``lost`` is read from its heartbeats, never
    written), else what its manifest says."""
    st = getattr(r, "status", None)
    m = r.manifest if isinstance(r.manifest, dict) else {}
    return st if isinstance(st, str) else str(m.get("status", "?"))


def run_text(r: Any, live: bool = False) -> str:
    """One line: ``<casmon run 2-lr02 ok, 2026-… , 3.20 s, commit … , 2 files, info lr=0.02>``."""
    m = r.manifest if isinstance(r.manifest, dict) else {}
    parts = [f"casmon run {r.name} {run_status(r)}"]
    if m.get("start") is not None:
        parts.append(f"started {when(m.get('start'))}")
    if _duration(m) is not None:
        parts.append(seconds(_duration(m)))
    if _git(r):
        parts.append(code_state(r))
    if m.get("files"):
        parts.append(plural(len(m["files"]), "file"))
    if m.get("error"):
        parts.append(cut(str(m["error"]), 80, flatten=True))
    info, _ = run_info_cells(r)
    if info:
        shown = ", ".join(f"{k}={short(v, 30)}" for k, v in list(info.items())[:5])
        parts.append("info " + shown + (", …" if len(info) > 5 else ""))
    return "<" + ", ".join(parts) + ">"


def run_html(r: Any) -> Html:
    m = r.manifest if isinstance(r.manifest, dict) else {}
    title = Html(f"casmon run <code>{esc(r.name)}</code> {status_badge(run_status(r))}")
    pairs: list[tuple[str, Any]] = []
    if m.get("comment"):
        pairs.append(("comment", m["comment"]))
    pairs += [("started", when(m.get("start"))), ("ended", when(m.get("end"))), ("duration", seconds(_duration(m)))]
    g = _git(r)
    if g:
        pairs.append(("code", code_state(r)))
        if g.get("root"):
            pairs.append(("repository", code(g["root"])))
        if g.get("untracked"):
            pairs.append(("untracked files in the patch", ", ".join(map(str, g["untracked"][:20]))))
        for note in (g.get("notes") or [])[:5]:
            pairs.append(("note", note))
    if m.get("function"):
        pairs.append(("function", code(m["function"])))
    for k in ("host", "user", "python"):
        if m.get(k):
            pairs.append((k, m[k]))
    if m.get("notebook"):  # a kernel's command line names only its temporary connection file
        pairs.append(("notebook", code(str(m["notebook"]))))
    elif m.get("argv"):
        pairs.append(("command", code(" ".join(map(str, m["argv"])))))
    if m.get("error"):
        pairs.append(("error", Html(f"<span class=\"casmon-error\">{esc(m['error'])}</span>")))
    parts: list[Any] = [kv_table(pairs)]
    if isinstance(m.get("traceback"), str) and m["traceback"]:
        parts.append(Html(f"<details><summary>traceback</summary><pre>{esc(m['traceback'][-20_000:])}</pre></details>"))
    err = getattr(r, "error", None)
    if err is not None:
        parts.append(error_line(f"this run cannot be read: {err}"))
    info, why = run_info_cells(r)
    if info:
        parts += [heading("info"), table(["key", "value"], [(k, code(show(v))) for k, v in info.items()])]
    if why:
        parts.append(error_line(f"info: {why}"))
    files = m.get("files")
    if isinstance(files, dict) and files:
        rows = []
        for path, f in sorted(files.items()):
            f = f if isinstance(f, dict) else {}
            rows.append((code(path), size(f.get("size")), code(hexshort(f.get("digest")))))
        parts += [heading(f"tracked files ({len(files)})"), table(["path", "size", "digest"], rows, num=[1])]
    return frame(title, *parts)


_RUN_COLUMNS = ["status", "start", "end", "duration_s", "commit", "branch", "dirty", "comment", "function", "host",
                "user", "python", "files"]


def run_row(r: Any) -> tuple[dict, dict]:
    """A run's table row: its fixed columns, and its info (JSON values as they are, stored values described)."""
    m = r.manifest if isinstance(r.manifest, dict) else {}
    g = _git(r)
    row = {
        "status": run_status(r), "start": local_datetime(m.get("start")), "end": local_datetime(m.get("end")),
        "duration_s": _duration(m), "commit": g.get("commit"), "branch": g.get("branch"),
        "dirty": bool(g.get("dirty") or g.get("patch")) if g else None, "comment": m.get("comment"),
        "function": m.get("function"), "host": m.get("host"), "user": m.get("user"), "python": m.get("python"),
        "files": len(m["files"]) if isinstance(m.get("files"), dict) else 0,
    }
    info, _ = run_info_cells(r)
    return row, {k: (v if _plain(v) else str(v)) for k, v in info.items()}


def _plain(v: Any) -> bool:
    return v is None or type(v) in (str, int, float, bool, list, dict)


class RunList(list):
    """A list of runs (``casmon.list_runs``) that shows itself as a table; ``to_pandas()`` gives a DataFrame."""

    __module__ = "casmon.display"  # the name pickles and keys have always given it (casmon/keys/names.py)

    @guarded_text("runs")
    def __repr__(self) -> str:
        if not self:
            return "<casmon: no runs>"
        rows = []
        for r in self[-_MAX_ROWS:]:  # the newest: a long list is not read whole to be shown
            m = r.manifest if isinstance(r.manifest, dict) else {}
            info, _ = run_info_cells(r)
            rows.append((r.name, run_status(r), when(m.get("start")), seconds(_duration(m)), code_state(r),
                         ", ".join(f"{k}={show(v, 20)}" for k, v in list(info.items())[:4])))
        skipped = f"\n  ({len(self) - len(rows):,} older runs not shown)" if len(self) > len(rows) else ""
        return (f"{plural(len(self), 'run')}:\n" + text_table(["run", "status", "started", "duration", "code", "info"], rows)
                + skipped)

    @guarded_html("runs")
    def _repr_html_(self) -> str:
        keys: list[str] = []
        rows = []
        for r in self[-_MAX_ROWS:]:
            row, info = run_row(r)
            for k in info:
                if k not in keys and len(keys) < 12:
                    keys.append(k)
            rows.append((r, row, info))
        out = []
        for r, row, info in rows:
            out.append([code(r.name), status_badge(row["status"] or "?"), when(r.manifest.get("start")),
                        seconds(row["duration_s"]), code_state(r), row["comment"] or ""]
                       + [code(show(info[k], 60)) if k in info else "" for k in keys])
        title = f"casmon: {plural(len(self), 'run')}" + (f" (the newest {len(out):,} shown)" if len(self) > len(out) else "")
        return frame(title, table(["run", "status", "started", "duration", "code", "comment"] + keys, out, num=[3]))

    def to_pandas(self):
        """One row per run (index: the run's name): status, times, code state, then one column per info key,
        ``params.NAME`` per parameter (nested ones flattened, ``params.cfg.lr``) and ``metrics.NAME`` per metric
        (its last value), as MLflow's ``search_runs`` names them."""
        pd = pandas()
        records, names = [], []
        for r in self:
            row, info = run_row(r)
            for k, v in info.items():
                row[k if k not in row else f"info.{k}"] = v
            if getattr(r, "error", None) is None and hasattr(r, "flat_params"):
                for k, v in r.flat_params().items():
                    row[f"params.{k}"] = v
                for k, cell in r.metric_summary().items():
                    row[f"metrics.{k}"] = cell.get("last")
            records.append(row)
            names.append(r.name)
        df = pd.DataFrame.from_records(records, index=pd.Index(names, name="run"), columns=_columns(records, _RUN_COLUMNS))
        return df


def _columns(records: list[dict], first: list[str]) -> list[str]:
    cols = list(first)
    for rec in records:
        for k in rec:
            if k not in cols:
                cols.append(k)
    return cols


# -- diff ------------------------------------------------------------------------------------------------


class RunDiff(dict):
    """What ``casmon.diff(a, b)`` found: the same dict as always, and views of it."""

    __module__ = "casmon.display"  # the name pickles and keys have always given it (casmon/keys/names.py)

    def __init__(self, data: dict, a: Any = None, b: Any = None) -> None:
        super().__init__(data)
        self.run_a = a
        self.run_b = b

    def __reduce__(self):
        return (RunDiff, (dict(self),))

    def _start(self, r: Any) -> str:
        m = getattr(r, "manifest", None)
        return when(m.get("start")) if isinstance(m, dict) else "-"

    @guarded_text("diff")
    def __repr__(self) -> str:
        a, b = self.get("a"), self.get("b")
        lines = [f"casmon diff {a} ({self._start(self.run_a)}) -> {b} ({self._start(self.run_b)})"]
        if self.get("same_manifest"):
            lines.append("  the two runs recorded the same thing")
        c = self.get("commit") or {}
        lines.append(f"  commit: {'same' if c.get('same') else 'changed'} {_pair(c.get('a'), c.get('b'), c.get('same'))}")
        p = self.get("patch") or {}
        if p.get("same"):
            lines.append("  uncommitted changes: same")
        else:
            d = str(p.get("diff", ""))
            lines.append(f"  uncommitted changes: differ (+{_count_lines(d, '+')} -{_count_lines(d, '-')} lines)")
        for k, rows in (self.get("files") or {}).items():
            if rows:
                lines.append(f"  files {k}: {', '.join(map(str, rows[:10]))}" + (" …" if len(rows) > 10 else ""))
        for group in ("params", "metrics"):
            cells = self.get(group) or {}
            if cells:
                lines.append(f"  {group}{' (last value)' if group == 'metrics' else ''}:")
                lines.append(text_table(["key", str(a), str(b)],
                                        [(k, *_side_by_side(v.get("a"), v.get("b"))) for k, v in cells.items()],
                                        indent="    "))
        info = self.get("info") or {}
        if info:
            lines.append("  info:")
            lines.append(text_table(["key", str(a), str(b)],
                                    [(k, *_side_by_side(v.get("a"), v.get("b"))) for k, v in info.items()], indent="    "))
        for k, v in (self.get("meta") or {}).items():
            if k == "packages":
                lines.append(f"  packages: {len(v)} differ")
            else:
                lines.append(f"  {k}: {short(v.get('a'), 50)} -> {short(v.get('b'), 50)}")
        for res in self.get("results") or []:
            lines.append(f"  results differ: {res.get('function')} ({res.get('calls')} calls, via {res.get('via')})")
        return "\n".join(lines)

    @guarded_html("diff")
    def _repr_html_(self) -> str:
        a, b = str(self.get("a")), str(self.get("b"))
        title = Html(f"casmon diff <code>{esc(a)}</code> → <code>{esc(b)}</code>")
        parts: list[Any] = []
        if self.get("same_manifest"):
            parts.append(Html("<p>The two runs recorded the same thing.</p>"))
        c = self.get("commit") or {}
        pairs = [("started", Html(f"{esc(self._start(self.run_a))} → {esc(self._start(self.run_b))}")),
                 ("commit", "same " + hexshort(c.get("a"), 10) if c.get("same")
                  else f"{hexshort(c.get('a'), 10)} → {hexshort(c.get('b'), 10)}")]
        p = self.get("patch") or {}
        pairs.append(("uncommitted changes", "same" if p.get("same") else "differ (below)"))
        for k, rows in (self.get("files") or {}).items():
            if rows:
                pairs.append((f"files {k}", Html(", ".join(str(code(x)) for x in rows[:50]))))
        parts.append(kv_table(pairs))
        for group, what in (("params", "parameters that differ"), ("metrics", "metrics that differ (last value)")):
            cells = self.get(group) or {}
            if cells:
                parts += [heading(f"{what} ({len(cells)})"),
                          table(["name", a, b], [(k, *map(code, _side_by_side(v.get("a"), v.get("b"))))
                                                 for k, v in cells.items()])]
        info = self.get("info") or {}
        if info:
            parts += [heading(f"info that differs ({len(info)})"),
                      table(["key", a, b], [(k, *map(code, _side_by_side(v.get("a"), v.get("b")))) for k, v in info.items()])]
        meta = self.get("meta") or {}
        rows = []
        for k, v in meta.items():
            if k == "packages" and isinstance(v, dict):
                rows += [(f"package {pkg}", code(ab.get("a")), code(ab.get("b"))) for pkg, ab in list(v.items())[:50]]
            elif isinstance(v, dict):
                rows.append((k, code(short(v.get("a"), 200)), code(short(v.get("b"), 200))))
        if rows:
            parts += [heading("environment that differs"), table(["what", a, b], rows)]
        results = self.get("results") or []
        if results:
            parts += [heading("same inputs, different results"),
                      table(["function", "calls", "via"], [(code(x.get("function")), x.get("calls"), x.get("via"))
                                                           for x in results], num=[1])]
        if not p.get("same"):
            parts += self._patches(a, b, str(p.get("diff") or ""))
        return frame(title, *parts)

    def _patches(self, a: str, b: str, diff: str) -> list:
        """One run without uncommitted changes: the other's patch as it is; both with: how the patches differ."""
        pa, why_a = attempt(lambda: self.run_a.patch(), b"")
        pb, why_b = attempt(lambda: self.run_b.patch(), b"")
        out: list[Any] = [error_line(f"the patch of {n}: {w}") for n, w in ((a, why_a), (b, why_b)) if w]
        if self.run_a is not None and self.run_b is not None and not why_a and not why_b and (not pa) != (not pb):
            name, patch = (b, pb) if pb else (a, pa)
            out += [heading(f"uncommitted changes: only {name} has them"), patch_html(patch.decode("utf-8", "replace"))]
        elif diff:
            out += [heading(f"uncommitted changes: {a}.patch → {b}.patch"), patch_html(diff)]
        return out


def show(v: Any, limit: int = 200) -> str:
    """A value in a table cell: strings as they are, anything else by its (cut) repr."""
    return cut(v, limit, flatten=True) if isinstance(v, str) else short(v, limit)


def _side_by_side(a: Any, b: Any) -> tuple[str, str]:
    """Two different values as text; equal texts (two arrays of one shape) get their digests, to tell them apart."""
    ta, tb = show(a), show(b)
    if ta == tb:
        ta += f" ({hexshort(_hex(getattr(a, 'digest', '')), 8) or 'inline'})"
        tb += f" ({hexshort(_hex(getattr(b, 'digest', '')), 8) or 'inline'})"
    return ta, tb


def _pair(a: Any, b: Any, same: Any) -> str:
    return hexshort(a, 10) if same else f"{hexshort(a, 10)} -> {hexshort(b, 10)}"


def _count_lines(text: str, sign: str) -> int:
    return sum(1 for ln in text.splitlines() if ln.startswith(sign) and not ln.startswith(sign * 3))


# -- store stats ---------------------------------------------------------------------------------------


def on_disk(stats: dict[str, Any]) -> str:
    """The "store on disk" line of ``store.stats()``: bytes and files, the gc reserve named apart."""
    g = stats.get
    return (f"{size(g('stored_bytes'))} in {g('files', 0):,} files"
            + (f" ({size(g('reserve_bytes'))} of it the gc reserve, room for gc on a full disk)" if g("reserve_bytes") else ""))


class StoreStats(dict):
    """``store.stats()``: the same dict as always, shown with sizes in MiB/GiB and ratios rounded."""

    __module__ = "casmon.display"  # the name pickles and keys have always given it (casmon/keys/names.py)

    def _pairs(self) -> list[tuple[str, str]]:
        g = self.get
        return [
            ("values", f"{g('values', 0):,} in {g('chunks', 0):,} chunks ({g('packs', 0):,} packs, "
                       f"{g('loose_objects', 0):,} loose objects)"),
            ("logical size", size(g("logical_bytes"))),
            ("after dedup", f"{size(g('chunk_bytes'))} (dedup {ratio(g('dedup_ratio'))}, chunks compressed "
                            f"{ratio(g('compression_ratio'))})"),
            ("objects on disk", size(g("object_bytes"))),
            ("store on disk", on_disk(self)),
            ("records", ", ".join(f"{k} {v:,}" for k, v in (g("records") or {}).items()) or "none"),
            ("refs", f"{g('refs', 0):,}"),
            ("damaged files", f"{g('damaged_files', 0):,}" + (" (casmon verify names them)" if g("damaged_files") else "")),
        ]

    @guarded_text("stats")
    def __repr__(self) -> str:
        width = max(len(k) for k, _ in self._pairs())
        return f"casmon store {self.get('store')}\n" + "\n".join(f"  {k.ljust(width)}  {v}" for k, v in self._pairs())

    @guarded_html("stats")
    def _repr_html_(self) -> str:
        area = self.get("bytes_by_area") or {}
        files = self.get("files_by_area") or {}
        parts: list[Any] = [kv_table(self._pairs())]
        if area:
            parts += [heading("by area"), table(["area", "files", "size"],
                                                [(code(k), f"{files.get(k, 0):,}", size(v)) for k, v in area.items()],
                                                num=[1, 2])]
        return frame(Html(f"casmon store <code>{esc(self.get('store'))}</code>"), *parts)


# -- verify ----------------------------------------------------------------------------------------------


def verify_text(rep: Any) -> str:
    checked = ", ".join(f"{k} {v:,}" for k, v in dict(rep.checked).items()) or "nothing"
    head = "ok" if rep.ok else f"DAMAGED: {plural(len(rep.damaged), 'damaged object')}, {len(rep.missing):,} missing"
    lines = [f"<casmon verify: {head}; checked {checked}"]
    for k, why in rep.damaged[:20]:
        lines.append(f"  damaged {k}: {cut(str(why), 120, flatten=True)}")
    for k, who in rep.missing[:20]:
        lines.append(f"  missing {k}, needed by {cut(str(who), 120, flatten=True)}")
    more = len(rep.damaged) + len(rep.missing) - len(rep.damaged[:20]) - len(rep.missing[:20])
    if more > 0:
        lines.append(f"  … and {more:,} more")
    if rep.affected:
        lines.append(f"  {plural(len(rep.affected), 'problem')} affect other objects (report.affected)")
    return "\n".join(lines) + ">"


def verify_html(rep: Any) -> Html:
    title = Html("casmon verify " + status_badge("ok" if rep.ok else "damaged"))
    parts: list[Any] = [table(["checked", "count"], [(k, f"{v:,}") for k, v in dict(rep.checked).items()], num=[1])]
    if rep.damaged:
        parts += [heading(f"damaged ({len(rep.damaged):,})"),
                  table(["object", "reason", "affects"],
                        [(code(k), why, len(rep.affected.get(k, ()))) for k, why in rep.damaged], num=[2])]
    if rep.missing:
        parts += [heading(f"missing ({len(rep.missing):,})"),
                  table(["object", "needed by"], [(code(k), who) for k, who in rep.missing])]
    return frame(title, *parts)


# -- call log ------------------------------------------------------------------------------------------


def session_where(session: Any) -> str:
    """What ran a session, in a few words from its record: ``"ray worker 1a2b3c4d5e6f actor 9f8e7d6c5b4a"``,
    ``"dask worker 0 (tcp://127.0.0.1:40321)"``, ``"multiprocessing SpawnPoolWorker-1"``, ``"MPI rank 3"``,
    ``"slurm array 4242 task 7"``, joined by ", "; ``""`` for a plain process. Never raises on a malformed record."""
    if not isinstance(session, dict):
        return ""
    parts = []
    e = session.get("engine")
    if isinstance(e, dict):
        name = e.get("name")
        if name == "ray":
            text = f"ray worker {str(e.get('worker'))[:12]}"
            if e.get("actor"):
                text += f" actor {str(e['actor'])[:12]}"
            parts.append(text)
        elif name == "dask":
            parts.append(f"dask worker {e.get('worker')} ({e.get('address')})")
        elif name == "multiprocessing":
            parts.append(f"multiprocessing {e.get('process')}")
        elif name == "joblib-loky":
            parts.append(f"joblib (loky) {e.get('process')}")
        elif isinstance(name, str):
            parts.append(name[:40])
    rank = session.get("rank")
    if type(rank) is int:
        parts.append(f"MPI rank {rank}")
    a = session.get("array")
    if isinstance(a, dict):
        parts.append(f"{a.get('scheduler')} array {a.get('job')} task {a.get('task')}")
    return ", ".join(parts)


class Sessions(dict):
    """``log.sessions``: session number -> its record, shown with local dates."""

    __module__ = "casmon.display"  # the name pickles and keys have always given it (casmon/keys/names.py)

    def _rows(self) -> list[tuple]:
        rows = []
        for n, s in self.items():
            s = s if isinstance(s, dict) else {}
            argv = s.get("argv")
            rows.append((n, when(s.get("start", s.get("time"))), s.get("pid", "-"), s.get("host", "-"),
                         s.get("python", "-"), session_where(s) or "-",
                         " ".join(map(str, argv)) if isinstance(argv, list) else "-"))
        return rows

    @guarded_text("sessions")
    def __repr__(self) -> str:
        if not self:
            return "<casmon: no sessions>"
        return f"{plural(len(self), 'session')}:\n" + text_table(["session", "started", "pid", "host", "python", "ran in", "command"],
                                                             self._rows(), width=60)

    @guarded_html("sessions")
    def _repr_html_(self) -> str:
        rows = [(n, t, pid, host, py, where, code(cmd)) for n, t, pid, host, py, where, cmd in self._rows()]
        return frame(f"casmon: {plural(len(self), 'session')}",
                     table(["session", "started", "pid", "host", "python", "ran in", "command"], rows, num=[0, 2]))

    def to_pandas(self):
        pd = pandas()
        rows = []
        for n, s in self.items():
            s = s if isinstance(s, dict) else {}
            argv = s.get("argv")
            rows.append({"session": n, "start": local_datetime(s.get("start", s.get("time"))), "pid": s.get("pid"),
                         "host": s.get("host"), "python": s.get("python"), "rank": s.get("rank"),
                         "ran_in": session_where(s) or None,
                         "argv": " ".join(map(str, argv)) if isinstance(argv, list) else None})
        return pd.DataFrame(rows, columns=["session", "start", "pid", "host", "python", "rank", "ran_in", "argv"])


def call_row(c: Any) -> dict:
    exc = c.exception
    return {"function": c.name, "session": c.session, "n": c.n, "start": local_datetime(c.start),
            "duration_s": c.duration, "pid": c.pid, "rank": c.rank, "thread": c.thread_name,
            "status": f"raised {exc[0]}" if exc else "ok", "error": exc[1] if exc else None,
            "result_recorded": c.result_recorded}


CALL_COLUMNS = ["function", "session", "n", "start", "duration_s", "pid", "rank", "thread", "status", "error",
                "result_recorded"]


def calls_frame(calls: Iterable[Any]):
    """Calls as a DataFrame: one row per call, with its start (local time) and duration in seconds."""
    pd = pandas()
    return pd.DataFrame([call_row(c) for c in calls], columns=CALL_COLUMNS)


def calllog_html(log: Any, signature: Callable[[str], str], ranges: Callable[[list], str]) -> Html:
    rows = []
    for name, fi in log.functions.items():
        sess = sorted(fi.sessions)
        calls = [c for s in sess for c in fi.sessions[s]]
        total = sum(c.duration for c in calls if isinstance(c.duration, (int, float)))
        sig, why = attempt(lambda: signature(name), name)
        rows.append((code(sig), f"{len(calls):,}", ranges(sess), len(fi.sessions[sess[-1]]) if sess else 0,
                     seconds(total / len(calls)) if calls else "-", when(max((c.start for c in calls), default=None))))
    return frame(Html(f"casmon call log <code>{esc(log.store.url)}</code>: {esc(plural(len(log.sessions), 'session'))}"),
                 table(["function", "calls", "sessions", "calls in latest", "mean time", "last call"], rows, num=[1, 3, 4]))


# -- cache ---------------------------------------------------------------------------------------------


def result_ref_text(ref: Any, described: str) -> str:
    e = ref.entry if isinstance(ref.entry, dict) else {}
    parts = [f"casmon result of {e.get('fn', '?')}", size(e.get("size")), described]
    if e.get("seconds") is not None:
        parts.append(f"took {seconds(e.get('seconds'))}")
    parts.append(f"stored {when(e.get('time'))}")
    if e.get("label") is not None:
        parts.append(f"label {short(e.get('label'), 40)}")
    parts.append(f"value {hexshort(_hex(ref.digest))}")
    return "<" + ", ".join(parts) + ">"


def result_ref_html(ref: Any, described: str) -> Html:
    e = ref.entry if isinstance(ref.entry, dict) else {}
    pairs: list[tuple[str, Any]] = [("function", code(e.get("fn", "?"))), ("value", code(described)), ("size", size(e.get("size"))),
             ("took", seconds(e.get("seconds"))), ("stored", when(e.get("time")))]
    if e.get("label") is not None:
        pairs.append(("label", e.get("label")))
    files = e.get("files")
    if isinstance(files, list) and files:
        pairs.append(("input files", Html(", ".join(str(code(f[0] if isinstance(f, list) and f else f)) for f in files[:20]))))
    pairs += [("key", code(_hex(ref.key))), ("digest", code(_hex(ref.digest)))]
    return frame("casmon cached result", kv_table(pairs))


def described(fn: Callable[..., str]) -> str:
    """A stored value's one-line description, or why it cannot be read."""
    text, why = attempt(fn, "")
    return text if why is None else f"<cannot read it: {why}>"


def _hex(d: Any) -> str:
    h = getattr(d, "hex", None)
    return h() if callable(h) else str(d)


def cache_row(ref: Any) -> dict:
    e = ref.entry if isinstance(ref.entry, dict) else {}
    return {"function": e.get("fn"), "key": _hex(ref.key), "result": _hex(ref.digest), "size": e.get("size"),
            "seconds": e.get("seconds"), "stored": local_datetime(e.get("time")), "label": e.get("label")}


CACHE_COLUMNS = ["function", "key", "result", "size", "seconds", "stored", "label"]


class CacheEntries(list):
    """A function's cache entries (:class:`~casmon.caching.entries.ResultRef` each, nothing loaded), newest first."""

    __module__ = "casmon.display"  # the name pickles and keys have always given it (casmon/keys/names.py)

    @guarded_text("cache entries")
    def __repr__(self) -> str:
        if not self:
            return "<casmon: no cache entries>"
        rows = [(r["function"], hexshort(r["key"]), size(r["size"]), seconds(r["seconds"]), when(r["time"]),
                 short(r["label"], 30) if r["label"] is not None else "")
                for r in (dict(cache_row(x), time=x.entry.get("time")) for x in self)]
        return (f"{plural(len(self), 'cache entry', 'cache entries')}, {self.total()}:\n"
                + text_table(["function", "key", "size", "took", "stored", "label"], rows))

    @guarded_html("cache entries")
    def _repr_html_(self) -> str:
        rows = []
        for x in self:
            r = cache_row(x)
            rows.append((code(r["function"]), code(hexshort(r["key"])), size(r["size"]), seconds(r["seconds"]),
                         when(x.entry.get("time")), "" if r["label"] is None else short(r["label"], 60)))
        return frame(f"casmon: {plural(len(self), 'cache entry', 'cache entries')}, {self.total()}",
                     table(["function", "key", "size", "took", "stored", "label"], rows, num=[2, 3]))

    def total(self) -> str:
        """The results' size, each stored value once (entries that return one value share it)."""
        values: dict[str, object] = {}
        for x in self:
            values[str(getattr(x, "digest", id(x)))] = x.entry.get("size", 0)
        n = 0
        for v in values.values():
            try:
                n += max(int(v or 0), 0)  # type: ignore[call-overload]  # a crafted record's size is caught
            except (TypeError, ValueError, OverflowError):
                pass
        return size(n) + (", each stored value once" if len(values) < len(self) else "")

    def to_pandas(self):
        """One row per entry: function, key, result digest, size in bytes, seconds the call took, when stored, label."""
        pd = pandas()
        return pd.DataFrame([cache_row(x) for x in self], columns=CACHE_COLUMNS)


# -- arrays ----------------------------------------------------------------------------------------------


def array_pairs(arr: Any) -> list[tuple[str, str]]:
    view = getattr(arr, "store", None)
    m = getattr(view, "_manifest", None)
    digest = _hex(m.digest) if m is not None else "?"
    nbytes = m.nbytes if m is not None else None
    nchunks = len(getattr(view, "_chunks", ()) or ())
    return [("shape", str(tuple(arr.shape))), ("dtype", str(arr.dtype)), ("chunks", str(tuple(arr.chunks))),
            ("stored chunks", f"{nchunks:,}"), ("size", size(nbytes)), ("order", "F" if getattr(view, "_fortran", False) else "C"),
            ("digest", digest)]


def array_text(arr: Any) -> str:
    p = dict(array_pairs(arr))
    return (f"<casmon array shape={p['shape']} dtype={p['dtype']} chunks={p['chunks']} ({p['stored chunks']} stored), "
            f"{p['size']}, read-only, digest {p['digest'][:12]}>")


def array_html(arr: Any) -> Html:
    return frame("casmon array (lazy, read-only zarr.Array)", kv_table([(k, code(v)) for k, v in array_pairs(arr)]))
