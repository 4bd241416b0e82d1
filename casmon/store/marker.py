"""The store's format marker, ``casmon.json``: format number, creation time, and a check.

Its own module because every open reads it, and ``maintenance`` (verify,
repair, stats) is too heavy to import for that.
"""

from __future__ import annotations

import json
import time

import xxhash

__all__ = ["marker_bytes", "parse_marker", "FORMAT_KEY"]

FORMAT_KEY = "casmon.json"


def _marker_check(info: dict) -> str:
    body = {k: v for k, v in info.items() if k != "check"}
    return xxhash.xxh3_64_hexdigest(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def marker_bytes(extra: dict | None = None) -> bytes:
    """A new ``casmon.json``: format, creation time, and a check of both (so damage is told from a newer format)."""
    from casmon.store.store import FORMAT_VERSION

    info = {"casmon": "content-addressed call store", "format": FORMAT_VERSION, "created": time.time(), **(extra or {})}
    info["check"] = _marker_check(info)
    return json.dumps(info, indent=1).encode()


def parse_marker(data) -> tuple[dict, str | None]:
    """``(info, None)`` for a sound marker, ``({}, what is wrong)`` for a damaged one.

    Markers written before the check field are accepted as they are.
    """
    try:
        info = json.loads(bytes(data))
        if not isinstance(info, dict):
            raise ValueError("not a JSON object")
        if type(info.get("format")) is not int or info["format"] < 1:
            raise ValueError("no format number")
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return {}, f"not a casmon store marker: {e}"
    if "check" in info and info["check"] != _marker_check(info):
        return {}, "its content does not match its check"
    return info, None
