"""``__repr__`` and ``_repr_html_`` that never raise: a view of a damaged store shows what it could not show.

Apart from :mod:`casmon.view.display` so that a class may guard its views at definition without loading
the views themselves: they load when an object is first shown.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

__all__ = ["guarded_text", "guarded_html", "failure"]


def failure(what: str, e: BaseException) -> str:
    """One line saying what could not be shown, and why."""
    return " ".join(f"<casmon {what}: cannot show it: {type(e).__name__}: {e}>".split())[:400]


def guarded_text(what: str) -> Callable:
    """A ``__repr__`` that never raises: on error it says what it could not show."""
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*a, **k) -> str:
            try:
                return fn(*a, **k)
            except Exception as e:  # noqa: BLE001 - a repr must never raise (a damaged store shows what it can)
                return failure(what, e)
        return wrapper
    return deco


def guarded_html(what: str) -> Callable:
    """A ``_repr_html_`` that never raises."""
    def deco(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def wrapper(*a, **k) -> str:
            try:
                return str(fn(*a, **k))
            except Exception as e:  # noqa: BLE001
                from casmon.view.display import error_line, frame

                return str(frame(f"casmon {what}", error_line(failure(what, e))))
        return wrapper
    return deco
