"""``casmon ui`` and ``casmon report``: runs, calls and cached results in a browser.

A read-only web app on the standard library's ``http.server`` (no dependency
beyond casmon's own; see docs/ARCHITECTURE.md). One job a module:

* ``model.py`` -- the index of runs (fresh at every request, cheap by the refs) and call statistics;
* ``table.py`` -- the runs table: column groups, the filter and its errors, sorting;
* ``compare.py`` -- a comparison of runs: side by side, identical outputs, diffs, diverging calls;
* ``series.py`` -- what charts draw: metrics downsampled and grouped for the dashboard, info sequences, a page's
  chart block;
* ``parcoords.py`` -- what the runs page's parallel coordinates draw: its runs' parameters and metric summaries;
* ``values.py`` -- values in cells: summaries, sparklines, JSON data blocks;
* ``api.py`` -- the JSON endpoints the pages poll while runs go on, and the dashboards' series;
* ``pages.py`` (layout, the report file's frame, runs, calls, store), ``runpage.py`` (a run, and the
  report of one run), ``comparepage.py`` (the report of two or more), ``cachepage.py`` (cached functions,
  their code versions and entries, one entry and what differs from its nearest) -- HTML, every store
  string escaped;
  ``charts.py`` -- the small SVG charts;
* ``server.py`` routes GET requests; ``report.py`` writes the report file;
* ``static/`` -- the style sheet and scripts, and uPlot (vendored: ``static/README.md``).

The ``casmon ui`` and ``casmon report`` verbs are in ``casmon.cli.ui`` (the
command line is the layer above). Importing this package starts nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import os

    from casmon.ui.server import UIServer

__all__ = ["make_server", "report_html", "write_report"]


def make_server(store: Any, host: str = "127.0.0.1", port: int = 0, trust: bool = False, verbose: bool = False,
                index: bool = True) -> UIServer:
    """A server ready to ``serve_forever()`` (see :func:`casmon.ui.server.make_server`)."""
    from casmon.ui.server import make_server as make

    return make(store, host, port, trust, verbose, index)


def report_html(store: Any, runs: list[str], trust: bool = False) -> tuple[bytes, int]:
    from casmon.ui.report import report_html as make

    return make(store, runs, trust)


def write_report(store: Any, runs: list[str], output: str | os.PathLike[str], trust: bool = False) -> tuple[Path, int]:
    from casmon.ui.report import write_report as write

    return write(store, runs, output, trust)
