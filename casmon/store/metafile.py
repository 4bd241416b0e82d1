"""The one reader of the small JSON files the store trusts: bounded, and damage is one casmon error naming the file.

gc's fences, lock, leases and lock-break claims, the condemned lists' headers,
``casmon.json``, refs (runs, sessions, compute claims) and records are JSON a
crash, a flipped bit or an attacker may have written. :func:`load` reads any of
them: a size limit, a nesting limit checked *before* parsing (the C parser
recurses: deep nesting is a ``RecursionError``, and a parsed deep object breaks
whatever walks it next), and, for metadata (``numbers=True``), numbers that are
finite and of a sane size (a time of ``1e999`` or a 400-digit integer is damage,
not a far future). Whatever is wrong is a :class:`~casmon.errors.DamagedObjectError`
naming the file; callers decide what damage means (docs/RELIABILITY.md, "Metadata
damage"), never a raw exception.

:func:`checked` and :func:`seal` add a checksum to a metadata body where one
flipped bit could change what it means (a fence's time or names): an xxh3 digest
of the canonical JSON of everything else, stored as ``"check"``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeAlias

from casmon.keys.digest import xxhash

from casmon.errors import DamagedObjectError
from casmon.keys import jsonlite

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["load", "load_object", "seal", "checked", "number", "FieldCheck", "register_fields", "check_fields", "MAX_BYTES", "MAX_DEPTH", "DATA_MAX", "CHECK"]

#: The largest metadata file read (a fence, which names every old level-0 file, may hold more: FENCE_MAX).
MAX_BYTES = 1 << 20
#: Records and refs: what a writer stored is read back whatever its size or depth (short of the parser's own
#: recursion limit, which is damage then); the limit keeps a crafted length from costing more than the bytes.
DATA_MAX = 1 << 34
#: The deepest nesting of metadata: casmon writes at most 3 levels.
MAX_DEPTH = 16
#: Integers in metadata have at most this many digits (times in ns, pids, counts).
_INT_DIGITS = 20
#: The field holding a body's checksum.
CHECK = "check"

#: Strings, and what is not a bracket: compiled on first use (``re``'s cache), by the rare deep document.
_STRING = rb'"[^"\\]*(?:\\.[^"\\]*)*"'
_NOT_BRACKET = rb"[^\[\]{}]+"

def _depth_ok(raw: bytes, limit: int) -> bool:
    """True if the JSON text ``raw`` nests at most ``limit`` deep (outside strings), without recursing."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return True
    s = re.sub(_NOT_BRACKET, b"", re.sub(_STRING, b"", raw, flags=re.DOTALL))
    for _ in range(limit):
        t = s.replace(b"[]", b"").replace(b"{}", b"")  # the innermost level goes each round
        if not t:
            return True
        if len(t) == len(s):
            return False  # unbalanced: not JSON either way
        s = t
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number metadata may hold")


def _finite(s: str) -> float:
    v = float(s)
    if not v - v == 0.0 or abs(v) > 1e300:  # NaN or infinite: math.isfinite without loading math
        raise ValueError(f"number {s[:40]} is out of range")
    return v


def _small_int(s: str) -> int:
    if len(s.lstrip("-")) > _INT_DIGITS:
        raise ValueError(f"integer of {len(s):,} digits")
    return int(s)


def load(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], key: str, *, limit: int = MAX_BYTES,
         depth: int | None = MAX_DEPTH, numbers: bool = True) -> Any:
    """Parse the JSON file ``key`` holding ``data``; :class:`DamagedObjectError` naming ``key`` if it is not
    JSON, longer than ``limit`` bytes, nested deeper than ``depth`` (None: any depth the parser reaches), or
    (``numbers``) holds NaN, infinities, or numbers too large to be a time or a count."""
    raw = data if isinstance(data, bytes) else bytes(data)
    if len(raw) > limit:
        raise DamagedObjectError(key, f"{len(raw):,} bytes, more than the {limit:,} such a file may hold")
    if depth is not None and not _depth_ok(raw, depth):
        raise DamagedObjectError(key, f"nested deeper than {depth} levels")
    try:
        if numbers:
            return jsonlite.loads(raw, parse_constant=_no_constant, parse_float=_finite, parse_int=_small_int)
        return jsonlite.loads(raw)
    except RecursionError:
        raise DamagedObjectError(key, "nested too deep to read") from None
    except (ValueError, TypeError, OverflowError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise DamagedObjectError(key, f"not valid JSON: {str(e)[:200]}") from None


def load_object(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], key: str, *, limit: int = MAX_BYTES,
                depth: int | None = MAX_DEPTH, numbers: bool = True) -> dict[str, Any]:
    """:func:`load`, for a file that must hold a JSON object."""
    got = load(data, key, limit=limit, depth=depth, numbers=numbers)
    if not isinstance(got, dict):
        raise DamagedObjectError(key, f"not a JSON object (a {type(got).__name__})")
    return got


def number(body: dict[str, Any], field: str, key: str, lo: float = -1e18, hi: float = 1e18) -> float:
    """``body[field]`` as a float in ``[lo, hi]``; :class:`DamagedObjectError` naming ``key`` otherwise."""
    v = body.get(field)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not lo <= v <= hi:
        raise DamagedObjectError(key, f"its {field!r} is {str(v)[:40]}, not a number from {lo:g} to {hi:g}")
    return float(v)


def _digest(body: dict[str, Any]) -> str:
    rest = {k: v for k, v in body.items() if k != CHECK}
    return xxhash.xxh3_64_hexdigest(jsonlite.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def seal(body: dict[str, Any]) -> bytes:
    """``body`` (JSON-able, finite numbers) as stored bytes, with its checksum."""
    import json  # a write's: a hit reads only

    return json.dumps({**body, CHECK: _digest(body)}, separators=(",", ":"), allow_nan=False).encode()


def checked(body: dict[str, Any], key: str) -> bool:
    """True if ``body`` (as :func:`load_object` read it) carries a checksum that matches; False if it carries
    none (written before checksums); :class:`DamagedObjectError` naming ``key`` if its checksum does not match."""
    if CHECK not in body:
        return False
    if body[CHECK] != _digest(body):
        raise DamagedObjectError(key, "its content does not match its checksum")
    return True


#: ``check(value) -> value``: a record's field as its readers may use it; ValueError or TypeError if it is not one.
FieldCheck: TypeAlias = "Callable[[Any], Any]"
_FIELDS: dict[str, dict[str, FieldCheck]] = {}


def register_fields(kind: str, fields: dict[str, FieldCheck]) -> None:
    """Check the ``fields`` of every record of ``kind`` as it is read (:func:`check_fields`). Here, not in the
    records module, so the layer that registers them loads no store to do it."""
    _FIELDS[kind] = dict(fields)


def check_fields(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body``, a record of ``kind``, with each registered field checked: one whose check fails is left out (a
    crafted or damaged record reads as one that never had it), so readers never meet a wrong type, NaN or a far
    future. ``_refs`` is never checked here: gc reads it as it is."""
    checks = _FIELDS.get(kind)
    if checks:
        for f, check in checks.items():
            if f in body:
                try:
                    body[f] = check(body[f])
                except (ValueError, TypeError, OverflowError):
                    del body[f]
    return body
