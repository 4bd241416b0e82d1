"""A value's manifest checked before anything is allocated from it: every length, count and shape fits.

Loaded by the first manifest with parts or children (an array's, a large pickle's): a plain value's
manifest (its inline bytes alone) has nothing to check, so a hit on one never loads it. Reached as
``casmon.store.serialize.check_manifest``.
"""

from __future__ import annotations

import re
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, NoReturn

from casmon.errors import DamagedObjectError
from casmon.store.serialize import MAX_CHUNK, MAX_NDIM, dtype_from_meta

__all__ = ["TAGS", "check_manifest"]

TAGS = ("json", "pickle", "array", "bytes", "handler")
_HEX32 = r"^[0-9a-f]{32}$"  # compiled on first use (``re``'s cache): most values have no children


def check_manifest(key: str, tag: Any, meta: Any, parts: Any, children: Any, inline_len: int, nbytes: Any) -> None:
    """Refuse a manifest whose fields do not fit together, before any buffer is allocated.

    Every length, count and shape is checked: each part's chunk count matches
    its length and chunk size, the chunk size is at most :data:`MAX_CHUNK`, an
    array's shape times its item size is its buffer's length, an array's dtype
    holds no Python objects. Raises :class:`DamagedObjectError` naming ``key``.
    """

    def bad(why: str) -> NoReturn:
        raise DamagedObjectError(key, f"not a valid manifest: {why}")

    if tag not in TAGS:
        bad(f"unknown form {str(tag)[:40]!r}")
    if not isinstance(meta, dict):
        bad("meta is not an object")
    if not isinstance(parts, list) or not all(isinstance(p, dict) for p in parts):
        bad("parts is not a list of objects")
    if not isinstance(children, list) or not all(type(h) is str and re.match(_HEX32, h) for h in children):
        bad("children is not a list of digests")
    if tag != "pickle" and children:
        bad(f"a {str(tag)} value has no children")
    if type(nbytes) is not int or nbytes < 0:
        bad("size is not a non-negative integer")
    total = 0
    for i, p in enumerate(parts):
        n, cb, rb, c = p.get("n"), p.get("cb"), p.get("rb", 1), p.get("c")
        if type(n) is not int or type(cb) is not int or type(rb) is not int or not isinstance(c, list):
            bad(f"part {i} lacks integer n/cb/rb or a chunk list")
        if n < 0 or not 1 <= cb <= MAX_CHUNK or rb < 1:
            bad(f"part {i}: length {n}, chunk size {cb}, row size {rb} out of range")
        if len(c) != -(-n // cb):
            bad(f"part {i}: {len(c)} chunks for {n} bytes in chunks of {cb}")
        if not all(type(h) is str and re.match(_HEX32, h) for h in c):
            bad(f"part {i}: a chunk name is not a digest")
        total += n
    if tag == "pickle":
        if meta.get("oob", len(parts)) != len(parts):
            bad("out-of-band buffer count does not match the parts")
        if nbytes != total + inline_len:
            bad(f"size {nbytes} is not the stream ({inline_len}) plus the buffers ({total})")
    elif tag in ("json",):
        if parts or children:
            bad("a JSON value has no parts")
    elif tag == "bytes":
        if len(parts) != 1 or nbytes != total or meta.get("type") not in ("bytes", "bytearray"):
            bad("a bytes value has one part of its size")
    elif tag == "handler":
        if not isinstance(meta.get("handler"), str) or "meta" not in meta or nbytes != total:
            bad("a handler value names its handler and has parts of its size")
    elif tag == "array":
        if len(parts) != 1 or children:
            bad("an array has exactly one part")
        dt = meta.get("dtype")
        shape = meta.get("shape")
        if meta.get("order") not in ("C", "F") or not isinstance(dt, str) or len(dt) > 4096:
            bad("an array needs an order C or F and a dtype")
        if not isinstance(shape, list) or len(shape) > MAX_NDIM or not all(type(x) is int and x >= 0 for x in shape):
            bad("an array's shape is a list of at most 64 non-negative integers")
        try:
            dtype = dtype_from_meta(dt)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, KeyError, IndexError) as e:
            bad(f"dtype {dt[:80]!r} is not a numpy dtype ({type(e).__name__})")
        if dtype.hasobject:
            bad(f"dtype {dt[:80]!r} holds Python objects")
        import math  # an array's check: a plain value's hit loads no math

        count = math.prod(shape)
        if dtype.itemsize and count * dtype.itemsize != total:
            bad(f"shape {shape} of {dtype} is {count * dtype.itemsize} bytes, the buffer is {total}")
        if not dtype.itemsize and total:
            bad("a zero-size dtype with data")
        if nbytes != total:
            bad("size does not match the buffer")
