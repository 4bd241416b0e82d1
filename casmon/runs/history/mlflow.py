"""MLflow's runs read without MLflow: the file store (``mlruns/``) and the sqlite database (``mlflow.db``).

File store: ``mlruns/<experiment_id>/<run_id>/`` holds ``meta.yaml`` (the
run's scalars: run_id, run_name, status, start_time, end_time, user_id,
lifecycle_stage), ``metrics/<key>`` (lines ``timestamp_ms value step``; a key
with ``/`` is a subfolder), ``params/<key>`` and ``tags/<key>`` (the value is
the file); the experiment's name is in ``mlruns/<experiment_id>/meta.yaml``.
Only top-level ``key: value`` scalars of meta.yaml are read, so no YAML
library is needed. Sqlite: the tables ``runs``, ``experiments``, ``metrics``,
``params`` and ``tags`` through the standard library's sqlite3, read-only,
taking the columns each MLflow version has.

What MLflow keeps as text comes back as the value it was logged from when the
text is exactly that value's ``str`` (``log_param("lr", 0.1)`` keeps
``"0.1"``: 0.1; ``"32"``: 32; ``"True"``: True); anything else stays a string.
Status: FINISHED is ok, FAILED failed, KILLED killed; RUNNING (and SCHEDULED)
become *lost*: an import is a snapshot that casmon never sees go on, and MLflow
has no heartbeat, so a run still marked RUNNING is most often one whose process
died without ending it. MLflow's own status is kept in the run's info.
Deleted runs (and runs of deleted experiments) are not imported.
"""

from __future__ import annotations

import io
import json
import math
import re
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from casmon.runs.history import HistoryError, Metrics, RunHistory, metric_name_problem

__all__ = ["is_run_folder", "is_mlflow_db", "read_meta", "read_run_folder", "read_database", "param_value",
           "STATUS"]

#: MLflow's RunStatus (names, and the numbers the file store writes) -> casmon's status.
STATUS = {"FINISHED": "ok", "FAILED": "failed", "KILLED": "killed", "RUNNING": "lost", "SCHEDULED": "lost"}
_STATUS_NUMBERS = {1: "RUNNING", 2: "SCHEDULED", 3: "FINISHED", 4: "FAILED", 5: "KILLED"}
_TABLES = {"runs", "experiments", "metrics", "params", "tags"}


# ---------------------------------------------------------------------------
# values as MLflow writes them
# ---------------------------------------------------------------------------

def _yaml_scalar(text: str) -> Any:
    """A YAML scalar as PyYAML's safe loader reads the ones MLflow writes: quoted strings, ints, null."""
    t = text.strip()
    if not t or t in ("null", "~", "Null", "NULL"):
        return None if t else ""
    if len(t) >= 2 and t[0] == t[-1] == "'":
        return t[1:-1].replace("''", "'")
    if len(t) >= 2 and t[0] == t[-1] == '"':
        try:
            return json.loads(t)
        except ValueError:
            return t[1:-1]
    if re.fullmatch(r"[-+]?\d+", t):
        return int(t)
    if t in ("true", "True", "false", "False"):
        return t.lower() == "true"
    return t


def read_meta(path: Path) -> dict[str, Any]:
    """The top-level ``key: value`` scalars of a meta.yaml (nested blocks and lists are left out)."""
    out: dict[str, Any] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise HistoryError(f"{path}: cannot read ({e.strerror or e})") from None
    for line in text.splitlines():
        if not line or line[0] in " \t-#":
            continue
        key, sep, value = line.partition(":")
        if sep and key and " " not in key:
            out[key] = _yaml_scalar(value)
    return out


def param_value(text: str) -> Any:
    """A param as the value it was logged from, when ``text`` is exactly that value's ``str``; else the text."""
    if text in ("True", "False"):
        return text == "True"
    if re.fullmatch(r"-?(0|[1-9]\d*)", text):
        return int(text)
    try:
        x = float(text)
    except ValueError:
        return text
    return x if math.isfinite(x) and repr(x) == text else text


def _status(raw: Any) -> tuple[str, str]:
    """(casmon's status, MLflow's name for it)."""
    name = _STATUS_NUMBERS.get(raw, str(raw)) if isinstance(raw, int) else str(raw or "")
    return STATUS.get(name.upper(), "lost"), name


def _seconds(ms: Any) -> float | None:
    return ms / 1000.0 if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms > 0 else None


def _history(*, run_id: str, path: str, name: str, status: Any, start_ms: Any, end_ms: Any, user: Any,
             experiment_id: Any, experiment: Any, params: dict[str, str], tags: dict[str, str], metrics: Metrics,
             notes: list[str], where: str) -> RunHistory:
    """The :class:`RunHistory` both stores give, from what they hold."""
    st, mlflow_status = _status(status)
    start = _seconds(start_ms)
    if start is None:  # a run created but never started: its first point, or nothing better than 0
        firsts = [float(t[0]) for _s, _v, t in metrics.values() if len(t)]
        start = min(firsts) if firsts else 0.0
    end = _seconds(end_ms) if st != "lost" else None
    kept: Metrics = {}
    for key, series in metrics.items():
        problem = metric_name_problem(key)
        if problem:
            notes.append(f"{where}: metric {key[:80]!r} not imported: {problem}")
        else:
            kept[key] = series
    info = {"mlflow": {"run_id": run_id, "experiment_id": str(experiment_id) if experiment_id is not None else None,
                       "experiment": experiment, "status": mlflow_status, "tags": dict(sorted(tags.items()))}}
    if st == "lost":
        notes.append(f"{where}: MLflow says {mlflow_status}: imported as 'lost' (casmon cannot see it go on)")
    return RunHistory(tool="mlflow", id=run_id, path=path, name=name, start=start, end=end, status=st,
                      params={k: param_value(v) for k, v in sorted(params.items())}, info=info, metrics=kept,
                      user=str(user) if user else tags.get("mlflow.user"), notes=notes)


# ---------------------------------------------------------------------------
# the file store
# ---------------------------------------------------------------------------

def is_run_folder(folder: Path) -> bool:
    """Whether ``folder`` is a run of an MLflow file store: a meta.yaml naming a run, beside metrics/ params/ or
    tags/."""
    if not any((folder / d).is_dir() for d in ("metrics", "params", "tags")):
        return False
    try:
        head = (folder / "meta.yaml").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return re.search(r"^run_(id|uuid):", head, re.M) is not None


def _files(folder: Path) -> dict[str, Path]:
    """Key -> file under ``folder`` (keys with ``/`` are subfolders)."""
    if not folder.is_dir():
        return {}
    return {p.relative_to(folder).as_posix(): p for p in sorted(folder.rglob("*")) if p.is_file()}


def _metric_file(path: Path, key: str, where: str, notes: list[str]
                 ) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """A metric file's lines ``timestamp_ms value [step [dataset digest]]`` as (steps, values, times in s)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    torn = 0
    if text and not text.endswith("\n"):  # MLflow appends whole lines: a last one without its newline was cut
        text, torn = text[: text.rfind("\n") + 1], 1  # short by a writer that died mid-write
    first = text.split("\n", 1)[0].split()
    if len(first) in (2, 3, 5):
        try:  # the common file: every line alike, parsed by numpy (~1 s for a million lines)
            width = 2 if len(first) == 2 else 3
            cols = np.loadtxt(io.StringIO(text), dtype=[("t", "<i8"), ("v", "<f8"), ("s", "<i8")][:width],
                              usecols=range(width), ndmin=1, comments=None)
            if len(cols) == text.count("\n"):  # no line skipped
                steps = cols["s"].copy() if width == 3 else np.zeros(len(cols), np.int64)
                if torn:
                    notes.append(f"{where}: metric {key!r}: 1 malformed line(s) skipped")
                return steps, cols["v"].copy(), cols["t"] / 1000.0
        except ValueError:
            pass
    rows = [line.split() for line in text.splitlines() if line.strip()]
    bad = torn
    st: list[int] = []
    va: list[float] = []
    ti: list[float] = []
    for r in rows:
        try:
            if len(r) not in (2, 3, 5):
                raise ValueError
            t, v, s = int(r[0]) / 1000.0, float(r[1]), int(r[2]) if len(r) > 2 else 0
        except (ValueError, OverflowError):
            bad += 1
            continue
        st.append(s)
        va.append(v)
        ti.append(t)
    if bad:
        notes.append(f"{where}: metric {key!r}: {bad} malformed line(s) skipped")
    return np.array(st, np.int64), np.array(va, np.float64), np.array(ti, np.float64)


def read_run_folder(folder: Path, notes: list[str] | None = None, skip: Callable[[str], bool] | None = None
                    ) -> RunHistory | None:
    """One run of a file store. None for a deleted run, or one ``skip(run_id)`` is True for (imported before)."""
    meta = read_meta(folder / "meta.yaml")
    run_id = str(meta.get("run_id") or meta.get("run_uuid") or folder.name)
    if skip is not None and skip(run_id):
        return None
    exp_meta = read_meta(folder.parent / "meta.yaml") if (folder.parent / "meta.yaml").is_file() else {}
    if meta.get("lifecycle_stage") == "deleted" or exp_meta.get("lifecycle_stage") == "deleted":
        if notes is not None:
            notes.append(f"{folder}: a deleted MLflow run: not imported")
        return None
    run_notes: list[str] = []
    try:
        params = {k: p.read_text(encoding="utf-8", errors="replace") for k, p in _files(folder / "params").items()}
        tags = {k: p.read_text(encoding="utf-8", errors="replace") for k, p in _files(folder / "tags").items()}
        metrics = {k: _metric_file(p, k, str(folder), run_notes) for k, p in _files(folder / "metrics").items()}
    except OSError as e:
        raise HistoryError(f"{folder}: cannot read this MLflow run ({e.strerror or e})") from None
    name = str(meta.get("run_name") or tags.get("mlflow.runName") or run_id)
    return _history(run_id=run_id, path=str(folder), name=name, status=meta.get("status"),
                    start_ms=meta.get("start_time"), end_ms=meta.get("end_time"), user=meta.get("user_id"),
                    experiment_id=meta.get("experiment_id", exp_meta.get("experiment_id")),
                    experiment=exp_meta.get("name"), params=params, tags=tags, metrics=metrics, notes=run_notes,
                    where=str(folder))


# ---------------------------------------------------------------------------
# the sqlite store
# ---------------------------------------------------------------------------

class _NotMlflow(HistoryError):
    """A readable sqlite database that is not MLflow's."""


def _open(path: Path) -> sqlite3.Connection:
    """``path`` opened read-only; :class:`HistoryError` naming it when it is not a readable sqlite database."""
    try:
        con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as e:
        raise HistoryError(f"{path}: not a readable sqlite database ({e})") from None
    if not _TABLES <= tables:
        con.close()
        raise _NotMlflow(f"{path}: not an MLflow database (it lacks the tables "
                         f"{', '.join(sorted(_TABLES - tables))})")
    return con


def is_mlflow_db(path: Path) -> bool:
    """Whether a sqlite file met in a folder is to be read as MLflow's: yes unless it is a readable database
    without MLflow's tables (a damaged one is read, so that the import says what is wrong with it)."""
    try:
        _open(path).close()
    except _NotMlflow:
        return False
    except HistoryError:
        return True
    return True


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {r[1] for r in con.execute(f"PRAGMA table_info({table})")}


def read_database(path: Path, notes: list[str] | None = None, skip: Callable[[str], bool] | None = None
                  ) -> list[RunHistory]:
    """Every run of an MLflow sqlite database but deleted ones and those ``skip(run_id)`` is True for."""
    con = _open(path)
    try:
        return _read_database(con, path, notes, skip)
    except sqlite3.Error as e:
        raise HistoryError(f"{path}: this MLflow database cannot be read ({e})") from None
    finally:
        con.close()


def _read_database(con: sqlite3.Connection, path: Path, notes: list[str] | None,
                   skip: Callable[[str], bool] | None) -> list[RunHistory]:
    run_cols = _columns(con, "runs")
    metric_cols = _columns(con, "metrics")
    name_col = "r.name" if "name" in run_cols else "NULL"
    exp_stage = "e.lifecycle_stage" if "lifecycle_stage" in _columns(con, "experiments") else "NULL"
    rows = con.execute(
        f"SELECT r.run_uuid, {name_col}, r.status, r.start_time, r.end_time, r.user_id, r.lifecycle_stage, "
        f"r.experiment_id, e.name, {exp_stage} FROM runs r LEFT JOIN experiments e "
        "ON e.experiment_id = r.experiment_id ORDER BY r.start_time, r.run_uuid").fetchall()
    step = "step" if "step" in metric_cols else "0"
    is_nan = "is_nan" if "is_nan" in metric_cols else "0"
    out = []
    for run_id, name, status, start, end, user, stage, exp_id, exp_name, exp_stage_v in rows:
        if skip is not None and skip(str(run_id)):
            continue
        where = f"{path} run {run_id}"
        if stage == "deleted" or exp_stage_v == "deleted":
            if notes is not None:
                notes.append(f"{where}: a deleted MLflow run: not imported")
            continue
        params = {k: str(v) for k, v in con.execute("SELECT key, value FROM params WHERE run_uuid = ?", (run_id,))}
        tags = {k: str(v) if v is not None else "" for k, v in
                con.execute("SELECT key, value FROM tags WHERE run_uuid = ?", (run_id,))}
        points: dict[str, tuple[list[int], list[float], list[float]]] = {}
        # rowid: the order the points were logged in, as the file store's lines are
        for key, value, ts, st, nan in con.execute(
                f"SELECT key, value, timestamp, {step}, {is_nan} FROM metrics WHERE run_uuid = ? ORDER BY rowid",
                (run_id,)):
            p = points.get(key)
            if p is None:
                p = points[key] = ([], [], [])
            p[0].append(int(st))
            p[1].append(math.nan if nan else float(value))
            p[2].append(int(ts) / 1000.0)
        metrics: Metrics = {k: (np.array(s, np.int64), np.array(v, np.float64), np.array(t, np.float64))
                            for k, (s, v, t) in sorted(points.items())}
        out.append(_history(run_id=str(run_id), path=str(path), name=str(name or tags.get("mlflow.runName") or run_id),
                            status=status, start_ms=start, end_ms=end, user=user, experiment_id=exp_id,
                            experiment=exp_name, params=params, tags=tags, metrics=metrics, notes=[], where=where))
    return out
