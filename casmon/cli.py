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
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .errors import CasmonError, UntrustedStoreError
from .peek import _human  # one formatter of sizes for everything casmon shows

# Piped output is not wrapped at 80 columns, so it can be searched line by line.
console = Console(width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True)

store_option = click.option(
    "--store",
    "store_location",
    envvar="CASMON_STORE",
    default=None,
    metavar="PATH_OR_URL",
    help="The store: a folder, a .zip file, memory://name or s3://bucket/prefix (default ./.casmon).",
)




def _trusted() -> bool:
    """``--trust`` given to the group (``casmon --trust CMD``) or to the command (``casmon CMD --trust``)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.params.get("trust"):
            return True
        ctx = ctx.parent
    return False


def _open(location, read_only: bool = False, trust: bool | None = None):
    """Open the store; untrusted (no pickle naming a global is loaded) unless ``--trust``."""
    from .store import open as open_store

    try:
        return open_store(location, read_only=read_only, autoflush=None, trust=_trusted() if trust is None else trust)
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


@contextmanager
def _progress(enabled: bool):
    if not enabled or not console.is_terminal:
        yield None
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err_console, transient=True
    ) as p:
        tasks: dict[str, int] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = p.add_task(phase, total=total)
            p.update(tasks[phase], completed=done, total=total)

        yield update


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
    with _progress(not as_json) as progress:
        s = store.stats(progress)
    if as_json:
        click.echo(json.dumps(s, indent=2))
        return
    t = Table(title=f"casmon store {s['store']}", show_header=False)
    t.add_column("what", style="bold")
    t.add_column("value", justify="right")
    t.add_row("values", f"{s['values']:,}")
    t.add_row("chunks", f"{s['chunks']:,}  ({s['loose_objects']:,} loose, {s['packs']:,} packs)")
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
    with _progress(not as_json) as progress:
        rep = store.verify(progress)
        if repair and not rep.ok:
            from .maintenance import repair as do_repair

            try:
                done = do_repair(store, progress)
            except CasmonError as e:
                raise click.ClickException(str(e)) from None
            if not as_json:
                console.print(f"[yellow]repaired[/yellow]: deleted {len(done['deleted_files'])} files, dropped "
                              f"{done['dropped_index_entries']} objects, {done['dropped_records']} records, "
                              f"{len(done['dropped_refs'])} refs")
            rep = store.verify(progress)
    if as_json:
        click.echo(json.dumps(rep.as_dict(), indent=2))
    else:
        checked = ", ".join(f"{n:,} {what}" for what, n in rep.checked.items())
        console.print(f"checked {checked}")
        for key, reason in rep.damaged:
            console.print(f"[red]damaged[/red] {key}: {reason}")
            for dep in rep.affected.get(key, []):
                console.print(f"    needed by {dep}")
        for what, needed_by in rep.missing:
            console.print(f"[red]missing[/red] {what}, needed by {needed_by}")
        console.print("[green]store is sound[/green]" if rep.ok else f"[red]{len(rep.damaged)} damaged, {len(rep.missing)} missing[/red]")
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
@click.option("--now", is_flag=True, help="Delete unreachable objects at once (only while nothing else writes).")
@click.option("--dry-run", is_flag=True, help="Report what would be removed; change nothing.")
@click.option("--break-lock", is_flag=True, help="Take the store lock from a gc or repair that died on another machine.")
@click.option("--json", "as_json", is_flag=True)
@trust_option
def gc(store_location, max_size, older_than, grace, now, dry_run, break_lock, as_json, trust) -> None:
    """Remove objects no record or ref reaches, and repack sparse packs.

    An unreachable object is first condemned (published for writers to see) and
    removed by a later gc at least --grace seconds after, if still unreachable.
    With --max-size or --older-than, first evict cache entries (least recently used first).
    """
    from .condemned import MIN_GRACE

    if not now and grace < MIN_GRACE:
        raise click.BadParameter(f"--grace must be at least {MIN_GRACE:g} seconds (writers rely on it); "
                                 f"--now deletes at once when nothing else writes to the store", param_hint="--grace")
    from .cache import evict

    max_bytes = _parse_size(max_size)
    max_age = _parse_age(older_than)
    store = _open(store_location, trust=False)  # gc never needs to unpickle, --trust or not
    evicted = (0, 0)
    if (max_bytes is not None or max_age is not None) and not dry_run:
        evicted = evict(store, max_size=max_bytes, older_than=max_age)
    with _progress(not as_json) as progress:
        rep = store.gc(grace=0.0 if now else grace, dry_run=dry_run, progress=progress, break_lock=break_lock)
    store.close()
    if as_json:
        d = rep.as_dict()
        d["evicted_entries"], d["evicted_bytes"] = evicted
        click.echo(json.dumps(d, indent=2))
        return
    if evicted[0]:
        console.print(f"evicted {evicted[0]:,} cache entries ({_human(evicted[1])} of results)")
    verb = "would remove" if dry_run else "removed"
    console.print(
        f"{rep.live_values:,} live values; {rep.unreachable:,} unreachable objects; {verb} {rep.deleted_objects:,} "
        f"({_human(rep.deleted_bytes)}), repacked {rep.repacked_packs} packs"
    )
    if rep.condemned:
        console.print(f"{'would condemn' if dry_run else 'condemned'} {rep.condemned:,} newly unreachable objects: "
                      f"a gc at least {grace:.0f} s from now removes them if they are still unreachable")
    if rep.waiting > rep.condemned:
        console.print(f"{rep.waiting - rep.condemned:,} condemned objects wait for their grace period (--now removes them)")


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
    from .cache import cache_entries

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


@cache.command("clear")
@click.argument("name")
@store_option
@click.pass_context
@trust_option
def cache_clear(ctx, name, store_location, trust) -> None:
    """Forget every cached result of function NAME (full or short name)."""
    from .cache import clear_function

    store = _open(store_location or ctx.obj.get("store"))
    try:
        full = clear_function(store, name)
    except LookupError as e:
        raise click.ClickException(str(e)) from None
    store.close()
    console.print(f"cleared {full}; `casmon gc` frees the space of its results")


def _when(t: float) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def _load_log(store_location):
    from .calllog import CallLog

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
        t = Table(title=f"call log {log.store.url}: {len(log.sessions)} sessions")
        for col, just in (("function", "left"), ("calls", "right"), ("sessions", "left"), ("latest session", "right")):
            t.add_column(col, justify=just)
        from .calllog import _ranges

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
    t = Table(title=f"{log.signature(full)} — session {session}: {len(selected):,} calls")
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
    from .calllog import _short

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
@trust_option
def replay(name, n, store_location, session, imports, trust) -> None:
    """Run call N of NAME again and check the result against the recorded one (exit 1 if it differs).

    Only code you name runs: the function is taken from the modules or scripts
    given with --import (their @casmon.intercept functions, or a function of
    that name in them), never imported from the name a record holds. Arguments
    that are pickles load only with --trust.
    """
    log = _load_log(store_location)
    c = log.call(name, n, session)
    if not imports:
        raise click.ClickException(
            f"replay runs code: name the code that defines {c.name} with --import module_or_script.py "
            "(casmon never imports what a record names)")
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
    from .calllog import _intercepted

    def unwrap(obj):
        fi = getattr(obj, "__casmon_intercept__", None)
        return fi.fn if fi is not None else obj

    mod_names = {m.__name__ for m in modules}
    fn = _intercepted.get(name)  # registered by @casmon.intercept while the --import code ran
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
    from .runs import load_run

    try:
        return load_run(which, _open(store_location, read_only=True))
    except (LookupError, CasmonError) as e:
        raise click.ClickException(_one_line(e)) from None


@main.command()
@store_option
@click.option("--json", "as_json", is_flag=True)
@trust_option
def runs(store_location, as_json, trust) -> None:
    """Recorded runs: number, comment, time, status, commit, dirty."""
    from .runs import list_runs

    all_runs = list_runs(_open(store_location, read_only=True))
    if as_json:
        click.echo(json.dumps([{"name": r.name, "ref": r.ref, "status": r.status, "start": r.manifest.get("start"),
                                "commit": r.manifest.get("git", {}).get("commit"), "dirty": r.manifest.get("git", {}).get("dirty")}
                               for r in all_runs], indent=2))
        return
    if not all_runs:
        console.print("no runs recorded")
        return
    t = Table(title="runs")
    for col in ("run", "comment", "started", "duration", "status", "commit", "dirty"):
        t.add_column(col)
    for r in all_runs:
        m = r.manifest
        g = m.get("git", {})
        status = {"ok": "[green]ok[/green]", "failed": "[red]failed[/red]"}.get(r.status, r.status)
        dur = f"{m['duration']:.1f} s" if m.get("duration") is not None else ""
        t.add_row(r.name, m.get("comment", ""), _when(m["start"]) if m.get("start") else "", dur, status,
                  (g.get("commit") or "")[:10] or ("no git" if not g.get("in_git") else "no commit"),
                  "yes" if g.get("dirty") else "")
    console.print(t)


def _show_run(which, store_location) -> None:
    r = _load_run(which, store_location)
    m = r.manifest
    g = m.get("git", {})
    console.print(f"[bold]run {r.name}[/bold]  {r.status}  manifest {r.digest[:12]}")
    if r.error is not None:
        console.print(f"  cannot read this run: {_one_line(r.error)}", markup=False)
        return
    if m.get("start"):
        console.print(f"  started {_when(m['start'])}" + (f", took {m['duration']:.2f} s" if m.get("duration") is not None else ""))
    console.print(f"  {m.get('user')}@{m.get('host')}, Python {m.get('python')}, pid {m.get('pid')}")
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
        from .calllog import _short

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
@click.option("--json", "as_json", is_flag=True)
@trust_option
def diff_cmd(a, b, store_location, as_json, trust) -> None:
    """What differs between runs A and B: code, tracked files, metadata, info, results."""
    from .runs import diff

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
        console.print(f"  info {k}: {v['a']!r} -> {v['b']!r}", markup=False)
    for r in d["results"]:
        console.print(f"  [yellow]{r['function']}[/yellow] returned different results for the same inputs ({r['calls']} calls, via {r['via']})")


@main.command("restore")
@click.argument("run")
@click.argument("target", type=click.Path(file_okay=False))
@store_option
@click.option("--repo", type=click.Path(exists=True, file_okay=False), help="The git repository holding the run's commit.")
@trust_option
def restore_cmd(run, target, store_location, repo, trust) -> None:
    """Write RUN's code into TARGET: its commit, its uncommitted changes, its tracked files."""
    from .runs import restore

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
    from .runs import export

    r = _load_run(run, store_location)
    try:
        root = export(r, target)
    except (CasmonError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    console.print(f"exported run {r.name} into {root}")


@main.command()
@store_option
@trust_option
def demo(store_location, trust) -> None:
    """Store and reload a few values; show deduplication and the store's stats."""
    from .demo import run_demo

    try:
        run_demo(store_location, console)
    except CasmonError as e:
        raise click.ClickException(str(e)) from None


if __name__ == "__main__":  # pragma: no cover
    main()
