"""Experiment records: ``casmon.record`` keeps what a run was; runs are listed, compared, restored.

``recorder`` (record, manifests, diff, restore, export), ``gitstate`` (the code
state through GitPython), ``capture`` (console output).
"""

from casmon.runs.recorder import RunInfo, RunWarning, diff, export, list_runs, load_run, record, record_context, restore

__all__ = ["record", "record_context", "RunInfo", "RunWarning", "list_runs", "load_run", "diff", "restore", "export"]
