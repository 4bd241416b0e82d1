"""Hugging Face ``transformers``: ``CasmonCallback`` logs a ``Trainer``'s arguments, metrics and checkpoints into a
casmon run.

    from casmon.integrations.transformers import CasmonCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[CasmonCallback()])

A real ``transformers.TrainerCallback``, built when ``CasmonCallback`` is first asked for: importing this module
imports no framework. Only the world's process zero logs. The training arguments are the run's params (the
model's config under ``model``), each ``on_log`` its metrics at the trainer's global step, each saved checkpoint
folder the artifact ``checkpoints/checkpoint-{step}`` (released when the trainer deletes the folder:
``save_total_limit``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from casmon.integrations.owner import RunOwner, TrainingRaised, framework, numbers, plain, training_frame
from casmon.runs.artifacts import release

__all__ = ["CasmonCallback", "ARTIFACT_PREFIX"]

#: Where checkpoint folders go among the run's artifacts.
ARTIFACT_PREFIX = "checkpoints/"


def __getattr__(name: str) -> Any:
    if name == "CasmonCallback":
        cls = _build(framework(("transformers",), __name__, "transformers", "transformers"))
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build(tf: Any) -> type:
    class CasmonCallback(tf.TrainerCallback):
        """Log a ``Trainer`` into a casmon run: ``Trainer(..., callbacks=[CasmonCallback()])``.

        ``run``: the run to log into; else the one active when training begins; else the callback's own,
        ``casmon.record(**record_options)``, ended when training ends (``failed`` when it raised) and continued by
        its next training or evaluation.
        ``checkpoints``: keep each saved checkpoint folder as the run's artifact (default True).
        """

        def __init__(self, run: Any = None, *, record_options: Mapping[str, Any] | None = None,
                     checkpoints: bool = True) -> None:
            self._owner = RunOwner(run, record_options, "CasmonCallback")
            self._checkpoints = bool(checkpoints)
            self._saved: dict[str, str] = {}  # artifact name -> the checkpoint folder

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            if self._owner.run is not None:  # a training that raised unseen before its end: that run is done
                e = TrainingRaised("casmon: CasmonCallback: the previous training raised before it ended")
                self._owner.end(TrainingRaised, e, None)
            run = self._owner.get()
            self._owner.watch(training_frame(("_inner_training_loop", "train"), tf.Trainer))
            params = plain(args.to_dict()) if hasattr(args, "to_dict") else {}
            config = getattr(model, "config", None)
            if config is not None and hasattr(config, "to_dict"):
                params["model"] = plain(config.to_dict())
            run.params.update(params)

        def on_log(self, args: Any, state: Any, control: Any, logs: Mapping[str, Any] | None = None,
                   **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            values = numbers(logs)
            if not values:
                return
            with self._owner.outside() as run:
                if run is not None:
                    run.log(values, step=self._owner.step(run, "transformers", state.global_step))

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not (state.is_world_process_zero and self._checkpoints):
                return
            run = self._owner.current()
            prefix = importlib.import_module("transformers.trainer_utils").PREFIX_CHECKPOINT_DIR
            folder = os.path.join(args.output_dir, f"{prefix}-{state.global_step}")
            if run is not None and os.path.isdir(folder):
                name = ARTIFACT_PREFIX + os.path.basename(folder)
                if self._owner.guard(f"save checkpoint {folder}", run.save_file, folder, name) is not None:
                    self._saved[name] = folder
            if run is not None:
                self._release_deleted(run)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not state.is_world_process_zero:
                return
            if self._owner.run is not None:
                self._release_deleted(self._owner.run)
            self._saved.clear()
            self._owner.end()

        def _release_deleted(self, run: Any) -> None:
            """Release the checkpoints whose folders the trainer deleted (``save_total_limit``)."""
            for name, folder in list(self._saved.items()):
                if not os.path.isdir(folder):
                    del self._saved[name]
                    self._owner.guard(f"release checkpoint {name}", release, run, name)

    CasmonCallback.__module__, CasmonCallback.__qualname__ = __name__, "CasmonCallback"  # pickled by the name it is imported by
    return CasmonCallback
