"""What every ``casmon`` verb shares: the consoles, ``--store`` and ``--trust``, opening a store, one-line errors.

The verbs live in several modules (one per kind of thing they look at); they
take these from here so that one rule holds everywhere: ``--trust`` counts
whether given to the group or to the verb, only ``demo`` and ``import`` create
a store, and an error is one line.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console

from casmon.errors import CasmonError, UntrustedStoreError
from casmon.view.text import short_error

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["console", "err_console", "store_option", "trust_option", "trusted", "open_store", "one_line", "show_warning",
           "timestamp"]

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

trust_option = click.option(
    "--trust", is_flag=True, default=False,
    help="Load pickled values (this can run code written by whoever wrote the store). Default: describe them.",
)


def trusted() -> bool:
    """``--trust`` given to the group (``casmon --trust CMD``) or to the command (``casmon CMD --trust``)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if ctx.params.get("trust"):
            return True
        ctx = ctx.parent
    return False


def open_store(location: str | None, read_only: bool = False, trust: bool | None = None, create: bool = False) -> Store:
    """Open the store; untrusted (no pickle naming a global is loaded) unless ``--trust``.

    Only ``demo`` creates a store: every other command refuses a path where there is none
    (a typo must not become a new, empty store that the command then reports on or cleans).
    """
    from casmon.store.store import open as open_location

    try:
        return open_location(location, read_only=read_only, autoflush=None,
                             trust=trusted() if trust is None else trust, create=create)
    except CasmonError as e:
        raise click.ClickException(str(e)) from None


def one_line(e: BaseException) -> str:
    """An error as the one line the CLI prints; a refused pickle says how to load it."""
    msg = short_error(e) or type(e).__name__
    if isinstance(e, UntrustedStoreError) and "--trust" not in msg:
        msg += " (casmon --trust loads it, if you trust who wrote this store)"
    return msg


def show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
    """casmon's warnings as one line each on stderr, like its errors (``warnings.showwarning``)."""
    text = str(message)
    click.echo(f"Warning: {text[len('casmon: '):] if text.startswith('casmon: ') else text}", err=True)


def timestamp(t: float) -> str:
    """An epoch time as the local date and time the CLI's tables show (``2024-05-01 14:03:59``)."""
    import datetime as _dt

    try:
        return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError, TypeError):  # a crafted store's time
        return "?"
