"""Keras 3: ``CasmonCallback`` logs ``fit``'s metrics and configuration into a casmon run.

    from casmon.integrations.keras import CasmonCallback
    model.fit(x, y, epochs=5, callbacks=[CasmonCallback()])

A real ``keras.callbacks.Callback``, built when ``CasmonCallback`` is first asked for: importing this module
imports no framework. Each batch's metrics are ``batch/{name}`` at the global batch index (counted across
epochs, from ``initial_epoch``'s first batch), each epoch's ``epoch/{name}`` at the epoch (validation ones are Keras's ``val_`` names); the params are
the optimizer's config (``optimizer.*``) and ``fit``'s own (``fit.epochs``, ``fit.steps``, ...).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from casmon.integrations.owner import RunOwner, TrainingRaised, framework, numbers, plain, training_frame

__all__ = ["CasmonCallback"]


def __getattr__(name: str) -> Any:
    if name == "CasmonCallback":
        cls = _build(framework(("keras",), __name__, "Keras", "keras"))
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _build(keras: Any) -> type:
    class CasmonCallback(keras.callbacks.Callback):
        """Log ``model.fit`` into a casmon run: ``model.fit(..., callbacks=[CasmonCallback()])``.

        ``run``: the run to log into; else the one active when ``fit`` begins; else the callback's own,
        ``casmon.record(**record_options)``, ended when ``fit`` ends (``failed`` when it raised) and continued
        by its next ``fit``.
        ``batches``: log each batch's metrics too (default True); the epochs' are always logged.
        """

        def __init__(self, run: Any = None, *, record_options: Mapping[str, Any] | None = None,
                     batches: bool = True) -> None:
            super().__init__()
            self._owner = RunOwner(run, record_options, "CasmonCallback")
            self._batches = bool(batches)
            self._base = 0  # global index of the current epoch's first batch
            self._next: int | None = None  # global index after the last batch seen in this fit

        def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
            if self._owner.run is not None:  # a fit that raised unseen before its end: that run is done
                e = TrainingRaised("casmon: CasmonCallback: the previous fit raised before it ended")
                self._owner.end(TrainingRaised, e, None)
            run = self._owner.get()
            self._owner.watch(training_frame(("fit",), keras.Model))
            self._base, self._next = 0, None
            params: dict[str, Any] = {"fit": plain(dict(self.params or {}))}
            optimizer = getattr(self.model, "optimizer", None)
            if optimizer is not None and hasattr(optimizer, "get_config"):
                try:
                    params["optimizer"] = plain(optimizer.get_config())
                except Exception as e:  # noqa: BLE001 - a custom optimizer's own; its name is still kept
                    params["optimizer"] = {"name": type(optimizer).__name__, "config_error": f"{type(e).__name__}: {e}"}
            run.params.update(params)

        def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
            # a fit from an initial epoch starts at that epoch's first batch, where its steps per epoch are known
            self._base = self._next if self._next is not None else int(epoch) * int((self.params or {}).get("steps") or 0)

        def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
            step = self._base + int(batch)
            self._next = max(self._next or 0, step + 1)
            run = self._owner.run
            if self._batches and run is not None:
                values = numbers(logs, "batch/")
                if values:
                    run.log(values, step=self._owner.step(run, "keras/batch", step))

        def on_epoch_end(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
            run = self._owner.run
            values = numbers(logs, "epoch/")
            if values and run is not None:
                run.log(values, step=self._owner.step(run, "keras/epoch", epoch))

        def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
            self._owner.end()

    CasmonCallback.__module__, CasmonCallback.__qualname__ = __name__, "CasmonCallback"  # pickled by the name it is imported by
    return CasmonCallback
