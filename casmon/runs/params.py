"""A run's parameters: what it was configured with, kept apart from what it measured.

``casmon.record(params={...})`` or ``run.params[...] = ...``. Nested dicts stay
nested in the manifest and are flattened to dotted names (``cfg.lr``) for tables,
filters and charts, as MLflow and W&B show them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["flatten", "MAX_DEPTH"]

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
