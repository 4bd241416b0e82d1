"""Replaying a logged call: run it again on its stored inputs and compare results by fingerprint.

Only code the caller vouches for runs: the ``fn`` given, or the function
``@casmon.intercept`` registered under the record's name in this process. A
callable is never looked up, nor a module imported, from what a record holds.

A replay logs nothing (:func:`~casmon.calllog.writer.not_logged`): not the replayed call,
even when ``fn`` is the intercepted function itself, and not the intercepted calls it
makes. It is a check of a recorded call, not a run; logging it would add a session whose
calls become their functions' "latest", and ``fn=pipeline.normalise`` would log a
second name beside the script's ``__main__.normalise``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from casmon.calllog.records import type_name
from casmon.calllog.writer import intercepted, not_logged
from casmon.errors import UntrustedStoreError
from casmon.keys.fingerprint import fingerprint

if TYPE_CHECKING:
    from casmon.calllog.reader import Call, CallLog

__all__ = ["Replay", "replay_call", "find_function"]


@dataclass
class Replay:
    """What happened when a logged call was run again."""

    name: str
    n: int
    session: int
    result: Any
    exception: BaseException | None
    recorded: str | None  # fingerprint of the recorded result (or "raised Type: msg")
    replayed: str | None
    matches: bool

    def __repr__(self) -> str:
        return f"<Replay {self.name} #{self.n}: {'matches' if self.matches else 'DIFFERS'} (recorded {self.recorded}, now {self.replayed})>"


def find_function(name: str) -> Callable[..., Any]:
    """The function ``@casmon.intercept`` registered under ``name`` in this process; never an import."""
    fn = intercepted.get(name)
    if fn is not None:
        return fn
    registered = ", ".join(sorted(intercepted)) or "none"
    raise LookupError(f"no function {name} is registered in this process, so there is nothing to replay: import the "
                      f"module that defines it (its @casmon.intercept registers it) or pass fn= (on the command line, "
                      f"--import module_or_script.py); registered: {registered}")


def replay_call(log: CallLog, c: Call, fn: Callable[..., Any] | None = None) -> Replay:
    """Run ``c`` again on its stored inputs (see :meth:`CallLog.replay <casmon.calllog.reader.CallLog.replay>`)."""
    if fn is not None:
        if not callable(fn):
            raise TypeError(f"replay: fn must be callable, got {type(fn).__name__}")
        target = fn
    else:
        if not log.store.trust:
            raise UntrustedStoreError(
                f"not replaying {c.name}: the store {log.store.url} was opened with trust=False, and replay "
                "would call code chosen by its records; pass fn= the function to call")
        target = find_function(c.name)
    args, kwargs = c.inputs()
    if c.exception is not None:
        recorded = f"raised {c.exception[0]}: {c.exception[1]}"
    elif not c.result_recorded:
        recorded = None
    else:
        recorded = fingerprint(log.load_cell(c.result_cell)).hex()
    try:
        with not_logged():
            out = target(*args, **kwargs)
        exc = None
        replayed = fingerprint(out).hex()
    except Exception as e:  # noqa: BLE001 - a replay reports, it does not crash
        out, exc = None, e
        replayed = f"raised {type_name(e)}: {str(e)[:1000]}"
    return Replay(c.name, c.n, c.session, out, exc, recorded, replayed, recorded is not None and recorded == replayed)

