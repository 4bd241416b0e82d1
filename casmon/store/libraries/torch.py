"""torch: dense tensors and parameters as one numeric buffer of their elements.

Stored: dtype, shape, device, ``requires_grad``, whether it is a ``Parameter`` and a
channels-last memory format; the elements in C order, chunked and shuffled by element size like a numpy array, so
equal tensors are stored once. A tensor comes back on the device it was saved from.
Where that device does not exist, loading raises :class:`TorchDeviceError` saying
so, unless ``CASMON_MAP_LOCATION`` names a device to load it on instead (``cpu``),
as ``torch.load(map_location=...)`` would. Sparse, quantized and subclassed tensors,
and tensors with Python attributes, are pickled (their dense parts still go here). As with
``torch.save`` of a tensor, ``.grad`` is not kept; unlike it, views stored in one value
come back as tensors of their own, not sharing one storage.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch

from casmon.errors import CasmonError
from casmon.keys.libraries.torch import element_bytes
from casmon.store.serialize import Part

__all__ = ["TensorHandler", "TorchDeviceError", "MAP_LOCATION_ENV"]

MAP_LOCATION_ENV = "CASMON_MAP_LOCATION"


class TorchDeviceError(CasmonError):
    """A stored tensor's device does not exist in this process."""


def _dtype(name: str) -> torch.dtype:
    d = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(d, torch.dtype):
        raise ValueError(f"{name!r} is not a torch dtype")
    return d


class TensorHandler:
    """Dense, strided tensors (``torch.Tensor`` and ``torch.nn.Parameter`` exactly)."""

    name = "torch.Tensor"
    safe = True  # builds a tensor from bytes and a checked dtype name: no code from the store runs

    def encode(self, t: Any) -> tuple[dict[str, Any], list[Any]] | None:
        if t.layout != torch.strided or t.is_quantized or t.device.type == "meta" or t.__dict__ or t.is_nested:
            return None
        data = element_bytes(t)
        shape = list(t.shape)
        itemsize = t.element_size()
        meta = {"dtype": str(t.dtype).removeprefix("torch."), "shape": shape, "device": str(t.device),
                "grad": bool(t.requires_grad), "param": type(t) is torch.nn.Parameter}
        fmt = _memory_format(t)
        if fmt is not None:
            meta["format"] = fmt
        row = data.nbytes // shape[0] if shape and shape[0] else max(1, data.nbytes)
        ts = itemsize if itemsize in (1, 2, 4, 8, 16) else 1
        return meta, [Part(data.data, row_bytes=max(1, row), typesize=ts, numeric=True)]

    def decode(self, meta: dict[str, Any], buffers: list[np.ndarray[Any, np.dtype[np.uint8]]]) -> Any:
        dtype = _dtype(meta["dtype"])
        shape = tuple(int(n) for n in meta["shape"])
        buf = buffers[0]
        t = torch.from_numpy(buf).view(dtype).reshape(shape) if buf.size else torch.empty(shape, dtype=dtype)
        fmt = meta.get("format")
        if fmt in _FORMATS and len(shape) == _FORMATS[fmt]:
            t = t.contiguous(memory_format=getattr(torch, fmt))
        device = str(meta.get("device", "cpu"))
        if device != "cpu":
            target = os.environ.get(MAP_LOCATION_ENV) or device
            try:
                t = t.to(target)
            except (RuntimeError, AssertionError, ValueError) as e:
                raise TorchDeviceError(
                    f"this tensor was saved on {device}, which this process cannot use ({type(e).__name__}: "
                    f"{str(e)[:120]}); set {MAP_LOCATION_ENV}=cpu (or another device) to load it there") from None
        if meta.get("param"):
            return torch.nn.Parameter(t, requires_grad=bool(meta.get("grad")))
        if meta.get("grad"):
            t.requires_grad_(True)
        return t

    def array_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The numpy form of the stored elements, for lazy reads (``Store.open_array``)."""
        dtype = _dtype(meta["dtype"])
        if dtype == torch.bfloat16:
            raise TypeError("a bfloat16 tensor has no numpy dtype to open it lazily with; load it with get()")
        return {"dtype": repr(np.lib.format.dtype_to_descr(torch.empty(0, dtype=dtype).numpy().dtype)),
                "shape": meta["shape"], "order": "C"}


#: Memory formats a tensor comes back in, by the rank they apply to. The elements are stored in C order either way.
_FORMATS = {"channels_last": 4, "channels_last_3d": 5}


def _memory_format(t: Any) -> str | None:
    """``channels_last`` (``_3d``) for a tensor laid out so and not also plain contiguous, else None."""
    for name, rank in _FORMATS.items():
        if t.dim() == rank and not t.is_contiguous() and t.is_contiguous(memory_format=getattr(torch, name)):
            return name
    return None


HANDLER = TensorHandler()


def handles(t: type) -> bool:
    """Whether :data:`HANDLER` saves values of exactly type ``t``."""
    return t in (torch.Tensor, torch.nn.Parameter)
