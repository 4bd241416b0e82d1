"""Compression codecs and the frame every stored object is wrapped in.

A *frame* is a 40-byte header followed by the (possibly compressed) payload::

    magic "CSMN" | version u8 | codec u8 | kind u8 | check u8 | raw length u64 | stored length u64 | xxh3-128 of raw payload

``check`` is the XOR of the header's other 39 bytes, so damage to any one
header byte (a kind or a length, which the payload digest does not cover) is
caught as surely as damage to the payload.

The stored length makes a pack (concatenated frames) readable from its start
without an index, so a lost index can be rebuilt and ``verify`` can walk packs.

The digest of the *uncompressed* payload travels with every object, so any
object can be checked on its own, wherever it was copied to. Codec ids are part
of the on-disk format and never change meaning; decoding needs only the id.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import lru_cache
from types import ModuleType
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeAlias, cast

from casmon.keys.cext import extension_alone
from casmon.keys.digest import Digest, xxhash
from casmon.errors import DamagedObjectError
from casmon.plain import Frozen

if TYPE_CHECKING:
    import numpy as np
    from typing_extensions import Buffer, TypeIs  # collections.abc.Buffer from Python 3.12 on

__all__ = ["Codec", "CODECS", "get_codec", "Frame", "encode_frame", "encode_frame_parts", "decode_frame", "decode_body",
           "worth_compressing", "FRAME_HEADER", "is_ndarray", "loaded_numpy"]

#: What a frame is read into: the backends return bytes or numpy byte arrays, packs are sliced as memoryviews.
FrameData: TypeAlias = "bytes | bytearray | memoryview | np.ndarray[Any, np.dtype[Any]]"

MAGIC = b"CSMN"
FRAME_VERSION = 1
#: A frame's header ("<4sBBBBQQ16s": magic, version, codec, kind, check byte, raw and stored length, digest) is
#: read with int.from_bytes, and packed by a Struct built on the first write: a hit loads no _struct (~0.3 ms).
_HEADER_FORMAT = "<4sBBBBQQ16s"
FRAME_HEADER = 40
_STRUCTS: dict[str, Any] = {}


def _packer(fmt: str) -> Any:
    """The Struct for ``fmt``, made on first use (writes and tools; a read never needs one)."""
    got = _STRUCTS.get(fmt)
    if got is None:
        import struct  # noqa: PLC0415 - first write only: a hit never loads it
        got = _STRUCTS[fmt] = struct.Struct(fmt)
    return got


def __getattr__(name: str) -> Any:
    if name == "_HEADER":
        return _packer(_HEADER_FORMAT)
    if name == "_LZ4_HEADER":
        return _packer(_HEADER_FORMAT + "I")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# Kinds of object, recorded in the frame so `verify` and `stats` can say what a thing is.
KIND_CHUNK = 0  # a block of a value's buffer
KIND_VALUE = 1  # a value manifest
KIND_TABLE = 2  # an index or record table file
KIND_REF = 3  # a ref
KIND_NAMES = {KIND_CHUNK: "chunk", KIND_VALUE: "value", KIND_TABLE: "table", KIND_REF: "ref"}


class Codec(Frozen):
    """One compression method. ``id`` is what the frame stores."""

    FIELDS = ("id", "name")
    id: int
    name: str

    def __init__(self, id: int, name: str) -> None:
        d = self.__dict__
        d["id"], d["name"] = id, name

    def compress(self, data: Buffer, typesize: int = 1) -> bytes:
        if self.id == 3:  # table files: see _lz4_compress
            return _lz4_compress()(data)
        c = _numcodec(self.id, typesize)
        if c is None:
            return bytes(data)
        return bytes(c.encode(data))

    def decompress(self, data: Buffer, raw_len: int, out: Any = None) -> Any:
        """The raw payload: in ``out`` when given (returned), else a new bytes-like object."""
        if self.id == 3:  # a lookup decodes one lz4 block: 2 µs, not numcodecs' 15
            if raw_len <= _LZ4_SMALL:  # through the lz4 package: a first lookup need not import numcodecs
                raw = _lz4_block_decompress()(data)
                if out is None:
                    return raw
                memoryview(out).cast("B")[:] = raw  # as bytes: numpy would parse ``out[:] = raw`` as a number
                return out
            if out is None:
                return _lz4().decompress(data)
            _lz4().decompress(data, out)
            return out
        c = _numcodec(self.id, 1)
        if c is None:
            if out is not None:
                memoryview(out).cast("B")[:] = data
                return out
            return bytes(data)
        if out is not None:
            c.decode(data, out=out)
            return out
        res = c.decode(data)
        return res if isinstance(res, bytes) else memoryview(res).cast("B").tobytes()


CODECS: dict[str, Codec] = {
    "none": Codec(0, "none"),
    "blosc-lz4": Codec(1, "blosc-lz4"),
    "zstd": Codec(2, "zstd"),
    "lz4": Codec(3, "lz4"),
    "blosc-zstd": Codec(4, "blosc-zstd"),
}
_BY_ID = {c.id: c for c in CODECS.values()}


def get_codec(name: str) -> Codec:
    """Look a codec up by name; a clear error lists the names there are."""
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; choose one of {', '.join(CODECS)}") from None


@lru_cache(maxsize=1)
def _lz4_compress() -> Callable[[Buffer], bytes]:
    """``compress(data) -> bytes`` in numcodecs' LZ4 format (a little-endian u32 size, then the lz4
    block), through the ``lz4`` package: the same bytes (checked by a test), and 1 ms to import where
    numcodecs takes 60-90 ms (its codec registry scans every installed package's entry points) -- a
    process that logs calls and exits would pay that at exit. Decoding stays numcodecs' (4x quicker
    on megabytes)."""
    block = lz4_block()
    if block is None:  # pragma: no cover - a dependency; numcodecs' own writes the same
        nc = _lz4()
        return lambda data: nc.compress(data, 1)
    compress = block.compress
    return lambda data: compress(data, mode="fast", acceleration=1, store_size=True)


#: Table blocks up to this size are decoded by the ``lz4`` package (1 ms to import); larger ones by numcodecs,
#: quicker on megabytes but 30-110 ms to import, which a fresh process's first lookup would pay.
_LZ4_SMALL = 1 << 20


@lru_cache(maxsize=1)
def _lz4_block_decompress() -> Callable[[Buffer], bytes]:
    """``decompress(data) -> bytes`` of numcodecs' LZ4 format through the ``lz4`` package."""
    block = lz4_block()
    if block is None:  # pragma: no cover - a dependency; numcodecs' own reads the same
        nc = _lz4()
        return lambda data: bytes(nc.decompress(data))
    decompress = block.decompress
    return lambda data: decompress(data)


def lz4_block() -> Any:
    """lz4's block functions (``compress``, ``decompress``), or None without lz4: where ``lz4.block`` is not
    loaded, its C extension alone (the ``lz4`` package's ``__init__`` loads a second shared library and its
    version modules, ~0.3 ms of a fresh process's first hit, that decoding never uses)."""
    try:
        return extension_alone("lz4.block._block", ("compress", "decompress"), "lz4.block")
    except ImportError:
        return None


@lru_cache(maxsize=1)
def _lz4() -> Any:
    """numcodecs' lz4 module: ``compress(data, acceleration)`` and ``decompress(data)``, in the
    format of ``numcodecs.LZ4`` (a little-endian u32 size, then the lz4 block)."""
    from numcodecs import lz4

    return lz4


@lru_cache(maxsize=64)
def _numcodec(codec_id: int, typesize: int) -> Any:
    if codec_id == 0:
        return None
    import numcodecs  # on first use: not every import of casmon compresses anything
    if codec_id in (1, 4):
        cname = "lz4" if codec_id == 1 else "zstd"
        clevel = 5 if codec_id == 1 else 3
        try:
            return numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=numcodecs.Blosc.SHUFFLE, typesize=typesize)
        except TypeError:  # older numcodecs without typesize: shuffle still works per byte
            return numcodecs.Blosc(cname=cname, clevel=clevel, shuffle=numcodecs.Blosc.SHUFFLE)
    if codec_id == 2:
        return numcodecs.Zstd(level=1)
    if codec_id == 3:
        return numcodecs.LZ4()
    raise ValueError(f"unknown codec id {codec_id}")


class Frame(Frozen):
    """A frame's header: the digest of its raw payload, its kind, codec and lengths."""

    FIELDS = ("digest", "kind", "codec", "raw_len", "stored_len")
    digest: Digest
    kind: int
    codec: int
    raw_len: int
    stored_len: int

    def __init__(self, digest: Digest, kind: int, codec: int, raw_len: int, stored_len: int) -> None:
        d = self.__dict__
        d["digest"], d["kind"], d["codec"], d["raw_len"], d["stored_len"] = digest, kind, codec, raw_len, stored_len


#: A chunk at least this large is first compressed in a few samples; if they do not shrink
#: below ``PROBE_RATIO`` of their size, the chunk is stored raw without compressing it.
PROBE_MIN = 256 << 10
#: The samples: ``PROBE_SLICES`` slices of ``PROBE_SLICE`` bytes spread evenly over the chunk.
PROBE_SLICE = 16 << 10
PROBE_SLICES = 4
#: Compression must save at least a fifth to be worth its cost: compressing runs at about
#: 1 GB/s a core and decompressing at 3 GB/s, while a raw chunk is written and read at the
#: speed of memory. Random float64 data, which byte shuffle shrinks to about 0.88, is stored raw.
PROBE_RATIO = 0.8


def worth_compressing(mv: memoryview, codec: Codec, typesize: int = 1, slices: int = PROBE_SLICES) -> bool:
    """Whether compressing ``mv`` will save at least ``1 - PROBE_RATIO``, judged from ``slices`` samples.

    Costs about 1/16 of compressing a 1 MiB chunk and 1/64 of a 4 MiB one. The
    slices start on element boundaries so byte shuffle sees whole elements.
    """
    n = len(mv)
    if codec.id == 0:
        return False
    if n < PROBE_MIN:
        return True
    step = n // slices
    ts = max(1, typesize)
    starts = [(i * step) - (i * step) % ts for i in range(slices)]
    sample = b"".join(mv[o : o + PROBE_SLICE] for o in starts)
    return len(codec.compress(memoryview(sample), typesize)) < PROBE_RATIO * len(sample)


def encode_frame_parts(raw: Buffer, kind: int, codec: Codec, typesize: int = 1,
                       digest: Digest | None = None) -> tuple[Digest, bytes, bytes | memoryview]:
    """Like :func:`encode_frame`, but return ``(digest, header, payload)`` without joining them.

    A raw payload is ``raw`` itself (a memoryview, not a copy), so a large chunk
    can be written with two writes and no copy. Chunks (``KIND_CHUNK``) of at
    least ``PROBE_MIN`` bytes are probed first (:func:`worth_compressing`).
    """
    mv: bytes | memoryview = memoryview(raw).cast("B") if not isinstance(raw, bytes) else raw
    if digest is None:
        digest = Digest(xxhash.xxh3_128_digest(mv))
    n = len(mv)
    payload: bytes | memoryview | None = None
    if codec.id and n >= 64 and (kind != KIND_CHUNK or worth_compressing(memoryview(mv), codec, typesize)):
        payload = codec.compress(mv, typesize)
    cid = codec.id
    if payload is None or len(payload) >= n:
        payload, cid = mv, 0
    header = _packer(_HEADER_FORMAT).pack(MAGIC, FRAME_VERSION, cid, kind, 0, n, len(payload), digest)
    header = header[:7] + bytes([_xor(header)]) + header[8:]
    return digest, header, payload


def encode_frame(raw: Buffer, kind: int, codec: Codec, typesize: int = 1, digest: Digest | None = None) -> tuple[Digest, bytes]:
    """Hash ``raw``, compress it, and return ``(digest, frame bytes)``.

    If compression does not pay (incompressible data), the payload is stored raw,
    which also makes it cheaper to read.
    """
    digest, header, payload = encode_frame_parts(raw, kind, codec, typesize, digest)
    return digest, header + payload


def _bytes_at(data: Any, offset: int, n: int) -> bytes:
    """``n`` bytes of ``data`` (bytes, a memoryview, a numpy byte array) from ``offset``: what a Struct's
    ``unpack_from`` reads, and ValueError where there are fewer (the callers check the length first)."""
    b = bytes(memoryview(data).cast("B")[offset : offset + n]) if offset >= 0 else b""
    if len(b) != n:
        raise ValueError(f"{n} bytes wanted at offset {offset}, {len(b)} there")
    return b


def _xor_at(data: Buffer, offset: int) -> int:
    """XOR of the 40 header bytes at ``offset`` (with the check byte in place, a sound header XORs to 0)."""
    return _xor_of(_bytes_at(data, offset, 40))


def _xor_of(h: bytes) -> int:
    w = (int.from_bytes(h[:8], "little") ^ int.from_bytes(h[8:16], "little") ^ int.from_bytes(h[16:24], "little")
         ^ int.from_bytes(h[24:32], "little") ^ int.from_bytes(h[32:40], "little"))
    w ^= w >> 32
    w ^= w >> 16
    w ^= w >> 8
    return w & 0xFF


def _xor(b: bytes) -> int:
    """XOR of the 40 header bytes (with the check byte in place, a sound header XORs to 0)."""
    return _xor_at(b, 0)


def read_header(data: FrameData, key: str, offset: int = 0) -> Frame:
    """The checked header of the frame at ``offset`` (magic, version, codec, kind, check byte)."""
    if len(data) - offset < FRAME_HEADER:
        raise DamagedObjectError(key, f"truncated: {len(data) - offset} bytes, shorter than a header")
    buf: Buffer = data  # type: ignore[assignment]  # numpy's stubs omit the buffer protocol its arrays have
    h = _bytes_at(buf, offset, 40)
    magic, version, cid, kind, raw_len, stored_len, dig = (h[:4], h[4], h[5], h[6], int.from_bytes(h[8:16], "little"),
                                                           int.from_bytes(h[16:24], "little"), h[24:])
    if magic != MAGIC:
        raise DamagedObjectError(key, "not a casmon object (bad magic)")
    if version != FRAME_VERSION:
        raise DamagedObjectError(key, f"unknown frame version {version}")
    if cid not in _BY_ID:
        raise DamagedObjectError(key, f"unknown codec id {cid}")
    if kind not in KIND_NAMES:
        raise DamagedObjectError(key, f"unknown object kind {kind}")
    if _xor_at(buf, offset) != 0:
        raise DamagedObjectError(key, "the header fails its check byte")
    return Frame(Digest.from_raw(dig), kind, cid, raw_len, stored_len)


#: No codec here expands its payload more than this (zstd's best case is about 32,768x).
MAX_RATIO = 1 << 16


def _declared_size(codec_id: int, body: bytes | memoryview) -> int | None:
    """The uncompressed size a payload states about itself (blosc and lz4 do), or None."""
    if codec_id in (1, 4):  # blosc header: version, versionlz, flags, typesize, nbytes u32, blocksize u32, cbytes u32
        return int.from_bytes(bytes(body[4:8]), "little") if len(body) >= 16 else -1
    if codec_id == 3:  # numcodecs' LZ4: a little-endian u32 size prefix
        return int.from_bytes(bytes(body[:4]), "little") if len(body) >= 4 else -1
    if codec_id == 2:
        return _zstd_content_size(body)
    return None


def _zstd_content_size(body: bytes | memoryview) -> int:
    """The content size a zstd frame header states, or -1 if it states none or is not a zstd frame.

    numcodecs compresses with ``ZSTD_compress2``, which always writes the size, so
    every zstd payload casmon wrote states it; without this check a 16 KiB payload
    could claim a gigabyte and have it allocated before the codec failed.
    """
    if len(body) < 6 or bytes(body[:4]) != b"\x28\xb5\x2f\xfd":
        return -1
    desc = body[4]
    fcs_flag, single, dict_flag = desc >> 6, (desc >> 5) & 1, desc & 3
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[dict_flag]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(body) < pos + size:
        return -1
    n = int.from_bytes(bytes(body[pos : pos + size]), "little")
    return n + 256 if size == 2 else n


def decode_frame(data: FrameData, key: str, expect: Digest | None = None,
                 out: Any = None) -> tuple[Frame, bytes | memoryview]:
    """Check and decompress a frame. Never returns bytes that do not match the digest.

    ``out`` (a writable buffer of exactly the raw length) receives the payload
    without an extra copy. Raises :class:`DamagedObjectError` naming ``key``.
    """
    frame = read_header(data, key)
    if expect is not None and frame.digest != expect:
        raise DamagedObjectError(key, f"header names digest {frame.digest.hex()}, expected {expect.hex()}")
    return frame, decode_body(frame, memoryview(data)[FRAME_HEADER:], key, out)  # type: ignore[arg-type]


_LZ4_ID = 3


def decode_table_block(data: FrameData, key: str, at: int = 0) -> bytes:
    """The payload of a table block's frame (lz4, kind table), checked exactly as
    :func:`decode_frame` checks it: the usual case in a few steps (a lookup decodes
    one block, and each Python step is a tenth of its cost); anything unusual goes
    through :func:`decode_frame`, whose errors name what is wrong."""
    if len(data) > FRAME_HEADER + 4:
        buf: Buffer = data  # type: ignore[assignment]  # numpy's stubs omit the buffer protocol its arrays have
        h = _bytes_at(buf, 0, 44)  # the header, then lz4's own size field
        magic, version, cid, kind, raw_len, stored_len, dig, declared = (
            h[:4], h[4], h[5], h[6], int.from_bytes(h[8:16], "little"), int.from_bytes(h[16:24], "little"), h[24:40],
            int.from_bytes(h[40:44], "little"))
        if (magic == MAGIC and version == FRAME_VERSION and cid == _LZ4_ID and kind == KIND_TABLE
                and stored_len == len(data) - FRAME_HEADER and declared == raw_len
                and raw_len <= MAX_RATIO * stored_len + 4096 and not _xor_of(h)):
            unpack = _lz4_block_decompress() if raw_len <= _LZ4_SMALL else _lz4().decompress
            try:
                raw = unpack(memoryview(buf)[FRAME_HEADER:])
            except Exception:  # noqa: BLE001 - damage: decode_frame below says what
                raw = None
            if raw is not None and len(raw) == raw_len and xxhash.xxh3_128_digest(raw) == dig:
                return raw
    raw = decode_frame(data, f"{key}@{at}" if at else key)[1]  # errors name the block's file and offset
    return raw if isinstance(raw, bytes) else bytes(raw)


def decode_body(frame: Frame, body: bytes | memoryview, key: str, out: Any = None, placed: bool = False) -> Any:
    """Check and decompress the payload ``body`` of a frame whose header is ``frame``.

    ``placed=True`` says the raw payload was already read straight into ``out``
    (``body`` is then ``out``): only its length and digest are checked. Returns
    ``out`` when given, else a bytes-like object of the raw payload.
    """
    if len(body) != frame.stored_len:
        raise DamagedObjectError(key, f"payload is {len(body)} bytes, header says {frame.stored_len} (truncated or extended)")
    try:
        if frame.codec == 0:
            if out is not None and memoryview(out).nbytes != frame.raw_len:
                raise DamagedObjectError(key, f"raw length {frame.raw_len} does not fit the {memoryview(out).nbytes} bytes expected")
            if len(body) != frame.raw_len:
                raise DamagedObjectError(key, f"stored payload is {len(body)} bytes, raw length is {frame.raw_len}")
            if out is not None:
                if not placed:
                    memoryview(out).cast("B")[:] = body
                raw = out
            else:
                raw = body
        else:
            # Bounds first: the codec's own size field must agree with the header, and no codec expands
            # a payload more than MAX_RATIO times, so a crafted length never becomes a huge allocation.
            if frame.raw_len > MAX_RATIO * frame.stored_len + 4096:
                raise DamagedObjectError(key, f"raw length {frame.raw_len} is impossible for a {frame.stored_len}-byte payload")
            declared = _declared_size(frame.codec, body)
            if declared is not None and declared != frame.raw_len:
                raise DamagedObjectError(key, f"the payload says {declared} bytes, the header {frame.raw_len}")
            if out is not None and memoryview(out).nbytes != frame.raw_len:
                raise DamagedObjectError(key, f"raw length {frame.raw_len} does not fit the {memoryview(out).nbytes} bytes expected")
            # The codec sizes its own output from its size field, checked above to be the header's raw
            # length (itself bounded): its buffer is allocated untouched, so a crafted payload that fails
            # early commits no memory, where a zero-filled buffer of the claimed size would commit it all.
            raw = _BY_ID[frame.codec].decompress(body, frame.raw_len, out=out)
    except DamagedObjectError:
        raise
    except Exception as e:  # noqa: BLE001 - any codec failure means damage
        raise DamagedObjectError(key, f"cannot decompress: {e}") from None
    mv = memoryview(raw).cast("B") if not isinstance(raw, bytes) else raw
    if len(mv) != frame.raw_len:
        raise DamagedObjectError(key, f"decompressed to {len(mv)} bytes, header says {frame.raw_len}")
    if xxhash.xxh3_128_digest(mv) != frame.digest:
        raise DamagedObjectError(key, "content does not match its digest")
    return raw


def is_ndarray(x: object) -> TypeIs[np.ndarray[Any, Any]]:
    """Whether ``x`` is a numpy array, without importing numpy: where it is not imported (or another thread is
    still importing it and ``ndarray`` is not defined yet), nothing is one."""
    nd = getattr(sys.modules.get("numpy"), "ndarray", None)
    return nd is not None and isinstance(x, nd)


def loaded_numpy() -> ModuleType | None:
    """numpy if this process imported it, else None (casmon never imports it for a value that is not an array).
    The import statement waits while another thread is still importing it; in the thread importing it (code run by
    numpy's own import) the module is half-made, without ``ndarray`` yet: None then too."""
    if sys.modules.get("numpy") is None:
        return None
    import numpy

    return numpy if hasattr(numpy, "ndarray") else None


def typesize_of(buf: object) -> int:
    """The element size to shuffle by, for blosc."""
    if is_ndarray(buf):
        return buf.dtype.itemsize if buf.dtype.itemsize in (1, 2, 4, 8, 16) else 1
    if isinstance(buf, memoryview):
        return buf.itemsize if buf.itemsize in (1, 2, 4, 8, 16) else 1
    return 1


def split_pack(data: FrameData, key: str) -> list[tuple[int, int, Frame]]:
    """Walk a pack from its start: ``(offset, length, header)`` of every frame.

    Raises :class:`DamagedObjectError` where the chain of headers breaks.
    """
    out = []
    off = 0
    n = len(data)
    while off < n:
        h = read_header(data, f"{key}@{off}", off)
        ln = FRAME_HEADER + h.stored_len
        if off + ln > n:
            raise DamagedObjectError(f"{key}@{off}", f"frame runs past the end of the pack ({off + ln} > {n})")
        out.append((off, ln, h))
        off += ln
    return out
