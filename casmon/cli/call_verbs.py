"""The call-log verbs: ``calls`` (logged functions, a function's calls), ``show NAME N`` and ``replay``.

``show RUN`` without a call number shows a run (see ``run_verbs``). ``replay``
runs only code the user names with ``--import`` or ``--import-main``: never
what a record names.
"""

from __future__ import annotations

import os
import sys

import click
from rich.console import JustifyMethod
from rich.markup import escape
from rich.table import Table

from casmon.cli.options import (Unloadable, console, load_or_say, one_line, open_store, store_option, timestamp,
                                trust_option, trusted, value_text)
from casmon.cli.run_verbs import show_run
from casmon.errors import CasmonError
from casmon.view.text import plural


def _load_log(store_location):
    from casmon.calllog import CallLog

    return CallLog(open_store(store_location, read_only=True))


def _cell_summary(log, cell) -> str:
    """A value as the log holds it, described without unpickling anything."""
    return log.describe_cell(cell, 40)


@click.command()
@click.argument("name", required=False)
@store_option
@click.option("--session", type=int, help="Only this session: its calls (of NAME, or of every function). "
                                         "Default: the function table; for NAME, its latest session.")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="Show at most this many calls.")
@trust_option
def calls(name, store_location, session, limit, trust) -> None:
    """Logged functions with their call counts; with NAME, that function's calls (in its latest session unless
    --session S); with --session S alone, every call of session S."""
    from casmon.calllog import ranges_text

    log = _load_log(store_location)
    known = set(log.sessions).union(*(fi.sessions for fi in log.functions.values()))
    if session is not None and session not in known:
        raise click.ClickException(f"no session {session}; " + (f"sessions: {ranges_text(sorted(known))}"
                                                                 if known else "no sessions recorded"))
    if name is None and session is None:
        _function_table(log)
        return
    if name is None:
        selected = sorted(log.calls(session=session), key=lambda c: (c.start, c.name, c.n))
        if not selected:
            console.print(f"session {session} logged no calls")
            return
        functions = len({c.name for c in selected})
        title = f"call log {log.store.url} — session {session}: {plural(len(selected), 'call')} of " \
                f"{plural(functions, 'function')}"
        _call_table(log, title, selected, limit, with_function=True)
        return
    try:
        full = log.resolve(name)
        fi = log.functions[full]
        if session is None and fi.sessions:
            session = max(fi.sessions)
        selected = log.calls(full, session=session)
    except LookupError as e:
        raise click.ClickException(one_line(e)) from None
    if not selected:
        where = (f"its calls are in {'session' if len(fi.sessions) == 1 else 'sessions'} "
                 f"{ranges_text(sorted(fi.sessions))}" if fi.sessions else "it has no logged calls yet")
        console.print(f"{full} has no calls in session {session}; {where}" if session is not None
                      else f"{full} has no logged calls yet", markup=False)
        return
    _call_table(log, f"{log.signature(full)} — session {session}: {plural(len(selected), 'call')}", selected, limit)


def _function_table(log) -> None:
    """The logged functions with their call counts and sessions (`casmon calls`)."""
    from casmon.calllog import ranges_text

    if not log.functions:
        console.print("no logged calls")
        return
    t = Table(title=f"call log {log.store.url}: {plural(len(log.functions), 'function')}, {plural(len(log.sessions), 'session')}")
    columns: tuple[tuple[str, JustifyMethod], ...] = (("function", "left"), ("calls", "right"), ("sessions", "left"),
                                                     ("latest session", "right"))
    for col, just in columns:
        t.add_column(col, justify=just)
    for fname, fi in log.functions.items():
        sess = sorted(fi.sessions)
        latest = f"{len(fi.sessions[sess[-1]]):,} in {sess[-1]}" if sess else ""
        t.add_row(escape(str(log.signature(fname))), f"{fi.total():,}", ranges_text(sess), latest)
    console.print(t)


def _call_table(log, title: str, selected: list, limit: int, with_function: bool = False) -> None:
    """Calls as a table, at most ``limit`` of them (`casmon calls NAME`, `casmon calls --session S`)."""
    t = Table(title=escape(title))
    for col in ("function",) * with_function + ("#", "start", "duration", "thread", "arguments", "result"):
        t.add_column(col)
    for c in selected[:limit]:
        args = [_cell_summary(log, a) for a in c.args_cells] + [f"{k}={_cell_summary(log, v)}" for k, v in c.kwargs_cells.items()]
        res = f"[red]raised {escape(str(c.exception[0]))}[/red]" if c.exception else escape(_cell_summary(log, c.result_cell))
        t.add_row(*(escape(c.name),) * with_function, str(c.n), timestamp(c.start), f"{c.duration * 1e3:.3f} ms",
                  escape(str(c.thread_name)), escape(", ".join(args)), res)
    console.print(t)
    if len(selected) > limit:
        console.print(f"… {len(selected) - limit:,} more (--limit)")


@click.command()
@click.argument("name")
@click.argument("n", type=int, required=False)
@store_option
@click.option("--session", type=int, help="Session (default: the latest with calls of NAME).")
@click.option("--json", "as_json", is_flag=True, help="`show RUN` only: the run as JSON (manifest, status, params, metrics).")
@trust_option
def show(name, n, store_location, session, as_json, trust) -> None:
    """`show RUN`: a recorded run. `show NAME N`: the inputs, result and timing of call N of function NAME."""
    if n is None:
        if session is not None:
            raise click.UsageError(f"--session is for `show NAME N` (a call of a logged function): "
                                   f"name the call, `casmon show {name} N --session {session}`")
        show_run(name, store_location, as_json)
        return
    if as_json:
        raise click.UsageError("--json is for `show RUN`")
    log = _load_log(store_location)
    trust_values = trusted()

    def load(cell):
        if not trust_values:  # pickles that could run code are described
            return log.peek_cell(cell)
        # a value whose code cannot load is one line among the others
        return load_or_say(lambda: log.load_cell(cell), lambda: log.describe_cell(cell, 80))
    try:
        c = log.call(name, n, session)
        a = log.bind(c, [load(x) for x in c.args_cells], {k: load(v) for k, v in c.kwargs_cells.items()}, load)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(one_line(e)) from None
    console.print(f"[bold]{escape(str(c.name))}[/bold] call {c.n} of session {c.session}")
    console.print(f"  started {timestamp(c.start)}, took {c.duration * 1e3:.3f} ms, process {c.pid}, thread {c.thread_name}"
                  + (f", rank {c.rank}" if c.rank is not None else ""), markup=False)
    for k, v in vars(a).items():
        console.print(f"  {k} = {value_text(v, 200)}", markup=False, soft_wrap=True)  # a reason is one line
    if c.exception:
        console.print(f"  raised {c.exception[0]}: {c.exception[1]}", markup=False)
    else:
        if not c.result_recorded:
            console.print("  result: not recorded (intercept(result=False))", markup=False)
        else:
            console.print(f"  result = {value_text(load(c.result_cell), 200)}", markup=False, soft_wrap=True)


@click.command()
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
    from casmon.calllog.writer import not_logged

    with not_logged():  # a script's top level may call its logged functions: a replay logs no call
        modules = [_import_code(spec) for spec in imports]
    target = _vouched_function(c.name, modules)
    try:
        r = log.replay(c.name, c.n, c.session, fn=target)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(one_line(e)) from None
    except Exception as e:  # noqa: BLE001 - what the function raises is the replay's result; this is loading a value
        why = Unloadable("", e).why()  # (a trusted pickle's module not found, say)
        raise click.ClickException(f"cannot replay {c.name} call {c.n} (session {c.session}): {why}") from None
    if r.matches:
        console.print(f"[green]{escape(str(r.name))} call {r.n} (session {r.session}): same result as recorded[/green] ({escape(str(r.replayed))})")
    else:
        console.print(f"[red]{escape(str(r.name))} call {r.n} (session {r.session}): result differs[/red]\n  recorded {escape(str(r.recorded))}\n  now      {escape(str(r.replayed))}")
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
    from casmon.calllog import registered_function

    def unwrap(obj):
        fi = getattr(obj, "__casmon_intercept__", None)
        return fi.fn if fi is not None else obj

    mod_names = {m.__name__ for m in modules}
    fn = registered_function(name)  # registered by @casmon.intercept while the --import code ran
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
