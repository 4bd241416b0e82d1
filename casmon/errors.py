"""Exceptions and warnings casmon raises, and a helper that finds what in a value cannot be pickled."""

from __future__ import annotations

import sys
import _thread  # threading's locks, without loading threading on a hit
import types
import warnings
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

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


class UnpicklableError(TypeError):
    """A value (or a part of it) cannot be pickled; ``path`` says where it sits."""

    def __init__(self, path: str, obj: Any, cause: BaseException | None = None) -> None:
        desc = describe_object(obj)
        msg = f"{path}: {desc} cannot be pickled"
        if cause is not None:
            msg += f" ({type(cause).__name__}: {cause})"
        super().__init__(msg)
        self.path = path
        self.type = type(obj)


class NotKeyableError(UnpicklableError):
    """A value has no key that stays true: a lazy value over files it does not say, a value bound to
    live resources. Raised by the hashers for such types; the cache runs the call uncached and says why."""

    def __init__(self, path: str, obj: Any, reason: str) -> None:
        TypeError.__init__(self, f"{path}: {describe_object(obj)} cannot be part of a cache key: {reason}")
        self.path = path
        self.type = type(obj)
        self.reason = reason


class NotKeyable(Exception):
    """Raised by a hasher (``register_hasher``) for a value that must not be keyed; ``reason`` says why.

    The fingerprint turns it into :class:`NotKeyableError` naming where the value sits.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnstableKeyWarning(UserWarning):
    """A type's fingerprint differs between a value and its copy: keys of it would never hit again.

    Warned once per type, the first time a small value of the type is keyed in a process."""


class UntrustedStoreError(CasmonError):
    """Loading this value would unpickle data from a store opened with ``trust=False``."""


class StoreDamageWarning(UserWarning):
    """A file of the store is damaged or missing; casmon goes on without it. ``casmon verify --repair`` fixes it."""

    __module__ = "casmon.table"  # the name pickles and keys have always given it (casmon/keys/names.py)


class NoActiveRunError(CasmonError, RuntimeError):
    """``casmon.log`` was called outside any ``casmon.record`` block."""


class RunSignal(BaseException):
    """SIGTERM or SIGHUP arrived while a run was recorded: raised in the main thread, as Ctrl-C raises
    ``KeyboardInterrupt``, so ``finally`` blocks run and the run is saved as ``killed``; once the outermost run
    is saved the signal is sent again and ends the process as it would have. ``except Exception`` does not
    catch it."""

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(f"{name} received while a run was recorded")
        self.signum = signum
        self.name = name


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
    warnings.warn(f"casmon: {key} in store {url} is damaged or missing ({reason}); casmon goes on without it. "
                  f"Run `casmon verify --repair` on the store.", StoreDamageWarning, stacklevel=3)


def describe_object(obj: Any) -> str:
    """A short description like ``function <lambda>`` or ``_thread.lock``."""
    t = type(obj)
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    tname = t.__name__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
    if isinstance(name, str) and not isinstance(obj, type):
        return f"{tname} {name}"
    return tname


def _try_pickle(obj: Any) -> BaseException | None:
    import pickle  # only where a value failed to store: a hit does not load it

    try:
        pickle.dumps(obj, protocol=5, buffer_callback=lambda b: False)
    except RecursionError:
        return None  # deep but picklable structures are not our concern here
    except Exception as e:  # noqa: BLE001 - any failure is what we look for
        return e
    return None


def locate_unpicklable(value: Any, root: str = "value", _depth: int = 0) -> UnpicklableError | None:
    """Walk ``value`` and return an error naming the first part that cannot be pickled.

    Only called after pickling already failed, so its cost does not matter; it
    descends containers and object state the way pickle would.
    """
    err = _try_pickle(value)
    if err is None:
        return None
    if _depth < 50:
        children: list[tuple[str, Any]] = []
        if isinstance(value, dict):
            for k, v in value.items():
                children.append((f"{root}[{k!r}]", v))
                children.append((f"{root} key {k!r}", k))
        elif isinstance(value, (list, tuple)):
            children = [(f"{root}[{i}]", v) for i, v in enumerate(value)]
        elif isinstance(value, (set, frozenset)):
            children = [(f"{root}{{{i}}}", v) for i, v in enumerate(value)]
        else:
            state = None
            try:
                reduced = value.__reduce_ex__(5)
                if isinstance(reduced, tuple) and len(reduced) > 2:
                    state = reduced[2]
                    if isinstance(reduced[1], tuple):
                        children += [(f"{root}<arg {i}>", a) for i, a in enumerate(reduced[1])]
            except Exception:  # noqa: BLE001
                state = getattr(value, "__dict__", None)
            if isinstance(state, tuple) and len(state) == 2:  # (dict state, slots state)
                state = {**(state[0] or {}), **(state[1] or {})}
            if isinstance(state, dict):
                children += [(f"{root}.{k}", v) for k, v in state.items()]
        for child_path, child in children:
            if child is value:
                continue
            found = locate_unpicklable(child, child_path, _depth + 1)
            if found is not None:
                return found
    return UnpicklableError(root, value, err)


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
