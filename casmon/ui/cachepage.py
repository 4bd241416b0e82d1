"""The cache pages as HTML: the cached functions, one function's code versions and entries, one entry.

``/cache`` lists the functions; ``/cache?fn=NAME`` shows the function's code
versions, oldest first, each with what changed since the one before (a source
diff for a changed function or helper), and its entries, each linked to its
own view; ``/cache?fn=NAME&entry=KEY`` shows one entry's record and what
differs between it and its nearest other entries
(:func:`casmon.caching.explain.explain_entry`).

Everything shown comes from the store and is untrusted text: function names,
source texts and their diffs, labels, paths, digests. It goes through
:func:`casmon.view.display.esc` or a building block that escapes
(``patch_html`` for diffs). Results are described from their manifests; nothing
is unpickled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from casmon.caching.entries import results_total
from casmon.caching.explain import Difference, Explanation, Version, relabel
from casmon.ui.pages import Ctx, heading, layout, scroll, url
from casmon.view import display
from casmon.view.display import Html, code, esc, kv_table, seconds, table, when
from casmon.view.text import plural, size

#: Entries listed on a function's page (the newest).
ENTRIES_SHOWN = 500

Entry = tuple[Any, dict[str, Any]]  # (key digest, record)
#: The columns of a function's entries.
COLUMNS = ("key", "version", "result", "size", "took", "stored", "label", "state")
NUM = ' class="num"'


def entry_url(fn: str, key_hex: str) -> str:
    return url("/cache", fn=fn, entry=key_hex)


def is_expired(record: dict[str, Any], now: float) -> bool:
    """An entry past its ``expires_after``: a miss for the function, kept until gc drops it."""
    t = record.get("expires")
    return isinstance(t, (int, float)) and not isinstance(t, bool) and t <= now


def state_badge(record: dict[str, Any], now: float) -> Html:
    if is_expired(record, now):
        return Html(f'<span class="casmon-status casmon-status-expired" title="expired {esc(when(record["expires"]))}">'
                    "expired</span>")
    return Html('<span class="casmon-status casmon-status-live">live</span>')


def version_numbers(versions: list[Version]) -> dict[str, int]:
    """Version hex -> its number on the page (1 the oldest)."""
    return {v.version: i for i, v in enumerate(versions, 1)}


def version_cell(ctx: Ctx, fn: str, v: Any, numbers: dict[str, int]) -> Html:
    """An entry's code version: its number and short hex, linked to its row of the versions table."""
    if not isinstance(v, str) or not v:
        return Html('<span class="muted">not recorded</span>')
    n = numbers.get(v)
    if n is None:
        return code(display.hexshort(v))
    return ctx.link(url("/cache", fn=fn) + f"#version-{n}", code(f"#{n} {display.hexshort(v)}"))


def differences_html(diffs: Iterable[Difference], old: str = "", new: str = "") -> Html:
    """What differs, one item each (what, name, detail), a source diff under an item that has one (its sides
    called ``old`` and ``new`` when given)."""
    items = []
    for d in diffs:
        name = f" {code(d.name)}" if d.name else ""
        text = relabel(d.diff, d.name, old, new) if old and new else d.diff
        diff = display.patch_html(text) if text else ""
        items.append(f'<li class="difference"><span class="what">{esc(d.what)}</span>{name}: {esc(d.detail)}{diff}</li>')
    return Html('<ul class="differences">' + "".join(items) + "</ul>")


def _version_counts(entries: list[Entry], now: float) -> dict[str, tuple[int, int]]:
    """Version hex -> (live entries, expired entries)."""
    out: dict[str, tuple[int, int]] = {}
    for _k, r in entries:
        v = str(r.get("v"))
        live, expired = out.get(v, (0, 0))
        out[v] = (live, expired + 1) if is_expired(r, now) else (live + 1, expired)
    return out


def versions_table(versions: list[Version], entries: list[Entry], now: float) -> Html:
    """The code versions, oldest first: number, short version, first seen, entries, what changed since the one
    before (with source diffs)."""
    counts = _version_counts(entries, now)
    rows = []
    for i, v in enumerate(versions, 1):
        live, expired = counts.get(v.version, (0, 0))
        n = f"{live:,}" + (f" + {expired:,} expired" if expired else "")
        if i == 1:
            changed = Html('<span class="muted">the first version seen</span>')
        else:
            changed = differences_html(v.changes, f"#{i - 1}", f"#{i}") if v.changes else Html('<span class="muted">nothing its record names</span>')
        pinned = v.parts.get("pinned") if isinstance(v.parts, dict) else None
        shown = Html(code(display.hexshort(v.version)) + (f' <span class="muted">pinned {esc(pinned)}</span>'
                                                          if pinned is not None else ""))
        rows.append(f'<tr id="version-{i}"><td class="num">{i}</td><td>{shown}</td>'
                    f'<td class="when">{esc(when(v.time or None))}</td><td class="num">{esc(n)}</td>'
                    f'<td class="changes">{changed}</td></tr>')
    head = "".join(f"<th>{h}</th>" for h in ("#", "version", "first seen", "entries", "what changed since the one before"))
    return Html(f'<table class="versions" id="versions"><tr>{head}</tr>{"".join(rows)}</table>')


def functions_page(ctx: Ctx, summary: dict[str, Any], fn: str | None, entries: list[Entry], versions: list[Version],
               describe: Callable[[Any], str], now: float) -> bytes:
    """The cached functions; with ``fn``, its code versions and its entries (``entries`` newest first)."""
    rows = [(ctx.link(url("/cache", fn=name), code(name)), f"{s['entries']:,}", size(s["bytes"]),
             size(s["shared_bytes"]) if s.get("shared_bytes") else "", f"{s['hits']:,}", when(s["last_used"] or None))
            for name, s in sorted(summary.items())]
    total, shared = results_total(summary)  # each stored value once, however many entries hold it
    note = f", {size(shared)} of it shared between functions" if shared else ""
    out: list[Any] = [Html(f"<h1>Cache <span class=\"muted\">{esc(plural(len(summary), 'function'))}, "
                           f"{esc(size(total))}{esc(note)}</span></h1>"),
                      table(["function", "entries", "bytes", "shared", "hits", "last use"], rows, num=[1, 2, 3, 4])]
    if fn is not None:
        out += [heading(f"Code versions of {fn}", 2, "code-versions")]
        if versions:
            out += [Html('<p class="muted">oldest first; a version is the function\'s code, the code of the helpers '
                         "it uses from your modules and the globals they read</p>"),
                    scroll(versions_table(versions, entries, now))]
        else:
            out.append(Html('<p class="muted">no code version recorded</p>'))
        out.append(entries_table(ctx, fn, entries, versions, describe, now))
    return layout(ctx, f"Cache {fn}" if fn else "Cache", Html("".join(display.cell(x) for x in out)), "Cache")


def entries_table(ctx: Ctx, fn: str, entries: list[Entry], versions: list[Version], describe: Callable[[Any], str],
                  now: float) -> Html:
    """A function's entries, newest first, each key linked to the entry's own view."""
    numbers = version_numbers(versions)
    expired = sum(1 for _k, r in entries if is_expired(r, now))
    count = plural(len(entries), "entry", "entries") + (f", {expired:,} of them expired" if expired else "")
    rows = []
    for k, r in entries[:ENTRIES_SHOWN]:
        label = "" if r.get("label") is None else display.show(r["label"])
        cells = [ctx.link(entry_url(fn, k.hex()), code(display.hexshort(k.hex(), 16))), version_cell(ctx, fn, r.get("v"), numbers),
                 code(describe(r.get("result"))), size(r.get("size")), seconds(r.get("seconds")), when(r.get("time")), label,
                 state_badge(r, now)]
        rows.append("<tr>" + "".join(f'<td data-k="{c}"{NUM if c in ("size", "took") else ""}>{display.cell(x)}</td>'
                                     for c, x in zip(COLUMNS, cells)) + "</tr>")
    head = "".join(f"<th>{h}</th>" for h in COLUMNS)
    more = (f'<p class="muted">the newest {ENTRIES_SHOWN:,} of {len(entries):,}</p>'
            if len(entries) > ENTRIES_SHOWN else "")
    return Html(f'{heading(f"Entries of {fn}", 2, "entries")}<p class="muted">{esc(count)}; a key opens the entry '
                f'and what differs from its nearest entries</p>'
                f'<div class="scroll"><table class="entries" id="entries"><tr>{head}</tr>{"".join(rows)}</table></div>{more}')


def _params_table(a: Any) -> Html:
    if not isinstance(a, dict):
        return Html('<p class="muted">not recorded (stored by an older casmon, or keyed by a custom key)</p>')
    if not a:
        return Html('<p class="muted">none</p>')
    # "~": a large buffer hashed once for the key, not again for a digest of its own
    rows = "".join(f"<tr><td>{code(k)}</td><td>{code(v) if v != '~' else 'not kept (a large value, hashed once)'}</td></tr>"
                   for k, v in sorted(a.items(), key=lambda kv: str(kv[0])))
    return Html(f'<table id="entry-params"><tr><th>parameter</th><th>digest of its value</th></tr>{rows}</table>')


def _files_table(record: dict[str, Any]) -> Html:
    files = [f for f in record.get("files") or () if isinstance(f, (list, tuple)) and len(f) >= 3]
    if not files:
        return Html("")
    rows = [(code(f[0]), code(f[1]), code(display.hexshort(f[2], 16)), size(f[3]) if len(f) > 3 else "")
            for f in files]
    more = record.get("files_truncated")
    note = (Html(f'<p class="muted">{esc(plural(more, "file"))} read; the first {len(files):,} are recorded</p>')
            if isinstance(more, int) and not isinstance(more, bool) else "")
    return Html(f'{heading("Files it read", 2, "files")}{scroll(table(["parameter", "path", "digest", "size"], rows, num=[3]))}'
                f"{display.cell(note)}")


def entry_page(ctx: Ctx, fn: str, key_hex: str, record: dict[str, Any], ex: Explanation, versions: list[Version],
               others: dict[str, dict[str, Any]], describe: Callable[[Any], str], now: float,
               lineage: list[Any] | None = None, scripts: list[str] | None = None) -> bytes:
    """One entry: its record, its parameters' digests, its files, its ``lineage`` (panels the server adds, with
    their ``scripts``), and what differs from its nearest entries (``others``: the function's live entries by key
    hex, to mark an expired neighbour and name its version)."""
    numbers = version_numbers(versions)
    state = state_badge(record, now)
    pairs: list[tuple[str, Any]] = [("function", ctx.link(url("/cache", fn=fn), code(fn))), ("key", code(key_hex)),
                                    ("state", state)]
    if "expires" in record:
        pairs.append(("expires", when(record.get("expires"))))
    pairs += [("stored", when(record.get("time"))), ("result", code(describe(record.get("result")))),
              ("size", size(record.get("size"))), ("computed in", seconds(record.get("seconds"))),
              ("code version", version_cell(ctx, fn, record.get("v"), numbers))]
    if record.get("label") is not None:
        pairs.append(("label", display.show(record["label"])))
    rec = kv_table(pairs).replace("<table>", '<table id="entry-record">', 1)
    out: list[Any] = [Html(f"<h1>Entry <code>{esc(key_hex[:12])}</code> of <code>{esc(fn)}</code></h1>"), Html(rec),
                      heading("Parameters", 2, "params"),
                      Html('<p class="muted">a short digest of each parameter\'s value as the key counts it</p>'),
                      _params_table(record.get("a")), _files_table(record)]
    out += lineage or []
    out.append(heading("What differs from its nearest entries", 2, "nearest"))
    others_n = max(0, ex.entries - 1)
    if not ex.nearest:
        out.append(Html(f'<p class="muted">no other live entry of {esc(fn)} to compare with</p>'))
    else:
        out.append(Html(f'<p class="muted">the {len(ex.nearest)} nearest of {esc(plural(others_n, "other live entry", "other live entries"))}'
                        ", the nearest first</p>"))
    for n in ex.nearest:
        other = others.get(n.key, {})
        mark = f" {state_badge(other, now)}" if is_expired(other, now) else ""
        link = ctx.link(entry_url(fn, n.key), code(display.hexshort(n.key)))
        out.append(Html(f'<section class="nearest"><h3>entry {link} <span class="muted">stored {esc(when(n.time))} · '
                        f'code version {version_cell(ctx, fn, other.get("v"), numbers)}</span>{mark}</h3>'
                        f"{differences_html(n.differences, f'entry {n.key[:12]}', 'this entry')}</section>"))
    out += [Html(f'<p class="muted">{esc(note)}</p>') for note in ex.notes]
    out.append(Html('<p class="muted">Values are described from their manifests; nothing was unpickled. '
                    "<code>f.explain(...)</code> in Python says the same for a call.</p>"))
    return layout(ctx, f"{fn} entry {key_hex[:12]}", Html("".join(display.cell(x) for x in out)), "Cache",
                  scripts=scripts)
