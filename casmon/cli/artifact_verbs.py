"""The verbs of what runs keep: ``artifacts RUN``, ``get RUN NAME -o PATH`` and ``rm RUN``."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from casmon.cli.options import console, one_line, open_store, say, store_option, trust_option
from casmon.errors import CasmonError
from casmon.view.text import plural, size


def _run(which, store):
    from casmon.runs import load_run

    try:
        return load_run(which, store)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(one_line(e)) from None


@click.command("artifacts")
@click.argument("run")
@store_option
@click.option("--json", "as_json", is_flag=True, help="Print the artifacts as JSON.")
@click.option("--shared", "count_shared", is_flag=True,
              help="Also count the share other runs, cache entries and refs hold (reads the whole store).")
@trust_option
@click.pass_context
def artifacts_cmd(ctx, run, store_location, as_json, count_shared, trust) -> None:
    """What RUN saved: artifacts and checkpoints, with their sizes; with --shared, the share other runs hold."""
    store = open_store(store_location or (ctx.obj or {}).get("store"), read_only=True)
    r = _run(run, store)
    try:
        arts = r.artifacts(shared=count_shared)
    except CasmonError as e:
        raise click.ClickException(one_line(e)) from None
    if as_json:
        click.echo(json.dumps(arts, indent=2))
        return
    if not arts:
        say(f"run {r.name} saved no artifacts (run.save, run.save_file, run.checkpoint)", markup=False)
        return
    t = Table(title=f"run {escape(r.name)}: {plural(len(arts), 'artifact')}")
    for col in ("name", "kind", "size", "stored", *(("shared",) if count_shared else ())):
        t.add_column(col, justify="left" if col in ("name", "kind") else "right")
    for a in arts:
        kind = a["kind"] + (f" ({plural(a['files'], 'file')})" if a.get("files") is not None else "")
        shared = "?" if a["shared"] is None else f"{size(a['shared'])} ({a['shared'] / a['stored']:.0%})" if a["stored"] else "0"
        t.add_row(escape(a["name"]), kind, size(a["size"]), size(a["stored"]), *((shared,) if count_shared else ()))
    console.print(t)
    if count_shared:
        say("stored: what the store holds for it, compressed; shared: the part another run, cache entry or ref also "
            "holds (deleting this run would not free it)", markup=False)
    else:
        say(f"stored: what the store holds for it, compressed; `casmon artifacts {r.name} --shared` also counts the "
            "part another run, cache entry or ref holds (it reads the whole store)", markup=False)


@click.command("get")
@click.argument("run")
@click.argument("name")
@click.option("-o", "--output", "dest", required=True, type=click.Path(), help="Where to write it (a file, or a folder).")
@store_option
@trust_option
@click.pass_context
def get_cmd(ctx, run, name, dest, store_location, trust) -> None:
    """Write artifact NAME of RUN to PATH (a file, or a folder's files)."""
    store = open_store(store_location or (ctx.obj or {}).get("store"), read_only=True, trust=trust)
    r = _run(run, store)
    try:
        out = r.load_file(name, dest)
    except (LookupError, CasmonError, OSError) as e:
        raise click.ClickException(one_line(e)) from None
    say(f"wrote {name} of run {r.name} to {out}", markup=False)


@click.command("rm")
@click.argument("run")
@store_option
@click.option("--dry-run", is_flag=True, help="Say what would be deleted; change nothing.")
@click.option("--force", is_flag=True, help="Delete a run that is still running too.")
@trust_option
@click.pass_context
def rm_cmd(ctx, run, store_location, dry_run, force, trust) -> None:
    """Delete RUN: its ref and records; gc then frees what no other run or entry holds."""
    from casmon.runs import delete_run

    store = open_store(store_location or (ctx.obj or {}).get("store"), read_only=dry_run, trust=False)
    try:
        d = delete_run(run, store=store, force=force, dry_run=dry_run)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(one_line(e)) from None
    finally:
        store.close()
    verb = "would delete" if dry_run else "deleted"
    say(f"{verb} run {d.name} ({d.status}): {plural(d.records, 'record')}, {plural(d.artifacts, 'artifact')}. "
        f"What only it held is freed by gc: `casmon gc` condemns it and a gc at least --grace (default an hour) later "
        f"removes it", markup=False)
