"""Looking at stored values without running code.

Loading a pickle can run code (see docs/SECURITY.md). Everything casmon shows
*about* a store -- summaries, reprs, ``casmon calls/show/runs/diff/export`` --
goes through here:

``describe(store, digest)``
    A one-line summary from the value's manifest alone: JSON values shown,
    arrays as shape and dtype, pickles as the type their opcodes build (read
    with :mod:`pickletools`, nothing executed), size and digest. Never loads a
    buffer.
``peek(store, digest)``
    The value itself if loading it cannot run code (JSON, arrays, bytes, and
    pickles that name no global), or the store was opened with ``trust=True``
    and the caller passes ``trust=True``; otherwise a :class:`Described`
    standing in for it.
``load_data(store, digest, what, types)``
    Data casmon wrote itself (run manifests, patches, package lists, console
    output, tracked files): loaded without ever resolving a global, even from a
    trusted store, and checked to be of the expected type.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from casmon.store import pickleinfo, serialize
from casmon.keys.digest import Digest
from casmon.errors import CasmonError, DamagedObjectError, UntrustedStoreError
from casmon.view.text import cut, size

if TYPE_CHECKING:
    from casmon.store.manifest import Manifest
    from casmon.store.store import Store

__all__ = ["Described", "describe", "peek", "load_data", "as_digest", "compare"]


def as_digest(h: Any, where: str = "record") -> Digest:
    """A digest named in a record or manifest (32 hex digits), or :class:`DamagedObjectError`."""
    if type(h) is str and len(h) == 32:
        try:
            return Digest(h)
        except (ValueError, TypeError):
            pass
    raise DamagedObjectError(where, f"{str(h)[:40]!r} is not a value digest")


class Described:
    """Stands in for a stored value that was not loaded because loading it could run code."""

    def __init__(self, digest: Digest | None, text: str) -> None:  # None: a reference that names no digest
        self.digest = digest
        self.text = text

    def __repr__(self) -> str:
        return self.text

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Described) and other.digest == self.digest

    def __hash__(self) -> int:
        return hash(self.digest)


def describe(store: Store, digest: Any, limit: int = 60) -> str:
    """A one-line description of a stored value from its manifest alone (nothing is unpickled)."""
    try:
        d = as_digest(digest.hex() if isinstance(digest, Digest) else digest, "value reference")
        m = store.manifest(d)
    except CasmonError as e:
        return f"<{e}>"
    short = d.hex()[:12]
    if m.tag == "array":
        try:
            dt: object = serialize.dtype_from_meta(m.meta["dtype"])
        except Exception:  # noqa: BLE001 - checked at manifest decode; belt and braces for display
            dt = "?"
        return f"array{tuple(m.meta.get('shape', ()))} {dt}"
    if m.tag == "json":
        if len(m.inline) <= 4096:
            try:
                r = repr(json.loads(m.inline))
                return cut(r, limit)
            except (ValueError, RecursionError):
                return f"<damaged JSON value {short}>"
        return f"<JSON, {size(m.nbytes)}, {short}>"
    if m.tag == "bytes":
        return f"<{m.meta.get('type', 'bytes')}, {size(m.nbytes)}, {short}>"
    if m.tag == "handler":
        return f"<{m.meta.get('handler')} (handler), {size(m.nbytes)}, {short}>"
    info = pickleinfo.describe_pickle(m.inline)
    needs = ""
    if info.globals:
        shown = ", ".join(info.globals[:4]) + (", …" if len(info.globals) > 4 else "")
        needs = f"; needs {shown}"
    return f"<pickle {info.type}, {size(m.nbytes)}, {short}{needs}>"


def peek(store: Store, digest: Any, trust: bool = False) -> Any:
    """The value if loading it cannot run code, else a :class:`Described` (see the module docstring).

    ``trust=True`` loads any value from a store opened with ``trust=True``.
    """
    d = as_digest(digest.hex() if isinstance(digest, Digest) else digest, "value reference")
    if trust and store.trust:
        return store.get(d)
    m = store.manifest(d)
    if m.tag == "handler" and m.meta.get("handler") != serialize.ArrayHandler.name:
        return Described(d, describe(store, d))
    if m.tag == "pickle":
        info = pickleinfo.describe_pickle(m.inline)
        if not info.safe or m.children:
            return Described(d, describe(store, d))
        return _load_without_globals(store, d, m)
    return store.get(d)


def _load_without_globals(store: Store, d: Digest, m: Manifest) -> Any:
    """Load a pickle through the unpickler that refuses every global, whatever the store's trust."""
    if not store.trust:
        return store.get(d)
    if m.parts or m.children:  # out-of-band buffers come from arrays: never casmon's own data, never global-free
        raise UntrustedStoreError(f"value {d.hex()} is a pickle with buffers or children; not loaded without trust")
    enc = serialize.Encoded("pickle", m.meta, m.inline)
    try:
        return serialize.decode(enc, [], trusted=False, key=f"value {d.hex()}")
    except UntrustedStoreError as e:
        raise UntrustedStoreError(f"value {d.hex()} in {store.url}: {e}") from None


def load_data(store: Store, digest: Any, what: str, types: type | tuple[type, ...]) -> Any:
    """Data casmon wrote itself, loaded without ever running code, of one of ``types``.

    Raises :class:`UntrustedStoreError` if the value is a pickle that names a
    global (casmon never writes such data: someone crafted it), and
    :class:`DamagedObjectError` if it is not of the expected type.
    """
    d = as_digest(digest, what)
    m = store.manifest(d)
    if m.tag == "handler":
        raise UntrustedStoreError(f"{what} (value {d.hex()}) is saved by a handler; casmon never writes it so")
    if m.tag == "pickle":
        v = _load_without_globals(store, d, m)
    else:
        v = store.get(d)
    if not isinstance(v, types):
        names = types.__name__ if isinstance(types, type) else " or ".join(t.__name__ for t in types)
        raise DamagedObjectError(f"value {d.hex()}", f"{what} is a {type(v).__name__}, not a {names}")
    return v


#: Arrays larger than this (each) are compared by shape, dtype and digest only, not element by element.
COMPARE_MAX_BYTES = 256 << 20


def compare(store: Store, a: Any, b: Any, max_bytes: int = COMPARE_MAX_BYTES) -> str:
    """How two stored values differ, in one line, without running code (``casmon diff`` uses it).

    Equal digests mean equal values. Two arrays (the ``array`` form, which loads
    without unpickling) are compared by shape and dtype, and when both match,
    element by element: how many elements differ and the largest absolute
    difference. Anything else is told apart by its digest.
    """
    import numpy as np

    da = as_digest(a.hex() if isinstance(a, Digest) else a, "value reference")
    db = as_digest(b.hex() if isinstance(b, Digest) else b, "value reference")
    if da == db:
        return "same value"
    by_digest = f"digest {da.hex()[:12]} -> {db.hex()[:12]}"
    try:
        ma, mb = store.manifest(da), store.manifest(db)
    except CasmonError as e:
        return f"{by_digest} ({e})"
    if ma.tag != "array" or mb.tag != "array":
        return by_digest
    try:
        ta, tb = serialize.dtype_from_meta(ma.meta["dtype"]), serialize.dtype_from_meta(mb.meta["dtype"])
    except Exception:  # noqa: BLE001 - a manifest that decoded but names an odd dtype: digests still tell them apart
        return by_digest
    sa, sb = tuple(ma.meta.get("shape", ())), tuple(mb.meta.get("shape", ()))
    parts = []
    if sa != sb:
        parts.append(f"shape {sa} -> {sb}")
    if ta != tb:
        parts.append(f"dtype {ta} -> {tb}")
    if parts:
        return ", ".join(parts)
    if ma.nbytes > max_bytes or mb.nbytes > max_bytes or ta.hasobject:
        return f"same shape and dtype; {by_digest} (not compared element by element: {size(max(ma.nbytes, mb.nbytes))})"
    try:
        xa, xb = store.get(da), store.get(db)
    except CasmonError as e:
        return f"{by_digest} ({e})"
    if not isinstance(xa, np.ndarray) or not isinstance(xb, np.ndarray) or xa.shape != xb.shape:
        return by_digest
    with np.errstate(all="ignore"):
        differ = xa != xb
        if ta.kind in "fc":  # NaN where both are NaN is no difference
            differ &= ~(np.isnan(xa) & np.isnan(xb))
        n = int(np.count_nonzero(differ))
        if n == 0:  # e.g. 0.0 and -0.0: equal values, different bytes
            return f"equal elements, different bytes ({by_digest})"
        text = f"{n:,} of {xa.size:,} elements differ"
        if ta.kind in "biufc":
            d = np.abs(xa[differ].astype(np.complex128 if ta.kind == "c" else np.float64)
                       - xb[differ].astype(np.complex128 if ta.kind == "c" else np.float64))
            text += f", max abs difference {float(np.nanmax(d)) if not np.all(np.isnan(d)) else float('nan'):.6g}"
    return text
