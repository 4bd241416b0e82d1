"""The ``cache`` verbs: which functions ``@casmon.cache`` holds results of, and ``cache clear NAME``."""

from __future__ import annotations

import click
from rich.console import JustifyMethod
from rich.table import Table

from casmon.cli.options import console, open_store, store_option, trust_option
from casmon.view.text import plural, size


@click.group(invoke_without_command=True)
@store_option
@click.pass_context
@trust_option
def cache(ctx, store_location, trust) -> None:
    """Cached functions: entries, hits, sizes. `casmon cache clear NAME` forgets one."""
    ctx.ensure_object(dict)
    ctx.obj["store"] = store_location
    if ctx.invoked_subcommand is not None:
        return
    from casmon.caching import cache_entries

    store = open_store(store_location, read_only=True)
    entries = cache_entries(store)
    t = Table(title=f"cached functions in {store.url}")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("function", "left"), ("entries", "right"), ("hits", "right"),
                                                     ("results", "right"), ("last used", "left"))
    for col, just in columns:
        t.add_column(col, justify=just)
    import datetime as _dt

    for fn, s in sorted(entries.items()):
        last = _dt.datetime.fromtimestamp(s["last_used"]).strftime("%Y-%m-%d %H:%M") if s["last_used"] else ""
        t.add_row(fn, f"{s['entries']:,}", f"{s['hits']:,}", size(s["bytes"]), last)
    if not entries:
        console.print("no cached functions")
    else:
        console.print(t)
        dups = sum(s.get("duplicates", 0) for s in entries.values())
        if dups:  # counted once above; they only take space
            console.print(f"{plural(dups, 'duplicate entry', 'duplicate entries')} besides these (calls computed by two processes "
                          "at once; the newest counts): `casmon gc` drops them")


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
    console.print(f"cleared {full}. Its results' space is freed by gc: `casmon gc` condemns them and a gc at least "
                  f"--grace (default an hour) later removes them; `casmon gc --now` removes them at once (only while "
                  f"nothing else writes to the store)")
