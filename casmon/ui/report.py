"""``casmon report``: one run's page, or the compare page of two runs or more, as one self-contained HTML file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from casmon.calllog import CallLog
from casmon.ui import comparepage, lineageview, model, pages, runpage
from casmon.ui.compare import compare


def report_html(store: Any, runs: str | list[str], trust: bool = False) -> tuple[bytes, int]:
    """The report's bytes and how many runs it shows. ``store``: a store or where one is; ``runs``: a name,
    a number or ``latest``, or a list of them."""
    if not hasattr(store, "refs"):  # a path or URL: the store there, never one made for the report
        from casmon.store.store import open as open_store

        store = open_store(store, create=False)
    if isinstance(runs, (str, int)):
        runs = [str(runs)]
    if not runs:
        raise LookupError("a report shows one run or more")
    index = model.RunIndex(store)
    entries = [index.find(w) for w in runs]
    if len({e.ref for e in entries}) != len(entries):
        raise LookupError("a run is named twice")
    infos = [index.run(e) for e in entries]
    for r in infos:
        if r.error is not None:
            raise LookupError(f"run {r.name} cannot be read: {r.error}")
    ctx = pages.Ctx(store.url, trust, standalone=True)
    if len(infos) == 1:  # one run: its own page (traceback, output, a chart per metric, parameters)
        return runpage.report(ctx, entries[0], infos[0]), 1
    linked = sum(1 for r in infos if (r.manifest.get("links") or {}).get("call_sessions"))
    cmp = compare(infos, [e.tail for e in entries], CallLog(store) if linked >= 2 else None, trust)
    return comparepage.report(ctx, cmp, lineageview.first_differences(store, infos)), len(infos)


def write_report(store: Any, runs: str | list[str], output: str | os.PathLike[str], trust: bool = False) -> tuple[Path, int]:
    """Write the report atomically (a temporary file renamed over ``output``)."""
    data, n = report_html(store, runs, trust)
    path = Path(output)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path, n
