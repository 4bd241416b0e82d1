"""The verbs that label runs: ``tag RUN +x -y`` and ``note RUN TEXT`` (ended runs too; every edit kept)."""

from __future__ import annotations

import click

from casmon.cli.options import console, one_line, open_store, say, store_option, timestamp
from casmon.errors import CasmonError


def _changes(changes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``+x`` (or a bare ``x``) adds, ``-y`` removes."""
    add, remove = [], []
    for c in changes:
        if c.startswith("-"):
            remove.append(c[1:])
        else:
            add.append(c[1:] if c.startswith("+") else c)
    return add, remove


def _history(r) -> None:
    for e in r.edits()[-50:]:
        when = timestamp(e["time"]) if isinstance(e.get("time"), (int, float)) else "?"
        what = (f"note: {e['note']!r:.200}" if "note" in e else
                " ".join([*(f"+{t}" for t in e["add"]), *(f"-{t}" for t in e["remove"])]))
        console.print(f"  {when}  {e['who']}  {what}", markup=False)


@click.command("tag", context_settings={"ignore_unknown_options": True})
@click.argument("run")
@click.argument("changes", nargs=-1, type=click.UNPROCESSED)
@store_option
@click.option("--history", is_flag=True, help="Also list every change of RUN's tags and note, oldest first.")
@click.pass_context
def tag_cmd(ctx, run, changes, store_location, history) -> None:
    """Add (+x) and remove (-y) tags of RUN, ended or not; with no change, its tags."""
    from casmon.runs import load_run, tag_run

    add, remove = _changes(changes)
    store = open_store(store_location or (ctx.obj or {}).get("store"), read_only=not changes, trust=False)
    try:
        try:
            if changes:
                tag_run(run, add, remove, store=store)
            r = load_run(run, store)
        except (LookupError, ValueError, TypeError, CasmonError) as e:
            raise click.ClickException(one_line(e)) from None
        say(f"run {r.name}: " + (" ".join(r.tags) if r.tags else "no tags"), markup=False)
        if history:
            _history(r)
    finally:
        store.close()


@click.command("note")
@click.argument("run")
@click.argument("text", nargs=-1)
@store_option
@click.option("--clear", is_flag=True, help="Remove RUN's note (its history keeps it).")
@click.pass_context
def note_cmd(ctx, run, text, store_location, clear) -> None:
    """Set RUN's note to TEXT, ended or not (the notes before stay in its history); with no TEXT, its note."""
    from casmon.runs import load_run, note_run

    if clear and text:
        raise click.ClickException("note: give TEXT or --clear, not both")
    edit = clear or bool(text)
    store = open_store(store_location or (ctx.obj or {}).get("store"), read_only=not edit, trust=False)
    try:
        try:
            if edit:
                note_run(run, "" if clear else " ".join(text), store=store)
            r = load_run(run, store)
        except (LookupError, ValueError, TypeError, CasmonError) as e:
            raise click.ClickException(one_line(e)) from None
        if edit:
            say(f"run {r.name}: note {'cleared' if clear else 'set'}", markup=False)
            return
        say(f"run {r.name}: " + (r.note if r.note else "no note"), markup=False)
        _history(r)
    finally:
        store.close()
