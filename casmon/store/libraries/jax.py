"""jax: arrays as one numeric buffer of their values; they come back on jax's default device."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from casmon.store.serialize import Part

__all__ = ["JaxArrayHandler"]


class JaxArrayHandler:
    name = "jax.Array"
    safe = True  # an array from bytes and a dtype name

    def encode(self, x: Any) -> tuple[dict[str, Any], list[Any]] | None:
        if getattr(x, "weak_type", False):
            return None  # pickled: jax's own pickle keeps weak_type, which an array built from bytes would lose
        try:
            host = np.asarray(np.asarray(x), order="C")
        except Exception:  # noqa: BLE001 - a PRNG key array and other extended dtypes: pickled
            return None
        if host.dtype.hasobject or host.dtype.kind == "V":
            return None
        shape = list(host.shape)
        row = host.nbytes // shape[0] if shape and shape[0] else max(1, host.nbytes)
        ts = host.dtype.itemsize if host.dtype.itemsize in (1, 2, 4, 8, 16) else 1
        flat = host.reshape(-1).view(np.uint8) if host.size else np.empty(0, np.uint8)
        return {"dtype": str(host.dtype), "shape": shape}, [Part(flat.data, row_bytes=max(1, row), typesize=ts, numeric=True)]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        dtype = np.dtype(jnp.dtype(str(meta["dtype"])))
        shape = tuple(int(n) for n in meta["shape"])
        buf = buffers[0]
        host = buf.view(dtype).reshape(shape) if buf.size else np.zeros(shape, dtype)
        return jnp.asarray(host)

    def array_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The numpy form of the stored elements, for lazy reads (``Store.open_array``, the zarr view)."""
        dtype = np.dtype(jnp.dtype(str(meta["dtype"])))
        if dtype.kind == "V" or dtype.type.__module__.startswith("ml_dtypes"):
            raise TypeError(f"a jax array of {dtype} has no dtype zarr describes; load it with get()")
        return {"dtype": repr(np.lib.format.dtype_to_descr(dtype)), "shape": meta["shape"], "order": "C"}


HANDLER = JaxArrayHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return isinstance(t, type) and issubclass(t, jax.Array) and t is not jax.Array
