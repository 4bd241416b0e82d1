"""``casmon ui`` and ``casmon report``: the verbs that serve and write ``casmon.ui``'s pages.

``casmon --trust ui`` counts like ``casmon ui --trust`` (``options.trusted``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from casmon.cli.options import STORE_HELP, open_store, trusted
from casmon.view.text import size

TRUST_HELP = "Load pickled values to show them (this can run code written by whoever wrote the store). Default: describe them."


@click.command("ui")
@click.option("--store", "store_location", envvar="CASMON_STORE", default=None, metavar="PATH_OR_URL", help=STORE_HELP)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to listen on. Other machines can reach the UI only if you name another address.")
@click.option("--port", default=8470, show_default=True, type=click.IntRange(0, 65535), help="The port (0: any free port).")
@click.option("--trust", is_flag=True, default=False, help=TRUST_HELP)
@click.option("--open", "open_browser", is_flag=True, default=False, help="Open the page in a web browser.")
@click.option("--verbose", is_flag=True, default=False, help="Log every request on stderr.")
def ui_command(store_location, host, port, trust, open_browser, verbose) -> None:
    """Look at runs, calls and cached results in a browser (read-only).

    Runs: a table with one column per info value, sortable and filterable;
    select runs to compare metrics, curves, code, files and environments, and
    see which runs stored identical outputs. Calls, Cache and Store pages too.
    Stop it with Ctrl-C.
    """
    from casmon.ui.server import make_server

    store = open_store(store_location, read_only=True, trust=trust or trusted())
    try:
        server = make_server(store, host, port, trust=trust or trusted(), verbose=verbose, own_process=True)
    except OSError as e:
        raise click.ClickException(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    click.echo(f"casmon ui for {store.url} at {server.url} (read-only; Ctrl-C stops it)")
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"Warning: listening on {host}: anyone who can reach this address can read the store", err=True)
    if open_browser:
        import webbrowser

        webbrowser.open(server.url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        click.echo("stopped", err=True)
    finally:
        server.close()  # the socket, and the background index loader before the store closes under it
        store.close()


@click.command("report")
@click.argument("runs", nargs=-1, required=True)
@click.option("-o", "--output", "output", required=True, type=click.Path(dir_okay=False, writable=True),
              help="The HTML file to write.")
@click.option("--store", "store_location", envvar="CASMON_STORE", default=None, metavar="PATH_OR_URL", help=STORE_HELP)
@click.option("--trust", is_flag=True, default=False, help=TRUST_HELP)
def report_command(runs, output, store_location, trust) -> None:
    """Write RUNS (names, numbers or `latest`) as one self-contained HTML file.

    One run: its page (traceback, output, a chart per metric, parameters and
    info). Two or more: their comparison (charts across runs, what differs).
    Style and script are inside the file; it loads nothing from anywhere, so it
    can be mailed to a colleague and opened offline.
    """
    from casmon.ui.report import write_report

    store = open_store(store_location, read_only=True, trust=trust or trusted())
    try:
        path, n = write_report(store, list(runs), output, trust or trusted())
    except LookupError as e:
        raise click.ClickException(str(e.args[0]) if e.args else str(e)) from None
    except OSError as e:
        raise click.ClickException(f"cannot write {output}: {e.strerror or e}") from None
    finally:
        store.close()
    what = "the report of 1 run" if n == 1 else f"the comparison of {n} runs"
    click.echo(f"wrote {what} to {path} ({size(Path(path).stat().st_size, 'KiB', 0)})")
    sys.stdout.flush()
