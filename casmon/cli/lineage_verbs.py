"""The lineage verbs: ``lineage RUN|FN|ENTRY``, ``used-by FN|ENTRY|FILE[@DIGEST]|DIGEST`` and ``stale`` (casmon.lineage);
each prints text (the first :data:`SHOWN` nodes and how many more, or ``--all``), ``--json`` (nodes with
kind/id/label/link, edges with kind) or ``--dot`` (Graphviz)."""

from __future__ import annotations

from typing import Any

import click

from casmon.cli.options import console, one_line, open_store, store_option, trust_option
from casmon.errors import CasmonError

_json_option = click.option("--json", "as_json", is_flag=True, help="Print the graph as JSON: nodes (kind, id, label, "
                                                                   "link) and edges (from, to, kind).")
_dot_option = click.option("--dot", "as_dot", is_flag=True, help="Print the graph as Graphviz dot.")
_all_option = click.option("--all", "show_all", is_flag=True, help="Print every node (without it: the first "
                                                                 "200 and how many more).")
#: Text prints this many nodes, then how many more (a used-by of a stage can reach most of a store).
SHOWN = 200


def _print(graph: Any, as_json: bool, as_dot: bool, show_all: bool = False) -> None:
    if as_json:
        click.echo(graph.to_json())
    elif as_dot:
        click.echo(graph.to_dot())
    else:
        console.print(graph.text(None if show_all else SHOWN), markup=False, soft_wrap=True)


def _answer(query: str, target: str | None, store_location: str | None, as_json: bool, as_dot: bool) -> Any:
    if as_json and as_dot:
        raise click.UsageError("--json and --dot: choose one")
    import casmon.lineage as lin

    store = open_store(store_location, read_only=True)
    try:
        return getattr(lin, query)(store) if target is None else getattr(lin, query)(target, store)
    except (LookupError, CasmonError) as e:
        raise click.ClickException(one_line(e)) from None


@click.command("lineage")
@click.argument("target")
@store_option
@_json_option
@_dot_option
@_all_option
@trust_option
def lineage_cmd(target, store_location, as_json, as_dot, show_all, trust) -> None:
    """Where TARGET's inputs came from: a run, a cached function or an entry (key or result digest), upstream."""
    _print(_answer("lineage", target, store_location, as_json, as_dot), as_json, as_dot, show_all)


@click.command("used-by")
@click.argument("target")
@store_option
@_json_option
@_dot_option
@_all_option
@trust_option
def used_by_cmd(target, store_location, as_json, as_dot, show_all, trust) -> None:
    """What consumed TARGET, transitively: entries and runs downstream of a function (FN or FN@VERSION), an entry,
    a file (FILE, or FILE@DIGEST for one content of it, as lineage prints it) or a digest."""
    _print(_answer("used_by", target, store_location, as_json, as_dot), as_json, as_dot, show_all)


@click.command("stale")
@store_option
@_json_option
@_dot_option
@_all_option
@trust_option
def stale_cmd(store_location, as_json, as_dot, show_all, trust) -> None:
    """Entries and runs whose upstream changed since they were made (code, a file, a cleared entry), with why."""
    _print(_answer("stale", None, store_location, as_json, as_dot), as_json, as_dot, show_all)
