"""Table files and generations as bytes: what a table writes, and how a reader parses and checks it.

A *table file* (a level-0 file, a format-1 bucket, a format-2 block) is sorted
16-byte keys, offsets and values. A *generation* is bucket files plus a JSON
manifest (format 2: followed by a block directory and a bloom filter). Every
field read from the store is checked before use: a damaged or crafted file
gives :class:`~casmon.errors.DamagedObjectError`, never a wrong answer or a
huge allocation. Encoders live beside their parsers, so the two never drift.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeAlias, Union

from casmon.keys.digest import xxhash

from casmon.errors import DamagedObjectError
from casmon.plain import Plain
from casmon.store import metafile
from casmon.store.codec import get_codec, is_ndarray, loaded_numpy
from casmon.store.table.ranges import Ranges, parse_contains, ranges_of_names, ranges_union

if TYPE_CHECKING:
    from array import array

    import numpy as np
    import numpy.typing as npt

    #: Bytes as the store hands them over: read from a backend (a uint8 array) or decoded from a frame.
    Payload: TypeAlias = Union[bytes, bytearray, memoryview, npt.NDArray[Any]]

__all__ = ["BlockStarts", "BLOCK_ENTRIES", "BUCKET_ENTRIES", "FILE_ENTRIES", "MAX_BUCKETS", "NAME_RE", "BUCKET_RE",
           "Generation", "TableFile", "encode_table_file", "gen_time", "parse_generation"]

#: What was here and lives where a reader never loads it: the writing side (:mod:`.encode`) and the survey's.
_MOVED = {"Columns": ("encode", "Columns"), "_encode_v2": ("encode", "encode_v2"), "_bloom": ("encode", "_bloom"),
          "split_bucket": ("survey", "split_bucket")}


def __getattr__(name: str) -> Any:
    fmt = _LAZY_STRUCTS.get(name)
    if fmt is not None:  # the Structs writers and tests pack with, made on first use
        got = globals()[name] = _structs().Struct(fmt)
        return got
    moved = _MOVED.get(name)
    if moved is None:
        raise AttributeError(f"module 'casmon.store.table.format' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"casmon.store.table.{moved[0]}"), moved[1])

class _Vanished(Exception):
    """A file listed a moment ago is gone, or a lookaside copy failed its check: list again. Never leaves
    the table package."""


_MAGIC = b"CTB1"
#: A table file's head ("<4sI": magic, entry count). Readers parse heads, offsets and sums with int.from_bytes and
#: memoryview casts, so a hit loads no _struct (~0.3 ms); writers and tools get Structs (``_structs()``).
_COUNT_SIZE = 8
_LITTLE = sys.byteorder == "little"
_struct_module: Any = None


def _structs() -> Any:
    """The struct module, imported on first use: by a write, or to raise struct's own error on a short buffer."""
    global _struct_module
    if _struct_module is None:
        import struct  # noqa: PLC0415 - writes and damaged input only: a hit never loads it

        _struct_module = struct
    return _struct_module


_LAZY_STRUCTS = {"_COUNT": "<4sI", "LA_HEAD": "<4sHH16sQII", "_LA_SUM": "<Q"}
if TYPE_CHECKING:
    import struct

    _COUNT: struct.Struct
    LA_HEAD: struct.Struct
    _LA_SUM: struct.Struct


def _u64s(raw: Any, n: int, at: int = 0) -> tuple[int, ...]:
    """``n`` little-endian unsigned 64-bit numbers at ``at`` of ``raw`` (what ``struct.unpack_from`` gives, and
    struct's error where ``raw`` is too short)."""
    mv = memoryview(raw).cast("B")[at : at + 8 * n] if at >= 0 else memoryview(b"")
    if len(mv) != 8 * n:
        return tuple(_structs().unpack_from(f"<{n}Q", raw, at))  # raises struct.error, as it always did
    if _LITTLE:
        return tuple(mv.cast("Q"))
    return tuple(int.from_bytes(mv[i : i + 8], "little") for i in range(0, 8 * n, 8))
#: Level-0 file names (``{time_ns:016x}-{writer}-{seq:06x}``) and generation ids.
NAME_RE = re.compile(r"^[0-9a-f]{16}-[0-9a-z]{1,40}-[0-9a-f]{1,12}$")
#: Bucket file names (a pattern: compiled on first use by ``re``'s cache, by a survey; readers never need it).
BUCKET_RE = r"^[0-9a-f]{4,5}$"
#: Target entries per bucket of a format-1 generation (read whole; still read, no longer written).
BUCKET_ENTRIES = 8192
#: Format-2 generations: target entries per block (one small read) ...
BLOCK_ENTRIES = 64
#: ... and per bucket file (a bucket file is its blocks' frames, back to back).
FILE_ENTRIES = 1 << 16
#: The most blocks a generation may have.
MAX_BLOCKS = 1 << 26
#: Bloom filter of a format-2 generation: bits per entry and probes (about 1% false positives).
BLOOM_BITS_PER_KEY = 10
BLOOM_K = 7
#: Level-0 files up to this size are lz4-compressed (numcodecs' lz4 takes up to ~2 GiB), larger ones zstd.
L0_LZ4_MAX = 1 << 30
_M64 = (1 << 64) - 1
#: The most buckets a generation may have (2**20 buckets of 8,192 entries: 8 billion entries).
MAX_BUCKETS = 1 << 20
_ZSTD = get_codec("zstd")
#: Format-2 blocks: lz4 decodes a block in a third of zstd's time (a lookup decodes one), for ~35% more bytes.
_LZ4 = get_codec("lz4")
_RAW = get_codec("none")


def byte_view(data: Payload) -> memoryview:
    """``data`` as a flat memoryview of bytes, without a copy."""
    mv = data.data if is_ndarray(data) else memoryview(data)
    return mv if isinstance(data, bytes) else mv.cast("B")


def encode_table_file(entries: list[tuple[bytes, bytes]]) -> bytes:
    """The payload of a table file: keys sorted (stable), offsets, values."""
    entries = sorted(entries, key=lambda kv: kv[0])
    n = len(entries)
    keys = b"".join(k for k, _ in entries)
    vals = [v for _, v in entries]
    if not n:  # the reader's empty table, made at import: no Struct for it
        return _MAGIC + bytes(12)
    st = _structs()
    offs: bytes = st.pack(f"<{n + 1}Q", 0, *accumulate(len(v) for v in vals))
    head: bytes = st.pack("<4sI", _MAGIC, n)  # (a global lookup of _COUNT would miss the module's __getattr__)
    return head + keys + offs + b"".join(vals)


class TableFile:
    """One parsed table file: sorted keys, and the values behind them.

    Searched through Python lists (a block, or any file where numpy is not
    imported: casmon does not import it to read), or through numpy arrays (a
    large level-0 file in a process that has numpy), which cost less to make
    than lists there and a search's few microseconds more.
    """

    __slots__ = ("name", "n", "_kraw", "_oraw", "vals", "_keys", "_offs", "_klist", "_olist", "_finds")
    n: int
    vals: memoryview
    _keys: npt.NDArray[np.bytes_] | None
    _offs: npt.NDArray[np.uint64] | None
    _klist: list[bytes] | None
    _olist: list[int] | None
    _finds: int

    def __init__(self, name: str, payload: Payload) -> None:
        self.name = name
        mv = byte_view(payload)
        try:
            if len(mv) < _COUNT_SIZE:
                raise ValueError(f"{len(mv)} bytes are too few for a header")
            magic, n = bytes(mv[:4]), int.from_bytes(mv[4:8], "little")
            if magic != _MAGIC:
                raise ValueError("bad magic")
            p = _COUNT_SIZE
            if len(mv) < p + 16 * n + 8 * (n + 1):
                raise ValueError(f"{len(mv)} bytes are too few for {n} entries")
            self.n = n
            self._kraw, self._oraw = mv[p : p + 16 * n], mv[p + 16 * n : p + 24 * n + 8]
            self.vals = mv[p + 24 * n + 8 :]
            self._keys = self._offs = None
            self._klist = self._olist = None
            self._finds = 0
            np_ = loaded_numpy() if n > 256 else None
            if np_ is None:  # plain Python lists, searched by bisect
                offs = list(_u64s(self._oraw, n + 1))
                if n and (offs[-1] != len(self.vals) or offs != sorted(offs)):  # sorted(): one C pass if in order
                    raise ValueError("offsets do not match the values")
                kb = bytes(self._kraw)
                ks = [kb[i : i + 16].rstrip(b"\0") for i in range(0, 16 * n, 16)]  # as numpy's tolist() gives them
                if ks != sorted(ks):
                    raise ValueError("keys are not sorted")
                self._klist, self._olist = ks, offs
            else:
                keys, offs_a = self.keys, self.offs
                if int(offs_a[-1]) != len(self.vals) or np_.any(offs_a[1:] < offs_a[:-1]):  # unsigned: no wrap-around
                    raise ValueError("offsets do not match the values")
                if np_.any(keys[1:] < keys[:-1]):
                    raise ValueError("keys are not sorted")
        except ValueError as e:  # the lengths are checked before any offset is read: no struct.error
            raise DamagedObjectError(name, f"not a valid table file: {e}") from None

    @property
    def keys(self) -> npt.NDArray[np.bytes_]:
        """The keys as a numpy ``S16`` array (merges; numpy is imported here if it was not)."""
        if self._keys is None:
            import numpy as np

            self._keys = np.frombuffer(self._kraw, dtype="S16")
        return self._keys

    @property
    def offs(self) -> npt.NDArray[np.uint64]:
        """The value offsets as a numpy array (``n + 1`` of them)."""
        if self._offs is None:
            import numpy as np

            self._offs = np.frombuffer(self._oraw, dtype="<u8")
        return self._offs

    def __len__(self) -> int:
        return self.n

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        offs = self._olist if self._olist is not None else self.offs.tolist()
        keys = self._klist if self._klist is not None else self.keys.tolist()
        vals = self.vals
        for i, k in enumerate(keys):
            yield k.ljust(16, b"\0"), bytes(vals[offs[i] : offs[i + 1]])

    def find(self, key: bytes) -> list[bytes]:
        """The values under ``key``: a binary search. numpy's search costs about 5 µs a call and lets go
        of the GIL (a background merge then keeps it for a switch interval), so a file searched often
        gets its keys as a Python list, searched by bisection; not at once, since making the list
        costs about what ``n / 128`` searches do, and a fresh process's first hit searches each
        level-0 file once. (Not a dict: one tracked list per key for the garbage collector to walk.)"""
        kl = self._klist
        if kl is None:
            n = self.n
            if not n:
                return []
            self._finds += 1
            keys = self.keys
            if self._finds <= 2 + n // 128:
                import numpy as np  # this file was parsed into arrays: numpy is imported

                want = np.array(key, dtype="S16")
                lo = int(np.searchsorted(keys, want, side="left"))
                if lo >= n or keys[lo] != want:
                    return []
                hi = int(np.searchsorted(keys, want, side="right"))
                offs = self.offs
                return [bytes(self.vals[int(offs[i]) : int(offs[i + 1])]) for i in range(lo, hi)]
            kl = keys.tolist()  # trailing zero bytes dropped, as numpy compares them
            self._olist = self.offs.tolist()
            self._klist = kl
        k = key.rstrip(b"\0")
        global _searches
        if _searches < _C_AFTER:
            _searches += 1
            if _searches == _C_AFTER:
                _use_c_bisect()
        lo = _bisect_left(kl, k, 0, len(kl))
        if lo == len(kl) or kl[lo] != k:
            return []
        hi = _bisect_right(kl, k, lo, len(kl))
        ol = self._olist or []  # set with _klist
        return [bytes(self.vals[ol[i] : ol[i + 1]]) for i in range(lo, hi)]


def _py_bisect_left(a: list[bytes], x: bytes, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _py_bisect_right(a: list[bytes], x: bytes, lo: int, hi: int) -> int:
    while lo < hi:
        mid = (lo + hi) >> 1
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


#: A fresh process's first searches run in Python: loading ``_bisect`` (a shared library) costs a first hit more
#: than its few searches do. A process that keeps searching switches to the C functions once, then keeps them.
_bisect_left: Callable[[list[bytes], bytes, int, int], int] = _py_bisect_left
_bisect_right: Callable[[list[bytes], bytes, int, int], int] = _py_bisect_right
_C_AFTER = 64
_searches = 0


def _use_c_bisect() -> None:
    global _bisect_left, _bisect_right
    import _bisect  # bisect.py re-exports it: the same functions

    _bisect_left, _bisect_right = _bisect.bisect_left, _bisect.bisect_right


class _Block:
    """A format-2 block as a lookup reads it: the payload of a table file, searched in place.

    A lookup searches a block once, so it is not turned into arrays and lists as
    :class:`TableFile` does (that cost more than reading it). Its frame's digest
    was checked; the offsets of what a search finds are checked as it is found.
    """

    __slots__ = ("key", "at", "raw", "n", "offs_at", "vals_at")
    n: int

    def __init__(self, key: str, raw: bytes, at: int = 0) -> None:
        self.key, self.at, self.raw = key, at, raw  # the block is at offset ``at`` of file ``key``
        magic, n = (bytes(raw[:4]), int.from_bytes(raw[4:8], "little")) if len(raw) >= _COUNT_SIZE else (b"", 0)
        offs_at = _COUNT_SIZE + 16 * n
        vals_at = offs_at + 8 * (n + 1)
        if magic != _MAGIC or len(raw) < vals_at:
            raise DamagedObjectError(self.name, "not a valid table file: bad magic or too short for its entries")
        self.n, self.offs_at, self.vals_at = n, offs_at, vals_at

    @property
    def name(self) -> str:
        return f"{self.key}@{self.at}" if self.at else self.key

    def __len__(self) -> int:
        return self.n

    def find(self, key: bytes) -> list[bytes]:
        """The values under ``key`` (a binary search over the 16-byte keys)."""
        if len(key) != 16:
            key = bytes(key).ljust(16, b"\0")[:16]
        raw, n = self.raw, self.n
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            p = 8 + (mid << 4)
            if raw[p : p + 16] < key:
                lo = mid + 1
            else:
                hi = mid
        out = []
        room = len(raw) - self.vals_at
        while lo < n:
            p = 8 + (lo << 4)
            if raw[p : p + 16] != key:
                break
            p = self.offs_at + 8 * lo  # within the block: its length was checked against n
            a, b = int.from_bytes(raw[p : p + 8], "little"), int.from_bytes(raw[p + 8 : p + 16], "little")
            if not a <= b <= room:
                raise DamagedObjectError(self.name, "not a valid table file: offsets do not match the values")
            out.append(raw[self.vals_at + a : self.vals_at + b])
            lo += 1
        return out


class BlockStarts:
    """Where each block of a format-2 generation starts in its bucket file, worked out for a file when a
    lookup first reads one of its blocks: a fresh process's first hit touches one file of each generation,
    and at ten million entries adding up every file's block lengths would cost it milliseconds."""

    __slots__ = ("_lens", "_per", "_files")

    def __init__(self, lens: memoryview | array[int] | _LazyU32, per: int) -> None:
        self._lens, self._per = lens, per  # blocks per bucket file (a power of two)
        self._files: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._lens)

    def __getitem__(self, b: int) -> int:
        per = self._per
        f, i = divmod(b, per)
        s = self._files.get(f)
        if s is None:
            if not 0 <= b < len(self._lens):
                raise IndexError(b)
            s = self._files[f] = list(accumulate(self._lens[f * per : (f + 1) * per - 1], initial=0))
        return s[i]


class Generation(Plain):
    """A generation manifest: the merged entries of the level-0 files it covers, in blocks of bucket files."""

    # Shown and compared by these; the block directory and the bloom filter are neither.
    FIELDS = ("id", "count", "nbuckets", "covers", "marks", "contains", "exact", "v", "blocks", "shift", "nbits", "k")
    id: str
    count: int
    nbuckets: int
    covers: list[str]
    marks: dict[str, int]  # writer -> highest level-0 sequence number in this generation (older readers use it)
    contains: Ranges  # writer -> level-0 sequence numbers whose entries it holds
    exact: bool  # False: written before provenance (contains lists only the level-0 files it covered directly)
    # Format 2: ``blocks`` blocks (by the key's leading bits), each a frame inside bucket file
    # ``block >> shift``, at ``starts[block]`` with ``lens[block]`` bytes (0: empty); a bloom filter.
    v: int
    blocks: int
    shift: int
    starts: BlockStarts | Sequence[int]
    lens: Sequence[int] | _LazyU32
    bloom: bytes | memoryview | _LazyBytes
    nbits: int
    k: int

    def __init__(self, id: str, count: int, nbuckets: int, covers: list[str], marks: dict[str, int],
                 contains: Ranges | None = None, exact: bool = True) -> None:
        self.id, self.count, self.nbuckets, self.covers, self.marks = id, count, nbuckets, covers, marks
        self.contains = {} if contains is None else contains
        self.exact = exact
        self.v, self.blocks, self.shift, self.nbits, self.k = 1, 0, 0, 0, 0
        self.starts, self.lens, self.bloom = [], [], b""
        #: Where the directory and bloom filter are read a chunk at a time (:class:`Lookaside`); None: in memory.
        self.lookaside: Lookaside | None = None

    def may_hold(self, h1: int, h2: int) -> bool:
        """False if the key whose :func:`_hashes` are ``h1, h2`` is surely not here (format 2), else True.
        (:meth:`Table._lookup_once` has these lines inline: a lookup asks every generation.)"""
        if self.v < 2:
            return True
        bl, nb = self.bloom, self.nbits
        x = h1
        for _ in range(self.k):  # probe i is at ((h1 + i * h2) mod 2**64) mod nbits
            p = x % nb
            if not (bl[p >> 3] >> (p & 7)) & 1:
                return False
            x = (x + h2) & _M64
        return True

    def block_of(self, key: bytes) -> int:
        bits = self.blocks.bit_length() - 1
        return int.from_bytes(key[:4], "big") >> (32 - bits) if bits else 0

    def accounted(self) -> Ranges:
        """Sequence numbers no longer expected as level-0 files (for finding deleted ones)."""
        if self.exact:
            return self.contains
        return ranges_union(self.contains, {w: [(1, m)] for w, m in self.marks.items() if m >= 1})


def parse_generation(gid: str, key: str, raw: Payload) -> Generation:
    """A generation manifest, every field checked before use (a crafted one gives DamagedObjectError)."""
    try:
        mv = byte_view(raw)
        # Format 2: JSON, a zero byte, the block directory and bloom filter (no copy of the binary part:
        # at 10M entries it is ~12 MiB, read by every fresh process).
        cut = bytes(mv[:65536]).find(b"\0")  # the JSON part is short: look there first
        if cut < 0 and len(mv) > 65536:
            cut = bytes(mv).find(b"\0")
        head, sep, binary = (mv, b"", mv[:0]) if cut < 0 else (mv[:cut], b"\0", mv[cut + 1 :])
        m = metafile.load_object(head, key, limit=metafile.DATA_MAX, numbers=False)
        g = _generation_of(gid, m)
        v = m.get("v", 1)
        if v == 2:
            _parse_v2(g, m, binary)
        elif v != 1 or sep:
            raise ValueError(f"unknown generation version {v!r}")
        return g
    except (KeyError, TypeError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DamagedObjectError(key, f"not a valid generation manifest: {e}") from None


def _generation_of(gid: str, m: dict[str, Any]) -> Generation:
    """A manifest's JSON fields, checked (ValueError, KeyError or TypeError naming what is wrong)."""
    count, nb, covers, marks = m["count"], m["nbuckets"], m["covers"], m.get("marks", {})
    if type(count) is not int or count < 0:
        raise ValueError("count is not a non-negative integer")
    if type(nb) is not int or not 1 <= nb <= MAX_BUCKETS or nb & (nb - 1):
        raise ValueError(f"nbuckets is not a power of two up to {MAX_BUCKETS}")
    if not isinstance(covers, list) or not all(type(c) is str for c in covers):
        raise ValueError("covers is not a list of names")
    if not isinstance(marks, dict) or not all(type(v) is int for v in marks.values()):
        raise ValueError("marks is not a map of writers to numbers")
    if "contains" in m:
        contains = parse_contains(m["contains"])
        exact = m.get("exact", True)
        if type(exact) is not bool:
            raise ValueError("exact is not a boolean")
    else:  # written before provenance: only the level-0 files it covered directly are known
        contains = ranges_of_names(c[3:] for c in covers if c.startswith("l0:") and NAME_RE.match(c[3:]))
        exact = False
    return Generation(gid, count, nb, covers, {str(w): v for w, v in marks.items()}, contains, exact)


def _v2_sizes(g: Generation, m: dict[str, Any]) -> tuple[int, int, int]:
    """A format-2 manifest's ``(blocks, bloom bits, bloom probes)``, checked."""
    blocks, nbits, k = m["blocks"], m["bloom_bits"], m["bloom_k"]
    if type(blocks) is not int or not g.nbuckets <= blocks <= MAX_BLOCKS or blocks & (blocks - 1):
        raise ValueError(f"blocks is not a power of two from nbuckets to {MAX_BLOCKS}")
    if type(nbits) is not int or nbits < 8 or nbits % 8 or type(k) is not int or not 1 <= k <= 32:
        raise ValueError("bad bloom filter size")
    return blocks, nbits, k


def _parse_v2(g: Generation, m: dict[str, Any], binary: memoryview) -> None:
    """Check and attach a format-2 manifest's block directory and bloom filter."""
    blocks, nbits, k = _v2_sizes(g, m)
    if len(binary) != 4 * blocks + nbits // 8:
        raise ValueError(f"block directory and bloom filter are {len(binary)} bytes, expected {4 * blocks + nbits // 8}")
    g.v, g.blocks, g.shift, g.nbits, g.k = 2, blocks, (blocks // g.nbuckets).bit_length() - 1, nbits, k
    # Unsigned ints read in place, not a list: a fresh process would make millions of Python ints it never reads.
    lens: memoryview | array[int]
    if sys.byteorder == "little":
        lens = memoryview(bytes(binary[: 4 * blocks])).cast("I")
    else:
        from array import array

        lens = array("I", bytes(binary[: 4 * blocks]))
        lens.byteswap()
    g.lens, g.starts = lens, BlockStarts(lens, blocks // g.nbuckets)
    g.bloom = binary[4 * blocks :]


#: A format-2 generation's *lookaside* copy, ``{prefix}buckets/{id}/lookup`` beside its bucket files: its manifest's
#: payload, checked a chunk at a time, so a fresh process's lookup reads the few chunks of the bloom filter and block
#: directory a key needs where the manifest is read whole (~1.3 MB a million entries). Derived data, written by the
#: merge that writes the generation (or a reader that found none, at its flush: :mod:`.lookaside`); missing, stale
#: (made from another manifest) or damaged, the manifest is read whole. Older casmon never reads it, and deletes it
#: with the generation's bucket files (a merge deletes ``buckets/{id}/`` whole).
LOOKASIDE = "lookup"
#: Its header: magic, version, 0, the manifest frame's digest, payload bytes, chunk bytes, bytes of the JSON part;
#: then an xxh3-64 of the header, the chunk sums and the payload's JSON part and zero byte (so the first read checks
#: them at once), then an xxh3-64 of each chunk of the payload, then the payload.
#: (``LA_HEAD``, "<4sHH16sQII", a Struct made for writers and tests on first use; its sum is "<Q", ``_LA_SUM``.)
LA_HEAD_SIZE = 40
LA_MAGIC = b"CTL1"
#: The first read of a lookaside file: its header, chunk sums and, as a rule, the JSON part.
LA_FIRST = 4096
#: Its chunk table is at most this many sums (the writer picks chunks large enough).
LA_MAX_CHUNKS = 1536
#: Chunks a lookup reads before the rest is read at once: a first hit reads fewer, and a process that looks up many
#: keys reads it all anyway (at 48, 300 random hits at 1M cost 5-10% more than reading the manifest whole).
LA_SETTLE = 16


class Lookaside:
    """A generation's lookaside file, read a chunk at a time, each chunk checked against its sum. A chunk that
    fails (a short read, a sum that does not match) has the manifest read whole (``whole()``: its payload,
    checked against its frame's digest) and served from memory, and ``bad(payload)`` told, to write a sound copy.
    Where the manifest cannot be read either, it is :attr:`failed` and raises :class:`_Vanished`: the table lists
    again (and reads the manifest whole, or finds it gone or damaged)."""

    __slots__ = ("key", "read", "whole", "bad", "at", "size", "chunk", "sums", "head", "json", "chunks", "loads",
                 "failed", "gen")
    at: int
    size: int
    chunk: int
    head: int
    sums: tuple[int, ...]

    def __init__(self, key: str, read: Callable[[int, int], Any], first: bytes, digest: bytes,
                 whole: Callable[[], Any], bad: Callable[[Any], None]) -> None:
        """``read(start, end)``: bytes of the file; ``first``: its first bytes; ``digest``: the manifest frame's
        digest, which the copy must name. Raises ValueError where it is not a sound copy of that manifest."""
        self.key, self.read, self.whole, self.bad = key, read, whole, bad
        if len(first) < LA_HEAD_SIZE + 8:
            raise ValueError("too short for a header")
        h = bytes(memoryview(first).cast("B")[:LA_HEAD_SIZE])
        magic, version, named, size, chunk, head = (h[:4], int.from_bytes(h[4:6], "little"), h[8:24],
                                                    int.from_bytes(h[24:32], "little"),
                                                    int.from_bytes(h[32:36], "little"), int.from_bytes(h[36:40], "little"))
        if magic != LA_MAGIC or version != 1:
            raise ValueError("not a lookaside file")
        if named != digest:
            raise ValueError("made from another manifest")
        if not 512 <= chunk <= 1 << 26 or chunk & (chunk - 1) or not 0 < head < size:
            raise ValueError("bad sizes")
        n = -(-size // chunk)
        at = LA_HEAD_SIZE + 8 + 8 * n
        if n > LA_MAX_CHUNKS or head > metafile.DATA_MAX:
            raise ValueError("too many chunks, or too long a JSON part")
        if len(first) < at + head + 1:
            more = read(len(first), at + head + 1)
            first = bytes(first) + bytes(more if more is not None else b"")
            if len(first) < at + head + 1:
                raise ValueError("truncated")
        mv = memoryview(first)
        if xxhash.xxh3_64_intdigest(bytes(mv[:LA_HEAD_SIZE]) + bytes(mv[LA_HEAD_SIZE + 8 : at + head + 1])) != \
                _u64s(first, 1, LA_HEAD_SIZE)[0]:
            raise ValueError("its header does not match its sum")
        if mv[at + head] != 0:
            raise ValueError("no zero byte after the JSON part")
        self.sums = _u64s(first, n, LA_HEAD_SIZE + 8)
        self.at, self.size, self.chunk, self.head = at, size, chunk, head
        self.json = mv[at : at + head]  # checked with the header
        self.chunks: dict[int, bytes] = {}
        self.loads, self.failed = 0, False
        self.gen: Generation | None = None

    def load(self, c: int) -> bytes:
        """Chunk ``c`` of the payload, read and checked."""
        if self.loads >= LA_SETTLE and self.gen is not None:
            self.settle()
            got = self.chunks.get(c)
            if got is not None:
                return got
        a = self.at + c * self.chunk
        b = min(a + self.chunk, self.at + self.size)
        try:
            data = self.read(a, b) if 0 <= c < len(self.sums) else None
        except OSError:
            data = None
        part = b"" if data is None else bytes(data)
        if len(part) != b - a or xxhash.xxh3_64_intdigest(part) != self.sums[c]:
            self.recover()
            return self.chunks[c]
        self.loads += 1
        self.chunks[c] = part
        return part

    def payload(self, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the payload, checked."""
        c0, c1 = start // self.chunk, (end - 1) // self.chunk
        parts = [self.chunks.get(c) or self.load(c) for c in range(c0, c1 + 1)]
        whole = parts[0] if len(parts) == 1 else b"".join(parts)
        off = start - c0 * self.chunk
        return whole[off : off + end - start]

    def settle(self) -> None:
        """Read the rest at once and hand the generation its directory and bloom filter in memory
        (:func:`.lookaside.settle`)."""
        from casmon.store.table import lookaside  # a process that reads much, or a merge: not a first lookup

        lookaside.settle(self)

    def recover(self) -> None:
        """This copy failed a check: serve it from the manifest read whole (:func:`.lookaside.recover`)."""
        from casmon.store.table import lookaside

        lookaside.recover(self)


class _LazyBytes:
    """Bytes ``[off, off + n)`` of a lookaside payload, each read with its chunk on first use (the bloom filter)."""

    __slots__ = ("la", "off", "n")
    la: Lookaside
    off: int
    n: int

    def __init__(self, la: Lookaside, off: int, n: int) -> None:
        self.la, self.off, self.n = la, off, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        la = self.la
        c, r = divmod(self.off + i, la.chunk)
        part = la.chunks.get(c)
        return (part if part is not None else la.load(c))[r]


class _LazyU32:
    """Little-endian unsigned 32-bit numbers ``[0, n)`` at ``off`` of a lookaside payload (the block directory)."""

    __slots__ = ("la", "off", "n")
    la: Lookaside
    off: int
    n: int

    def __init__(self, la: Lookaside, off: int, n: int) -> None:
        self.la, self.off, self.n = la, off, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int | slice) -> Any:
        if isinstance(i, slice):
            a, b, _ = i.indices(self.n)
            b = max(a, b)
            raw = self.la.payload(self.off + 4 * a, self.off + 4 * b) if b > a else b""
            if len(raw) != 4 * (b - a) or not _LITTLE:
                return list(_structs().unpack(f"<{b - a}I", raw))  # struct's error where the bytes are short
            return memoryview(raw).cast("B").cast("I").tolist()
        if not 0 <= i < self.n:
            raise IndexError(i)
        return int.from_bytes(self.la.payload(self.off + 4 * i, self.off + 4 * i + 4), "little")


def parse_lookaside(gid: str, key: str, la: Lookaside) -> Generation:
    """Generation ``gid`` from its lookaside copy: the JSON part checked as :func:`parse_generation` checks it, the
    directory and bloom filter read on use. Raises ValueError (or KeyError, TypeError) where the copy is unsound."""
    try:
        m = metafile.load_object(la.json, key, limit=metafile.DATA_MAX, numbers=False)
    except DamagedObjectError as e:
        raise ValueError(e.reason) from None
    g = _generation_of(gid, m)
    if m.get("v", 1) != 2:
        raise ValueError("not a format-2 generation")
    blocks, nbits, k = _v2_sizes(g, m)
    if la.size - la.head - 1 != 4 * blocks + nbits // 8:
        raise ValueError("block directory and bloom filter are not the size the manifest says")
    g.v, g.blocks, g.shift, g.nbits, g.k = 2, blocks, (blocks // g.nbuckets).bit_length() - 1, nbits, k
    lens = _LazyU32(la, la.head + 1, blocks)
    g.lens, g.starts = lens, BlockStarts(lens, blocks // g.nbuckets)
    g.bloom = _LazyBytes(la, la.head + 1 + 4 * blocks, nbits // 8)
    g.lookaside, la.gen = la, g
    return g


def _hashes(key: bytes) -> tuple[int, int]:
    """The bloom filter's two hashes of a key: bytes the block number does not use (keys are digests)."""
    return int.from_bytes(key[8:16], "little"), int.from_bytes(key[4:8], "little") | 1


def gen_time(gid: str) -> float:
    """When a generation was made (seconds), from its id."""
    try:
        return int(gid.split("-", 1)[0], 16) / 1e9
    except ValueError:
        return 0.0


def _bucket_of(key: bytes, nbuckets: int) -> int:
    if nbuckets <= 1:
        return 0
    bits = nbuckets.bit_length() - 1
    return int.from_bytes(key[:4], "big") >> (32 - bits)
