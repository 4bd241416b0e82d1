"""scipy.sparse: matrices and arrays by format, shape and the arrays that define them.

Cached flags (``has_sorted_indices``, ``has_canonical_format``) and the order their
attributes were set in do not count: reading ``has_sorted_indices`` adds an attribute,
and ``copy()`` sets them in another order. The class counts (``csr_array`` and
``csr_matrix`` differ), and so do the index dtype and the stored order of entries.
"""

from __future__ import annotations

from typing import Any

import scipy.sparse as sp

from casmon.keys.fingerprint import register_library_hasher

__all__: list[str] = []


def _sparse_key(m: Any) -> Any:
    fmt = m.format
    head = (fmt, tuple(m.shape), str(m.dtype))
    if fmt in ("csr", "csc", "bsr"):
        return head + (m.data, m.indices, m.indptr)
    if fmt == "coo":
        coords = getattr(m, "coords", None)
        return head + (tuple(coords) if coords is not None else (m.row, m.col), m.data)
    if fmt == "dia":
        return head + (m.data, m.offsets)
    if fmt == "dok":
        return head + (sorted(m.items()),)
    if fmt == "lil":
        return head + (m.rows, m.data)
    raise TypeError(f"a scipy sparse {fmt} matrix has no content key; give it one with casmon.register_hasher")


register_library_hasher(sp.sparray if hasattr(sp, "sparray") else sp.spmatrix, _sparse_key)
register_library_hasher(sp.spmatrix, _sparse_key)
