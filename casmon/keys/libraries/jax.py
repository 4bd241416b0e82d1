"""jax: arrays by dtype, shape, ``weak_type``, the platform they live on and their values (copied to the host)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []


def _array_key(x: Any) -> Any:
    host = np.asarray(x)
    platform = next(iter(x.devices())).platform if hasattr(x, "devices") else "cpu"
    return (str(x.dtype), tuple(x.shape), bool(getattr(x, "weak_type", False)), platform,
            np.asarray(host, order="C").reshape(-1).view(np.uint8))


register_library_hasher(jax.Array, _array_key)
