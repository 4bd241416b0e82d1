"""MLflow's fluent tracking API on casmon runs: ``import casmon.compat.mlflow as mlflow``.

``start_run`` (a context manager and a plain call; ``run_name``, ``nested``, ``tags``, ``run_id`` to
continue a run), ``end_run``, ``active_run`` and ``last_active_run`` (``.info.run_id``, ``.info.run_name``,
``.info.status``, ``.data``), ``log_param(s)``, ``log_metric(s)`` with ``step``, ``set_tag(s)``,
``log_artifact(s)``, ``log_text``, ``log_dict``, ``set_experiment``, ``set_tracking_uri`` and
``search_runs`` (a pandas DataFrame with MLflow's columns, ``filter_string`` and ``order_by`` as MLflow
reads them, AND-joined) work as MLflow's do; as in MLflow, logging with no active run starts one, and a
run left open ends with the process (``FINISHED``; ``FAILED`` after an uncaught exception).

How MLflow's ideas map onto casmon's: a run is a casmon run (``casmon runs`` lists it) whose ``run_id``
is its ref's name (``3``, ``mnist-3``); ``run_name`` is its comment. An experiment is a run prefix:
``set_experiment("mnist")`` names the runs that follow ``mnist-1``, ``mnist-2`` (``Default`` is no
prefix, id ``0``), and ``search_runs`` reads the current experiment's (every run's when none was set).
The tracking URI is the store: a folder (``file:`` URIs too), ``.zip``, ``memory://``, ``s3://``...;
a tracking server or database URI is refused. Params keep their values (MLflow's columns show them as
strings); metrics logged without a step are at step 0, as MLflow's. A run's ``metrics.x`` is the value
logged last (MLflow's is the one at the highest step, then the latest ``timestamp``: they differ where
steps go back, and ``timestamp`` is not kept). Tags are MLflow's key/value pairs,
kept in the run's info as ``mlflow_tags`` (written when the run ends, so a live run's tags reach
``search_runs`` at its end), and also as a casmon tag ``key=value`` where that is one (``casmon runs
--tag team=a``). Statuses: ok -> ``FINISHED``, failed -> ``FAILED``, killed and lost -> ``KILLED``,
running -> ``RUNNING``. Model flavors, autolog, datasets and traces are not here.
"""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Literal

from casmon.errors import CasmonError
from casmon.runs.listing import list_runs
from casmon.runs.session import SessionRun, end_run as _end_session_run, start_run as _start_session_run
from casmon.runs.tags import check_tag
from casmon.store.store import Store, default_store

__all__ = ["start_run", "end_run", "active_run", "last_active_run", "log_param", "log_params", "log_metric",
           "log_metrics", "set_tag", "set_tags", "log_artifact", "log_artifacts", "log_text", "log_dict",
           "set_experiment", "get_experiment_by_name", "create_experiment", "set_tracking_uri", "get_tracking_uri",
           "search_runs", "ActiveRun", "RunStatus"]

#: casmon's statuses as MLflow says them.
_STATUS = {"ok": "FINISHED", "failed": "FAILED", "killed": "KILLED", "lost": "KILLED", "running": "RUNNING"}
_FROM_MLFLOW = {"FINISHED": "ok", "FAILED": "failed", "KILLED": "killed", "ok": "ok", "failed": "failed",
                "killed": "killed"}
#: URIs that name a tracking server or a database, not a place casmon can keep a store.
_SERVERS = ("http:", "https:", "databricks", "sqlite:", "postgresql", "mysql", "mssql", "uc:")


class RunStatus:
    RUNNING, FINISHED, FAILED, KILLED, SCHEDULED = "RUNNING", "FINISHED", "FAILED", "KILLED", "SCHEDULED"


_state = threading.local()
_tracking_uri: str | None = None
_experiment: str | None = None  # the prefix of the current experiment; None: none set
_last: ActiveRun | None = None


def _err(msg: str) -> CasmonError:
    return CasmonError(f"casmon.compat.mlflow: {msg}")


# -- where runs go: the tracking URI and experiments ------------------------------------------------------
def set_tracking_uri(uri: str | os.PathLike[str]) -> None:
    """The store runs go to: a folder (``file:`` URIs too), a ``.zip``, ``memory://``, ``s3://``, ...."""
    global _tracking_uri
    _tracking_uri = _location(uri)


def _location(uri: Any) -> str:
    text = os.fspath(uri) if isinstance(uri, os.PathLike) else uri
    if not isinstance(text, str) or not text:
        raise _err(f"a tracking URI is a folder or store URL, got {uri!r:.80}")
    if text.lower().startswith(_SERVERS):
        raise _err(f"tracking URI {text!r:.120} names a tracking server or database; casmon keeps runs in a store: "
                   f"give a folder, a .zip file, memory://name or s3://bucket/prefix")
    if text.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return unquote(urlparse(text).path) or "."
    return text


def get_tracking_uri() -> str:
    return _tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") and _location(os.environ["MLFLOW_TRACKING_URI"]) \
        or os.environ.get("CASMON_STORE") or ".casmon"


def _store() -> Store | str | None:
    if _tracking_uri is not None:
        return _tracking_uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    return _location(env) if env else None  # None: casmon's default store ($CASMON_STORE, ./.casmon)


class Experiment:
    """What ``set_experiment`` returns: ``experiment_id`` (the run prefix's name, ``0`` for Default), ``name``."""

    def __init__(self, name: str, prefix: str) -> None:
        self.name = name
        self.experiment_id = prefix.rstrip("-") or "0"
        self.prefix = prefix
        self.lifecycle_stage = "active"
        self.tags: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"<Experiment: experiment_id={self.experiment_id!r}, name={self.name!r}>"


def _prefix(name_or_id: Any) -> str:
    name = str(name_or_id)
    if name in ("Default", "0", ""):
        return ""
    safe = re.sub(r"[^A-Za-z0-9_.]+", "_", name).strip("_")
    if not safe:
        raise _err(f"experiment {name!r:.80} has no letter or digit to name its runs by")
    return safe + "-"


def set_experiment(experiment_name: str | None = None, experiment_id: str | None = None) -> Experiment:
    """Name the runs that follow ``{experiment}-{n}``: an experiment is a run prefix."""
    global _experiment
    which = experiment_name if experiment_name is not None else experiment_id
    if which is None:
        raise _err("set_experiment needs experiment_name or experiment_id")
    _experiment = _prefix(which)
    return Experiment(str(which), _experiment)


def create_experiment(name: str, artifact_location: str | None = None, tags: dict[str, Any] | None = None) -> str:
    """The id of experiment ``name`` (nothing to create: its runs' prefix is its name)."""
    return Experiment(name, _prefix(name)).experiment_id


def get_experiment_by_name(name: str) -> Experiment:
    return Experiment(name, _prefix(name))


def _current_prefix() -> str:
    if _experiment is not None:
        return _experiment
    env = os.environ.get("MLFLOW_EXPERIMENT_NAME") or os.environ.get("MLFLOW_EXPERIMENT_ID")
    return _prefix(env) if env else ""


# -- runs ----------------------------------------------------------------------------------------------
class _Info:
    def __init__(self, run: SessionRun, run_name: str) -> None:
        self._run = run
        self.run_name = run_name
        self.experiment_id = (run.manifest.get("prefix") or "").rstrip("-") or "0"
        self.user_id = run.manifest.get("user")
        self.lifecycle_stage = "active"

    @property
    def run_id(self) -> str:
        return _run_id(self._run.ref) or self._run.name

    run_uuid = run_id

    @property
    def status(self) -> str:
        return _STATUS.get(self._run.manifest.get("status", "running"), "RUNNING")

    @property
    def start_time(self) -> int:
        return int(self._run.manifest["start"] * 1000)

    @property
    def end_time(self) -> int | None:
        end = self._run.manifest.get("end")
        return int(end * 1000) if end is not None else None

    @property
    def artifact_uri(self) -> str:
        return _artifact_uri(self._run.store, self.run_id)


class _Data:
    def __init__(self, run: SessionRun) -> None:
        self._run = run

    @property
    def params(self) -> dict[str, str]:
        return {k: str(v) for k, v in self._run.params.items()}

    @property
    def metrics(self) -> dict[str, float]:
        return {k: v["last"] for k, v in self._run._metrics.ref_summary().items() if isinstance(v, dict)}

    @property
    def tags(self) -> dict[str, str]:
        return dict(self._run.info.get("mlflow_tags") or {})


class ActiveRun:
    """MLflow's ``ActiveRun``: ``.info`` (``run_id``, ``run_name``, ``status``, ...), ``.data``; ended by its
    ``with`` block. ``.casmon_run`` is the casmon run underneath."""

    def __init__(self, run: SessionRun, run_name: str) -> None:
        self.casmon_run = run
        self.info = _Info(run, run_name)
        self.data = _Data(run)

    def __enter__(self) -> ActiveRun:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        _forget(self)
        self.casmon_run.__exit__(exc_type, exc, tb)  # FAILED on an exception, KILLED on Ctrl-C
        return False

    def __repr__(self) -> str:
        return f"<ActiveRun: run_id={self.info.run_id!r}, run_name={self.info.run_name!r}>"


def _run_id(ref: str) -> str:
    return ref.split("/", 1)[1] if "/" in ref else ref


def _artifact_uri(store: Any, run_id: str) -> str:
    url = getattr(store, "url", None) or get_tracking_uri()
    return f"{url}#runs/{run_id}/artifacts"


def _stack() -> list[ActiveRun]:
    st = getattr(_state, "runs", None)
    if st is None:
        st = _state.runs = []
    # Runs ended elsewhere (casmon.end_run, run.end, a signal) are active no more.
    st[:] = [a for a in st if not a.casmon_run._ended]
    return st


def _forget(a: ActiveRun) -> None:
    global _last
    st = _stack()
    if a in st:
        st.remove(a)
    _last = a


def start_run(run_id: str | None = None, experiment_id: str | None = None, run_name: str | None = None,
              nested: bool = False, parent_run_id: str | None = None, tags: dict[str, Any] | None = None,
              description: str | None = None, log_system_metrics: bool | None = None) -> ActiveRun:
    """Start a run (or continue run ``run_id``): use it as ``with start_run() as run:`` or end it with ``end_run``."""
    if tags is not None and not isinstance(tags, dict):
        raise TypeError(f"casmon.compat.mlflow: start_run: tags must be a dict of name -> value, got {type(tags).__name__}")
    st = _stack()
    if st and not nested:
        raise _err(f"run {st[-1].info.run_id} is already active. To start a new run, first end the current run with "
                   f"mlflow.end_run(). To start a nested run, call start_run with nested=True")
    prefix = _prefix(experiment_id) if experiment_id is not None else _current_prefix()
    options: dict[str, Any] = {"store": _store(), "prefix": prefix, "comment": run_name or ""}
    if run_id is not None:
        options.update(resume=run_id, resume_ok=True)
        options.pop("comment")
        options.pop("prefix")
    run = _start_session_run(nested=nested or bool(st), per_thread=True, **options)  # MLflow's runs are per thread
    active = ActiveRun(run, run_name or (run.manifest.get("comment") or run.name))
    st.append(active)
    if description:
        tags = {**(tags or {}), "mlflow.note.content": description}
    if tags:
        set_tags(tags)
    if parent_run_id is not None:
        run.manifest["parent"] = f"runs/{parent_run_id}"
    return active


def end_run(status: str = "FINISHED") -> None:
    """End the active run as ``FINISHED``, ``FAILED`` or ``KILLED``; nothing to do when none is active."""
    which = _FROM_MLFLOW.get(status) or _FROM_MLFLOW.get(status.upper()) if isinstance(status, str) else None
    if which is None:
        raise ValueError(f"casmon.compat.mlflow: end_run: status must be FINISHED, FAILED or KILLED, got {status!r:.80}")
    st = _stack()
    if not st:
        _end_session_run(which)  # a run casmon.start_run started, as MLflow's end_run ends any active run
        return
    a = st[-1]
    _forget(a)
    a.casmon_run.end(which)


def active_run() -> ActiveRun | None:
    """The active run, or None."""
    st = _stack()
    return st[-1] if st else None


def last_active_run() -> ActiveRun | None:
    """The active run, else the run ended last in this process."""
    return active_run() or _last


def _run() -> SessionRun:
    """The active run; one is started if none is (as MLflow's logging functions do)."""
    st = _stack()
    return st[-1].casmon_run if st else start_run().casmon_run


# -- what a run logs -----------------------------------------------------------------------------------------
def log_param(key: str, value: Any, synchronous: bool | None = None) -> Any:
    _run().params[_key(key, "log_param")] = value
    return value


def log_params(params: dict[str, Any], synchronous: bool | None = None, run_id: str | None = None) -> None:
    run = _run()
    for k, v in params.items():
        run.params[_key(k, "log_params")] = v


def log_metric(key: str, value: float, step: int | None = None, synchronous: bool | None = None,
               timestamp: int | None = None, run_id: str | None = None, **kwargs: Any) -> None:
    """Log ``value`` at ``step`` (0 when not given, as MLflow's); ``timestamp`` is casmon's own clock's."""
    _run().log({_key(key, "log_metric"): value}, step=0 if step is None else step)


def log_metrics(metrics: dict[str, float], step: int | None = None, synchronous: bool | None = None,
                run_id: str | None = None, timestamp: int | None = None, **kwargs: Any) -> None:
    _run().log({_key(k, "log_metrics"): v for k, v in metrics.items()}, step=0 if step is None else step)


def _key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"casmon.compat.mlflow: {where}: a key is a non-empty string, got {key!r:.80}")
    return key


def set_tag(key: str, value: Any, synchronous: bool | None = None) -> None:
    set_tags({key: value})


def set_tags(tags: dict[str, Any], synchronous: bool | None = None) -> None:
    """MLflow's key/value tags: kept in the run's info (``mlflow_tags``), and as casmon tag ``key=value`` where
    that is one (no whitespace or comma)."""
    run = _run()
    kept = dict(run.info.get("mlflow_tags") or {})
    for k, v in tags.items():
        kept[_key(k, "set_tag")] = str(v)
        try:
            run.tags.add(check_tag(f"{k}={v}", ""))
        except (TypeError, ValueError):
            pass  # not a casmon tag: kept in mlflow_tags alone
    run.info["mlflow_tags"] = kept


def log_artifact(local_path: str | os.PathLike[str], artifact_path: str | None = None, run_id: str | None = None) -> None:
    """Keep the file (or folder) at ``local_path`` with the run, as ``artifact_path/name``."""
    p = Path(local_path)
    _run().save_file(p, _artifact_name(artifact_path, p.name))


def log_artifacts(local_dir: str | os.PathLike[str], artifact_path: str | None = None, run_id: str | None = None) -> None:
    """Keep every file under ``local_dir``, each as ``artifact_path/its path under local_dir``."""
    root = Path(local_dir)
    if not root.is_dir():
        raise _err(f"log_artifacts: {str(root)!r} is not a folder (log_artifact keeps one file)")
    run = _run()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for f in sorted(filenames):
            full = Path(dirpath) / f
            run.save_file(full, _artifact_name(artifact_path, full.relative_to(root).as_posix()))


def log_text(text: str, artifact_file: str, run_id: str | None = None) -> None:
    _run().save(artifact_file, text.encode("utf-8"))


def log_dict(dictionary: Any, artifact_file: str, run_id: str | None = None) -> None:
    if artifact_file.endswith((".yaml", ".yml")):
        try:
            import yaml  # type: ignore[import-untyped]

            text = yaml.safe_dump(dictionary, default_flow_style=False)
        except ImportError:
            text = json.dumps(dictionary, indent=2)
    else:
        text = json.dumps(dictionary, indent=2)
    log_text(text, artifact_file)


def _artifact_name(artifact_path: str | None, name: str) -> str:
    return f"{artifact_path.strip('/')}/{name}" if artifact_path and artifact_path.strip("/") else name


# -- reading runs back ---------------------------------------------------------------------------------------
def search_runs(experiment_ids: list[str] | None = None, filter_string: str = "", run_view_type: Any = None,
                max_results: int = 100000, order_by: list[str] | None = None, output_format: str = "pandas",
                search_all_experiments: bool = False, experiment_names: list[str] | None = None) -> Any:
    """The runs as a pandas DataFrame with MLflow's columns (``run_id``, ``experiment_id``, ``status``,
    ``artifact_uri``, ``start_time``, ``end_time``, ``metrics.x``, ``params.x``, ``tags.x``), newest first."""
    from casmon.compat import mlflow_search

    if output_format not in ("pandas", "list"):
        raise ValueError(f"casmon.compat.mlflow: search_runs: output_format must be 'pandas' or 'list', got "
                         f"{output_format!r:.40}")
    prefixes: set[str] | None
    if search_all_experiments:
        prefixes = None
    elif experiment_ids is not None or experiment_names is not None:
        prefixes = {_prefix(x) for x in [*(experiment_ids or []), *(experiment_names or [])]}
    else:
        prefixes = {_current_prefix()} if _experiment is not None or os.environ.get("MLFLOW_EXPERIMENT_NAME") else None
    store = default_store(_store(), create=False)
    runs = [r for r in list_runs(store) if prefixes is None or (r.manifest.get("prefix") or "") in prefixes]
    rows = [mlflow_search.row(r, _STATUS, _artifact_uri(store, _run_id(r.ref))) for r in runs]
    rows = mlflow_search.where(rows, filter_string)
    rows = mlflow_search.ordered(rows, order_by)[:max_results]
    return mlflow_search.frame(rows) if output_format == "pandas" else rows


def __getattr__(name: str) -> Any:
    raise AttributeError(f"casmon.compat.mlflow has no {name!r}: it gives MLflow's fluent tracking API (runs, params, "
                         f"metrics, tags, artifacts, search_runs); model flavors, autolog, datasets and traces are not "
                         f"part of it")
