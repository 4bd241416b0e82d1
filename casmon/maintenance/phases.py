"""The progress callback every maintenance operation takes: ``progress(phase, done, total)``.

Its own module because stats, verify, repair and gc all report through it, and
:func:`casmon.view.progress.progress_phases` draws it; ``None`` means "report nothing".
"""

from __future__ import annotations

from casmon.store.store import Progress

__all__ = ["Progress", "quiet"]


def quiet(phase: str, done: int, total: int) -> None:
    """The progress callback that reports nothing (what ``progress=None`` means)."""
