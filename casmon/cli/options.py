"""What every ``casmon`` verb shares: the consoles, ``--store`` and ``--trust``, opening a store, one-line errors.

The verbs live in several modules (one per kind of thing they look at); they
take these from here so that one rule holds everywhere: ``--trust`` counts
whether given to the group or to the verb, only ``demo`` and ``import`` create
a store, and an error is one line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from casmon.errors import CasmonError, UntrustedStoreError
from casmon.view.text import short_error, short_repr

if TYPE_CHECKING:
    from rich.console import Console

    from casmon.store.store import Store

__all__ = ["console", "err_console", "STORE_HELP", "CREATING_STORE_HELP", "store_option", "creating_store_option",
           "trust_option", "trusted", "open_store", "see_current_folder", "Unloadable", "load_or_say", "value_text",
           "one_line", "show_warning", "timestamp", "say"]

if TYPE_CHECKING:
    console: Console
    err_console: Console


def __getattr__(name: str) -> Any:
    """``console`` and ``err_console``, made on first use: rich is not loaded for ``casmon --help``."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    # Piped output is not wrapped at 80 columns, so it can be searched line by line.
    made = Console(width=None if sys.stdout.isatty() else 160) if name == "console" else Console(stderr=True)
    globals()[name] = made
    return made

#: The help of ``--store`` for the verbs that read or tidy a store: they never make one (a typo must not become a
#: new, empty store that the command then reports on or cleans).
STORE_HELP = ("The store: a folder, a .zip file, memory://name or s3://bucket/prefix (default: $CASMON_STORE, then "
              "./.casmon). This command never creates one: it refuses a path where there is no store "
              "(only `demo` and `import` create stores).")
#: The help of ``--store`` for ``demo`` and ``import``, the two verbs that make a store where there is none.
CREATING_STORE_HELP = ("The store: a folder, a .zip file, memory://name or s3://bucket/prefix (default: $CASMON_STORE, "
                       "then ./.casmon); created if there is none.")


def _store_option(help_text: str) -> Any:
    return click.option("--store", "store_location", envvar="CASMON_STORE", default=None, metavar="PATH_OR_URL",
                        help=help_text)


store_option = _store_option(STORE_HELP)
creating_store_option = _store_option(CREATING_STORE_HELP)

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

    Only ``demo`` and ``import`` create a store: every other command refuses a path where there is none
    (a typo must not become a new, empty store that the command then reports on or cleans).
    """
    from casmon.store.store import open as open_location

    trust = trusted() if trust is None else trust
    if trust:
        see_current_folder()
    try:
        return open_location(location, read_only=read_only, autoflush=None, trust=trust, create=create)
    except CasmonError as e:
        hint = ""
        if location is None and "no such folder" in str(e):  # the default store, looked for where the command ran
            hint = " (name one with --store PATH_OR_URL or $CASMON_STORE, or run the command where .casmon is)"
        raise click.ClickException(str(e) + hint) from None


def see_current_folder() -> None:
    """Let ``--trust`` load the classes of the project the command is run in, as ``python -m casmon`` would.

    A console script starts with its own folder first on ``sys.path``, not the current one, so a pickle of
    ``model.Model`` written by ``python train.py`` would not load from ``casmon --trust``. The current folder
    goes *last*, where ``python -m`` puts it first: a file there named like a module casmon or a library
    imports later (``random.py``, ``types.py``, ``zarr.py``) must not shadow it; a project module named like
    an installed one is the one case this gives up. Only trusted commands call this: without ``--trust``
    nothing of the project is imported, so the folder is not added at all.
    """
    try:
        here = os.getcwd()
    except OSError:  # the current folder was deleted: nothing to add
        return
    if here not in sys.path and "" not in sys.path:
        sys.path.append(here)


class Unloadable:
    """A stored value ``--trust`` could not load, shown in its place: what it is and why it did not load."""

    def __init__(self, description: str, error: BaseException) -> None:
        self.description, self.error = description, error

    def why(self) -> str:
        """The reason in one line, with what to do when the value's module is not to be found."""
        msg = short_error(self.error, 300, typed=True)
        if isinstance(self.error, ImportError) or (isinstance(self.error, AttributeError) and "Can't get" in msg):
            msg += " (casmon --trust finds modules in the current folder and on PYTHONPATH)"
        return msg

    def __repr__(self) -> str:
        return f"<cannot load {self.description}: {self.why()}>"


def load_or_say(load: Callable[[], Any], description: Callable[[], str]) -> Any:
    """``load()``, or an :class:`Unloadable` naming the value (``description()``) and why it did not load.

    Loading a pickle under ``--trust`` runs the code it names, which can raise anything (a missing module, a
    renamed class, a failing ``__setstate__``): the command shows the rest and this value as one line. The
    store's own errors (damage) are the command's and propagate.
    """
    try:
        return load()
    except CasmonError:  # the store's own refusal (damage, an untrusted pickle): the command's error
        raise
    except Exception as e:  # noqa: BLE001 - any error of the code a trusted pickle runs is the value's, not ours
        return Unloadable(description(), e)


def value_text(v: Any, limit: int) -> str:
    """A value as a verb prints it: a short repr, or the whole of why an :class:`Unloadable` did not load."""
    return repr(v) if isinstance(v, Unloadable) else short_repr(v, limit, arrays=True, qualified=True)


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


def say(text: str, **kw: Any) -> None:
    """A sentence on stdout, never cut into lines by the console: a command it suggests (`casmon gc --now`) stays
    whole, to be copied; the terminal wraps what is too long for it."""
    console.print(text, soft_wrap=True, **kw)


def timestamp(t: float) -> str:
    """An epoch time as the local date and time the CLI's tables show (``2024-05-01 14:03:59``)."""
    import datetime as _dt

    try:
        return _dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")
    except (OverflowError, OSError, ValueError, TypeError):  # a crafted store's time
        return "?"
