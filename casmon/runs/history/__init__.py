"""Run histories other tools kept -- TensorBoard event files, MLflow stores -- read and imported as casmon runs.

``tensorboard`` reads event files (a run per folder holding them) and
``mlflow`` reads MLflow's file store (``mlruns/``) and its sqlite database
(``mlflow.db``), each without the tool installed. Both give plain
:class:`RunHistory` descriptions: params, metrics as numpy arrays, start, end,
status and where the run came from. This module finds what a path holds
(:func:`scan`), reads it (:func:`read_history`) and writes the runs into a
store (:func:`import_history`, behind ``casmon import``), skipping runs
imported before: each run's tool and id are kept in its manifest
(``imported``), so importing the same thing twice adds no second run.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import numpy as np

from casmon.errors import CasmonError

__all__ = ["RunHistory", "HistoryError", "HistoryWarning", "HistoryReport", "Found", "scan", "holds_history",
           "read_history", "import_history", "metric_name_problem", "local_path"]

Metrics = dict[str, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any], np.ndarray[Any, Any]]]


class HistoryError(CasmonError, ValueError):
    """A file that should hold a run history does not: not an event file, a damaged or foreign database."""


class HistoryWarning(UserWarning):
    """Part of a history could not be read (a damaged record): what came before it is kept."""


@dataclass
class RunHistory:
    """One run as another tool kept it, in plain data."""

    tool: str  # "tensorboard" or "mlflow"
    id: str  # the tool's own identity of the run (MLflow's run id; a digest of TensorBoard's event file names)
    path: str  # where it was read: the run's folder, or the database file
    name: str  # the tool's name for it: TensorBoard's run (folder path under the import root), MLflow's run name
    start: float  # Unix seconds
    end: float | None
    status: str  # casmon's: ok, failed, killed, lost
    params: dict[str, Any]
    info: dict[str, Any]
    metrics: Metrics  # name -> (steps int64, values float64, times float64 Unix seconds), in the order logged
    host: str | None = None
    user: str | None = None
    notes: list[str] = field(default_factory=list)  # what was left out or could not be read, and why

    def source(self) -> dict[str, str]:
        """What the imported run's manifest keeps as ``imported``."""
        return {"from": self.tool, "id": self.id, "path": self.path, "name": self.name}


def metric_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a casmon metric name, or None when it can."""
    from casmon.runs.metrics import check_name

    try:
        check_name(name, "import")
    except (TypeError, ValueError) as e:
        return str(e).removeprefix("import: ")
    return None


# ---------------------------------------------------------------------------
# What a path holds
# ---------------------------------------------------------------------------

SQLITE_MAGIC = b"SQLite format 3\x00"
#: Names of database files a folder search looks into (a PATH naming a file is read whatever its name).
DB_SUFFIXES = (".db", ".sqlite", ".sqlite3")


@dataclass
class Found:
    """The history sources under one path."""

    root: Path
    event_folders: dict[Path, list[Path]] = field(default_factory=dict)  # TensorBoard runs and their event files
    mlflow_runs: list[Path] = field(default_factory=list)  # MLflow file store run folders
    databases: list[Path] = field(default_factory=list)  # MLflow sqlite databases

    def __bool__(self) -> bool:
        return bool(self.event_folders or self.mlflow_runs or self.databases)


def local_path(path: str | os.PathLike[str]) -> Path:
    """A path, or an MLflow tracking URI naming a local one: ``sqlite:///mlflow.db`` (relative),
    ``sqlite:////abs/mlflow.db``, ``file:///abs/mlruns``, ``file:./mlruns``."""
    s = os.fspath(path)
    if s.startswith("sqlite:///"):
        return Path(unquote(s[len("sqlite:///"):].split("?", 1)[0]))
    if s.startswith("sqlite:"):
        raise HistoryError(f"{s}: only local sqlite databases are read (sqlite:///relative.db, sqlite:////abs.db)")
    if s.startswith("file:"):
        u = urlparse(s)
        return Path(unquote(u.path if u.netloc in ("", "localhost") else f"//{u.netloc}{u.path}"))
    return Path(s)


def is_sqlite(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(16) == SQLITE_MAGIC
    except OSError:
        return False


def scan(path: str | os.PathLike[str]) -> Found:
    """Find the TensorBoard runs, MLflow run folders and MLflow databases at ``path`` (a file or a folder).

    Hidden folders (``mlruns/.trash``: deleted runs; ``.casmon``), casmon stores
    and callmonitor folders are not searched, and neither is the inside of an
    MLflow run folder (its ``artifacts/`` are the run's files, not more runs).
    """
    from casmon.runs.history import mlflow, tensorboard

    root = local_path(path)
    found = Found(root)
    if root.is_file():
        if tensorboard.is_event_file(root.name):
            found.event_folders[root.parent] = [root]
        elif is_sqlite(root):
            found.databases.append(root)
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if "meta.yaml" in filenames and mlflow.is_run_folder(here):
            found.mlflow_runs.append(here)
            dirnames[:] = []
            continue
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not d.startswith("call-monitor")
                             and d != "__pycache__" and not (here / d / "casmon.json").exists())
        events = sorted(here / f for f in filenames if tensorboard.is_event_file(f))
        if events:
            found.event_folders[here] = events
        found.databases += [here / f for f in sorted(filenames)
                            if f.endswith(DB_SUFFIXES) and is_sqlite(here / f) and mlflow.is_mlflow_db(here / f)]
    found.mlflow_runs.sort()
    return found


def holds_history(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is or holds TensorBoard event files or an MLflow store (``casmon import`` asks)."""
    s = os.fspath(path)
    if s.startswith(("sqlite:", "file:")):
        return True
    p = Path(s)
    if p.is_file():
        from casmon.runs.history import tensorboard

        return tensorboard.is_event_file(p.name) or is_sqlite(p)
    return bool(scan(p))


def read_history(path: str | os.PathLike[str], progress: Callable[[str, int, int], None] | None = None,
                 notes: list[str] | None = None, skip: Callable[[str, str], bool] | None = None
                 ) -> list[RunHistory]:
    """Every run at ``path``, TensorBoard's and MLflow's, oldest first.

    A PATH naming a file that holds no history, or a bad one (not an event
    file, a damaged database), raises :class:`HistoryError` naming it; a bad
    file met in a folder is left out with a note and the others are read.
    ``notes`` is told what was left out and why (deleted MLflow runs, folders
    without scalars, damaged records).
    ``skip(tool, id)``: True for a run not to read (imported before); it is
    left out before its metrics are read.
    """
    from casmon.runs.history import mlflow, tensorboard

    found = scan(path)
    root = found.root
    if not root.exists():
        raise HistoryError(f"{root}: no such file or folder")
    if root.is_file() and not found:
        raise HistoryError(f"{root}: not a TensorBoard event file (events.out.tfevents.*) nor an MLflow database "
                           "(sqlite)")
    notes = [] if notes is None else notes
    ml_skip = (lambda ident: skip("mlflow", ident)) if skip else None
    out: list[RunHistory] = []
    tb_root = root.parent if root.is_file() else root

    def each(what: str, items: list[Any], read: Callable[[Any], list[RunHistory]]) -> None:
        for i, item in enumerate(items):
            if progress:
                progress(what, i, len(items))
            try:
                out.extend(read(item))
            except HistoryError as e:
                if root.is_file():
                    raise  # the file PATH names: the import fails, saying why
                notes.append(f"not imported: {e}")  # one bad file of a folder does not stop the others

    def tb_run(item: tuple[Path, list[Path]]) -> list[RunHistory]:
        folder, files = item
        if skip and skip("tensorboard", tensorboard.run_id(files)):
            return []
        run = tensorboard.read_run(folder, files, tb_root)
        if run is None:
            notes.append(f"{folder}: its event files hold no scalar and no hparams: nothing to import")
        return [run] if run is not None else []

    def ml_run(folder: Path) -> list[RunHistory]:
        run = mlflow.read_run_folder(folder, notes, ml_skip)
        return [run] if run is not None else []

    each("read TensorBoard runs", sorted(found.event_folders.items()), tb_run)
    each("read MLflow runs", found.mlflow_runs, ml_run)
    each("read MLflow databases", found.databases, lambda db: mlflow.read_database(db, notes, ml_skip))
    out.sort(key=lambda r: r.start)
    return out


# ---------------------------------------------------------------------------
# Into a store
# ---------------------------------------------------------------------------

@dataclass
class HistoryReport:
    """What an import of histories did."""

    source: str
    runs: list[str] = field(default_factory=list)  # names of the runs written
    points: int = 0  # metric points written
    already: int = 0  # runs imported before (skipped)
    empty: int = 0  # runs with nothing to import (no metric, no param)
    by_tool: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "runs": len(self.runs), "names": self.runs, "points": self.points,
                "by_tool": self.by_tool, "already_imported": self.already, "notes": self.notes}

    def summary(self) -> str:
        tools = ", ".join(f"{n} from {t}" for t, n in sorted(self.by_tool.items()))
        lines = [f"imported from {self.source}: {len(self.runs)} run(s)" + (f" ({tools})" if tools else "")
                 + f", {self.points} metric point(s)"]
        if self.already:
            lines.append(f"already imported, skipped: {self.already}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def import_history(path: str | os.PathLike[str], store: Any = None,
                   progress: Callable[[str, int, int], None] | None = None) -> HistoryReport:
    """Read every run at ``path`` and write those not imported before into ``store`` (a Store, a location, or
    None for the default store); returns a :class:`HistoryReport`. Warnings about damaged records become the
    report's notes."""
    from casmon.runs.imported import imported_ids, write_run
    from casmon.store.store import default_store

    s = default_store(store)
    report = HistoryReport(os.fspath(path))
    seen: dict[str, set[str]] = {}

    def imported(tool: str) -> set[str]:
        if tool not in seen:
            seen[tool] = imported_ids(s, tool)
        return seen[tool]

    def skip(tool: str, ident: str) -> bool:
        if ident in imported(tool):
            report.already += 1
            return True
        return False

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", HistoryWarning)  # each is a note of the run it belongs to
        runs = read_history(path, progress, report.notes, skip)
    for i, run in enumerate(runs):
        if progress:
            progress("write runs", i, len(runs))
        report.notes += run.notes
        ids = imported(run.tool)
        if run.id in ids:  # twice in one import (a run folder copied beside itself)
            report.already += 1
            continue
        name = write_run(s, comment=_comment(run.name), status=run.status, start=run.start, end=run.end,
                         params=run.params, info=run.info, metrics=run.metrics, source=run.source(),
                         host=run.host, user=run.user)
        ids.add(run.id)
        report.runs.append(name)
        report.points += sum(len(st) for st, _v, _t in run.metrics.values())
        report.by_tool[run.tool] = report.by_tool.get(run.tool, 0) + 1
    return report


def _comment(name: str) -> str:
    """A run name's comment part from the tool's name: printable, one line, at most 80 characters."""
    text = "".join(c if c.isprintable() and c not in "/\\" else "-" for c in name).strip("-. ")
    return text[:80]
