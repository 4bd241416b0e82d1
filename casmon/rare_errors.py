"""The exceptions and warnings only a failure meets, and the finder of a value's unpicklable part.

:mod:`casmon.errors` loads this module the first time one of these names is looked up there (an ``except``
clause, an import, a pickle's lookup), so a call that fails nothing never builds them. Each class says it is
``casmon.errors``'s: pickles, keys and messages name it there, as they always have. It imports nothing of
casmon's (``casmon.errors`` is above it).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["UnpicklableError", "NotKeyableError", "NotKeyable", "UnstableKeyWarning", "StoreDamageWarning",
           "RunSignal", "describe_object", "locate_unpicklable"]


class UnpicklableError(TypeError):
    """A value (or a part of it) cannot be pickled; ``path`` says where it sits."""

    __module__ = "casmon.errors"  # where pickles, keys and messages name it

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

    __module__ = "casmon.errors"

    def __init__(self, path: str, obj: Any, reason: str) -> None:
        TypeError.__init__(self, f"{path}: {describe_object(obj)} cannot be part of a cache key: {reason}")
        self.path = path
        self.type = type(obj)
        self.reason = reason


class NotKeyable(Exception):
    """Raised by a hasher (``register_hasher``) for a value that must not be keyed; ``reason`` says why.

    The fingerprint turns it into :class:`NotKeyableError` naming where the value sits.
    """

    __module__ = "casmon.errors"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class UnstableKeyWarning(UserWarning):
    """A type's fingerprint differs between a value and its copy: keys of it would never hit again.

    Warned once per type, the first time a small value of the type is keyed in a process."""

    __module__ = "casmon.errors"


class StoreDamageWarning(UserWarning):
    """A file of the store is damaged or missing; casmon goes on without it. ``casmon verify --repair`` fixes it."""

    __module__ = "casmon.table"  # the name pickles and keys have always given it (casmon/keys/names.py)


class RunSignal(BaseException):
    """SIGTERM or SIGHUP arrived while a run was recorded: raised in the main thread, as Ctrl-C raises
    ``KeyboardInterrupt``, so ``finally`` blocks run and the run is saved as ``killed``; once the outermost run
    is saved the signal is sent again and ends the process as it would have. ``except Exception`` does not
    catch it."""

    __module__ = "casmon.errors"

    def __init__(self, signum: int, name: str) -> None:
        super().__init__(f"{name} received while a run was recorded")
        self.signum = signum
        self.name = name




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
