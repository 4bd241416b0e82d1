"""``casmon ui`` and ``casmon report``: runs, calls and cached results in a browser.

A read-only web app on the standard library's ``http.server`` (no dependency
beyond casmon's own; see docs/ARCHITECTURE.md): ``model.py`` reads what pages
show, ``charts.py`` draws SVG, ``pages.py`` writes HTML (every store string
escaped), ``server.py`` routes GET requests, ``report.py`` writes the compare
page as one file; the ``casmon ui`` and ``casmon report`` verbs are in
``casmon.cli.ui`` (the command line is the layer above). Importing this
package starts nothing.
"""

from __future__ import annotations

__all__ = ["make_server", "report_html", "write_report"]


def make_server(*args, **kwargs):
    from casmon.ui.server import make_server as _make

    return _make(*args, **kwargs)


def report_html(*args, **kwargs):
    from casmon.ui.report import report_html as _r

    return _r(*args, **kwargs)


def write_report(*args, **kwargs):
    from casmon.ui.report import write_report as _w

    return _w(*args, **kwargs)
