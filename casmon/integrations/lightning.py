"""PyTorch Lightning: ``CasmonLogger`` logs a trainer's hyperparameters, metrics and checkpoints into a casmon run.

    from casmon.integrations.lightning import CasmonLogger
    trainer = lightning.Trainer(logger=CasmonLogger())

A real ``Logger`` of ``lightning.pytorch`` (of ``pytorch_lightning`` when only that is installed, or only that is
imported), built when ``CasmonLogger`` is first asked for: importing this module imports no framework. Only
rank 0 logs (Lightning's ``rank_zero_only``). The checkpoints ``ModelCheckpoint`` writes are kept as the run's
artifacts ``checkpoints/{file name}``; one it deletes (``save_top_k``) is released. A logger is one run, as
Lightning's own loggers are one version: each ``fit``, ``validate`` or ``test`` ends the logger's own run
(Lightning's ``finalize``), and the next continues it (``record(resume=...)``), its steps after the last ones.
"""

from __future__ import annotations

import argparse
import importlib
import os
from pathlib import Path
import sys
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from casmon.integrations.owner import RunOwner, TrainingRaised, framework, numbers, plain
from casmon.runs.artifacts import release

__all__ = ["CasmonLogger", "ARTIFACT_PREFIX", "lightning_module"]

#: Where checkpoint files go among the run's artifacts.
ARTIFACT_PREFIX = "checkpoints/"


def lightning_module() -> ModuleType:
    """``lightning.pytorch``, or ``pytorch_lightning`` when that is the one imported or the only one installed."""
    return framework(("lightning.pytorch", "pytorch_lightning"), __name__, "PyTorch Lightning", "lightning")


def __getattr__(name: str) -> Any:
    if name == "CasmonLogger":
        cls = _build(lightning_module())
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build(pl: ModuleType) -> type:
    base = importlib.import_module(f"{pl.__name__}.loggers").Logger
    rank_zero_only = importlib.import_module(f"{pl.__name__}.utilities").rank_zero_only
    # on other ranks ``logger.experiment.anything(...)`` does nothing, as with Lightning's own loggers
    rank_zero_experiment = getattr(importlib.import_module(f"{pl.__name__}.loggers.logger"), "rank_zero_experiment",
                                   lambda fn: fn)

    class CasmonLogger(base):  # type: ignore[misc, valid-type]
        """Log a Lightning trainer into a casmon run: ``Trainer(logger=CasmonLogger())``.

        ``run``: the run to log into; else the one active when logging starts; else the logger's own,
        ``casmon.record(**record_options)``, ended with the trainer's status (``failed`` when training raised) and
        continued by the logger's next fit, validate or test.
        ``checkpoints``: keep what ``ModelCheckpoint`` writes as the run's artifacts (default True).
        """

        def __init__(self, run: Any = None, *, record_options: Mapping[str, Any] | None = None,
                     checkpoints: bool = True) -> None:
            super().__init__()
            self._owner = RunOwner(run, record_options, "CasmonLogger", one_run=True)
            self._checkpoints = bool(checkpoints)
            self._saved: dict[str, tuple[str, tuple[int, int]]] = {}  # checkpoint path -> artifact name, stat
            self._kept: dict[Any, set[str]] = {}  # each ModelCheckpoint's key -> the paths it keeps now
            self._last_name: str | None = None

        @property
        def name(self) -> str:
            return "casmon"

        @property
        def version(self) -> str | None:
            """The run's name (Lightning names checkpoint folders by it); None on ranks other than 0."""
            if self._owner.run is None and self._last_name is not None:
                return self._last_name
            run = self._run_now()
            return None if run is None else run.name

        @property
        @rank_zero_experiment
        def experiment(self) -> Any:
            """The casmon run logged into (opened on first use); on ranks other than 0, an object whose every
            method does nothing."""
            return self._run_now()

        @rank_zero_only
        def _run_now(self) -> Any:
            run = self._owner.get()
            self._last_name = run.name
            return run

        @rank_zero_only
        def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(params, argparse.Namespace):
                params = vars(params)
            if not isinstance(params, Mapping):
                params = getattr(params, "__dict__", {"hparams": params})
            self._run_now().params.update(plain(dict(params)))

        @rank_zero_only
        def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
            values = numbers(metrics)
            if values:
                run = self._run_now()
                run.log(values, step=None if step is None else self._owner.step(run, "lightning", step))

        @rank_zero_only
        def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
            self._ignore_own_folder(checkpoint_callback)
            if self._checkpoints:
                self._scan(checkpoint_callback)

        def _ignore_own_folder(self, cb: Any) -> None:
            """Where Lightning puts checkpoints under this logger's own folder (``{root}/casmon/{run}/checkpoints``:
            no ``dirpath`` given), that folder ignores itself for git (a ``.gitignore`` of ``*``, as pytest's
            cache does): the files are the run's artifacts already, and would otherwise sit in every later run's
            patch as untracked files."""
            d = getattr(cb, "dirpath", None)
            if not d:
                return
            path = Path(os.path.abspath(os.fspath(d)))
            if path.name != "checkpoints" or len(path.parents) < 3 or path.parents[1].name != self.name:
                return
            try:
                fd = os.open(path.parents[1] / ".gitignore", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError:  # there already (the user's own is kept), or not writable: nothing to do
                return
            with os.fdopen(fd, "w") as f:
                f.write("# written by casmon's CasmonLogger: checkpoints here are kept as the runs' artifacts\n*\n")

        @rank_zero_only
        def finalize(self, status: str) -> None:
            exc_info: tuple[Any, Any, Any] = (None, None, None)
            if status == "failed":  # called while Lightning handles the exception
                exc_info = sys.exc_info()
                if exc_info[0] is None:
                    e = TrainingRaised("casmon: Lightning reported the training failed")
                    exc_info = (TrainingRaised, e, None)
            if self._owner.run is not None:
                self._last_name = self._owner.run.name
            self._saved.clear()
            self._kept.clear()
            self._owner.end(*exc_info)

        def _scan(self, cb: Any) -> None:
            """Save the checkpoints ``cb`` keeps that are new or rewritten; release those no callback keeps now."""
            paths = {os.path.abspath(os.fspath(p)) for p in [*(getattr(cb, "best_k_models", None) or {}),
                                                             getattr(cb, "best_model_path", ""),
                                                             getattr(cb, "last_model_path", "")] if p}
            self._kept[getattr(cb, "state_key", None) or getattr(cb, "dirpath", None)] = paths
            run = self._run_now()
            taken = {n for n, _ in self._saved.values()}
            for p in sorted(paths):
                try:
                    st = os.stat(p)
                except OSError:
                    continue
                sig = (st.st_mtime_ns, st.st_size)
                old = self._saved.get(p)
                if old is not None and old[1] == sig:
                    continue
                name = old[0] if old is not None else _fresh(ARTIFACT_PREFIX + os.path.basename(p), taken)
                if self._owner.guard(f"save checkpoint {p}", run.save_file, p, name) is not None:
                    self._saved[p] = (name, sig)
                    taken.add(name)
            keep = set().union(*self._kept.values())
            for p in [p for p in self._saved if p not in keep]:
                name = self._saved.pop(p)[0]
                self._owner.guard(f"release checkpoint {name}", release, run, name)

    CasmonLogger.__module__, CasmonLogger.__qualname__ = __name__, "CasmonLogger"  # pickled by the name it is imported by
    return CasmonLogger


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name (2)``, ``name (3)``, ... when a checkpoint of another folder took it."""
    if name not in taken:
        return name
    n = 2
    while f"{name} ({n})" in taken:
        n += 1
    return f"{name} ({n})"
