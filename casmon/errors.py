"""Exceptions and warnings casmon raises, and a helper that finds what in a value cannot be pickled.

The classes a store's reads and writes raise are defined here; those only a failure meets (a value that cannot
be pickled or keyed, a damaged file's warning, a run's errors) and the unpicklable-part finder are in
:mod:`casmon.rare_errors`, loaded the first time one is named here (``casmon.errors.RunSignal``, an import of
it, a pickle's lookup): the same objects, so ``except`` and ``isinstance`` hold however they were reached."""

from __future__ import annotations

import sys
import _thread  # threading's locks, without loading threading on a hit
import types
import warnings
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

    from casmon.rare_errors import (NotKeyable, NotKeyableError, RunSignal, StoreDamageWarning,
                                    UnpicklableError, UnstableKeyWarning, describe_object, locate_unpicklable)

__all__ = [
    "stacklevel_outside",
    "CasmonError",
    "StoreError",
    "StoreFormatError",
    "DamagedObjectError",
    "MissingObjectError",
    "UnpicklableError",
    "NotKeyableError",
    "NotKeyable",
    "UnstableKeyWarning",
    "UntrustedStoreError",
    "StoreDamageWarning",
    "NoActiveRunError",
    "RunSignal",
    "locate_unpicklable",
    "warn_damage",
    "MAX_SECONDS",
    "MAX_BYTES",
    "checked_number",
    "env_seconds",
]


class CasmonError(Exception):
    """Base class of casmon's own errors."""


class StoreError(CasmonError):
    """A store cannot be opened or written: bad path, no permission, unreachable."""


class StoreFormatError(StoreError):
    """The store was written by a newer casmon, or is not a casmon store."""


class DamagedObjectError(CasmonError):
    """An object's bytes do not match its digest, or cannot be decoded.

    Carries the object's key so the user (and ``verify``) can say which one.
    """

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"damaged object {key}: {reason}")
        self.key = key
        self.reason = reason


class MissingObjectError(CasmonError, KeyError):
    """A digest that the store does not hold."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.what


class UntrustedStoreError(CasmonError):
    """Loading this value would unpickle data from a store opened with ``trust=False``."""


class NoActiveRunError(CasmonError, RuntimeError):
    """``casmon.log`` was called outside any ``casmon.record`` block."""


#: What :mod:`casmon.rare_errors` defines, loaded on the first lookup of one of them (see :func:`__getattr__`).
RARE = frozenset({"UnpicklableError", "NotKeyableError", "NotKeyable", "UnstableKeyWarning", "StoreDamageWarning",
                  "RunSignal", "describe_object", "locate_unpicklable"})


def __getattr__(name: str) -> Any:
    if name not in RARE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from casmon import rare_errors

    value = getattr(rare_errors, name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | RARE)


_warned: set[str] = set()
_warned_lock = _thread.allocate_lock()


def warn_damage(url: str, key: str, reason: str) -> None:
    """Warn once per process and file that ``key`` is damaged, and what to do about it.

    ``stacklevel=3``: the warning names the caller of the function that found the damage.
    """
    with _warned_lock:
        tag = f"{url}\0{key}"
        if tag in _warned:
            return
        _warned.add(tag)
    from casmon.rare_errors import StoreDamageWarning  # damage's only

    warnings.warn(f"casmon: {key} in store {url} is damaged or missing ({reason}); casmon goes on without it. "
                  f"Run `casmon verify --repair` on the store.", StoreDamageWarning, stacklevel=3)


def stacklevel_outside(prefix: str) -> int:
    """The ``stacklevel`` for a warning its caller gives that points at the first frame whose file is not under
    ``prefix`` (a casmon folder): the user's line, not casmon's."""
    f: types.FrameType | None = sys._getframe(1)
    level = 1
    while f is not None and f.f_code.co_filename.startswith(prefix):
        f = f.f_back
        level += 1
    return level


#: The most seconds any option takes (100 years): more is a typo, and a wait that long overflows the clock.
MAX_SECONDS = 100 * 365.25 * 86400
#: The most bytes any size option takes (1 EiB).
MAX_BYTES = 1 << 60


def checked_number(value: Any, name: str, low: float = 0.0, high: float = MAX_SECONDS, *, above_low: bool = False,
                   unit: str = "seconds") -> float:
    """``value`` as a float if it is a real number from ``low`` (or ``above_low``: over it) to ``high``;
    else a one-line ``ValueError`` naming the option (``name``): NaN, infinities and absurd sizes are typos
    that would wait, keep or evict forever."""
    import math
    import numbers

    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)  # numpy's numbers too
    try:
        x = float(value) if ok else math.nan
    except OverflowError:  # an int too large for a float
        x = math.inf
    if not math.isfinite(x) or not (x > low if above_low else x >= low) or x > high:
        top = {MAX_SECONDS: "100 years", MAX_BYTES: "1 EiB"}.get(high, f"{high:g}")
        shown = repr(value)
        shown = shown if len(shown) <= 40 else shown[:37] + "..."
        raise ValueError(f"{name} must be a finite number of {unit} {'over' if above_low else 'from'} {low:g} "
                         f"to {top}, got {shown}")
    return x


def env_seconds(name: str, default: float, *, above_low: bool = True) -> float:
    """Seconds from environment variable ``name`` (``default`` when unset), checked as :func:`checked_number` does:
    a one-line error naming the variable, not a NaN lease that never ends or a float() traceback."""
    import os

    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        v: Any = float(raw)
    except ValueError:
        v = raw  # refused below, naming the variable
    try:
        return checked_number(v, f"${name}", above_low=above_low)
    except ValueError as e:  # the text as it was given
        raise ValueError(f"{str(e).rsplit(', got ', 1)[0]}, got {raw!r}") from None
