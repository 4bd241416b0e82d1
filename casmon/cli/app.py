"""The ``casmon`` command: its group, which turns errors into one line, and the verbs registered on it.

The verbs live by what they look at: ``store_verbs`` (stats, verify, gc),
``cache_verbs``, ``call_verbs`` (calls, show, replay), ``tag_verbs`` (tag, note), ``run_verbs`` (runs,
diff, restore, export), ``artifact_verbs`` (artifacts, get, rm), ``lineage_verbs`` (lineage, used-by, stale),
``import_verb``,
``demo`` and ``ui`` (ui, report);
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

import importlib
from typing import Any

import click

from casmon.cli.options import one_line, show_warning, trust_option
from casmon.errors import CasmonError
from casmon.view.text import did_you_mean

__all__ = ["main", "VERBS"]

#: Each verb: the module and name of its command, and its one-line summary (the first sentence of its help; a
#: test keeps the two equal). ``casmon --help`` lists the verbs from here, importing none of them; a verb's
#: module is imported when the verb runs, so ``casmon runs`` never loads the browser view or the importers.
VERBS: dict[str, tuple[str, str, str]] = {
    "artifacts": ("casmon.cli.artifact_verbs", "artifacts_cmd",
                  "What RUN saved: artifacts and checkpoints, with their sizes; with --shared, the share other runs hold."),
    "cache": ("casmon.cli.cache_verbs", "cache", "Cached functions: entries, hits, sizes."),
    "calls": ("casmon.cli.call_verbs", "calls",
              "Logged functions with their call counts; with NAME, that function's calls (in its latest session "
              "unless --session S); with --session S alone, every call of session S."),
    "demo": ("casmon.cli.demo", "demo", "Store and reload a few values; show deduplication and the store's stats."),
    "diff": ("casmon.cli.run_verbs", "diff_cmd",
             "What differs between runs A and B: code, tracked files, metadata, info, results."),
    "export": ("casmon.cli.run_verbs", "export_cmd",
               "Write RUN as a plain folder: information.json, current_changes.patch, console.log, tracked files, "
               "artifacts; with --zarr OUT, the store (or the runs, functions and entries named) as a zarr v3 hierarchy."),
    "lineage": ("casmon.cli.lineage_verbs", "lineage_cmd",
                "Where TARGET's inputs came from: a run, a cached function or an entry (key or result digest), "
                "upstream."),
    "gc": ("casmon.cli.store_verbs", "gc", "Remove objects no record or ref reaches, and repack sparse packs."),
    "get": ("casmon.cli.artifact_verbs", "get_cmd", "Write artifact NAME of RUN to PATH (a file, or a folder's files)."),
    "import": ("casmon.cli.import_verb", "import_command",
               "Import TensorBoard and MLflow runs, callmonitor 0.3 folders and FineCache 0.1 cache and run folders "
               "from PATH."),
    "note": ("casmon.cli.tag_verbs", "note_cmd",
             "Set RUN's note to TEXT, ended or not (the notes before stay in its history); with no TEXT, its note."),
    "replay": ("casmon.cli.call_verbs", "replay",
               "Run call N of NAME again and check the result against the recorded one (exit 1 if it differs)."),
    "report": ("casmon.cli.ui", "report_command",
               "Write RUNS (names, numbers or `latest`) as one self-contained HTML file."),
    "restore": ("casmon.cli.run_verbs", "restore_cmd",
                "Write RUN's code into TARGET: its commit, its uncommitted changes, its tracked files."),
    "rm": ("casmon.cli.artifact_verbs", "rm_cmd",
           "Delete RUN: its ref and records; gc then frees what no other run or entry holds."),
    "runs": ("casmon.cli.run_verbs", "runs",
             "Recorded runs: number, comment, time, status, commit, dirty, and the latest value of each metric."),
    "show": ("casmon.cli.call_verbs", "show", "`show RUN`: a recorded run."),
    "stale": ("casmon.cli.lineage_verbs", "stale_cmd",
              "Entries and runs whose upstream changed since they were made (code, a file, a cleared entry), with "
              "why."),
    "stats": ("casmon.cli.store_verbs", "stats", "Values, chunks, bytes, dedup ratio and files of a store."),
    "used-by": ("casmon.cli.lineage_verbs", "used_by_cmd",
                "What consumed TARGET, transitively: entries and runs downstream of a function (FN or FN@VERSION), "
                "an entry, a file (FILE, or FILE@DIGEST for one content of it, as lineage prints it) or a digest."),
    "tag": ("casmon.cli.tag_verbs", "tag_cmd", "Add (+x) and remove (-y) tags of RUN, ended or not; with no change, its tags."),
    "ui": ("casmon.cli.ui", "ui_command", "Look at runs, calls and cached results in a browser (read-only)."),
    "verify": ("casmon.cli.store_verbs", "verify", "Re-hash every object and follow every pointer."),
}


class _Group(click.Group):
    """Turns every error into one line on stderr and exit status 1: casmon's errors, lookups of what does not
    exist, and usage errors (click's own usage block and status 2 are for its help, which stays as it is).
    Its verbs are loaded when used (:data:`VERBS`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(VERBS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = self.commands.get(cmd_name)
        if cmd is None and cmd_name in VERBS:
            module, attr, _summary = VERBS[cmd_name]
            cmd = getattr(importlib.import_module(module), attr)
            self.commands[cmd_name] = cmd
        return cmd

    def resolve_command(self, ctx: click.Context, args: list[str]) -> tuple[str | None, click.Command | None, list[str]]:
        name = click.utils.make_str(args[0])
        if self.get_command(ctx, name) is None and not name.startswith("-") and not ctx.resilient_parsing:
            hint = did_you_mean(name, self.list_commands(ctx))
            if hint:
                raise click.UsageError(f"no such command {name!r}; {hint}", ctx)
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click lists commands, but a verb not loaded yet is described by its summary in :data:`VERBS`."""
        names = [n for n in self.list_commands(ctx) if n in VERBS or not self.commands[n].hidden]
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        rows: list[tuple[str, str]] = []
        for n in names:
            cmd = self.commands.get(n) or click.Command(n, help=VERBS[n][2])  # cut as click cuts the verb's own
            rows.append((n, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)

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


if __name__ == "__main__":  # pragma: no cover
    main()
