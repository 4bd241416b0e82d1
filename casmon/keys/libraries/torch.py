"""torch: tensors, parameters and generators by content, never by the storage pointer pickle names.

A dense tensor counts by its type (``Parameter`` and subclasses differ), dtype, shape,
layout, device type (not its index), ``requires_grad``, Python
attributes and the bytes of exactly its own elements in C order: a view costs its own
size, not its storage's, and strides do not count (as for numpy). A leaf's ``.grad``
counts; whether a tensor is a leaf does not (``torch.save`` does not keep it either). Conjugate and
negative bits are resolved first. Sparse tensors count by layout, shape, their
index and value tensors and ``is_coalesced``; quantized ones by their integer values
and quantization parameters. A ``Generator`` counts by device type and state.
Modules and optimizers need no rule of their own: their state is made of these.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []

_SPARSE_COMPRESSED = {torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_csc: ("ccol_indices", "row_indices"),
                      torch.sparse_bsr: ("crow_indices", "col_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices")}


def element_bytes(t: torch.Tensor) -> np.ndarray[Any, Any]:
    """A dense tensor's elements in C order as a ``uint8`` numpy array: in place when it is a
    contiguous CPU tensor, otherwise a copy of its own elements only."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    flat = t.reshape(-1)  # a view when contiguous; a copy of the view's own elements when not
    if flat.numel() == 0:
        return np.empty(0, np.uint8)
    if not flat.is_contiguous() or flat.stride(-1) != 1:  # a 1-D strided view reshapes to itself (and one element
        flat = flat.clone(memory_format=torch.contiguous_format)  # counts as contiguous whatever its stride)
    return np.asarray(flat.view(torch.uint8).numpy())


def _tensor_key(t: torch.Tensor) -> Any:
    layout = t.layout
    attrs = dict(sorted(t.__dict__.items())) if t.__dict__ else None
    grad = t.grad if t.is_leaf else None
    head = (str(t.dtype), tuple(t.shape), str(layout), t.device.type, bool(t.requires_grad), attrs,
            None if grad is None else _tensor_key(grad))
    if layout == torch.strided:
        if t.is_quantized:
            q = t.qscheme()
            if q in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                params: Any = (float(t.q_scale()), int(t.q_zero_point()))
            else:
                params = (element_bytes(t.q_per_channel_scales()), element_bytes(t.q_per_channel_zero_points()),
                          int(t.q_per_channel_axis()))
            return head + ("quantized", str(q), params, element_bytes(t.int_repr()))
        if t.device.type == "meta":
            return head + ("meta",)
        return head + (element_bytes(t),)
    if layout == torch.sparse_coo:
        return head + (bool(t.is_coalesced()), _tensor_key(t._indices()), _tensor_key(t._values()))
    pair = _SPARSE_COMPRESSED.get(layout)
    if pair is not None:
        return head + tuple(_tensor_key(getattr(t, name)()) for name in pair) + (_tensor_key(t.values()),)
    raise TypeError(f"a torch tensor of layout {layout} has no content key; give it one with casmon.register_hasher")


def _generator_key(g: torch.Generator) -> Any:
    return (g.device.type, element_bytes(g.get_state()))


register_library_hasher(torch.Tensor, _tensor_key)
register_library_hasher(torch.Generator, _generator_key)
