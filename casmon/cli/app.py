"""The ``casmon`` command line: look around a store, check it, clean it.

Every command takes ``--store PATH_OR_URL`` (default: ``$CASMON_STORE`` or
``./.casmon``). Long work shows a progress bar on a terminal.

Looking never runs code: every command opens the store with ``trust=False``
unless ``--trust`` is given (``casmon --trust show ...`` or ``casmon show ...
--trust``), so a pickle that names a global is described -- its type read from
its opcodes, its size and digest -- not loaded. There is deliberately no
environment variable that turns trust on for every command: trust is a choice
about one store, made where the command is typed. ``replay`` runs only code
named with ``--import``. A casmon error is one line on stderr and exit status 1.
"""

from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console
from rich.table import Table

from casmon.errors import CasmonError, UntrustedStoreError
from casmon.store.peek import _human  # one formatter of sizes for everything casmon shows
from casmon.view.progress import progress_phases

# Piped output is not wrapped at 80 columns, so it can be searched line by line.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

store_option = click.option(
    "--store",
    "store_location",
    envvar="CASMON_STORE",
    default=None,
    metavar="PATH_OR_URL",
    help="The store: a folder, a .zip file, memory://name or s3://bucket/prefix "
         "(default: $CASMON_STORE, then ./.casmon). Only `demo` creates a store where there is none.",
)




def _trusted() -> bool:
    """``--trust`` given to the group (``casmon --trust CMD``) or to the command (``casmon CMD --trust``)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.params.get("trust"):
            return True
        ctx = ctx.parent
    return False


def _open(location, read_only: bool = False, trust: bool | None = None, create: bool = False):
    """Open the store; untrusted (no pickle naming a global is loaded) unless ``--trust``.

    Only ``demo`` creates a store: every other command refuses a path where there is none
    (a typo must not become a new, empty store that the command then reports on or cleans).
    """
    from casmon.store.store import open as open_store

    try:
        return open_store(location, read_only=read_only, autoflush=None, trust=_trusted() if trust is None else trust,
                          create=create)
    except CasmonError as e:
        raise click.ClickException(str(e)) from None


trust_option = click.option(
    "--trust", is_flag=True, default=False,
    help="Load pickled values (this can run code written by whoever wrote the store). Default: describe them.",
)


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, UntrustedStoreError) and "--trust" not in msg:
        msg += " (casmon --trust loads it, if you trust who wrote this store)"
    return msg


class _Group(click.Group):
    """Turns casmon's errors (and lookups of what does not exist) into one line on stderr, exit status 1."""

    def invoke(self, ctx):
        import warnings

        # casmon's warnings (a damaged file skipped, ...) are one line each on stderr, like its errors.
        warnings.showwarning = _show_warning
        try:
            return super().invoke(ctx)
        except (CasmonError, LookupError) as e:
            raise click.ClickException(_one_line(e)) from None


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    text = str(message)
    click.echo(f"Warning: {text[len('casmon: '):] if text.startswith('casmon: ') else text}", err=True)


def _n(count: int, one: str, many: str | None = None) -> str:
    """``1 function``, ``2 functions``: a count with its noun in the right number."""
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="casmon")
@trust_option
def main(trust) -> None:
    """casmon: remember function calls in a content-addressed, deduplicating store.

    Looking into a store never runs code: pickled values are described, not
    loaded, unless you pass --trust. See docs/SECURITY.md.
    """


@main.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@trust_option
def stats(store_location, as_json, trust) -> None:
    """Values, chunks, bytes, dedup ratio and files of a store."""
    store = _open(store_location, read_only=True)
    with progress_phases(not as_json, err_console) as progress:
        s = store.stats(progress)
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    t = Table(title=f"casmon store {s['store']}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("values", f"{s['values']:,}")
    t.add_row("chunks", f"{s['chunks']:,}  ({s['loose_objects']:,} loose, {_n(s['packs'], 'pack')})")
    t.add_row("logical bytes", _human(s["logical_bytes"]))
    t.add_row("after dedup", _human(s["chunk_bytes"]) + f"  (dedup {s['dedup_ratio']:.2f}x)")
    t.add_row("stored bytes", _human(s["stored_bytes"]) + f"  (compression {s['compression_ratio']:.2f}x)")
    t.add_row("files", f"{s['files']:,}  " + ", ".join(f"{a} {n}" for a, n in s["files_by_area"].items()))
    for kind, n in s["records"].items():
        t.add_row(f"records: {kind}", f"{n:,}")
    t.add_row("refs", f"{s['refs']:,}")
    console.print(t)


@main.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a report.")
@click.option("--repair", is_flag=True, help="Drop what cannot be trusted (damaged objects, and what needs them).")
@trust_option
def verify(store_location, as_json, repair, trust) -> None:
    """Re-hash every object and follow every pointer. Exit status 1 if anything is wrong."""
    store = _open(store_location, read_only=not repair)
    with progress_phases(not as_json, err_console) as progress:
        rep = store.verify(progress)
        if repair and not rep.ok:
            from casmon.maintenance.verify import repair as do_repair

            try:
                done = do_repair(store, progress)
            except CasmonError as e:
                raise click.ClickException(str(e)) from None
            if not as_json:
                console.print(f"[yellow]repaired[/yellow]: deleted {_n(len(done['deleted_files']), 'file')}, dropped "
                              f"{_n(done['dropped_index_entries'], 'object')}, {_n(done['dropped_records'], 'record')}, "
                              f"{_n(len(done['dropped_refs']), 'ref')}")
            rep = store.verify(progress)
    if as_json:
        click.echo(json.dumps(rep.as_dict(), indent=2))
    else:
        checked = ", ".join(_n(n, what[:-1] if what.endswith("s") else what, what) for what, n in rep.checked.items())
        console.print(f"checked {checked}")
        for key, reason in rep.damaged:
            console.print(f"[red]damaged[/red] {key}: {reason}")
            for dep in rep.affected.get(key, []):
                console.print(f"    needed by {dep}")
        for what, needed_by in rep.missing:
            console.print(f"[red]missing[/red] {what}, needed by {needed_by}")
        console.print("[green]store is sound[/green]" if rep.ok else f"[red]{len(rep.damaged):,} damaged, {len(rep.missing):,} missing[/red]")
    sys.exit(0 if rep.ok else 1)


def _parse_size(text: str | None) -> int | None:
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*", text.lower())
    if not m:
        raise click.BadParameter(f"{text!r} is not a size; write e.g. 500M, 10G, 1.5GiB")
    mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def _parse_age(text: str | None) -> float | None:
    if text is None:
        return None
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([smhdw]?)\s*", text.lower())
    if not m:
        raise click.BadParameter(f"{text!r} is not an age; write e.g. 3600s, 90m, 12h, 30d, 2w")
    return float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}[m.group(2)]


@main.command()
@store_option
@click.option("--max-size", metavar="SIZE", help="Evict least recently used cache entries until their results total at most SIZE (e.g. 10G).")
@click.option("--older-than", metavar="AGE", help="Evict cache entries not used for AGE (e.g. 30d, 12h).")
@click.option("--grace", type=float, default=3600.0, show_default=True, metavar="SECONDS",
              help="Delete only what an earlier gc condemned (published as unreachable) at least this long ago; "
                   "at least 60.")
@click.option("--now", is_flag=True, help="Delete unreachable objects at once (only while nothing else writes); "
                                          "not with --grace.")
@click.option("--dry-run", is_flag=True, help="Report exactly what this gc would evict, remove, condemn and repack; change nothing.")
@click.option("--break-lock", is_flag=True, help="Take the store lock from a gc or repair that died on another machine.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (evicted and deleted counts and bytes).")
@trust_option
@click.pass_context
def gc(ctx, store_location, max_size, older_than, grace, now, dry_run, break_lock, as_json, trust) -> None:
    """Remove objects no record or ref reaches, and repack sparse packs.

    An unreachable object is first condemned (published for writers to see) and
    removed by a later gc at least --grace seconds after, if still unreachable.
    With --max-size or --older-than, first evict cache entries (least recently used first).
    """
    from casmon.caching.memoize import eviction_plan, evict
    from casmon.store.condemned import MIN_GRACE
    from casmon.maintenance.gc import gc as run_gc

    if now and ctx.get_parameter_source("grace") is not click.core.ParameterSource.DEFAULT:
        raise click.UsageError("--now deletes at once and --grace waits: give one of them, not both")
    if not now and grace < MIN_GRACE:
        raise click.BadParameter(f"--grace must be at least {MIN_GRACE:g} seconds (writers rely on it); "
                                 f"--now deletes at once when nothing else writes to the store", param_hint="--grace")
    max_bytes = _parse_size(max_size)
    max_age = _parse_age(older_than)
    # gc never needs to unpickle, --trust or not; and it never creates a store where there is none.
    store = _open(store_location, trust=False, create=False)
    evicting = max_bytes is not None or max_age is not None
    # Entries of functions `casmon cache clear` forgot are dropped by every gc (with no limits, evict drops just
    # those), so that their results become unreachable; the dry run plans the same and reports it.
    if not dry_run and not store.backend.supports_deletes:
        raise click.ClickException(f"cannot gc {store.url}: it cannot delete (a zip file); "
                                   f"`casmon gc --dry-run` shows what gc would remove")
    from casmon.caching.memoize import drop_duplicates, duplicates_plan

    dups = duplicates_plan(store)  # records of keys a newer record holds (two processes missed one key at once)
    deduped = (len(dups), sum(p[1] for p in dups.values()))
    if dups and not dry_run:
        deduped, dups = drop_duplicates(store, dups), {}
    plan: dict = eviction_plan(store, max_size=max_bytes, older_than=max_age)
    evicted = (len(plan), sum(size for _fn, size in plan.values()))
    if plan and not dry_run:
        evicted = evict(store, plan=plan)
        shown, plan = plan, {}  # the real gc marks without the dropped entries: they are gone
    else:
        shown = plan
    from casmon.caching.memoize import KIND as CACHE_KIND

    with progress_phases(not as_json, err_console) as progress:
        try:
            rep = run_gc(store, grace=0.0 if now else grace, dry_run=dry_run, progress=progress, break_lock=break_lock,
                         without={CACHE_KIND: set(plan) | {(k, t) for (k, _v), (_fn, _s, t) in dups.items()}}
                         if plan or dups else None)
        finally:
            store.close()
    if as_json:
        d = rep.as_dict()
        d["evicted_entries"], d["evicted_bytes"] = evicted
        d["duplicate_entries"], d["duplicate_bytes"] = deduped
        click.echo(json.dumps(d, indent=2))
        return
    if deduped[0]:
        console.print(f"{'would drop' if dry_run else 'dropped'} {_n(deduped[0], 'duplicate cache entry', 'duplicate cache entries')} "
                      f"({_human(deduped[1])} of results; every call keeps its newest entry)")
    if evicted[0] or evicting:
        verb = "would drop" if dry_run else "dropped"
        console.print(f"{verb} {_n(evicted[0], 'cache entry', 'cache entries')} ({_human(evicted[1])} of results)")
        if shown:
            per_fn: dict[str, list[int]] = {}
            for fn, size in shown.values():
                c = per_fn.setdefault(fn, [0, 0])
                c[0] += 1
                c[1] += size
            for fn, (n, size) in sorted(per_fn.items()):
                console.print(f"  {fn}: {_n(n, 'entry', 'entries')} ({_human(size)})", markup=False)
    verb = "would remove" if dry_run else "removed"
    console.print(
        f"{_n(rep.live_values, 'live value')}; {_n(rep.unreachable, 'unreachable object')}; {verb} "
        f"{_n(rep.deleted_objects, 'object')} ({_human(rep.deleted_bytes)}), "
        f"{'would repack' if dry_run else 'repacked'} {_n(rep.repacked_packs, 'pack')}"
    )
    if rep.condemned:
        console.print(f"{'would condemn' if dry_run else 'condemned'} {_n(rep.condemned, 'newly unreachable object')}: "
                      f"a gc at least {grace:.0f} s from now removes {'it if it is' if rep.condemned == 1 else 'them if they are'} "
                      f"still unreachable")
    if rep.waiting > rep.condemned:
        waiting = rep.waiting - rep.condemned
        console.print(f"{_n(waiting, 'condemned object')} {'waits for its' if waiting == 1 else 'wait for their'} grace period "
                      f"(a later gc removes {'it' if waiting == 1 else 'them'}; --now at once)")


@main.group(invoke_without_command=True)
@store_option
@click.pass_context
@trust_option
def cache(ctx, store_location, trust) -> None:
    """Cached functions: entries, hits, sizes. `casmon cache clear NAME` forgets one."""
    ctx.ensure_object(dict)
    ctx.obj["store"] = store_location
    if ctx.invoked_subcommand is not None:
        return
    from casmon.caching.memoize import cache_entries

    store = _open(store_location, read_only=True)
    entries = cache_entries(store)
    t = Table(title=f"cached functions in {store.url}")
    for col, just in (("function", "left"), ("entries", "right"), ("hits", "right"), ("results", "right"), ("last used", "left")):
        t.add_column(col, justify=just)
    import datetime as _dt

    for fn, s in sorted(entries.items()):
        last = _dt.datetime.fromtimestamp(s["last_used"]).strftime("%Y-%m-%d %H:%M") if s["last_used"] else ""
        t.add_row(fn, f"{s['entries']:,}", f"{s['hits']:,}", _human(s["bytes"]), last)
    if not entries:
        console.print("no cached functions")
    else:
        console.print(t)
        dups = sum(s.get("duplicates", 0) for s in entries.values())
        if dups:  # counted once above; they only take space
            console.print(f"{_n(dups, 'duplicate entry', 'duplicate entries')} besides these (calls computed by two processes "
                          "at once; the newest counts): `casmon gc` drops them")


@cache.command("clear")
@click.argument("name")
@store_option
@click.pass_context
@trust_option
def cache_clear(ctx, name, store_location, trust) -> None:
    """Forget every cached result of function NAME (full or short name)."""
    from casmon.caching.memoize import clear_function

    store = _open(store_location or ctx.obj.get("store"))
    try:
        full = clear_function(store, name)
    except LookupError as e:
        raise click.ClickException(str(e)) from None
    store.close()
    console.print(f"cleared {full}. Its results' space is freed by gc: `casmon gc` condemns them and a gc at least "
                  f"--grace (default an hour) later removes them; `casmon gc --now` removes them at once (only while "
                  f"nothing else writes to the store)")


def _when(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _load_log(store_location):
    from casmon.calllog.log import CallLog

    return CallLog(_open(store_location, read_only=True))


def _cell_summary(log, cell) -> str:
    """A value as the log holds it, described without unpickling anything."""
    return log.describe_cell(cell, 40)


@main.command()
@click.argument("name", required=False)
@store_option
@click.option("--session", type=int, help="Only this session (default: all; for NAME, the latest).")
@click.option("--limit", type=int, default=50, show_default=True, help="Show at most this many calls.")
@trust_option
def calls(name, store_location, session, limit, trust) -> None:
    """Logged functions with their call counts; with NAME, that function's calls."""
    log = _load_log(store_location)
    if name is None:
        if not log.functions:
            console.print("no logged calls")
            return
        t = Table(title=f"call log {log.store.url}: {_n(len(log.functions), 'function')}, {_n(len(log.sessions), 'session')}")
        for col, just in (("function", "left"), ("calls", "right"), ("sessions", "left"), ("latest session", "right")):
            t.add_column(col, justify=just)
        from casmon.calllog.log import _ranges

        for fname, fi in log.functions.items():
            sess = sorted(fi.sessions)
            latest = f"{len(fi.sessions[sess[-1]]):,} in {sess[-1]}" if sess else ""
            t.add_row(log.signature(fname), f"{fi.total():,}", _ranges(sess), latest)
        console.print(t)
        return
    try:
        full = log.resolve(name)
        fi = log.functions[full]
        if session is None and fi.sessions:
            session = max(fi.sessions)
        selected = log.calls(full, session=session)
    except LookupError as e:
        raise click.ClickException(str(e)) from None
    t = Table(title=f"{log.signature(full)} — session {session}: {_n(len(selected), 'call')}")
    for col in ("#", "start", "duration", "thread", "arguments", "result"):
        t.add_column(col)
    for c in selected[:limit]:
        args = [_cell_summary(log, a) for a in c.args_cells] + [f"{k}={_cell_summary(log, v)}" for k, v in c.kwargs_cells.items()]
        res = f"[red]raised {c.exception[0]}[/red]" if c.exception else _cell_summary(log, c.result_cell)
        t.add_row(str(c.n), _when(c.start), f"{c.duration * 1e3:.3f} ms", c.thread_name, ", ".join(args), res)
    console.print(t)
    if len(selected) > limit:
        console.print(f"… {len(selected) - limit:,} more (--limit)")


@main.command()
@click.argument("name")
@click.argument("n", type=int, required=False)
@store_option
@click.option("--session", type=int, help="Session (default: the latest with calls of NAME).")
@trust_option
def show(name, n, store_location, session, trust) -> None:
    """`show RUN`: a recorded run. `show NAME N`: the inputs, result and timing of call N of function NAME."""
    from casmon.calllog.log import _short

    if n is None:
        _show_run(name, store_location)
        return
    log = _load_log(store_location)
    trusted = _trusted()
    load = log._load_cell if trusted else log.peek_cell  # untrusted: pickles that could run code are described
    try:
        c = log.call(name, n, session)
        a = log._bind(c, [load(x) for x in c.args_cells], {k: load(v) for k, v in c.kwargs_cells.items()}, load)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(_one_line(e)) from None
    console.print(f"[bold]{c.name}[/bold] call {c.n} of session {c.session}")
    console.print(f"  started {_when(c.start)}, took {c.duration * 1e3:.3f} ms, process {c.pid}, thread {c.thread_name}"
                  + (f", rank {c.rank}" if c.rank is not None else ""))
    for k, v in a._asdict().items():
        console.print(f"  {k} = {_short(v, 200)}", markup=False)
    if c.exception:
        console.print(f"  raised {c.exception[0]}: {c.exception[1]}", markup=False)
    else:
        if not c.result_recorded:
            console.print("  result: not recorded (intercept(result=False))", markup=False)
        else:
            console.print(f"  result = {_short(load(c.result_cell), 200)}", markup=False)


@main.command()
@click.argument("name")
@click.argument("n", type=int)
@store_option
@click.option("--session", type=int, help="Session (default: the latest with calls of NAME).")
@click.option("--import", "imports", multiple=True, metavar="MODULE_OR_SCRIPT",
              help="The code to replay: a module name or a .py file (repeatable). Required: replay calls only code you name.")
@click.option("--import-main", is_flag=True,
              help="Import the script that ran as __main__ when the call was logged (its path is in the call log; "
                   "printed before it runs). You vouch for that file: its top level runs, its "
                   "`if __name__ == \"__main__\"` block does not.")
@trust_option
def replay(name, n, store_location, session, imports, import_main, trust) -> None:
    """Run call N of NAME again and check the result against the recorded one (exit 1 if it differs).

    Only code you name runs: the function is taken from the modules or scripts
    given with --import (their @casmon.intercept functions, or a function of
    that name in them), or from the recorded __main__ script with --import-main;
    never imported from the name a record holds. Arguments that are pickles load
    only with --trust.
    """
    log = _load_log(store_location)
    c = log.call(name, n, session)
    imports = list(imports)
    script = _recorded_main(log, c.session)
    if import_main:
        if script is None:
            raise click.ClickException(f"session {c.session} recorded no __main__ script (an interactive session, "
                                       f"or casmon older than 0.3): name the code with --import module_or_script.py")
        click.echo(f"importing {script} (recorded as __main__ of session {c.session}; its top level runs)", err=True)
        imports.append(script)
    if not imports:
        hint = ""
        if c.name.startswith(("__main__.", "__mp_main__.")) and script is not None:
            hint = f"; {c.name} was logged by the script {script}: --import {script}, or --import-main"
        raise click.ClickException(
            f"replay runs code: name the code that defines {c.name} with --import module_or_script.py "
            f"(casmon never imports what a record names){hint}")
    modules = [_import_code(spec) for spec in imports]
    target = _vouched_function(c.name, modules)
    try:
        r = log.replay(c.name, c.n, c.session, fn=target)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(_one_line(e)) from None
    if r.matches:
        console.print(f"[green]{r.name} call {r.n} (session {r.session}): same result as recorded[/green] ({r.replayed})")
    else:
        console.print(f"[red]{r.name} call {r.n} (session {r.session}): result differs[/red]\n  recorded {r.recorded}\n  now      {r.replayed}")
    sys.exit(0 if r.matches else 1)


def _recorded_main(log, session: int) -> str | None:
    """The script path session ``session`` recorded as its ``__main__`` (a .py path), or None.

    The path is data from the store, checked as such: only an absolute ``.py`` path is taken, and it
    is imported only when the user asks (``--import-main``).
    """
    main = (log.sessions.get(session) or {}).get("main")
    path = main.get("script") if isinstance(main, dict) else None
    if isinstance(path, str) and path.endswith(".py") and os.path.isabs(path) and "\x00" not in path:
        return path
    return None


def _import_code(spec: str):
    """Import a module by name, or a script by path (under its file name, so ``__main__`` code does not run)."""
    import importlib
    import importlib.util

    if spec.endswith(".py") or os.sep in spec or "/" in spec:
        path = os.path.abspath(spec)
        if not os.path.isfile(path):
            raise click.ClickException(f"--import {spec}: no such file")
        mod_name = os.path.splitext(os.path.basename(path))[0]
        folder = os.path.dirname(path)
        if folder not in sys.path:
            sys.path.insert(0, folder)  # its own sibling modules import as they do when it runs
        if mod_name in sys.modules and getattr(sys.modules[mod_name], "__file__", None) == path:
            return sys.modules[mod_name]
        ispec = importlib.util.spec_from_file_location(mod_name, path)
        if ispec is None or ispec.loader is None:
            raise click.ClickException(f"--import {spec}: not a Python file")
        mod = importlib.util.module_from_spec(ispec)
        sys.modules[mod_name] = mod
        try:
            ispec.loader.exec_module(mod)
        except Exception as e:  # noqa: BLE001 - the user's code failed to import: say so in one line
            raise click.ClickException(f"--import {spec} failed: {type(e).__name__}: {e}") from None
        return mod
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(spec)
    except Exception as e:  # noqa: BLE001
        raise click.ClickException(f"--import {spec} failed: {type(e).__name__}: {e}") from None


def _vouched_function(name: str, modules: list):
    """The function the record names, but only from what the user vouched for (the --import modules)."""
    from casmon.calllog.log import intercepted

    def unwrap(obj):
        fi = getattr(obj, "__casmon_intercept__", None)
        return fi.fn if fi is not None else obj

    mod_names = {m.__name__ for m in modules}
    fn = intercepted.get(name)  # registered by @casmon.intercept while the --import code ran
    if fn is not None:
        return fn
    for m in modules:
        prefixes = [m.__name__ + ".", "__main__.", "__mp_main__."]  # a script's functions were logged as __main__.f
        for p in prefixes:
            if name.startswith(p):
                obj = m
                try:
                    for part in name[len(p):].split("."):
                        obj = getattr(obj, part)
                except AttributeError:
                    continue
                if callable(obj):
                    return unwrap(obj)
    raise click.ClickException(f"{name} is not in what --import named ({', '.join(sorted(mod_names))}); "
                               "import the module or script that defines it")


def _load_run(which, store_location):
    from casmon.runs.recorder import load_run

    try:
        return load_run(which, _open(store_location, read_only=True))
    except (LookupError, CasmonError) as e:
        raise click.ClickException(_one_line(e)) from None


@main.command()
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print the runs as a JSON list (name, ref, status, start, commit, dirty).")
@trust_option
def runs(store_location, as_json, trust) -> None:
    """Recorded runs: number, comment, time, status, commit, dirty."""
    from casmon.runs.recorder import list_runs

    all_runs = list_runs(_open(store_location, read_only=True))
    if as_json:
        click.echo(json.dumps([{"name": r.name, "ref": r.ref, "status": r.status, "start": r.manifest.get("start"),
                                "commit": r.manifest.get("git", {}).get("commit"), "dirty": r.manifest.get("git", {}).get("dirty"),
                                "notebook": r.manifest.get("notebook")}
                               for r in all_runs], indent=2))
        return
    if not all_runs:
        console.print("no runs recorded")
        return
    t = Table(title="runs")
    from rich.markup import escape

    notebooks = any(r.manifest.get("notebook") for r in all_runs)  # a column only where some run came from one
    for col in ("run", "comment", "started", "duration", "status", "commit", "dirty") + (("notebook",) if notebooks else ()):
        t.add_column(col)
    for r in all_runs:
        m = r.manifest
        g = m.get("git", {})
        status = {"ok": "[green]ok[/green]", "failed": "[red]failed[/red]"}.get(r.status, r.status)
        dur = f"{m['duration']:.1f} s" if m.get("duration") is not None else ""
        t.add_row(r.name, m.get("comment", ""), _when(m["start"]) if m.get("start") else "", dur, status,
                  (g.get("commit") or "")[:10] or ("no git" if not g.get("in_git") else "no commit"),
                  "yes" if g.get("dirty") else "",
                  *([escape(os.path.basename(m.get("notebook") or ""))] if notebooks else []))  # `show` has the path
    console.print(t)


def _not_a_run(which: str, store, e: LookupError) -> str:
    """Why `casmon show WHICH` found no run: WHICH may be a logged function whose call number was left out."""
    from casmon.calllog.log import CallLog, _ranges

    try:
        log = CallLog(store)
        full = log.resolve(which)
    except (LookupError, CasmonError):
        return _one_line(e)
    fi = log.functions[full]
    latest = max(fi.sessions) if fi.sessions else None
    calls = _ranges(sorted(c.n for c in fi.sessions[latest])) if latest is not None else "none"
    return (f"no run {which!r}, but {which!r} is a logged function ({full}; calls {calls} in session {latest}): "
            f"name a call with `casmon show {which} N` (and --session S for another session)")


def _show_run(which, store_location) -> None:
    from casmon.runs.recorder import load_run

    store = _open(store_location, read_only=True)
    try:
        r = load_run(which, store)
    except LookupError as e:
        raise click.ClickException(_not_a_run(which, store, e)) from None
    except CasmonError as e:
        raise click.ClickException(_one_line(e)) from None
    m = r.manifest
    g = m.get("git", {})
    console.print(f"[bold]run {r.name}[/bold]  {r.status}  manifest {r.digest[:12]}")
    if r.error is not None:
        console.print(f"  cannot read this run: {_one_line(r.error)}", markup=False)
        return
    if m.get("start"):
        console.print(f"  started {_when(m['start'])}" + (f", took {m['duration']:.2f} s" if m.get("duration") is not None else ""))
    console.print(f"  {m.get('user')}@{m.get('host')}, Python {m.get('python')}, pid {m.get('pid')}")
    if m.get("notebook"):  # a kernel's command line names only a temporary connection file
        console.print(f"  notebook: {m['notebook']}", markup=False)
    else:
        console.print(f"  command: {' '.join(m.get('argv', []))}", markup=False)
    if g.get("in_git"):
        console.print(f"  git: {g.get('root')} commit {(g.get('commit') or 'none')[:12]} on {g.get('branch') or 'detached HEAD'}"
                      f"{', uncommitted changes (' + str(len(r.patch())) + ' byte patch)' if g.get('dirty') else ', clean'}", markup=False)
        if g.get("untracked"):
            console.print(f"  untracked files in the patch: {', '.join(g['untracked'][:10])}", markup=False)
    for note in g.get("notes", []):
        console.print(f"  note: {note}", markup=False)
    for path, f in m.get("files", {}).items():
        console.print(f"  tracked {path} ({_human(f['size'])}, {f['digest'][:12]})", markup=False)
    for k, v in (r.info() if _trusted() else r.info_peek()).items():
        from casmon.calllog.log import _short

        console.print(f"  info {k} = {_short(v, 120)}", markup=False)
    if m.get("status") == "failed":
        console.print(m.get("traceback", ""), markup=False)
    if m.get("output"):
        out = r.output()
        tail = out[-2000:]
        console.print(f"  output ({len(out):,} characters{', last 2,000' if len(out) > 2000 else ''}):")
        console.print(tail, markup=False)


@main.command("diff")
@click.argument("a")
@click.argument("b")
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print the differences as JSON (stored values described, not loaded).")
@trust_option
def diff_cmd(a, b, store_location, as_json, trust) -> None:
    """What differs between runs A and B: code, tracked files, metadata, info, results."""
    from casmon.runs.recorder import diff

    ra, rb = _load_run(a, store_location), _load_run(b, store_location)
    d = diff(ra, rb)
    if as_json:
        click.echo(json.dumps(d, indent=2, default=str))
        return
    console.print(f"[bold]{d['a']}[/bold] vs [bold]{d['b']}[/bold]" + ("  (identical records)" if d["same_manifest"] else ""))
    c = d["commit"]
    console.print(f"  commit: {'same' if c['same'] else (c['a'] or 'none')[:12] + ' -> ' + (c['b'] or 'none')[:12]}")
    console.print(f"  uncommitted changes: {'same' if d['patch']['same'] else 'differ'}")
    if not d["patch"]["same"] and d["patch"].get("diff"):
        console.print(d["patch"]["diff"][:4000], markup=False)
    for kind in ("added", "removed", "changed"):
        for p in d["files"][kind]:
            console.print(f"  tracked file {kind}: {p}", markup=False)
    for k, v in d["meta"].items():
        console.print(f"  {k}: {v}", markup=False)
    for k, v in d["info"].items():
        how = f"  ({v['how']})" if v.get("how") else ""
        console.print(f"  info {k}: {v['a']!r} -> {v['b']!r}{how}", markup=False)
    for r in d["results"]:
        console.print(f"  [yellow]{r['function']}[/yellow] returned different results for the same inputs ({_n(r['calls'], 'call')}, via {r['via']})")


@main.command("restore")
@click.argument("run")
@click.argument("target", type=click.Path(file_okay=False))
@store_option
@click.option("--repo", type=click.Path(exists=True, file_okay=False), help="The git repository holding the run's commit.")
@trust_option
def restore_cmd(run, target, store_location, repo, trust) -> None:
    """Write RUN's code into TARGET: its commit, its uncommitted changes, its tracked files."""
    from casmon.runs.recorder import restore

    r = _load_run(run, store_location)
    try:
        root = restore(r, target, repo=repo)
    except (CasmonError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    console.print(f"restored run {r.name} into {root}")


@main.command("export")
@click.argument("run")
@click.argument("target", type=click.Path(file_okay=False))
@store_option
@trust_option
def export_cmd(run, target, store_location, trust) -> None:
    """Write RUN as a plain folder: information.json, current_changes.patch, console.log, tracked files."""
    from casmon.runs.recorder import export

    r = _load_run(run, store_location)
    try:
        with progress_phases(True, err_console) as progress:
            root = export(r, target, progress=progress)
    except (CasmonError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    console.print(f"exported run {r.name} into {root}")


@main.command()
@store_option
@trust_option
def demo(store_location, trust) -> None:
    """Store and reload a few values; show deduplication and the store's stats."""
    from casmon.cli.demo import run_demo

    try:
        run_demo(store_location, console)
    except CasmonError as e:
        raise click.ClickException(str(e)) from None


from casmon.compat.importer import import_command as _import_command  # noqa: E402 - casmon import (callmonitor, FineCache)

main.add_command(_import_command)

from casmon.cli.ui import report_command as _report_command, ui_command as _ui_command  # noqa: E402 - casmon ui, report

main.add_command(_ui_command)
main.add_command(_report_command)


if __name__ == "__main__":  # pragma: no cover
    main()
