"""A run's parameters: what it was configured with, kept apart from what it measured.

``casmon.record(params={...})`` or ``run.params[...] = ...``. Nested dicts stay
nested in the manifest and are flattened to dotted names (``cfg.lr``) for tables,
filters and charts, as MLflow and W&B show them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from casmon.view.text import short_repr

__all__ = ["flatten", "key_text", "MAX_DEPTH"]

#: Deeper dicts are kept whole under their dotted name.
MAX_DEPTH = 8


def flatten(d: Mapping[str, Any], prefix: str = "", depth: int = 0) -> dict[str, Any]:
    """``{"cfg": {"lr": 0.1}, "seed": 1}`` -> ``{"cfg.lr": 0.1, "seed": 1}``; an empty dict stays as it is."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping) and v and depth < MAX_DEPTH and not (set(v) == {"$"}):
            out.update(flatten(v, name + ".", depth + 1))
        else:
            out[name] = v
    return out


def key_text(k: Any, taken: Mapping[str, Any]) -> str:
    """A key of a run's info or params as the manifest's string, never one already ``taken`` (``1`` beside
    ``"1"`` is ``"1 (int)"``). Never raises: a key whose ``str`` fails is described."""
    if isinstance(k, str):
        text = str.__str__(k)  # a subclass's own __str__ may fail or lie
    else:
        try:
            text = str(k)
        except Exception:  # noqa: BLE001 - the key's own
            text = short_repr(k, 200)
    if text not in taken:
        return text
    base, n = f"{text} ({type(k).__name__})", 2
    name = base
    while name in taken:
        name, n = f"{base} #{n}", n + 1
    return name
