"""Experiment records: ``casmon.record`` keeps what a run was; runs are listed, compared, restored.

``recorder`` (record, the run while it goes on), ``cells`` (info and params as manifest cells), ``environment`` (notebook, user, packages), ``manifest`` (the run's record
kind, refs and manifest checks), ``listing`` (``RunInfo``, list and load runs),
``comparison`` (``diff``), ``folders`` (``restore`` and ``export``), ``gitstate``
(the code state through GitPython), ``capture`` (console output), ``metrics``
(``run.log`` and the series it keeps), ``params`` (parameters, flattened),
``live`` (heartbeats, and what a live run writes as it goes), ``signals`` (SIGTERM
and SIGHUP save the run as killed), ``artifacts`` (what a run saves, and
checkpoints), ``deletion`` (``delete_run``), ``resume`` (``record(resume=...)``), ``imported`` (runs brought in from elsewhere),
``session`` (``start_run``/``end_run``: runs that span notebook cells), ``tags`` (tags and notes, and their edits).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = [
    "record", "record_context", "Run", "RunInfo", "RunWarning", "list_runs", "load_run", "diff", "restore", "export",
    "UnsafePathError", "safe_target", "vcs_component", "CodeState", "capture_code_state", "KIND_RUN", "RUN_REFS",
    "PREFIX_RE", "check_run_manifest", "notebook_path", "log", "active_run", "Series", "downsample", "flatten",
    "delete_run", "ResumeError", "start_run", "end_run", "SessionRun", "tag_run", "note_run",
]

#: Each name's module, loaded on first use: ``casmon runs`` needs the listing, not git, capture or comparison.
_HOMES = {
    "diff": "casmon.runs.comparison",
    **dict.fromkeys(["UnsafePathError", "export", "restore", "safe_target", "vcs_component"], "casmon.runs.folders"),
    **dict.fromkeys(["CodeState", "capture_code_state"], "casmon.runs.gitstate"), "delete_run": "casmon.runs.deletion",
    **dict.fromkeys(["RunInfo", "list_runs", "load_run"], "casmon.runs.listing"),
    **dict.fromkeys(["KIND_RUN", "PREFIX_RE", "RUN_REFS", "check_run_manifest"], "casmon.runs.manifest"),
    **dict.fromkeys(["Series", "downsample"], "casmon.runs.metrics"), "flatten": "casmon.runs.params",
    "ResumeError": "casmon.runs.resume",
    **dict.fromkeys(["start_run", "end_run", "SessionRun"], "casmon.runs.session"),
    **dict.fromkeys(["tag_run", "note_run"], "casmon.runs.tags"),
    **dict.fromkeys(["Run", "RunWarning", "active_run", "log", "notebook_path", "record", "record_context"],
                    "casmon.runs.recorder"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'casmon.runs' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from casmon.runs.comparison import diff
    from casmon.runs.deletion import delete_run
    from casmon.runs.folders import UnsafePathError, export, restore, safe_target, vcs_component
    from casmon.runs.gitstate import CodeState, capture_code_state
    from casmon.runs.listing import RunInfo, list_runs, load_run
    from casmon.runs.manifest import KIND_RUN, PREFIX_RE, RUN_REFS, check_run_manifest
    from casmon.runs.metrics import Series, downsample
    from casmon.runs.params import flatten
    from casmon.runs.resume import ResumeError
    from casmon.runs.session import SessionRun, end_run, start_run
    from casmon.runs.tags import note_run, tag_run
    from casmon.runs.recorder import Run, RunWarning, active_run, log, notebook_path, record, record_context
