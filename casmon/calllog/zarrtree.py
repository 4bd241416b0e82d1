"""The call log's part of the store's zarr view: ``calls/{function}/{session}/{n}``, one group per logged call
(call numbers start again in each session), its arguments under ``args/{name}`` and its result as ``result``.

A stored argument or result is what :func:`casmon.store.zarrvalues.value_node`
makes of it (an array, a frame's group, or a group describing it: nothing is
unpickled); a scalar kept in the record is a group with it as attribute
``value``; ``*args`` and ``**kwargs`` are groups of their items.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from casmon.calllog.reader import Call, CallLog
from casmon.calllog.records import NOT_RECORDED
from casmon.errors import CasmonError, StoreDamageWarning
from casmon.store.zarrvalues import value_node
from casmon.store.zarrview import Tree, install_section, json_attrs, node_name

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["build"]


def _cell(store: Store, tree: Tree, path: str, cell: Any, where: str) -> None:
    if isinstance(cell, dict) and "$" in cell:
        value_node(store, tree, path, cell["$"], {}, where)
    elif isinstance(cell, dict) and "!" in cell:
        tree.group(path, {"casmon": {"not_stored": str(cell["!"])[:200], "why": str(cell.get("why", ""))[:500]}})
    elif cell == NOT_RECORDED:
        tree.group(path, {"casmon": {"not_recorded": True}})
    else:
        tree.group(path, {"value": json_attrs(cell)})


def _call(store: Store, log: CallLog, tree: Tree, c: Call) -> None:
    path = f"calls/{node_name(c.name)}/{c.session}/{c.n}"
    where = f"{c.name} call {c.n} (session {c.session})"
    tree.group(path, {"function": c.name, "session": c.session, "n": c.n, "pid": c.pid, "thread": c.thread_name,
                      "start": c.start, "duration": c.duration,
                      "exception": list(c.exception) if c.exception is not None else None})
    try:
        bound = log.bind(c, c.args_cells, c.kwargs_cells, load=lambda cell: cell)._asdict()
    except (CasmonError, LookupError, TypeError, ValueError):
        bound = {str(i): v for i, v in enumerate(c.args_cells)} | {str(k): v for k, v in c.kwargs_cells.items()}
    tree.group(f"{path}/args")
    for name, cell in bound.items():
        at = f"{path}/args/{node_name(str(name))}"
        if isinstance(cell, tuple) or (isinstance(cell, dict) and not ({"$", "!"} & set(cell)) and cell != NOT_RECORDED):
            tree.group(at)  # *args or **kwargs: their items
            items = enumerate(cell) if isinstance(cell, tuple) else cell.items()
            for k, item in items:
                _cell(store, tree, f"{at}/{node_name(str(k))}", item, f"{where}, argument {name}")
        else:
            _cell(store, tree, at, cell, f"{where}, argument {name}")
    if c.exception is None:
        _cell(store, tree, f"{path}/result", c.result_cell, f"{where}, result")


def build(store: Store, tree: Tree) -> None:
    """Add the logged calls of ``store`` under ``calls/``: the call log read when ``calls/`` is first listed."""
    logs: list[CallLog] = []

    def log() -> CallLog:
        if not logs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", StoreDamageWarning)  # a damaged record is left out; verify says so
                logs.append(CallLog(store))
        return logs[0]

    def names() -> dict[str, str]:
        return {node_name(fn): fn for fn, fi in log().functions.items() if fi.sessions}

    def function(name: str) -> None:
        fn = names()[name]
        for c in log().calls(fn):
            _call(store, log(), tree, c)

    tree.lazy("calls", names, function)


install_section("calls", build)
