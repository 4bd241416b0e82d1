"""The call log: ``@casmon.intercept`` records calls; ``casmon.load`` reads them back.

``records`` (the record format: kinds, cells, repair), ``writer`` (intercept,
sessions, the recorder that batches calls), ``engines`` (what launched a session:
a Ray, Dask or multiprocessing worker, a job array's task), ``reader`` (``load`` -> ``CallLog``,
``Call``, ``Args``), ``replay`` (run a logged call again and compare).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "intercept", "load", "flush", "CallLog", "Call", "Args", "NotStored", "Replay", "CallLogWarning", "FunctionInfo",
    "Recorder", "Intercepted", "recorder_for", "find_recorder", "restart_numbering", "registered_function",
    "ranges_text", "type_name", "INLINE_STR", "SCALARS", "NOT_RECORDED", "KIND_CALLS", "KIND_SESSION", "KIND_CALLFN",
    "SESSION_REFS", "session_where",
]

#: Each name's module, loaded on first use: ``@casmon.intercept`` needs the writer, not the reader or replay.
_HOMES = {
    **dict.fromkeys(["Args", "Call", "CallLog", "FunctionInfo", "load", "ranges_text"], "casmon.calllog.reader"),
    **dict.fromkeys(["INLINE_STR", "KIND_CALLFN", "KIND_CALLS", "KIND_SESSION", "NOT_RECORDED", "SCALARS",
                     "SESSION_REFS", "NotStored", "type_name"], "casmon.calllog.records"),
    **dict.fromkeys(["CallLogWarning", "Intercepted", "Recorder", "find_recorder", "flush", "intercept",
                     "recorder_for", "registered_function", "restart_numbering"], "casmon.calllog.writer"),
    "Replay": "casmon.calllog.replay", "session_where": "casmon.calllog.engines",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'casmon.calllog' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from casmon.calllog.engines import session_where
    from casmon.calllog.reader import Args, Call, CallLog, FunctionInfo, load, ranges_text
    from casmon.calllog.records import (INLINE_STR, KIND_CALLFN, KIND_CALLS, KIND_SESSION, NOT_RECORDED, SCALARS,
                                        SESSION_REFS, NotStored, type_name)
    from casmon.calllog.replay import Replay
    from casmon.calllog.writer import (CallLogWarning, Intercepted, Recorder, find_recorder, flush, intercept,
                                       recorder_for, registered_function, restart_numbering)
