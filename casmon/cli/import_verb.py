"""``casmon import``: the verb that keeps callmonitor's and FineCache's folders (``compat.importer``), and TensorBoard's
and MLflow's runs (``runs.history``), in a store."""

from __future__ import annotations

import json
import os

import click

from casmon.cli.options import creating_store_option, see_current_folder
from casmon.errors import CasmonError
from casmon.view.text import short_error


@click.command("import")
@click.argument("path")  # a folder, a file (an event file, mlflow.db) or an MLflow URI (sqlite:///mlflow.db)
@creating_store_option
@click.option("--trust", is_flag=True, default=False,
              help="Load every pickle in PATH, whatever class it names (this runs code from PATH). "
                   "Default: only callmonitor's own classes and plain data load.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def import_command(path: str, store_location: str | None, trust: bool, as_json: bool) -> None:
    """Import TensorBoard and MLflow runs, callmonitor 0.3 folders and FineCache 0.1 cache and run folders from PATH.

    TensorBoard and MLflow: PATH is, or is a folder holding, TensorBoard event
    files (events.out.tfevents.*; a run per folder holding some), an MLflow
    file store (mlruns/) or an MLflow sqlite database (mlflow.db, also as
    sqlite:///mlflow.db). Each run becomes a casmon run with its params and
    metrics; neither tool needs to be installed, and runs imported before are
    skipped.

    Otherwise, PATH is a callmonitor folder (call-monitor*), a folder holding
    several, a FineCache base folder (cache files *.pk and run folders), or
    one run folder. Values are stored by content (deduplicated); importing the
    same data again adds nothing.

    callmonitor and FineCache keep their data as pickles. Without --trust,
    only pickles naming callmonitor's classes and plain data (numbers,
    strings, containers, numpy arrays, dates) are loaded, and nothing they
    name is called; a value needing any other class is recorded as not
    stored. --trust loads everything, as callmonitor's and FineCache's own
    load would: use it only for folders you trust (see docs/SECURITY.md).
    """
    from rich.console import Console

    from casmon.compat.importer import import_path
    from casmon.store.store import open as open_store
    from casmon.view.progress import progress_phases

    if _import_history(path, store_location, as_json):
        return
    if not os.path.isdir(path):
        raise click.BadParameter(f"{path!r} does not exist" if not os.path.exists(path) else
                                 f"{path!r} is not a folder, a TensorBoard event file (events.out.tfevents.*) "
                                 "nor an MLflow database (sqlite)", param_hint="'PATH'")
    trust = trust or bool(click.get_current_context().find_root().params.get("trust"))  # casmon --trust import
    if trust:  # the pickles' classes are the project's: found in the current folder, as by `python -m casmon`
        see_current_folder()
    try:
        store = open_store(store_location, autoflush=None, create=True)
        try:
            with progress_phases(not as_json, Console(stderr=True)) as progress:
                report = import_path(path, store, trust=trust, progress=progress)
        finally:
            store.close()
    except CasmonError as e:
        raise click.ClickException(short_error(e)) from None
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo(report.summary())


# -- TensorBoard and MLflow (casmon.runs.history): tried first, as they are told apart from callmonitor's and
# FineCache's data by their own files alone.
def _import_history(path: str, store_location: str | None, as_json: bool) -> bool:
    """Import PATH's TensorBoard and MLflow runs if it holds some; False (nothing done) if it holds none."""
    from rich.console import Console

    from casmon.runs.history import holds_history, import_history
    from casmon.store.store import open as open_store
    from casmon.view.progress import progress_phases

    try:
        if not holds_history(path):
            return False
        store = open_store(store_location, autoflush=None, create=True)
        try:
            with progress_phases(not as_json, Console(stderr=True)) as progress:
                report = import_history(path, store, progress=progress)
        finally:
            store.close()
    except CasmonError as e:
        raise click.ClickException(short_error(e)) from None
    click.echo(json.dumps(report.as_dict(), indent=2) if as_json else report.summary())
    return True
