"""Progress bars for long work: drawn on a terminal, silent when piped.

A bar is drawn on stderr only when stderr is a terminal, so ``casmon verify |
grep damaged``, ``casmon stats --json > s.json`` and CI logs get no escape
codes and no partial lines, while a person at a terminal sees that a long
``verify``, ``gc``, ``stats``, ``export`` or ``import`` is moving. The bar is
transient: it is erased when the work ends, and what the command prints stays.

Two shapes, one look:

* :func:`progress_phases` yields a ``callback(phase, done, total)`` -- the
  protocol of :mod:`casmon.maintenance.check` and :mod:`casmon.maintenance.collect` -- that draws one
  bar per phase;
* :func:`progress` yields a bar for one counted job (``bar.advance()``), and
  :func:`track` wraps an iterable in one.

rich is imported only when a bar is drawn, so importing this module costs
nothing and writes nothing.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

__all__ = ["progress", "progress_phases", "track", "wanted"]

T = TypeVar("T")


def wanted(stream: Any = None) -> bool:
    """True if a bar would reach a person: ``stream`` (default stderr) is a terminal that draws.

    ``CASMON_PROGRESS=0`` switches bars off, ``=1`` forces them on (to test a bar without a terminal
    is not what users see, so tests use a pseudo-terminal instead).
    """
    forced = os.environ.get("CASMON_PROGRESS")
    if forced in ("0", "1"):
        return forced == "1"
    stream = sys.stderr if stream is None else stream
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError, OSError):  # closed or replaced streams
        return False
    return bool(tty) and os.environ.get("TERM") != "dumb"


class _Quiet:
    """The bar of a job nobody watches: every call does nothing."""

    def advance(self, n: int = 1) -> None:
        pass

    def update(self, done: int, total: int | None = None) -> None:
        pass


class _Bar:
    def __init__(self, p: Any, task: int) -> None:
        self._p, self._task = p, task

    def advance(self, n: int = 1) -> None:
        """``n`` more items done."""
        self._p.advance(self._task, n)

    def update(self, done: int, total: int | None = None) -> None:
        """``done`` items of ``total`` (unchanged if None) done."""
        self._p.update(self._task, completed=done, total=total)


def _rich_progress(console: Any = None):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console or Console(stderr=True), transient=True)


@contextmanager
def progress_phases(enabled: bool = True, console: Any = None) -> Iterator[Callable[[str, int, int], None] | None]:
    """A ``callback(phase, done, total)`` drawing one bar per phase, or None when no bar is wanted.

    ``enabled=False`` (e.g. ``--json``) or a stderr that is not a terminal: None,
    which the maintenance functions take as "report nothing".
    """
    if not enabled or not wanted(getattr(console, "file", None)):
        yield None
        return
    with _rich_progress(console) as p:
        tasks: dict[str, int] = {}

        def update(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = p.add_task(phase, total=total)
            p.update(tasks[phase], completed=done, total=total)

        yield update


@contextmanager
def progress(total: int | None, label: str, enabled: bool = True, console: Any = None) -> Iterator[_Bar | _Quiet]:
    """One bar for a counted job: ``with progress(n, "importing") as bar: ... bar.advance()``.

    ``total`` None: a bar without an end (it counts). Silent (every call does
    nothing) when ``enabled`` is False or stderr is not a terminal.
    """
    if not enabled or not wanted(getattr(console, "file", None)):
        yield _Quiet()
        return
    with _rich_progress(console) as p:
        yield _Bar(p, p.add_task(label, total=total))


def track(iterable: Iterable[T], total: int | None = None, label: str = "", enabled: bool = True) -> Iterator[T]:
    """Yield from ``iterable`` with a bar (``total`` defaults to ``len(iterable)`` where it has one)."""
    if total is None:
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    with progress(total, label, enabled) as bar:
        for item in iterable:
            yield item
            bar.advance()
