"""Records and refs as bytes: how they are encoded, checked, and trimmed when a value they name is lost.

*Records* are small JSON objects of a *kind* (``call``, ``cache``, ``run`` …);
the values one needs are listed in its ``_refs`` (gc keeps exactly what
records and refs reach). *Refs* (``refs/{name}``) are small named pointers,
the only mutable keys, each one frame holding ``{"target", "data", "nonce"}``.
:class:`~casmon.store.store.Store` decides when they are written; this module
holds their formats, and the *salvagers* features register so that a record
whose values are partly lost keeps what it can (used by a flush and by
``verify --repair``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeAlias

from casmon.keys.names import keep_flat_names
from casmon.errors import DamagedObjectError
from casmon.plain import Frozen
from casmon.keys.digest import Digest
from casmon.store import metafile
from casmon.store.codec import KIND_REF, decode_frame, encode_frame, get_codec
from casmon.store.table import Table

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Ref", "KIND_PATTERN", "is_kind_name", "ref_key", "is_ref_name", "ref_frame", "decode_ref", "encode_record", "parse_record", "refs_of",
           "trim_sealed", "Salvager", "SALVAGERS", "register_salvager", "salvage"]

#: What a record kind may be called (it names a folder, ``records/{kind}/``), checked by :func:`is_kind_name`.
KIND_PATTERN = r"[a-z][a-z0-9_-]{0,31}"
_KIND_REST = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_-")


def is_kind_name(kind: object) -> bool:
    """True if ``kind`` is a whole :data:`KIND_PATTERN` (checked without compiling it: a store's open names a
    few kinds, and a first hit would pay a tenth of a millisecond to compile it)."""
    return (isinstance(kind, str) and 1 <= len(kind) <= 32 and "a" <= kind[0] <= "z"
            and all(c in _KIND_REST for c in kind))
#: The longest ref name, and the longest part of one between slashes (a file name: 255 bytes).
REF_NAME_MAX = 512
REF_PART_MAX = 200
#: A ref name's form (compiled on first use, by ``re``'s cache: a hit reads no ref).
_REF_PATTERN = r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"

#: ``fn(record, lost) -> record | None``: a record trimmed of what needs a value in ``lost`` (its ``_refs``
#: updated), or None to drop it.
Salvager: TypeAlias = "Callable[[dict[str, Any], set[Digest]], dict[str, Any] | None]"


class Ref(Frozen):
    """A ref as read: its name, the value it points at (if any), and its JSON data."""

    FIELDS = ("name", "target", "data")
    name: str
    target: Digest | None
    data: dict[str, Any]

    def __init__(self, name: str, target: Digest | None, data: dict[str, Any]) -> None:
        d = self.__dict__
        d["name"], d["target"], d["data"] = name, target, data


def ref_key(name: str) -> str:
    """The backend key of ref ``name``; ``ValueError`` for a name that is not a clean relative path."""
    if not isinstance(name, str) or not re.fullmatch(_REF_PATTERN, name):
        raise ValueError(f"ref names are letters, digits, '_', '.', '-' and '/': got {name!r:.80}")
    parts = name.split("/")
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"a ref name's parts may not be '.' or '..': got {name!r:.80}")
    if len(name) > REF_NAME_MAX or max(len(p.encode()) for p in parts) > REF_PART_MAX:
        # file systems and S3 keys have limits (255 bytes a name, 1,024 a key): say so, not ENAMETOOLONG
        raise ValueError(f"a ref name is at most {REF_NAME_MAX} characters, {REF_PART_MAX} between slashes: "
                         f"got {len(name):,} ({name[:40]!r}...)")
    return "refs/" + name


def is_ref_name(name: str) -> bool:
    """True if ``name`` is one :func:`ref_key` takes (a stray file under ``refs/`` may be named anything)."""
    try:
        ref_key(name)
        return True
    except ValueError:
        return False


def ref_frame(target: Digest | bytes | str | None, data: dict[str, Any] | None, nonce: str | None = None) -> bytes:
    """The stored bytes of a ref (a ``nonce`` makes a created ref's bytes its creator's own)."""
    body: dict[str, Any] = {"target": None if target is None else Digest(target).hex(), "data": data or {}}
    if nonce:
        body["nonce"] = nonce
    import json  # a write's: a hit loads no json
    return encode_frame(json.dumps(body).encode(), KIND_REF, get_codec("none"))[1]


def decode_ref(name: str, key: str, data: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> Ref:
    """Parse the ref stored at ``key``; :class:`DamagedObjectError` naming it if it is not one."""
    raw = decode_frame(data, key)[1]
    try:
        body = metafile.load_object(raw, key, limit=metafile.DATA_MAX, depth=None, numbers=False)
        target = Digest(body["target"]) if body.get("target") else None
        info = body.get("data") or {}
        if not isinstance(info, dict):
            raise ValueError("its data is not a JSON object")
        return Ref(name, target, info)
    except DamagedObjectError as e:
        raise DamagedObjectError(key, f"not a valid ref: {e.reason}") from None
    except (ValueError, KeyError, TypeError) as e:
        raise DamagedObjectError(key, f"not a valid ref: {e}") from None


def encode_record(kind: str, record: dict[str, Any], refs: list[Digest],
                  encoded: str | bytes | Iterable[bytes] | None = None) -> bytes:
    """A record's stored bytes: ``record`` as JSON, or ``encoded`` (already a JSON object: text, UTF-8, or
    pieces whose concatenation is one), with ``refs`` added as its ``_refs``."""
    if encoded is not None:
        pieces = [encoded.encode()] if isinstance(encoded, str) else [encoded] if isinstance(encoded, bytes) else list(encoded)
        if refs:
            last = pieces[-1]
            if last[-1:] != b"}":
                raise ValueError("encoded record does not end with '}'")
            import json
            pieces[-1] = last[:-1] + b',"_refs":' + json.dumps([r.hex() for r in refs]).encode() + b"}"
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)
    if refs:
        record = dict(record)
        record["_refs"] = [r.hex() for r in refs]
    try:
        import json
        return json.dumps(record, separators=(",", ":"), allow_nan=True).encode()
    except (TypeError, ValueError) as e:
        raise TypeError(f"record of kind {kind!r} is not JSON-serializable: {e}") from None


def parse_record(kind: str, key: bytes, v: bytes) -> dict[str, Any]:
    """A stored record as a dict; :class:`DamagedObjectError` naming it if it is not a JSON object."""
    body = metafile.load_object(v, f"record {kind}/{bytes(key).hex()}", limit=metafile.DATA_MAX, depth=None,
                                numbers=False)
    return metafile.check_fields(kind, body)


def refs_of(t: Table) -> set[Digest]:
    """The values the records sealed in ``t`` (set aside by a flush, not written yet) name."""
    out: set[Digest] = set()
    for _name, entries in t.sealed():
        for _k, v in entries:
            try:
                out.update(Digest(h) for h in metafile.load_object(v, "a sealed record", limit=metafile.DATA_MAX,
                                                                       depth=None, numbers=False).get("_refs", ()))
            except (ValueError, TypeError, DamagedObjectError):
                pass
    return out


def trim_sealed(tables: Iterable[tuple[str, Table]], bad: set[Digest]) -> tuple[int, int]:
    """Keep the sealed records of ``tables`` from naming the lost values ``bad``: each is trimmed by its
    kind's salvager, or dropped. Returns how many were dropped and how many trimmed."""
    bad_hex = {d.hex() for d in bad}
    dropped = trimmed = 0
    for kind, t in tables:
        for name, entries in t.sealed():
            kept: list[tuple[bytes, bytes]] = []
            changed = False
            for k, v in entries:
                try:
                    rec = metafile.load_object(v, "a sealed record", limit=metafile.DATA_MAX, depth=None, numbers=False)
                    refs = rec.get("_refs", ())
                except DamagedObjectError:
                    kept.append((k, v))
                    continue
                if not bad_hex.intersection(refs):
                    kept.append((k, v))
                    continue
                changed = True
                fixed = salvage(kind, rec, bad)
                if fixed is None:
                    dropped += 1
                else:
                    trimmed += 1
                    import json
                    kept.append((k, json.dumps(fixed, separators=(",", ":"), allow_nan=True).encode()))
            if changed:
                t.replace_sealed(name, kept)
    return dropped, trimmed


#: kind -> salvager: keeps what a record can keep when some of the values it names are lost. Used by
#: ``verify --repair`` and by a flush that finds a value gone before its record is written. Kinds
#: without one lose the whole record.
SALVAGERS: dict[str, Salvager] = {}
#: kind -> (module, function) of the salvagers of casmon's own layers above the store, loaded by name the first
#: time a record of the kind needs one: repair keeps what it can of a call batch in a process that never
#: imported the call log.
SALVAGER_HOMES: dict[str, tuple[str, str]] = {"calls": ("casmon.calllog.records", "salvage_calls")}


def register_salvager(kind: str, fn: Salvager) -> None:
    """Teach repair and flush how to keep the intact part of a ``kind`` record whose values are partly lost."""
    SALVAGERS[kind] = fn


def salvage(kind: str, record: dict[str, Any], bad: set[Digest]) -> dict[str, Any] | None:
    """The part of ``record`` that does not need a value in ``bad`` (None: nothing)."""
    fn = SALVAGERS.get(kind)
    if fn is None and kind in SALVAGER_HOMES:
        import importlib

        module, name = SALVAGER_HOMES[kind]
        fn = SALVAGERS.setdefault(kind, getattr(importlib.import_module(module), name))
    if fn is None:
        return None
    try:
        return fn(record, bad)
    except Exception:  # noqa: BLE001 - a salvager that fails keeps nothing, never stops a flush or repair
        return None

# Pickles and keys name it where it was before the packages (casmon/keys/names.py).
keep_flat_names([Ref])
