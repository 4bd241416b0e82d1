"""One run's page: what it is, its metrics (latest values and charts), parameters, info, artifacts, output, code and links.

A live run's page follows it without a reload: ``casmon-ui.js`` polls
``/api/run/NAME`` every two seconds while the run is running and sets its
status, elapsed time, latest metric values, the tail of its output (as a
terminal shows it: a progress bar's last state) and, if it fails, its
traceback; ``casmon-charts.js`` draws a metric again when it has new points.
The title, the traceback and every value appear once; lists are summaries with
a sparkline, never printed at length. ``casmon report RUN`` writes this page as
one file (:func:`report`), its points inline.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from casmon.view import display
from casmon.view.display import Html, code, esc, kv_table, patch_html, seconds, table, when
from casmon.view.text import size
from casmon.runs import flatten
from casmon.ui import artifactview, lineageview
from casmon.ui.api import OUTPUT_TAIL, TRACEBACK_CHARS, summary_json
from casmon.ui.model import LIVE_STATUSES, Entry
from casmon.ui.pages import Ctx, badge, heading, layout, scroll, standalone_file, url
from casmon.ui.series import REPORT_POINTS, chart_spec, flat_info, sequence_of
from casmon.ui.values import cell_html, console_text, json_block

#: An ended run's output shows its last lines first; all of it is one click away.
OUTPUT_TAIL_LINES = 200
#: Info values shown with a sparkline read a stored array at most this many times.
SPARK_READS = 100


def _facts(r: Any) -> list[tuple[str, Any]]:
    m = r.manifest
    pairs: list[tuple[str, Any]] = []
    if m.get("comment"):
        pairs.append(("comment", m["comment"]))
    if r.tags:
        pairs.append(("tags", Html(" ".join(f'<span class="casmon-tag">{esc(t)}</span>' for t in r.tags))))
    if r.note:
        pairs.append(("note", r.note))
    pairs += [("status", Html(f'<span id="run-status">{badge(r.status, m.get("signal"))}</span>')),
              ("started", when(m.get("start")))]
    if m.get("end") is not None:
        pairs.append(("ended", when(m.get("end"))))
    elapsed = r.elapsed
    pairs.append(("elapsed" if r.status in ("running", "lost") else "duration",
                  Html(f'<span id="run-elapsed">{esc(seconds(elapsed) if elapsed is not None else "-")}</span>')))
    if r.status in ("running", "lost") and r.heartbeat is not None:
        pairs.append(("last heartbeat", when(r.heartbeat)))
    if r.status == "lost":
        pairs.append(("lost", "no heartbeat for three heartbeat intervals: the process died without saying so "
                              "(SIGKILL, out of memory, a node that went away); elapsed is up to its last heartbeat"))
    if m.get("signal"):
        pairs.append(("signal", m["signal"]))
    pairs += artifactview.resume_facts(r)
    g = m.get("git")
    if isinstance(g, dict) and g:
        pairs.append(("code", display.code_state(r)))
        if g.get("root"):
            pairs.append(("repository", code(g["root"])))
    if m.get("function"):
        pairs.append(("function", code(m["function"])))
    for k in ("host", "user", "python"):
        if m.get(k):
            pairs.append((k, m[k]))
    if m.get("notebook"):  # a kernel's command line names only its temporary connection file
        pairs.append(("notebook", code(str(m["notebook"]))))
    elif m.get("argv"):
        pairs.append(("command", code(" ".join(map(str, m["argv"])))))
    if isinstance(m.get("imported"), dict):
        pairs.append(("imported", code(", ".join(f"{k}={v}" for k, v in m["imported"].items()))))
    if m.get("error") and not m.get("traceback"):
        pairs.append(("error", Html(f'<span class="casmon-error">{esc(m["error"])}</span>')))
    if r.error is not None:
        pairs.append(("cannot be read", Html(f'<span class="casmon-error">this run cannot be read: {esc(r.error)}</span>')))
    return pairs


def _metrics_table(r: Any) -> Html:
    rows = []
    summary = summary_json(r)
    for name, s in summary.items():
        rows.append(f'<tr data-metric="{esc(name)}"><th data-k="name">{esc(name)}</th>'
                    + "".join(f'<td class="num" data-k="{k}">{esc(s[k + "_text"])}</td>'
                              for k in ("last", "step", "n", "min", "max")) + "</tr>")
    hidden = "" if rows else " hidden"
    none = "" if rows else '<p class="muted" id="no-metrics">No metrics logged (yet).</p>'
    return Html(none + f'<div class="scroll"><table class="metrics" id="run-metrics"{hidden}><thead><tr><th>metric</th>'
                "<th>last</th><th>step</th><th>points</th><th>min</th><th>max</th></tr></thead>"
                f'<tbody>{"".join(rows)}</tbody></table></div>')


def _values_table(r: Any, values: dict[str, Any], shown: dict[str, Any]) -> Html:
    """Keys and values; a stored 1-D array or a list of numbers gets a sparkline."""
    rows, reads = [], 0
    for k in sorted(values):
        raw, v = values[k], shown.get(k, values[k])
        spark = None
        if isinstance(raw, dict) and set(raw) == {"$"} and reads < SPARK_READS:
            reads += 1
            spark = sequence_of(r.store, raw, False)
        rows.append((k, cell_html(v, spark)))
    return scroll(table(["key", "value"], rows))


def _output(r: Any, live: bool) -> list[Any]:
    out: list[Any] = []
    if live:
        text, why = display.attempt(lambda: console_text(r.output_tail(OUTPUT_TAIL)), "")
        out.append(heading("Output (the tail, as the run writes it)", 2, "output"))
        out.append(display.error_line(why) if why else
                   Html(f'<pre class="output tail" id="output-tail"{"" if text else " hidden"}>{esc(text)}</pre>'))
        return out
    whole = bool(r.manifest.get("output"))  # else a lost run's batches, written while it ran
    text, why = display.attempt(lambda: console_text(r.output()), "")
    if not whole and not text and not why:
        return out
    out.append(heading("Captured output" if whole else "Output (what the run wrote before it stopped)", 2, "output"))
    if why:
        return out + [display.error_line(why)]
    lines = text.splitlines()
    if len(lines) > OUTPUT_TAIL_LINES:
        out.append(Html(f'<p class="muted">the last {OUTPUT_TAIL_LINES} of {len(lines):,} lines</p>'
                        f'<pre class="output tail">{esc(chr(10).join(lines[-OUTPUT_TAIL_LINES:]))}</pre>'
                        f'<details><summary>all {len(lines):,} lines</summary>'
                        f'<pre class="output">{esc(text)}</pre></details>'))
    else:
        out.append(Html(f'<pre class="output">{esc(text)}</pre>'))
    return out


def run_body(ctx: Ctx, e: Entry, r: Any, spec: dict[str, Any], shared: bool = False) -> Html:
    """The run page's content; ``spec`` is its chart block (points fetched from the server, or inline); ``shared``:
    count the share of its artifacts other runs hold (a walk of the whole store)."""
    m = r.manifest
    running = r.status in LIVE_STATUSES  # a lost run is not polled: it says so, and a reload looks again
    live = running and not ctx.standalone  # a report file polls nothing
    standalone = ' data-standalone="1"' if ctx.standalone else ""
    out: list[Any] = [Html(f"<h1>Run <code>{esc(r.name)}</code></h1>"),
                      Html(f'<div id="run-live" data-run="{esc(e.tail)}" data-status="{esc(r.status)}"{standalone} '
                           f"hidden></div>"),
                      kv_table(_facts(r))]
    tb = m.get("traceback")
    if isinstance(tb, str) and tb:
        out += [heading("Traceback", 2, "traceback"), Html(f'<pre class="traceback">{esc(tb[-TRACEBACK_CHARS:])}</pre>')]
    elif live:  # filled by the page's script if the run fails while the page is open
        out.append(Html('<h2 id="traceback" hidden>Traceback</h2><pre class="traceback" id="run-traceback" hidden></pre>'))
    out += [heading("Metrics", 2, "metrics"), _metrics_table(r)]
    if spec["metrics"] or live:
        out += [Html('<section id="charts" class="charts"><noscript><p class="muted">The charts need JavaScript.</p>'
                     "</noscript></section>"), json_block("casmon-chart-data", spec)]
    params = m.get("params")
    if isinstance(params, dict) and params:
        shown, _why = display.attempt(r.flat_params, {})
        out += [heading("Parameters", 2, "params"), _values_table(r, flatten(params), shown)]
    info = flat_info(r)
    if info:
        cells, why = display.run_info_cells(r)
        out += [heading("Info", 2, "info"), _values_table(r, info, flatten(cells) if isinstance(cells, dict) else {})]
        if why:
            out.append(display.error_line(f"info: {why}"))
    out += artifactview.run_section(ctx, e.tail, r, shared)  # artifacts, checkpoints, resumes: a section of its own
    out += _output(r, running)
    g = m.get("git") or {}
    if g.get("patch"):
        patch, why = display.attempt(lambda: r.patch().decode("utf-8", "replace"), "")
        out.append(heading("Uncommitted changes (the patch)", 2, "patch"))
        out.append(display.error_line(why) if why else patch_html(patch))
    files = m.get("files")
    if isinstance(files, dict) and files:
        rows = [(code(path), size((f if isinstance(f, dict) else {}).get("size")),
                 code(display.hexshort((f if isinstance(f, dict) else {}).get("digest")))) for path, f in sorted(files.items())]
        out += [heading(f"Tracked files ({len(files)})", 2, "files"), scroll(table(["path", "size", "digest"], rows, num=[1]))]
    out.append(lineageview.panel(ctx, "/api/lineage/run/" + quote(e.tail, safe=""), "this run's inputs"))
    links = m.get("links") or {}
    sessions = [s for s in links.get("call_sessions", []) if type(s) is int]
    cache = [x for x in links.get("cache", []) if isinstance(x, dict)]
    if sessions or cache:
        out.append(heading("Links", 2, "links"))
        if sessions:
            out.append(Html(f"<p>{ctx.link(url('/calls', run=e.tail), 'the calls made during this run', 'run-calls')}"
                            " · call-log sessions: " + ", ".join(
                                str(ctx.link(url("/calls", session=s), f"session {s}")) for s in sessions) + "</p>"))
        if cache:
            crows = [(ctx.link(url("/cache", fn=x.get("fn")), code(x.get("fn"))), _entry_link(ctx, x),
                      code(display.hexshort(x.get("result"))), "hit" if x.get("hit") else "stored") for x in cache[:500]]
            out += [display.heading(f"cache entries ({len(cache)})"), scroll(table(["function", "key", "result", "how"], crows))]
    return Html("".join(display.cell(x) for x in out))


def run_page(ctx: Ctx, e: Entry, r: Any, shared: bool = False) -> bytes:
    spec = chart_spec("run", [r], [e.tail], api=True)
    return layout(ctx, f"Run {r.name}", run_body(ctx, e, r, spec, shared), "Runs", charts_=True,
                  scripts=[lineageview.SCRIPT])


def report(ctx: Ctx, e: Entry, r: Any) -> bytes:
    """One run's page as one file (``casmon report RUN``): its charts' points inline, nothing fetched."""
    spec = chart_spec("run", [r], [e.tail], api=False, inline_points=REPORT_POINTS)
    return standalone_file(ctx, f"casmon report: run {r.name}", run_body(ctx, e, r, spec, shared=True))  # no link to ask


def _entry_link(ctx: Ctx, link: dict[str, Any]) -> Html:
    """A cache entry the run hit or filled: its key, linked to the entry's view when it is a key."""
    key, fn = link.get("key"), link.get("fn")
    if isinstance(key, str) and isinstance(fn, str) and re.fullmatch(r"[0-9a-f]{32}", key):
        return ctx.link(url("/cache", fn=fn, entry=key), code(display.hexshort(key)))
    return code(display.hexshort(key))
