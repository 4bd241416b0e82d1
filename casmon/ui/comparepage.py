"""The compare page and the report file: runs side by side, their metrics charted, what differs.

Charts are uPlot's (``static/casmon-charts.js``), fed by the page's chart block
(``series.chart_spec``): on the server the script fetches points from
``/api/metric``; the report file carries them inline, with uPlot and the
scripts inlined under a Content-Security-Policy of their hashes, so it opens
offline and loads nothing. Tables of parameters, metrics and info sit in
boxes of their own that scroll sideways; lists are summaries with a
sparkline; "only what differs" hides the rows every run shares.
"""

from __future__ import annotations

from typing import Any

from casmon.view import display
from casmon.view.display import Html, code, esc, kv_table, patch_html, short, table
from casmon.view.text import plural
from casmon.ui import artifactview
from casmon.ui.compare import Comparison, Divergence, Row
from casmon.ui.lineageview import first_difference_html
from casmon.ui.pages import Ctx, badge, call_href, heading, layout, num_cell, run_url, scroll, standalone_file
from casmon.ui.series import REPORT_POINTS, chart_spec
from casmon.ui.values import cell_html, fmt, json_block


def _run_chips(ctx: Ctx, cmp: Comparison) -> str:
    return " ".join(f'<span class="run-chip" data-run="{esc(t)}" data-status="{esc(r.status)}">'
                    f'{ctx.link(run_url(t), r.name, "run-link")} {badge(r.status, r.manifest.get("signal"))}</span>'
                    for t, r in zip(cmp.tails, cmp.runs))


def _table(rows: list[Row], names: list[str], cls: str, cell: Any) -> Html:
    body = "".join(f'<tr class="{"differs" if row.differs else "same"}" data-key="{esc(row.key)}"><th>{esc(row.key)}</th>'
                   + "".join(f'<td{_num_class(row.cells[i])}>{cell(row, i)}</td>' for i in range(len(names))) + "</tr>"
                   for row in rows)
    heads = "".join(f"<th>{esc(n)}</th>" for n in names)
    return scroll(Html(f'<table class="{cls}"><thead><tr><th>key</th>{heads}</tr></thead><tbody>{body}</tbody></table>'))


def _num_class(v: Any) -> str:
    """Numbers (and metric summaries) right-aligned; text and described values wrap as text."""
    return ' class="num"' if v is None or type(v) in (int, float, bool) or isinstance(v, dict) and "last" in v else ""


def _value(row: Row, i: int) -> Html:
    v = row.cells[i]
    spark = row.sparks[i] if i < len(row.sparks) else None
    return cell_html(v, spark) if spark is not None or isinstance(v, (list, dict)) else num_cell(v)


def _metric(row: Row, i: int) -> Html:
    s = row.cells[i]
    if not isinstance(s, dict):
        return Html("")
    n = s.get("n")
    extra = f"{fmt(s['min'])} .. {fmt(s['max'])}" if s.get("min") is not None and s.get("max") is not None else ""
    pts = plural(n, "point") if type(n) is int else ""
    detail = ", ".join(x for x in (extra, pts) if x)
    last = fmt(s["last"]) if type(s.get("last")) in (int, float) else "-"
    return Html(f'{esc(last)}<br><span class="muted">{esc(detail)}</span>' if detail else esc(last))


def compare_body(ctx: Ctx, cmp: Comparison, spec: dict[str, Any], serial: int = 0,
                 first: list[tuple[str, Any, str]] | None = None) -> Html:
    names = [r.name for r in cmp.runs]
    ref = names[0]
    one = len(names) == 1
    standalone = ' data-standalone="1"' if ctx.standalone else ""
    out: list[str] = [f"<h1>{'Run ' + esc(ref) if one else f'Compare {len(names)} runs'}</h1>",
                      f'<p id="compare" data-serial="{serial}"{standalone}>{_run_chips(ctx, cmp)}'
                      + ("" if one else f' <span class="muted">(differences are against {esc(ref)})</span>') + "</p>"]
    out.append(str(_summary(cmp)))
    out.append(str(first_difference_html(ctx, first or [])))  # the cause, above the tables of its effects
    out.append('<p class="only-differs-switch" hidden><label><input type="checkbox" id="only-differs"> '
               "only what differs</label></p>")
    if spec["metrics"] or spec["params"]:
        out.append(str(heading("Charts", 2, "charts-heading")))
        out.append('<section id="charts" class="charts"><noscript><p class="muted">The charts need JavaScript.'
                   "</p></noscript></section>")
        out.append(str(json_block("casmon-chart-data", spec)))
    out.append(str(heading("Metrics", 2, "metrics")))
    out.append(str(_table(cmp.metrics, names, "metrics", _metric)) if cmp.metrics else
               '<p class="muted">None of these runs logged a metric (run.log).</p>')
    out.append(str(heading("Parameters", 2, "params")))
    out.append(str(_table(cmp.params, names, "params", _value)) if cmp.params else
               '<p class="muted">None of these runs recorded parameters (params=...).</p>')
    out.append(str(heading("Info", 2, "info")))
    out.append(str(_table(cmp.info, names, "info", _value)) if cmp.info else
               '<p class="muted">None of these runs recorded info.</p>')
    out += [str(x) for x in artifactview.compare_section(cmp)]  # a section of its own: which artifacts differ
    if not one:
        out.append(str(heading("Identical outputs", 2, "identical")))
        if cmp.groups:
            grows = "".join(f'<tr><th>{esc(what)}</th><td>{" ".join(_group(g) for g in groups)}</td></tr>'
                            for what, groups in cmp.groups)
            out.append('<p class="muted">Runs listed together produced the same outputs: byte-identical values (equal '
                       "digests); for a logged metric, the same points (the same steps and values, by their digest; "
                       "a metric logged by a casmon older than that digest is never called identical). "
                       "Parameters and info scalars are inputs, not outputs.</p>"
                       f'<div class="scroll"><table class="groups" id="groups">{grows}</table></div>')
        else:
            out.append('<p class="muted" id="groups">No two of these runs produced identical outputs.</p>')
    if cmp.divergences or cmp.errors:
        out.append(str(heading("Logged calls", 2, "calls")))
        for d in cmp.divergences:
            out.append(str(_divergence(ctx, d)))
        for e in cmp.errors:
            out.append(str(display.error_line(e)))
    for other, d, why in cmp.diffs:
        out.append(str(heading(f"{ref} → {other.name}", 2)))
        if why:
            out.append(str(display.error_line(f"cannot compare: {why}")))
            continue
        out.append(str(_diff_section(ctx, d, [x for x in cmp.file_diffs if x[0] == other.name], cmp.runs[0], other)))
    return Html("".join(out))


def _group(names: list[str]) -> str:
    return '<span class="group">' + ", ".join(f"<code>{esc(n)}</code>" for n in names) + "</span>"


def _summary(cmp: Comparison) -> Html:
    parts = [f"{cmp.differing} of {cmp.shown} values differ"] if len(cmp.runs) > 1 else []
    for other, d, _ in cmp.diffs:
        if d is None:
            continue
        f = d["files"]
        changed = sum(len(v) for v in f.values())
        parts.append(f"{other.name}: " + ("same code" if d["commit"]["same"] and d["patch"]["same"] else "code differs")
                     + (f", {changed} tracked files differ" if changed else ""))
    return Html('<p class="summary">' + esc("; ".join(parts)) + "</p>") if parts else Html("")


def _commit(h: Any) -> str:
    return display.hexshort(h, 10) if isinstance(h, str) and h else "none (not in git)"


def _diff_section(ctx: Ctx, d: Any, file_diffs: list[tuple[str, str, str, str]], ra: Any, rb: Any) -> Html:
    a, b = str(d["a"]), str(d["b"])
    c = d["commit"]
    pairs: list[tuple[str, Any]] = [
        ("commit", ("same " + _commit(c["a"])) if c["same"] else f"{_commit(c['a'])} → {_commit(c['b'])}"),
        ("uncommitted changes", "same" if d["patch"]["same"] else "differ (below)")]
    out: list[Any] = [kv_table(pairs)]
    files = d["files"]
    if any(files.values()):
        rows = [(code(p), k) for k in ("added", "removed", "changed") for p in files[k]]
        out += [display.heading("tracked files"), scroll(table(["path", "how"], rows))]
    for _n, path, kind, text in file_diffs:
        if kind == "text":
            out += [display.heading(f"{path}"), patch_html(text) if text else Html("<p>same text</p>")]
        else:
            out += [display.heading(f"{path} ({kind})"), Html(f"<p>{esc(text)}</p>")]
    meta = d["meta"]
    meta_rows: list[tuple[str, Html, Html]] = []
    for k, v in meta.items():
        if k == "packages" and isinstance(v, dict):
            meta_rows += [(f"package {p}", code(ab.get("a") or "-"), code(ab.get("b") or "-")) for p, ab in list(v.items())[:200]]
        elif k == "env" and isinstance(v, dict):
            env_a, env_b = v.get("a"), v.get("b")
            ea: dict[str, Any] = env_a if isinstance(env_a, dict) else {}
            eb: dict[str, Any] = env_b if isinstance(env_b, dict) else {}
            meta_rows += [(f"env {name}", code(ea.get(name, "-")), code(eb.get(name, "-")))
                          for name in sorted(set(ea) | set(eb)) if ea.get(name) != eb.get(name)]
        elif k in ("params", "metrics"):
            continue  # the tables above show them
        elif isinstance(v, dict):
            meta_rows.append((k, code(short(v.get("a"), 200)), code(short(v.get("b"), 200))))
    if meta_rows:
        out += [display.heading("environment and packages that differ"), scroll(table(["what", a, b], meta_rows))]
    results = d.get("results") or []
    if results:
        out += [display.heading("same inputs, different results"),
                scroll(table(["function", "calls", "via"], [(code(x["function"]), x["calls"], x["via"]) for x in results],
                             num=[1]))]
    if not d["patch"]["same"]:
        out += _patches(d, ra, rb)
    return Html('<section class="diff">' + "".join(display.cell(x) for x in out) + "</section>")


def _patches(d: Any, ra: Any, rb: Any) -> list[Any]:
    """Only one run has uncommitted changes: its patch as it is; both have: how the patches differ."""
    pa, why_a = display.attempt(ra.patch, b"")
    pb, why_b = display.attempt(rb.patch, b"")
    out: list[Any] = [display.error_line(f"the patch of {r.name}: {w}") for r, w in ((ra, why_a), (rb, why_b)) if w]
    if not why_a and not why_b and (not pa) != (not pb):
        r, patch = (rb, pb) if pb else (ra, pa)
        return out + [display.heading(f"uncommitted changes: only {r.name} has them"),
                      patch_html(patch.decode("utf-8", "replace"))]
    return out + [display.heading(f"uncommitted changes: {ra.name}.patch → {rb.name}.patch"),
                  patch_html(str(d["patch"].get("diff") or ""))]


def _divergence(ctx: Ctx, d: Divergence) -> Html:
    head = f"{d.a} → {d.b}"
    if d.note:
        return Html(f'<p class="divergence"><b>{esc(head)}</b>: {esc(d.note)}</p>')
    if d.first is None:
        text = f"{d.compared:,} calls paired by function and number; every pair with the same inputs has the same result"
        extra = ""
    else:
        k, x, y = d.first
        text = f"first call with the same inputs and a different result: {x.name} call {k}"
        extra = (f" ({ctx.link(call_href(x), f'{d.a}: #{x.n} in session {x.session}')} · "
                 f"{ctx.link(call_href(y), f'{d.b}: #{y.n} in session {y.session}')})")
    inputs = ""
    if d.first_inputs is not None:
        k, x, _y = d.first_inputs
        inputs = f"; inputs first differ at {esc(x.name)} call {k}"
    cls = "divergence found" if d.first else "divergence"
    return Html(f'<p class="{cls}"><b>{esc(head)}</b>: {esc(text)}{extra}{inputs}</p>')


def compare_page(ctx: Ctx, cmp: Comparison, serial: int = 0, first: list[tuple[str, Any, str]] | None = None) -> bytes:
    spec = chart_spec("compare", cmp.runs, cmp.tails, api=True)
    return layout(ctx, "Compare " + ", ".join(r.name for r in cmp.runs), compare_body(ctx, cmp, spec, serial, first),
                  "Runs", charts_=True)


def report(ctx: Ctx, cmp: Comparison, first: list[tuple[str, Any, str]] | None = None) -> bytes:
    """The compare page as one file (:func:`pages.standalone_file`); the charts' points inline (at most
    REPORT_POINTS buckets a series)."""
    spec = chart_spec("compare", cmp.runs, cmp.tails, api=False, inline_points=REPORT_POINTS)
    return standalone_file(ctx, "casmon report: " + ", ".join(r.name for r in cmp.runs),
                           compare_body(ctx, cmp, spec, first=first))
