"""The ``casmon`` command: its group, which turns errors into one line, and the verbs registered on it.

The verbs live by what they look at: ``store_verbs`` (stats, verify, gc),
``cache_verbs``, ``call_verbs`` (calls, show, replay), ``run_verbs`` (runs,
diff, restore, export), ``import_verb``, ``demo`` and ``ui`` (ui, report);
``options`` holds what they share.

Every command takes ``--store PATH_OR_URL`` (default: ``$CASMON_STORE`` or
``./.casmon``). Long work shows a progress bar on a terminal.

Looking never runs code: every command opens the store with ``trust=False``
unless ``--trust`` is given (``casmon --trust show ...`` or ``casmon show ...
--trust``), so a pickle that names a global is described -- its type read from
its opcodes, its size and digest -- not loaded. There is deliberately no
environment variable that turns trust on for every command: trust is a choice
about one store, made where the command is typed. ``replay`` runs only code
named with ``--import``. Every error is one line on stderr and exit status 1: casmon's own, and usage errors
(``Error: missing argument 'B' (see casmon diff --help)``), which click would print as its usage block with
status 2.
"""

from __future__ import annotations

from typing import Any

import click

from casmon.cli.cache_verbs import cache
from casmon.cli.call_verbs import calls, replay, show
from casmon.cli.demo import demo
from casmon.cli.import_verb import import_command
from casmon.cli.options import one_line, show_warning, trust_option
from casmon.cli.run_verbs import diff_cmd, export_cmd, restore_cmd, runs
from casmon.cli.store_verbs import gc, stats, verify
from casmon.cli.ui import report_command, ui_command
from casmon.errors import CasmonError

__all__ = ["main"]


class _Group(click.Group):
    """Turns every error into one line on stderr and exit status 1: casmon's errors, lookups of what does not
    exist, and usage errors (click's own usage block and status 2 are for its help, which stays as it is)."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:  # the group's own options: `casmon --bogus`
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:
            raise click.ClickException(usage_line(e, info_name or self.name or "casmon")) from None

    def invoke(self, ctx: click.Context) -> Any:
        import warnings

        # casmon's warnings (a damaged file skipped, ...) are one line each on stderr, like its errors.
        warnings.showwarning = show_warning
        try:
            return super().invoke(ctx)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as e:  # a verb's arguments, an unknown verb, a verb's own refusal
            verb = f"{ctx.command_path} {ctx.invoked_subcommand}" if ctx.invoked_subcommand else ctx.command_path
            raise click.ClickException(usage_line(e, verb)) from None
        except (CasmonError, LookupError) as e:
            raise click.ClickException(one_line(e)) from None


def usage_line(e: click.UsageError, command: str) -> str:
    """A usage error as one line: what is wrong, and where the command's help is (``see casmon gc --help``)."""
    msg = " ".join(e.format_message().split()).rstrip(".")
    if len(msg) > 1 and msg[0].isupper() and msg[1].islower():  # click's "Missing argument 'B'." as a clause
        msg = msg[0].lower() + msg[1:]
    path = e.ctx.command_path if e.ctx is not None else command
    return f"{msg} (see {path} --help)"


@click.group("casmon", cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="casmon")
@trust_option
def main(trust: bool) -> None:
    """casmon: remember function calls in a content-addressed, deduplicating store.

    Looking into a store never runs code: pickled values are described, not
    loaded, unless you pass --trust. See docs/SECURITY.md.
    """


for _verb in (stats, verify, gc, cache, calls, show, replay, runs, diff_cmd, restore_cmd, export_cmd, demo,
              import_command, ui_command, report_command):
    main.add_command(_verb)


if __name__ == "__main__":  # pragma: no cover
    main()
