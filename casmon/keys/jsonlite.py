"""JSON on a cached hit's path without loading the ``json`` package: the C code ``json`` itself runs.

A cached call that hits reads a few small JSON documents (the store's marker, records, a kept parse) and
checks two digests of JSON text; ``import json`` loads its encoder, decoder and pure-Python scanner, ~1 ms
of a script's first hit. :func:`loads` parses with ``_json``'s scanner, configured as ``json.loads``
configures it; :func:`dumps` writes plain values (strings, ints, finite floats, booleans, None, lists and
str-keyed dicts of them) with ``_json``'s string escaping. Anything else (bytes that are not plain UTF-8, a
BOM, other types, an error of any kind) goes to ``json`` itself, so each returns exactly what ``json.loads``
or ``json.dumps`` would and raises what they raise.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing's flag without importing typing
if TYPE_CHECKING:
    from typing import Any, Callable

_make_scanner: Any
_quote: Any
try:
    from _json import encode_basestring_ascii, make_scanner

    _make_scanner, _quote = make_scanner, encode_basestring_ascii
except ImportError:  # an interpreter without the C accelerator: json does it all
    _make_scanner = _quote = None

__all__ = ["loads", "dumps"]

_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}
_WS = " \t\n\r"


class _Context:
    """What ``_json.make_scanner`` reads off a ``JSONDecoder``: json.loads's defaults, or the hooks given."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    memo: dict[str, str]

    def __init__(self, parse_constant: Callable[[str], Any] | None, parse_float: Callable[[str], Any] | None,
                 parse_int: Callable[[str], Any] | None) -> None:
        self.parse_constant = parse_constant or _CONSTANTS.__getitem__
        self.parse_float = parse_float or float
        self.parse_int = parse_int or int
        self.memo = {}


_scanners: dict[tuple[Any, Any, Any], Any] = {}


def loads(data: str | bytes | bytearray, *, parse_constant: Callable[[str], Any] | None = None,
          parse_float: Callable[[str], Any] | None = None, parse_int: Callable[[str], Any] | None = None) -> Any:
    """``json.loads(data, parse_constant=..., parse_float=..., parse_int=...)``: the same value, the same errors."""
    if _make_scanner is not None and isinstance(data, (str, bytes, bytearray)):  # json's TypeError for the rest
        try:
            text = data if isinstance(data, str) else data.decode("utf-8")
            if text[:1] != "\ufeff" and not text[:1].isspace() and not text.endswith(tuple(_WS)):
                hooks = (parse_constant, parse_float, parse_int)
                scan = _scanners.get(hooks)
                if scan is None:
                    scan = _scanners[hooks] = _make_scanner(_Context(*hooks))
                value, end = scan(text, 0)
                if end == len(text):
                    return value
        except Exception:  # noqa: BLE001 - json.loads below gives the error, or the value, as it would
            pass
    import json

    return json.loads(data, parse_constant=parse_constant, parse_float=parse_float, parse_int=parse_int)


class _NotPlain(Exception):
    """A value :func:`dumps` leaves to ``json.dumps``."""


def _encode(v: Any, out: list[str], item_sep: str, key_sep: str, sort_keys: bool, depth: int) -> None:
    t = type(v)
    if t is str:
        out.append(_quote(v))
    elif v is None:
        out.append("null")
    elif v is True:
        out.append("true")
    elif v is False:
        out.append("false")
    elif t is int:
        out.append(int.__repr__(v))
    elif t is float and v - v == 0.0:  # finite: json writes NaN and infinities its own way
        out.append(float.__repr__(v))
    elif depth > 32:
        raise _NotPlain
    elif t is list or t is tuple:
        out.append("[")
        for i, x in enumerate(v):
            if i:
                out.append(item_sep)
            _encode(x, out, item_sep, key_sep, sort_keys, depth + 1)
        out.append("]")
    elif t is dict:
        out.append("{")
        if not all(type(k) is str for k in v):
            raise _NotPlain
        for i, k in enumerate(sorted(v) if sort_keys else v):
            if i:
                out.append(item_sep)
            out.append(_quote(k))
            out.append(key_sep)
            _encode(v[k], out, item_sep, key_sep, sort_keys, depth + 1)
        out.append("}")
    else:
        raise _NotPlain


def dumps(value: Any, *, sort_keys: bool = False, separators: tuple[str, str] | None = None) -> str:
    """``json.dumps(value, sort_keys=..., separators=...)``, with json's other defaults: the same text."""
    item_sep, key_sep = separators if separators is not None else (", ", ": ")
    if _quote is not None:
        out: list[str] = []
        try:
            _encode(value, out, item_sep, key_sep, sort_keys, 0)
            return "".join(out)
        except _NotPlain:
            pass
    import json

    return json.dumps(value, sort_keys=sort_keys, separators=separators)
