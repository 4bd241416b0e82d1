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
named with ``--import``. A casmon error is one line on stderr and exit status 1.
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
    """Turns casmon's errors (and lookups of what does not exist) into one line on stderr, exit status 1."""

    def invoke(self, ctx: click.Context) -> Any:
        import warnings

        # casmon's warnings (a damaged file skipped, ...) are one line each on stderr, like its errors.
        warnings.showwarning = show_warning
        try:
            return super().invoke(ctx)
        except (CasmonError, LookupError) as e:
            raise click.ClickException(one_line(e)) from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
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
