"""The ``cache`` verbs: which functions ``@casmon.cache`` holds results of, one function's code versions and entries
(``cache NAME``), and ``cache clear NAME``."""

from __future__ import annotations

import click
from rich.console import JustifyMethod
from rich.table import Table

from casmon.cli.options import console, open_store, say, store_option, trust_option
from casmon.view.text import did_you_mean, plural, size


class _CacheGroup(click.Group):
    """``casmon cache NAME`` is ``casmon cache show NAME``: a first argument that is no verb names a function."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        i = 0
        while i < len(args) and args[i].startswith("-"):  # the group's own options may come first
            i += 2 if args[i] in ("--store", "-s") else 1
        if i < len(args) and args[i] not in self.commands:
            hint = did_you_mean(args[i], self.verbs())
            if hint and positional(args[i + 1:]):  # `cache cleer NAME`: a verb given wrong, not a function
                raise click.UsageError(f"no such command {args[i]!r}; {hint}", ctx)
            args = [*args[:i], "show", *args[i:]]
        return super().parse_args(ctx, args)

    def verbs(self) -> list[str]:
        return [n for n, c in self.commands.items() if not c.hidden]


def positional(args: list[str]) -> list[str]:
    """The arguments that are no option nor the value of ``--store``."""
    out, i = [], 0
    while i < len(args):
        if args[i] in ("--store", "-s"):
            i += 2
            continue
        if not args[i].startswith("-"):
            out.append(args[i])
        i += 1
    return out


@click.group(cls=_CacheGroup, invoke_without_command=True)
@store_option
@click.pass_context
@trust_option
def cache(ctx, store_location, trust) -> None:
    """Cached functions: entries, hits, sizes. `casmon cache NAME` shows one function's code versions (what
    changed between them) and newest entries; `casmon cache clear NAME` forgets one."""
    ctx.ensure_object(dict)
    ctx.obj["store"] = store_location
    if ctx.invoked_subcommand is not None:
        return
    from casmon.caching import cache_entries, results_total

    store = open_store(store_location, read_only=True)
    entries = cache_entries(store)
    total, shared = results_total(entries)
    t = Table(title=f"cached functions in {store.url}")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("function", "left"), ("entries", "right"), ("hits", "right"),
                                                     ("results", "right"), ("last used", "left"))
    for col, just in columns:
        t.add_column(col, justify=just)
    import datetime as _dt

    for fn, s in sorted(entries.items()):
        last = _dt.datetime.fromtimestamp(s["last_used"]).strftime("%Y-%m-%d %H:%M") if s["last_used"] else ""
        t.add_row(fn, f"{s['entries']:,}", f"{s['hits']:,}", shared_size(s), last)
    if not entries:
        console.print("no cached functions")
    else:
        console.print(t)
        # Each value once: functions that return the same value share its one stored copy.
        console.print(f"results in all: {size(total)}, each stored value counted once" +
                      (f" ({size(shared)} of it shared between functions)" if shared else ""))
        dups = sum(s.get("duplicates", 0) for s in entries.values())
        if dups:  # counted once above; they only take space
            console.print(f"{plural(dups, 'duplicate entry', 'duplicate entries')} besides these (calls computed by two processes "
                          "at once; the newest counts): `casmon gc` drops them")


def shared_size(s: dict) -> str:
    """A function's results, each value once, and how much of that other functions' entries hold too."""
    shared = s.get("shared_bytes", 0)
    return size(s["bytes"]) + (f" ({size(shared)} shared)" if shared else "")


@cache.command("clear")
@click.argument("name")
@store_option
@click.pass_context
@trust_option
def cache_clear(ctx, name, store_location, trust) -> None:
    """Forget every cached result of function NAME (full or short name)."""
    from casmon.caching import clear_function

    store = open_store(store_location or ctx.obj.get("store"))
    try:
        full = clear_function(store, name)
    except LookupError as e:
        raise click.ClickException(str(e)) from None
    store.close()
    say(f"cleared {full}. Its results' space is freed by gc: `casmon gc` condemns them and a gc at least "
        f"--grace (default an hour) later removes them; `casmon gc --now` removes them at once (only while "
        f"nothing else writes to the store)", markup=False)


@cache.command("show", hidden=True)
@click.argument("name")
@store_option
@click.pass_context
@trust_option
def cache_show(ctx, name, store_location, trust) -> None:
    """One cached function: its code versions, what changed between them, and its newest entries."""
    import datetime as _dt
    import time

    from casmon.caching import KIND_FN, cache_entries, resolve_function
    from casmon.caching.explain import code_versions

    store = open_store(store_location or ctx.obj.get("store"), read_only=True)
    entries = cache_entries(store)
    names = set(entries) | {str(r.get("fn")) for _k, r in store.records(KIND_FN, strict=False) if r.get("fn")}
    try:
        full = resolve_function(names, name)
    except LookupError as e:
        import difflib

        verbs = difflib.get_close_matches(name, cache.verbs(), n=1)  # `casmon cache clera`
        raise click.ClickException(str(e) + (f" (or did you mean `casmon cache {verbs[0]} NAME`?)" if verbs else "")) from None

    def when(t: float) -> str:
        return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else ""

    s = entries.get(full, {"entries": 0, "bytes": 0, "hits": 0})
    console.print(f"{full}: {plural(s['entries'], 'entry', 'entries')}, {shared_size(s)} of results, "
                  f"{plural(s['hits'], 'hit')}", markup=False)
    from casmon.caching import KIND, newest_per_key

    now = time.time()
    every = [r for _k, r in newest_per_key((k, r) for k, r in store.records(KIND, strict=False)
                                           if r.get("fn") == full).values()]
    live = [r for r in every if not (isinstance(r.get("expires"), (int, float)) and r["expires"] <= now)]
    expired = len(every) - len(live)
    if expired:
        say(f"{plural(expired, 'entry', 'entries')} past {'its' if expired == 1 else 'their'} expires_after "
            "(misses; `casmon gc` drops them) not counted below")
    per_version: dict[str, int] = {}
    for r in live:
        per_version[str(r.get("v"))] = per_version.get(str(r.get("v")), 0) + 1
    versions = code_versions(store, full)
    t = Table(title="code versions, oldest first")
    for col in ("#", "version", "first seen", "entries", "what changed since the one before"):
        t.add_column(col, justify="right" if col in ("#", "entries") else "left")
    for i, v in enumerate(versions, 1):
        changed = "; ".join(f"{d.what} {d.name} {d.detail}".replace("  ", " ") for d in v.changes) if i > 1 else ""
        t.add_row(str(i), v.version[:12], when(v.time), f"{per_version.get(v.version, 0):,}", changed)
    if versions:
        console.print(t)
    newest = sorted(live, key=lambda r: r.get("time", 0), reverse=True)[:10]
    if newest:
        et = Table(title=f"newest entries (of {len(live):,})")
        for col in ("stored", "version", "result", "computed in", "label"):
            et.add_column(col, justify="right" if col in ("result", "computed in") else "left")
        for r in newest:
            et.add_row(when(r.get("time", 0)), str(r.get("v", ""))[:12], size(int(r.get("size", 0) or 0)),
                      f"{float(r.get('seconds', 0) or 0):.3g} s", str(r.get("label", "")))
        console.print(et)
    say("`f.explain(...)` in Python says why one call misses, with the source diff of what changed")
