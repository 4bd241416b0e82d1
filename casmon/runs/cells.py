"""A run's ``info`` and ``params`` as manifest cells: plain JSON kept inline, anything else stored by content."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

from casmon.errors import CasmonError, UnpicklableError
from casmon.keys.digest import Digest
from casmon.runs.manifest import is_plain_json
from casmon.runs.params import MAX_DEPTH, key_text
from casmon.store.store import Store
from casmon.view.text import short_error, short_repr

__all__ = ["json_or_value", "param_cell", "cells", "a_dict"]


def json_or_value(store: Store, v: Any, refs: list[Digest]) -> Any:
    """JSON values stay in the manifest; anything else is stored and referenced."""
    if type(v) in (str, int, float, bool, type(None)) or (type(v) in (list, dict) and is_plain_json(v)):
        try:
            if len(json.dumps(v, allow_nan=True)) <= 4096:
                return v
        except RecursionError:  # deeper than the encoder goes: stored as a value, or refused as one
            pass
    d = store.put(v)
    refs.append(d)
    return {"$": d.hex()}


def param_cell(store: Store, v: Any, refs: list[Digest], depth: int = 0) -> Any:
    """A parameter for the manifest: a dict that is not plain JSON (an Enum or an array inside a config) stays a
    dict, each leaf stored on its own, so its plain siblings still flatten to ``cfg.lr`` for tables and filters."""
    if (type(v) is dict and v and depth < MAX_DEPTH and set(v) != {"$"} and all(type(k) is str for k in v)
            and not is_plain_json(v)):
        return {k: param_cell(store, x, refs, depth + 1) for k, x in v.items()}
    return json_or_value(store, v, refs)


def cells(store: Store, values: dict[Any, Any], refs: list[Digest], what: str, category: type[Warning]) -> dict[str, Any]:
    """``run.info`` or ``run.params`` for the manifest. A value that cannot be stored (a lock, an open file)
    is kept as its description, with a warning: the user's value never stops the run's end from being saved,
    and is never blamed on the store."""
    out: dict[str, Any] = {}
    # dict.items: one step under the GIL (another thread may be changing the dict) and blind to a subclass's
    # own items(); string keys first, so a key that only reads like one (1 and "1") is the one renamed.
    items: list[tuple[Any, Any]] = sorted(dict.items(values), key=lambda kv: type(kv[0]) is not str)
    cell = param_cell if what == "run.params" else json_or_value
    for k, v in items:
        name = _key_text(k, out, what, category)
        try:
            out[name] = cell(store, v, refs)
        except (CasmonError, OSError):  # the store's: the run's end is tried again
            raise
        except Exception as e:  # noqa: BLE001 - the value's own (unpicklable, nested too deep, ...)
            why = short_error(e, 300) if isinstance(e, UnpicklableError) else f"{type(e).__name__}: {short_error(e, 300)}"
            warnings.warn(f"casmon.record: {what}[{short_repr(k, 80)}] cannot be stored ({why}); its description is "
                          "kept instead", category, stacklevel=2)
            out[name] = f"<not stored: {short_repr(v, 100, arrays=True, qualified=True)}: {why}>"
    return out


def _key_text(k: Any, taken: Mapping[str, Any], what: str, category: type[Warning]) -> str:
    name = key_text(k, taken)
    if name != k:
        warnings.warn(f"casmon.record: {what} has two keys that read alike; the {type(k).__name__} one is kept as "
                      f"{name!r}", category, stacklevel=3)
    return name


def a_dict(value: Any, what: str) -> dict[str, Any]:
    """``value`` if it is a dict, else a TypeError naming what was given (the run's end would fail on it)."""
    if not isinstance(value, dict):
        raise TypeError(f"casmon: {what} must be a dict (name -> value), got {type(value).__name__} "
                        f"{short_repr(value, 80)}")
    return value
