"""Value manifests: the small stored object that says what a value is and which chunks hold it.

A value's digest is its manifest's digest. Three encodings, by first byte:
``j`` + JSON text (a ``json`` value, nothing else to store), ``p`` + a pickle
stream (a pickle with no buffers and no children), and ``m`` + u32 header
length + JSON header (``t`` form, ``meta``, ``parts``, ``n`` size,
``children``) + inline bytes. Its own module because both the store (put/get)
and maintenance (verify, repair) read manifests, and every field of one read
from a store is checked before anything is allocated from it.
"""

from __future__ import annotations

from collections.abc import Iterator
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, NotRequired, TypedDict

from casmon.keys.names import keep_flat_names
from casmon.errors import DamagedObjectError
from casmon.plain import Plain
from casmon.keys.digest import Digest
from casmon.store import metafile, serialize

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["Manifest", "encode_manifest", "decode_manifest"]

#: One buffer of a value, as its manifest names it: its chunks, in order. ``n``: bytes in the buffer; ``cb``: bytes
#: per chunk (the last may be shorter); ``rb``: row size (chunk boundaries fall on multiples of it); ``c``: the
#: chunks' digests, as hex. (For the type checker alone: at run time it is a plain dict, and typing not loaded.)
if TYPE_CHECKING:
    PartRef = TypedDict("PartRef", {"n": int, "cb": int, "rb": NotRequired[int], "c": list[str]})


class Manifest(Plain):
    """A stored value's description: its form, metadata, chunks and children."""

    FIELDS = ("digest", "tag", "meta", "parts", "children", "inline", "nbytes")
    digest: Digest
    tag: str  # json | pickle | array | bytes | handler
    meta: dict[str, Any]
    parts: list[PartRef]
    children: list[Digest]
    inline: bytes
    nbytes: int

    def __init__(self, digest: Digest, tag: str, meta: dict[str, Any], parts: list[PartRef], children: list[Digest],
                 inline: bytes, nbytes: int) -> None:
        self.digest, self.tag, self.meta, self.parts = digest, tag, meta, parts
        self.children, self.inline, self.nbytes = children, inline, nbytes

    def chunk_digests(self) -> Iterator[Digest]:
        """Every chunk of every part, in order (a chunk two parts share is named twice)."""
        for p in self.parts:
            for h in p["c"]:
                yield Digest(h)


def encode_manifest(tag: str, meta: dict[str, Any], parts: list[PartRef], children: list[Digest], inline: bytes,
                    nbytes: int) -> bytes:
    """The bytes of a value's manifest (the shortest of the three encodings that holds it)."""
    if tag == "json":
        return b"j" + inline
    if tag == "pickle" and not parts and not children:
        return b"p" + inline
    head: dict[str, Any] = {"t": tag, "meta": meta, "parts": parts, "n": nbytes}
    if children:
        head["children"] = [c.hex() for c in children]
    import json  # a write's: a hit loads no json
    h = json.dumps(head, separators=(",", ":")).encode()
    return b"m" + len(h).to_bytes(4, "little") + h + inline  # int.to_bytes, not struct: a hit loads no _struct


def decode_manifest(d: Digest, raw: bytes | bytearray | memoryview | npt.NDArray[np.uint8]) -> Manifest:
    """Parse the manifest of value ``d``; :class:`DamagedObjectError` naming it if any field is off."""
    raw = bytes(raw)
    t = raw[:1]
    try:
        if t == b"j":
            return Manifest(d, "json", {}, [], [], raw[1:], len(raw) - 1)
        if t == b"p":
            return Manifest(d, "pickle", {"oob": 0}, [], [], raw[1:], len(raw) - 1)
        if t == b"m":
            if len(raw) < 5:
                raise ValueError(f"{len(raw)} bytes are too few for a header length")
            n = int.from_bytes(raw[1:5], "little")
            if 5 + n > len(raw):
                raise ValueError(f"header of {n} bytes in a manifest of {len(raw)}")
            head = metafile.load_object(raw[5 : 5 + n], f"value {d.hex()}", limit=metafile.DATA_MAX, depth=None,
                                        numbers=False)
            inline = raw[5 + n :]
            # Every length, count and shape is checked before anything is allocated from it.
            serialize.check_manifest(f"value {d.hex()}", head.get("t"), head.get("meta"), head.get("parts"),
                                     head.get("children", []), len(inline), head.get("n"))
            children = [Digest(c) for c in head.get("children", [])]
            return Manifest(d, head["t"], head["meta"], head["parts"], children, inline, int(head["n"]))
    except (ValueError, KeyError, TypeError, RecursionError) as e:  # the one length read is checked: no struct.error
        raise DamagedObjectError(f"value {d.hex()}", f"not a valid manifest: {e}") from None
    raise DamagedObjectError(f"value {d.hex()}", f"not a value manifest (tag {t!r})")

# Pickles and keys name it where it was before the packages (casmon/keys/names.py).
keep_flat_names([Manifest])
