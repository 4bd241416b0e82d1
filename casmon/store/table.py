"""Tables: append-only multimaps from 16-byte keys to small values, shared by many writers.

The object index (digest -> where the object lives) and every kind of record
(calls, cache entries, runs) are tables. A table is a set of immutable files
under one prefix, written without locks:

``{prefix}l0/{name}``
    *Level-0 files.* Each flush of a writer adds one, named
    ``{time_ns:016x}-{writer}-{seq:06x}``: writers never touch each other's
    files, and a writer numbers its files 1, 2, 3, ... without gaps.
``{prefix}gens/{id}`` and ``{prefix}buckets/{id}/{i:04x}``
    *Generations.* When level-0 files accumulate, a writer merges them (and
    small older generations) into a generation: its entries split into
    ``2**k`` buckets by the key's leading bits (about 8,192 entries a bucket),
    then a manifest. The manifest is written last, so a visible manifest means a
    complete generation; what it merged is deleted after it.

A manifest records its *provenance* exactly: ``contains`` maps each writer to
the ranges of level-0 sequence numbers whose entries the generation holds,
through every generation it merged (``covers`` names the files it replaced
directly). Readers work from provenance, never from timing:

* a level-0 file that a listed generation contains is not read again;
* a generation whose provenance lies inside another active generation's is
  redundant (two writers merged the same files at once): it is not read, and
  the next merge deletes it;
* generations whose provenance overlaps only in part are read together, each
  entry once (a table is a set of ``(key, value)`` entries: an entry added
  twice is one entry), and the next merge takes them together, which ends the
  overlap;
* so ``items()`` yields every entry once and ``count()`` is exact.

A reader lists ``l0/`` first and ``gens/`` second: a merge writes its manifest
before it deletes, so a file missing from the first listing was merged into a
generation the second listing shows. If a file vanishes while it is read (merged
meanwhile), the reader lists again.

A damaged or missing file never stops a reader: ``refresh`` and lookups skip
it, remember it in :attr:`Table.damaged`, and warn once per process
(:class:`StoreDamageWarning`); merges leave it alone; ``items(strict=True)``
(the default) raises instead of returning an incomplete table, because gc must
never judge reachability from part of the records. ``casmon verify --repair``
(:mod:`casmon.maintenance.verify`) rebuilds a damaged table from every readable file
(:meth:`Table.survey`, :meth:`Table.rewrite`).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import struct
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from casmon import faultpoints
from casmon.store.backend import Backend
from casmon.store.codec import FRAME_HEADER, KIND_TABLE, MAGIC, decode_frame, decode_table_block, encode_frame, get_codec, read_header
from casmon.errors import DamagedObjectError

__all__ = ["Table", "TableFile", "Generation", "Survey", "StoreDamageWarning", "encode_table_file"]

_MAGIC = b"CTB1"
_COUNT = struct.Struct("<4sI")
NAME_RE = re.compile(r"^[0-9a-f]{16}-[0-9a-z]{1,40}-[0-9a-f]{1,12}$")
BUCKET_RE = re.compile(r"^[0-9a-f]{4,5}$")
#: A lookup that finds nothing lists the table again at most this often (seconds):
#: other writers' entries newer than this may be missed, which costs a recomputation, never a wrong answer.
MISS_REFRESH_INTERVAL = 1.0
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
#: Format-2 blocks a table keeps after reading them.
BLOCK_CACHE = 8
#: Generation format written (1: whole buckets; 2: blocks, block directory and bloom filter).
GEN_FORMAT = 2
#: Merge a generation with what is merged when it holds at most this many times as many entries:
#: generations grow geometrically, so a table holds O(log n) of them and an entry is rewritten O(log n) times.
MERGE_FACTOR = 1
_M64 = (1 << 64) - 1
#: Merge level-0 files once this many are visible ...
L0_MERGE = 16
#: ... or once they hold this many entries (readers load level-0 files whole).
L0_MERGE_ENTRIES = BUCKET_ENTRIES
#: Buckets without a manifest this old (seconds, by the time in their generation's id) are left
#: over (a merge killed before its manifest, or a lost manifest): repair deletes them after
#: salvaging them. Younger ones may belong to a merge in progress.
ORPHAN_AGE = 600.0
#: The most buckets a generation may have (2**20 buckets of 8,192 entries: 8 billion entries).
MAX_BUCKETS = 1 << 20
_ZSTD = get_codec("zstd")
#: Format-2 blocks: lz4 decodes a block in a third of zstd's time (a lookup decodes one), for ~35% more bytes.
_LZ4 = get_codec("lz4")
_RAW = get_codec("none")


class StoreDamageWarning(UserWarning):
    """A file of the store is damaged or missing; casmon goes on without it. ``casmon verify --repair`` fixes it."""


_warned: set[str] = set()
_warned_lock = threading.Lock()


def warn_damage(url: str, key: str, reason: str) -> None:
    """Warn once per process and file that ``key`` is damaged, and what to do about it."""
    with _warned_lock:
        tag = f"{url}\0{key}"
        if tag in _warned:
            return
        _warned.add(tag)
    warnings.warn(f"casmon: {key} in store {url} is damaged or missing ({reason}); casmon goes on without it. "
                  f"Run `casmon verify --repair` on the store.", StoreDamageWarning, stacklevel=3)


def encode_table_file(entries: list[tuple[bytes, bytes]]) -> bytes:
    """The payload of a table file: keys sorted (stable), offsets, values."""
    entries = sorted(entries, key=lambda kv: kv[0])
    n = len(entries)
    keys = b"".join(k for k, _ in entries)
    vals = [v for _, v in entries]
    offs = np.zeros(n + 1, dtype="<u8")
    if n:
        np.cumsum([len(v) for v in vals], out=offs[1:])
    return _COUNT.pack(_MAGIC, n) + keys + offs.tobytes() + b"".join(vals)


class TableFile:
    """One parsed table file: sorted keys, and the values behind them."""

    __slots__ = ("name", "keys", "offs", "vals", "_klist", "_olist", "_finds")

    def __init__(self, name: str, payload) -> None:
        self.name = name
        mv = memoryview(payload).cast("B") if not isinstance(payload, bytes) else memoryview(payload)
        try:
            magic, n = _COUNT.unpack_from(mv, 0)
            if magic != _MAGIC:
                raise ValueError("bad magic")
            p = _COUNT.size
            self.keys = np.frombuffer(mv, dtype="S16", count=n, offset=p)
            p += 16 * n
            self.offs = np.frombuffer(mv, dtype="<u8", count=n + 1, offset=p)
            p += 8 * (n + 1)
            self.vals = mv[p:]
            self._klist = self._olist = None
            self._finds = 0
            if n <= 256:  # a block: plain Python lists, quicker than numpy's per-call cost (searched by bisect)
                offs = self.offs.tolist()
                if n and (offs[-1] != len(self.vals) or offs != sorted(offs)):  # sorted(): one C pass if in order
                    raise ValueError("offsets do not match the values")
                ks = self.keys.tolist()  # trailing zero bytes dropped, as numpy compares them
                if ks != sorted(ks):
                    raise ValueError("keys are not sorted")
                self._klist, self._olist = ks, offs
            else:
                if int(self.offs[-1]) != len(self.vals) or np.any(np.diff(self.offs.astype(np.int64)) < 0):
                    raise ValueError("offsets do not match the values")
                if np.any(self.keys[1:] < self.keys[:-1]):
                    raise ValueError("keys are not sorted")
        except (ValueError, struct.error) as e:
            raise DamagedObjectError(name, f"not a valid table file: {e}") from None

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        offs = self.offs.tolist()
        vals = self.vals
        for i, k in enumerate(self.keys.tolist()):
            yield k.ljust(16, b"\0"), bytes(vals[offs[i] : offs[i + 1]])

    def find(self, key: bytes) -> list[bytes]:
        """The values under ``key``: a binary search. numpy's search costs about 5 µs a call and lets go
        of the GIL (a background merge then keeps it for a switch interval), so a file searched often
        gets its keys as a Python list, searched by bisection; not at once, since making the list
        costs about what ``n / 128`` searches do, and a fresh process's first hit searches each
        level-0 file once. (Not a dict: one tracked list per key for the garbage collector to walk.)"""
        kl = self._klist
        if kl is None:
            n = len(self.keys)
            if not n:
                return []
            self._finds += 1
            if self._finds <= 2 + n // 128:
                k = np.array(key, dtype="S16")
                lo = int(np.searchsorted(self.keys, k, side="left"))
                if lo >= n or self.keys[lo] != k:
                    return []
                hi = int(np.searchsorted(self.keys, k, side="right"))
                offs = self.offs
                return [bytes(self.vals[int(offs[i]) : int(offs[i + 1])]) for i in range(lo, hi)]
            kl = self.keys.tolist()  # trailing zero bytes dropped, as numpy compares them
            self._olist = self.offs.tolist()
            self._klist = kl
        k = key.rstrip(b"\0")
        lo = bisect.bisect_left(kl, k)
        if lo == len(kl) or kl[lo] != k:
            return []
        hi = bisect.bisect_right(kl, k, lo)
        offs = self._olist
        return [bytes(self.vals[offs[i] : offs[i + 1]]) for i in range(lo, hi)]


_OFF2 = struct.Struct("<QQ")


class _Block:
    """A format-2 block as a lookup reads it: the payload of a table file, searched in place.

    A lookup searches a block once, so it is not turned into arrays and lists as
    :class:`TableFile` does (that cost more than reading it). Its frame's digest
    was checked; the offsets of what a search finds are checked as it is found.
    """

    __slots__ = ("key", "at", "raw", "n", "offs_at", "vals_at")

    def __init__(self, key: str, raw: bytes, at: int = 0) -> None:
        self.key, self.at, self.raw = key, at, raw  # the block is at offset ``at`` of file ``key``
        try:
            magic, n = _COUNT.unpack_from(raw, 0)
        except struct.error:
            magic, n = b"", 0
        offs_at = _COUNT.size + 16 * n
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
            a, b = _OFF2.unpack_from(raw, self.offs_at + 8 * lo)
            if not a <= b <= room:
                raise DamagedObjectError(self.name, "not a valid table file: offsets do not match the values")
            out.append(raw[self.vals_at + a : self.vals_at + b])
            lo += 1
        return out


# -- provenance: per writer, ranges of level-0 sequence numbers ---------------------
Ranges = dict  # writer -> sorted, disjoint, non-adjacent inclusive spans [(lo, hi), ...]


def _norm(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def ranges_union(*rs: Ranges) -> Ranges:
    acc: dict[str, list[tuple[int, int]]] = {}
    for r in rs:
        for w, spans in r.items():
            acc.setdefault(w, []).extend(spans)
    return {w: _norm(s) for w, s in acc.items()}


def ranges_of_names(names: Iterable[str]) -> Ranges:
    """The provenance of level-0 files by name."""
    acc: dict[str, list[tuple[int, int]]] = {}
    for n in names:
        w, s = parse_name(n)
        acc.setdefault(w, []).append((s, s))
    return {w: _norm(s) for w, s in acc.items()}


def ranges_has(r: Ranges, writer: str, seq: int) -> bool:
    spans = r.get(writer)
    if not spans:
        return False
    i = bisect.bisect_right(spans, (seq, math.inf)) - 1
    return i >= 0 and spans[i][0] <= seq <= spans[i][1]


def ranges_overlap(a: Ranges, b: Ranges) -> bool:
    for w, sa in a.items():
        sb = b.get(w)
        if not sb:
            continue
        i = j = 0
        while i < len(sa) and j < len(sb):
            if sa[i][1] < sb[j][0]:
                i += 1
            elif sb[j][1] < sa[i][0]:
                j += 1
            else:
                return True
    return False


def ranges_within(a: Ranges, b: Ranges) -> bool:
    """Every number of ``a`` is in ``b``."""
    for w, sa in a.items():
        sb = b.get(w)
        if not sb:
            if sa:
                return False
            continue
        for lo, hi in sa:
            i = bisect.bisect_right(sb, (lo, math.inf)) - 1
            if i < 0 or sb[i][1] < hi:
                return False
    return True


def ranges_json(r: Ranges) -> dict:
    return {w: [[lo, hi] for lo, hi in s] for w, s in sorted(r.items())}


def _ranges_parse(obj) -> Ranges:
    if not isinstance(obj, dict):
        raise ValueError("contains is not a map of writers to ranges")
    out = {}
    for w, spans in obj.items():
        if not isinstance(spans, list):
            raise ValueError("contains is not a map of writers to ranges")
        pairs = []
        for s in spans:
            if not (isinstance(s, list) and len(s) == 2 and all(type(x) is int for x in s) and 1 <= s[0] <= s[1]):
                raise ValueError(f"bad range {s!r} in contains")
            pairs.append((s[0], s[1]))
        out[str(w)] = _norm(pairs)
    return out


@dataclass
class Generation:
    id: str
    count: int
    nbuckets: int
    covers: list[str]
    marks: dict[str, int]  # writer -> highest level-0 sequence number in this generation (older readers use it)
    contains: Ranges = field(default_factory=dict)  # writer -> level-0 sequence numbers whose entries it holds
    exact: bool = True  # False: written before provenance (contains lists only the level-0 files it covered directly)
    # Format 2: ``blocks`` blocks (by the key's leading bits), each a frame inside bucket file
    # ``block >> shift``, at ``starts[block]`` with ``lens[block]`` bytes (0: empty); a bloom filter.
    v: int = 1
    blocks: int = 0
    shift: int = 0
    starts: list = field(default_factory=list, repr=False, compare=False)
    lens: list = field(default_factory=list, repr=False, compare=False)
    bloom: bytes = field(default=b"", repr=False, compare=False)
    nbits: int = 0
    k: int = 0

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


def parse_generation(gid: str, key: str, raw) -> Generation:
    """A generation manifest, every field checked before use (a crafted one gives DamagedObjectError)."""
    try:
        mv = memoryview(raw).cast("B") if not isinstance(raw, bytes) else memoryview(raw)
        # Format 2: JSON, a zero byte, the block directory and bloom filter (no copy of the binary part:
        # at 10M entries it is ~12 MiB, read by every fresh process).
        cut = bytes(mv[:65536]).find(b"\0")  # the JSON part is short: look there first
        if cut < 0 and len(mv) > 65536:
            cut = bytes(mv).find(b"\0")
        head, sep, binary = (mv, b"", mv[:0]) if cut < 0 else (mv[:cut], b"\0", mv[cut + 1 :])
        m = json.loads(bytes(head))
        if not isinstance(m, dict):
            raise ValueError("not an object")
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
            contains = _ranges_parse(m["contains"])
            exact = m.get("exact", True)
            if type(exact) is not bool:
                raise ValueError("exact is not a boolean")
        else:  # written before provenance: only the level-0 files it covered directly are known
            contains = ranges_of_names(c[3:] for c in covers if c.startswith("l0:") and NAME_RE.match(c[3:]))
            exact = False
        g = Generation(gid, count, nb, covers, {str(w): v for w, v in marks.items()}, contains, exact)
        v = m.get("v", 1)
        if v == 2:
            _parse_v2(g, m, binary)
        elif v != 1 or sep:
            raise ValueError(f"unknown generation version {v!r}")
        return g
    except (KeyError, TypeError, ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise DamagedObjectError(key, f"not a valid generation manifest: {e}") from None


def _parse_v2(g: Generation, m: dict, binary: memoryview) -> None:
    """Check and attach a format-2 manifest's block directory and bloom filter."""
    blocks, nbits, k = m["blocks"], m["bloom_bits"], m["bloom_k"]
    if type(blocks) is not int or not g.nbuckets <= blocks <= MAX_BLOCKS or blocks & (blocks - 1):
        raise ValueError(f"blocks is not a power of two from nbuckets to {MAX_BLOCKS}")
    if type(nbits) is not int or nbits < 8 or nbits % 8 or type(k) is not int or not 1 <= k <= 32:
        raise ValueError("bad bloom filter size")
    if len(binary) != 4 * blocks + nbits // 8:
        raise ValueError(f"block directory and bloom filter are {len(binary)} bytes, expected {4 * blocks + nbits // 8}")
    lens = np.frombuffer(binary, dtype="<u4", count=blocks).astype(np.int64)
    per_file = lens.reshape(g.nbuckets, blocks // g.nbuckets)
    g.v, g.blocks, g.shift = 2, blocks, (blocks // g.nbuckets).bit_length() - 1
    # Arrays, not lists: a lookup reads one entry of each, and a fresh process would spend
    # milliseconds making millions of Python ints it never reads.
    # Memoryviews of int64 arrays: indexing one gives a Python int without a numpy scalar in between.
    g.starts = memoryview(np.ascontiguousarray((np.cumsum(per_file, axis=1) - per_file).ravel(), dtype=np.int64))
    g.lens = memoryview(np.ascontiguousarray(lens, dtype=np.int64))
    g.bloom, g.nbits, g.k = binary[4 * blocks :], nbits, k


def _hashes(key: bytes) -> tuple[int, int]:
    """The bloom filter's two hashes of a key: bytes the block number does not use (keys are digests)."""
    return int.from_bytes(key[8:16], "little"), int.from_bytes(key[4:8], "little") | 1


def _bloom(keys: np.ndarray, nbits: int, k: int) -> bytes:
    """The bloom filter of ``keys`` (an ``(n, 16)`` uint8 array), probes as in :meth:`Generation.may_hold`."""
    h1 = np.ascontiguousarray(keys[:, 8:16]).view("<u8").ravel()
    h2 = np.ascontiguousarray(keys[:, 4:8]).view("<u4").ravel().astype(np.uint64) | np.uint64(1)
    bits = np.zeros(nbits, dtype=bool)
    with np.errstate(over="ignore"):
        for i in range(k):
            bits[(h1 + np.uint64(i) * h2) % np.uint64(nbits)] = True
    return np.packbits(bits, bitorder="little").tobytes()


def split_bucket(data, key: str) -> tuple[list[TableFile], str | None]:
    """The tables in a bucket file (one frame in format 1, its blocks' frames in format 2), found
    without the manifest; ``(readable ones, what was wrong or None)``. Past a damaged header the
    next frame is found again by its magic, so one damaged block costs only its own entries."""
    out: list[TableFile] = []
    problem = None
    mv = memoryview(data).cast("B") if not isinstance(data, bytes) else memoryview(data)
    n, off = len(mv), 0
    while off < n:
        where = f"{key}@{off}" if off else key
        try:
            h = read_header(mv, where, off)
            ln = FRAME_HEADER + h.stored_len
            if off + ln > n:
                raise DamagedObjectError(where, f"frame runs past the end of the file ({off + ln} > {n})")
            out.append(TableFile(where, decode_frame(mv[off : off + ln], where)[1]))
            off += ln
        except DamagedObjectError as e:
            problem = problem or e.reason
            nxt = bytes(mv[off + 1 :]).find(MAGIC)
            if nxt < 0:
                break
            off += 1 + nxt
    return out, problem


def parse_name(name: str) -> tuple[str, int]:
    """``(writer, seq)`` of a level-0 file name."""
    _t, writer, seq = name.split("-")
    return writer, int(seq, 16)


def _gen_time(gid: str) -> float:
    """When a generation was made (seconds), from its id."""
    try:
        return int(gid.split("-", 1)[0], 16) / 1e9
    except ValueError:
        return 0.0


class Columns:
    """Table entries as columns, in order: 16-byte keys, and each value's start and length in one
    buffer. A merge of a million entries handles a few arrays instead of a million tuples."""

    __slots__ = ("keys", "starts", "lens", "buf")

    def __init__(self, keys: np.ndarray, starts: np.ndarray, lens: np.ndarray, buf) -> None:
        self.keys, self.starts, self.lens, self.buf = keys, starts, lens, buf

    def __len__(self) -> int:
        return len(self.keys)

    @classmethod
    def of_tables(cls, tables: list[TableFile]) -> Columns:
        """The entries of ``tables``, one table after the other, in their order (nothing dropped)."""
        bufs = [tf.vals for tf in tables if len(tf)]
        tables = [tf for tf in tables if len(tf)]
        if not tables:
            return cls(np.empty(0, "S16"), np.empty(0, np.int64), np.empty(0, np.int64), b"")
        base = np.cumsum([0] + [len(b) for b in bufs[:-1]])
        offs = [tf.offs.astype(np.int64) for tf in tables]
        return cls(np.concatenate([tf.keys for tf in tables]),
                   np.concatenate([o[:-1] + b0 for o, b0 in zip(offs, base.tolist())]),
                   np.concatenate([np.diff(o) for o in offs]),
                   b"".join(bufs))

    @classmethod
    def of_entries(cls, entries: list[tuple[bytes, bytes]]) -> Columns:
        lens = np.fromiter((len(v) for _, v in entries), dtype=np.int64, count=len(entries))
        starts = np.zeros(len(entries), np.int64)
        if len(entries) > 1:
            np.cumsum(lens[:-1], out=starts[1:])
        keys = np.frombuffer(b"".join(k.ljust(16, b"\0") for k, _ in entries), dtype="S16")
        return cls(keys, starts, lens, b"".join(v for _, v in entries))

    def value(self, i: int) -> bytes:
        s = int(self.starts[i])
        return bytes(self.buf[s : s + int(self.lens[i])])

    def take(self, order: np.ndarray) -> Columns:
        """The entries at ``order`` (an index array), sharing the buffer."""
        return Columns(self.keys[order], self.starts[order], self.lens[order], self.buf)

    def sorted_unique(self) -> Columns:
        """Sorted by key (stable), and each (key, value) pair once, where it first appears: what
        ``dict.fromkeys`` then a stable sort make of the same entries as tuples."""
        order = np.argsort(self.keys, kind="stable")
        out = self.take(order)
        same = np.flatnonzero(out.keys[1:] == out.keys[:-1]) + 1  # rows whose key is the previous row's
        if len(same):
            keep = np.ones(len(out), dtype=bool)
            seen: set[bytes] = set()
            prev = -2
            for p in same.tolist():  # runs of one key are rare and short: compare their values
                if p != prev + 1:
                    seen = {out.value(p - 1)}
                v = out.value(p)
                if v in seen:
                    keep[p] = False
                else:
                    seen.add(v)
                prev = p
            out = out.take(np.flatnonzero(keep))
        return out

    def entries(self) -> list[tuple[bytes, bytes]]:
        return [(k.ljust(16, b"\0"), self.value(i)) for i, k in enumerate(self.keys.tolist())]

    def table_file(self, lo: int, hi: int) -> bytes:
        """The payload of a table file of rows ``lo:hi`` (sorted already), as :func:`encode_table_file` makes it."""
        n = hi - lo
        offs = np.zeros(n + 1, dtype="<u8")
        lens = self.lens[lo:hi]
        np.cumsum(lens, out=offs[1:])
        buf = memoryview(self.buf) if not isinstance(self.buf, memoryview) else self.buf
        vals = b"".join([buf[st : st + ln] for st, ln in zip(self.starts[lo:hi].tolist(), lens.tolist())])
        return _COUNT.pack(_MAGIC, n) + self.keys[lo:hi].tobytes() + offs.tobytes() + vals


def _encode_v2(entries: list[tuple[bytes, bytes]] | Columns, nb: int) -> tuple[list[bytes], bytes, dict]:
    """A format-2 generation's bucket files, its directory and bloom filter, and manifest fields.

    Entries are split by the key's leading bits into blocks of about
    :data:`BLOCK_ENTRIES` (each one frame, checked on its own, so a lookup reads
    and checks one block); ``nb`` bucket files hold the blocks in order.
    """
    cols = entries if isinstance(entries, Columns) else Columns.of_entries(entries)
    n = len(cols)
    blocks = nb
    while blocks < MAX_BLOCKS and n / blocks > BLOCK_ENTRIES:
        blocks *= 2
    bits = blocks.bit_length() - 1
    nbits = max(64, (n * BLOOM_BITS_PER_KEY + 7) // 8 * 8)
    if n:
        if n > 1 and not bool(np.all(cols.keys[1:] >= cols.keys[:-1])):  # a merge's are sorted already
            cols = cols.take(np.argsort(cols.keys, kind="stable"))
        keys = np.frombuffer(cols.keys.tobytes(), dtype=np.uint8).reshape(n, 16)
        top = np.ascontiguousarray(keys[:, :4]).view(">u4").ravel().astype(np.int64) >> (32 - bits) if bits else np.zeros(n, np.int64)
        bounds = np.searchsorted(top, np.arange(blocks + 1)).tolist()
        bloom = _bloom(keys, nbits, BLOOM_K)
    else:
        bounds, bloom = [0] * (blocks + 1), bytes(nbits // 8)
    lens = np.zeros(blocks, dtype="<u4")
    per = blocks // nb
    files = []
    for i in range(nb):
        parts = []
        for b in range(i * per, (i + 1) * per):
            lo, hi = bounds[b], bounds[b + 1]
            if lo == hi:
                continue
            _, frame = encode_frame(cols.table_file(lo, hi), KIND_TABLE, _LZ4)
            lens[b] = len(frame)
            parts.append(frame)
        files.append(b"".join(parts))
    return files, lens.tobytes() + bloom, {"v": 2, "blocks": blocks, "bloom_bits": nbits, "bloom_k": BLOOM_K}


def _index_values(idx: dict, key: bytes) -> tuple[bytes, ...]:
    """The values :func:`_index_add` put under ``key``."""
    v = idx.get(key)
    return () if v is None else v if type(v) is tuple else (v,)


def _index_add(idx: dict, key: bytes, value: bytes) -> None:
    """Add to a key -> value(s) index: one value as itself, more as a tuple. Not a list per key: the
    garbage collector walks every list at each full collection, and a writer's index holds
    thousands; a tuple of bytes it stops tracking."""
    old = idx.get(key)
    idx[key] = value if old is None else (old + (value,) if type(old) is tuple else (old, value))


class _Vanished(Exception):
    """A file listed a moment ago is gone: list again. Never leaves this module."""


def _bucket_of(key: bytes, nbuckets: int) -> int:
    if nbuckets <= 1:
        return 0
    bits = nbuckets.bit_length() - 1
    return int.from_bytes(key[:4], "big") >> (32 - bits)


@dataclass
class _View:
    """What a listing means: which generations and level-0 files to read."""

    gens: dict[str, Generation]  # every readable manifest listed
    active: list[Generation]  # the generations to read, by id
    redundant: list[str]  # generations whose provenance lies inside an active one's
    active_l0: list[str]  # level-0 files to read, by name
    contained_l0: list[str]  # level-0 files a generation already holds
    groups: list[frozenset[str]]  # active generations whose provenance overlaps (each group read as one)


def resolve(gens: dict[str, Generation], l0_names: Iterable[str]) -> _View:
    """Decide from provenance alone what a reader reads (see the module docstring)."""
    covered: set[str] = set()
    for g in gens.values():
        covered.update(g.covers)
    cands = sorted((g for g in gens.values() if "gen:" + g.id not in covered), key=lambda g: g.id)
    redundant: set[str] = set()
    for g in cands:
        if not g.exact or not g.contains:
            continue  # an older manifest's provenance is incomplete: it is never taken as redundant
        for h in cands:
            if h is g or h.id in redundant or not ranges_within(g.contains, h.contains):
                continue
            # Inside h. If both hold the same, the newer (larger id) stays.
            if not h.exact or h.id > g.id or not ranges_within(h.contains, g.contains):
                redundant.add(g.id)
                break
    active = [g for g in cands if g.id not in redundant]
    held = ranges_union(*(g.contains for g in gens.values()))
    active_l0, contained_l0 = [], []
    for n in sorted(l0_names):
        w, s = parse_name(n)
        if "l0:" + n in covered or ranges_has(held, w, s):
            contained_l0.append(n)
        else:
            active_l0.append(n)
    # Groups of active generations that overlap (union-find).
    parent = {g.id: g.id for g in active}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if len(active) > 1:
        direct = {g.id: set(g.covers) for g in active}
        for i, a in enumerate(active):
            for b in active[i + 1 :]:
                if ranges_overlap(a.contains, b.contains) or not direct[a.id].isdisjoint(direct[b.id]):
                    parent[root(a.id)] = root(b.id)
    by_root: dict[str, set[str]] = {}
    for g in active:
        by_root.setdefault(root(g.id), set()).add(g.id)
    groups = [frozenset(s) for s in by_root.values() if len(s) > 1]
    return _View(dict(gens), active, sorted(redundant), active_l0, contained_l0, groups)


def gaps_of(r: Ranges) -> list[tuple[str, int, int]]:
    """``(writer, lo, hi)`` for every run of numbers from 1 to a writer's highest that ``r`` lacks."""
    out = []
    for w, spans in sorted(r.items()):
        nxt = 1
        for lo, hi in spans:
            if lo > nxt:
                out.append((w, nxt, lo - 1))
            nxt = max(nxt, hi + 1)
    return out



class Table:
    """One table: pending entries of this writer, plus what is on the backend."""

    def __init__(self, backend: Backend, prefix: str, writer: str, bucket_cache: int = 64) -> None:
        self.backend = backend
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.writer = writer
        self._seq = 0
        self._lock = threading.RLock()
        self._refresh_lock = threading.RLock()  # taken before _lock, never while holding it
        self._pending: list[tuple[bytes, bytes]] = []
        self._batches: list[tuple[str, list[tuple[bytes, bytes]]]] = []  # named, not yet written
        self._pending_index: dict[bytes, bytes | tuple[bytes, ...]] = {}  # see _index_add
        self._l0: dict[str, TableFile] = {}  # the level-0 files to read
        self._listed_l0: list[str] = []  # every level-0 file listed
        self._gens: dict[str, Generation] = {}  # every readable manifest listed
        self._active_gens: list[Generation] = []
        self._redundant: list[str] = []
        self._contained_l0: list[str] = []
        self._groups: list[frozenset[str]] = []
        self._grouped: frozenset[str] = frozenset()
        self._distinct: dict[frozenset[str], int] = {}  # overlap group -> entries, each counted once
        self._buckets: OrderedDict[tuple[str, int], TableFile] = OrderedDict()
        self._bucket_cache = bucket_cache
        # Format-2 blocks read lately, oldest first. Few: a repeated key is remembered by the features
        # above (a cache's key -> result), and a block kept is ~9 KiB; freed ones are reused by the next
        # read, where thousands kept would each take fresh memory (page faults cost a third of a lookup).
        self._blocks: dict[tuple[str, int], _Block | TableFile] = {}
        self._block_cache = BLOCK_CACHE
        self._bad_blocks: set[tuple[str, int]] = set()
        #: Called before the first format-2 generation is written; False keeps writing format 1
        #: (the store upgrades its format marker here, so older casmon refuses rather than misreads).
        self.format_gate = None
        self._gen_seq = 0
        self._bad_gens: dict[str, str] = {}  # damaged manifests, by id
        self._bad_l0: dict[str, str] = {}  # damaged level-0 files, by name
        self._bad_buckets: set[tuple[str, int]] = set()
        #: Damaged or missing files this table needs, skipped by reads: key -> reason.
        self.damaged: dict[str, str] = {}
        self._listed = False
        self._visible: set[str] = set()
        self.last_refresh = 0.0

    # -- writing ---------------------------------------------------------------
    def add(self, key: bytes, value: bytes) -> None:
        if type(key) is not bytes:
            key = bytes(key)  # not a Digest: the garbage collector walks those (instances of a Python class)
        with self._lock:
            self._pending.append((key, value))
            _index_add(self._pending_index, key, value)

    @property
    def pending(self) -> int:
        batches = self._batches  # asked at every write: no generator when no batch waits (the usual case)
        return len(self._pending) + sum(len(e) for _, e in batches) if batches else len(self._pending)

    def take_pending(self) -> list[tuple[bytes, bytes]]:
        """Remove and return the entries not assigned to a batch (tests and tools)."""
        with self._lock:
            entries, self._pending = self._pending, []
            self._reindex_pending()
            return entries

    def _reindex_pending(self) -> None:
        idx: dict[bytes, bytes | tuple[bytes, ...]] = {}
        for _name, entries in self._batches:
            for k, v in entries:
                _index_add(idx, k, v)
        for k, v in self._pending:
            _index_add(idx, k, v)
        self._pending_index = idx

    def flush(self) -> None:
        """Write this writer's waiting entries as level-0 files.

        A batch whose write failed keeps its name and is written again first,
        under the same name: if the failed write did land, the retry changes
        nothing (create-if-absent), so no entry is ever written twice, and the
        writer's numbering has no gap.
        """
        self.seal()
        self.write_sealed()

    def seal(self) -> None:
        """Set the waiting entries aside as a named batch, for :meth:`write_sealed`.

        The store seals every table before it writes the objects of a flush, so a
        sealed record never names an object that flush does not write.
        """
        with self._lock:
            if self._pending:
                self._batches.append((self.new_name(), self._pending))
                self._pending = []

    def sealed(self) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
        """The sealed batches not written yet: ``[(name, entries)]``."""
        with self._lock:
            return list(self._batches)

    def replace_sealed(self, name: str, entries: list[tuple[bytes, bytes]]) -> None:
        """Change a sealed batch before it is written (a flush dropping records whose values are gone)."""
        with self._lock:
            self._batches = [(n, entries if n == name else e) for n, e in self._batches]
            self._reindex_pending()

    def write_sealed(self) -> None:
        """Write the sealed batches, oldest first; a batch that fails stays sealed under its name."""
        while self._batches:
            name, entries = self._batches[0]
            tf = self._write_named(name, entries)  # even empty: the writer's numbering must not show a gap
            with self._lock:  # one step: no reader sees the entries both written and waiting
                self._l0[name] = tf
                self._batches.pop(0)
                self._reindex_pending()

    def new_name(self) -> str:
        with self._lock:
            self._seq += 1
            return f"{time.time_ns():016x}-{self.writer}-{self._seq:06x}"

    def write_l0(self, entries: list[tuple[bytes, bytes]]) -> str:
        """Write entries as a new level-0 file at once and return its name."""
        name = self.new_name()
        tf = self._write_named(name, entries)
        with self._lock:
            self._l0[name] = tf
        return name

    def _write_named(self, name: str, entries: list[tuple[bytes, bytes]]) -> TableFile:
        payload = encode_table_file(entries)
        # lz4: a level-0 file lives until the next merge, and is written by the exit flush (an 8 MB
        # call-log record: zstd 16 ms, lz4 5) and read whole by every fresh reader (lz4 decodes ~3x quicker).
        _, frame = encode_frame(payload, KIND_TABLE, _LZ4 if len(payload) < L0_LZ4_MAX else _ZSTD)
        self.backend.create(self.prefix + "l0/" + name, frame)
        return TableFile(self.prefix + "l0/" + name, payload)

    # -- damage ----------------------------------------------------------------
    def _bucket_key(self, gid: str, i: int) -> str:
        """The key of bucket file ``i`` of generation ``gid``."""
        return f"{self.prefix}buckets/{gid}/{i:04x}"

    def _damage(self, key: str, reason: str) -> None:
        with self._lock:
            self.damaged[key] = reason
        warn_damage(self.backend.url, key, reason)

    def _bad_bucket(self, g: Generation, i: int, key: str, reason: str) -> None:
        with self._lock:
            self._bad_buckets.add((g.id, i))
        self._damage(key, reason)

    def _bad_block(self, g: Generation, b: int, key: str, reason: str) -> None:
        with self._lock:
            self._bad_blocks.add((g.id, b))
        self._damage(key, reason)

    # -- reading ---------------------------------------------------------------
    def refresh(self) -> None:
        """See what other writers added: list, load new level-0 files and manifests.

        Never raises for damage: damaged or missing files are skipped and
        remembered in :attr:`damaged` (with a warning once per process).
        """
        tries = 8
        # One refresh at a time: a slower one (listed before another thread's merge) would otherwise
        # set its older view over the newer one, forgetting the merge's generation and the level-0
        # files it read from memory (found by an attack: a stored key missed until the next refresh).
        with self._refresh_lock:
            for attempt in range(tries):
                try:
                    self._refresh_once(tolerant=attempt == tries - 1)
                    break
                except _Vanished:
                    continue
            self._listed = True
            self.last_refresh = time.monotonic()

    def _list(self, sub: str) -> list[str]:
        names = [k.rsplit("/", 1)[-1] for k in self.backend.list(self.prefix + sub)]
        return [n for n in names if NAME_RE.match(n)]

    def _refresh_once(self, tolerant: bool = False) -> None:
        # Level-0 files first: a merge writes its manifest before it deletes what it merged.
        l0_names = self._list("l0/")
        gen_ids = self._list("gens/")
        listed_gens = set(gen_ids)
        gens = {g: v for g, v in self._gens.items() if g in listed_gens}
        bad_gens = {g: r for g, r in self._bad_gens.items() if g in listed_gens}
        new_gens = [g for g in gen_ids if g not in gens and g not in bad_gens]
        if new_gens:
            keys = [self.prefix + "gens/" + g for g in new_gens]
            for g, key, data in zip(new_gens, keys, self.backend.get_many(keys)):
                if data is None:
                    if not tolerant:
                        raise _Vanished(key)
                    bad_gens[g] = "listed, but it cannot be read"
                    self._damage(key, bad_gens[g])
                    continue
                try:
                    gens[g] = parse_generation(g, key, decode_frame(data, key)[1])
                except DamagedObjectError as e:
                    bad_gens[g] = e.reason
                    self._damage(key, e.reason)
        view = resolve(gens, l0_names)
        listed_l0 = set(l0_names)
        bad_l0 = {n: r for n, r in self._bad_l0.items() if n in listed_l0}
        new_l0 = [n for n in view.active_l0 if n not in self._l0 and n not in bad_l0]
        loaded: dict[str, TableFile] = {}
        if new_l0:
            keys = [self.prefix + "l0/" + n for n in new_l0]
            for n, key, data in zip(new_l0, keys, self.backend.get_many(keys)):
                if data is None:
                    if not tolerant:
                        raise _Vanished(key)
                    bad_l0[n] = "listed, but it cannot be read"
                    self._damage(key, bad_l0[n])
                    continue
                try:
                    loaded[n] = TableFile(key, decode_frame(data, key)[1])
                except DamagedObjectError as e:
                    bad_l0[n] = e.reason
                    self._damage(key, e.reason)
        with self._lock:
            self._visible = {"l0:" + n for n in l0_names} | {"gen:" + g for g in gen_ids}
            self._gens = gens
            self._bad_gens = bad_gens
            self._bad_l0 = bad_l0
            was_active = self._active_gens
            self._active_gens = view.active
            self._redundant = view.redundant
            self._contained_l0 = view.contained_l0
            self._listed_l0 = sorted(l0_names)
            if view.groups != self._groups:
                self._distinct = {}
            self._groups = view.groups
            self._grouped = frozenset().union(*view.groups) if view.groups else frozenset()
            keep = set(view.active_l0)
            # This writer's level-0 files written after the listing above (a flush in another thread)
            # are not in it; dropping them would hide their entries until the next refresh. One that a
            # merge took is held by a generation listed after it (manifests are listed second).
            late = [n for n in self._l0 if n not in listed_l0 and parse_name(n)[0] == self.writer]
            if late:
                held = ranges_union(*(g.contains for g in gens.values()))
                keep.update(n for n in late if not ranges_has(held, *parse_name(n)))
            l0 = {n: tf for n, tf in self._l0.items() if n in keep}
            l0.update(loaded)
            self._l0 = dict(sorted(l0.items()))
            live = {g.id for g in view.active}
            # Snapshots (one C-level step each): lookups in other threads reorder the block cache
            # without this lock, and a Python-level walk of it would see it change.
            for bk in [bk for bk in list(self._buckets) if bk[0] not in live]:
                del self._buckets[bk]
            blocks = list(self._blocks.items())
            if any(bk[0] not in live for bk, _ in blocks):
                self._blocks = {bk: tf for bk, tf in blocks if bk[0] in live}
            for g in was_active:
                if g.id not in live:  # merged away: close its bucket files
                    self.backend.forget(f"{self.prefix}buckets/{g.id}/")
            self._bad_buckets = {bk for bk in list(self._bad_buckets) if bk[0] in live}
            self._bad_blocks = {bk for bk in list(self._bad_blocks) if bk[0] in live}
            # What is damaged and still matters: listed manifests, level-0 files to read, buckets of active generations.
            needed = {self.prefix + "gens/" + g for g in bad_gens}
            needed |= {self.prefix + "l0/" + n for n in bad_l0 if n in keep}
            needed |= {self._bucket_key(g, i) for g, i in self._bad_buckets}
            shifts = {g.id: g.shift for g in view.active}
            needed |= {self._bucket_key(g, b >> shifts[g]) for g, b in self._bad_blocks}
            self.damaged = {k: r for k, r in self.damaged.items() if k in needed}

    def _bucket(self, g: Generation, i: int, tolerant: bool = False) -> TableFile:
        bk = (g.id, i)
        tf = self._buckets.get(bk)
        if tf is not None:
            with self._lock:  # a refresh in another thread copies the cache under the lock
                if bk in self._buckets:
                    self._buckets.move_to_end(bk)
            return tf
        if bk in self._bad_buckets:
            return _EMPTY
        key = self._bucket_key(g.id, i)
        tf = self._read_bucket(g, i, key, tolerant)
        if tf is None:
            return _EMPTY
        with self._lock:
            self._buckets[bk] = tf
            while len(self._buckets) > self._bucket_cache:
                self._buckets.popitem(last=False)
        return tf

    def _fetch(self, g: Generation, key: str, tolerant: bool, start: int = 0, end: int | None = None):
        """The bytes of a bucket file of ``g`` (or a range of them); None if it is gone.

        Gone because a merge deleted ``g`` meanwhile: raises :class:`_Vanished`
        unless ``tolerant``, which then returns None quietly. Gone although ``g``
        is still listed: None, and the caller remembers the damage.
        """
        get = self.backend.get if end is None else (lambda k: self.backend.get_range(k, start, end))
        data = get(key)
        if data is None:
            if not tolerant:
                raise _Vanished(key)
            if not self.backend.exists(self.prefix + "gens/" + g.id):
                return False  # merged and deleted meanwhile: the next listing no longer names it
            data = get(key)
        return data

    def _block(self, g: Generation, b: int, tolerant: bool = False) -> _Block | TableFile:
        """Block ``b`` of a format-2 generation: one small read (a range of its bucket file, kept open)."""
        bk = (g.id, b)
        blk = self._blocks.get(bk)
        if blk is not None:
            return blk
        ln = int(g.lens[b])
        if not ln or bk in self._bad_blocks:
            return _EMPTY
        key = self._bucket_key(g.id, b >> g.shift)
        start = int(g.starts[b])
        data = self.backend.read_kept(key, start, start + ln)
        if data is None:
            data = self._fetch(g, key, tolerant, start, start + ln)
            if data is False:
                return _EMPTY
            if data is None:
                self._bad_block(g, b, key, f"missing, although generation {g.id} needs it")
                return _EMPTY
        try:
            blk = _Block(key, decode_table_block(data, key, start), start)
        except DamagedObjectError as e:
            self._bad_block(g, b, key, f"block at {start}: {e.reason}")
            return _EMPTY
        with self._lock:
            blocks = self._blocks
            blocks[bk] = blk
            if len(blocks) > self._block_cache:
                del blocks[next(iter(blocks))]  # the oldest read (a dict keeps insertion order)
        return blk

    def _find_in_block(self, g: Generation, key: bytes, tolerant: bool) -> list[bytes]:
        b = g.block_of(key)
        try:
            return self._block(g, b, tolerant).find(key)
        except DamagedObjectError as e:  # a block whose offsets do not fit its values (crafted: its digest matched)
            with self._lock:
                self._blocks.pop((g.id, b), None)
            self._bad_block(g, b, self._bucket_key(g.id, b >> g.shift), e.reason)
            return []

    def _file_tables(self, g: Generation, i: int, tolerant: bool, data=None) -> tuple[list[TableFile], bool]:
        """``(tables, damaged)`` of bucket file ``i`` of ``g``: the whole bucket (format 1) or its
        blocks (format 2, damaged blocks skipped and remembered). Missing: ``([], ...)``."""
        key = self._bucket_key(g.id, i)
        if g.v < 2:
            if (g.id, i) in self._bad_buckets:
                return [], True
            tf = self._buckets.get((g.id, i))
            if tf is None and data is not None:
                try:
                    tf = TableFile(key, decode_frame(data, key)[1])
                except DamagedObjectError as e:
                    self._bad_bucket(g, i, key, e.reason)
                    return [], True
            elif tf is None:
                tf = self._read_bucket(g, i, key, tolerant)
            return ([tf], False) if tf is not None else ([], (g.id, i) in self._bad_buckets)
        per = g.blocks >> (g.nbuckets.bit_length() - 1)
        blocks = range(i * per, (i + 1) * per)
        if data is None:
            data = self._fetch(g, key, tolerant)
            if data is False:
                return [], False
            if data is None:
                self._bad_block(g, i * per, key, f"missing, although generation {g.id} needs it")
                return [], True
        out, damaged = [], False
        for b in blocks:
            ln = int(g.lens[b])
            if not ln:
                continue
            if (g.id, b) in self._bad_blocks:
                damaged = True
                continue
            start = int(g.starts[b])
            where = f"{key}@{start}"
            try:
                out.append(TableFile(where, decode_frame(data[start : start + ln], where)[1]))
            except DamagedObjectError as e:
                self._bad_block(g, b, key, f"block at {start}: {e.reason}")
                damaged = True
        return out, damaged

    def _read_bucket(self, g: Generation, i: int, key: str, tolerant: bool) -> TableFile | None:
        """A bucket of ``g``; None (remembered as damaged) if it is damaged, or missing although ``g`` is not."""
        data = self._fetch(g, key, tolerant)
        if data is False:
            return None
        if data is None:
            self._bad_bucket(g, i, key, f"missing, although generation {g.id} needs it")
            return None
        try:
            return TableFile(key, decode_frame(data, key)[1])
        except DamagedObjectError as e:
            self._bad_bucket(g, i, key, e.reason)
            return None

    def lookup(self, key: bytes, refresh_on_miss: bool = True) -> list[bytes]:
        """Every value stored under ``key``, oldest file first, duplicates removed.

        Damaged files are skipped (see :attr:`damaged`): a lookup never raises for them.
        """
        if not self._listed:
            self.refresh()
        for attempt in range(2):
            try:
                out = self._lookup_once(key)
            except _Vanished:
                out = self._lookup_after_vanished(key)
            if out or not refresh_on_miss or attempt:
                return out
            if time.monotonic() - self.last_refresh < MISS_REFRESH_INTERVAL:
                return out
            self.refresh()
        return []

    def _lookup_after_vanished(self, key: bytes, tries: int = 8) -> list[bytes]:
        # Merges in another thread or process can delete what each new listing names, more than once
        # (a thread merging every few hundred entries made two tries miss a stored key): list again,
        # as a refresh does, and only the last try takes a vanished file as gone.
        for attempt in range(tries):
            self.refresh()
            try:
                return self._lookup_once(key, tolerant=attempt == tries - 1)
            except _Vanished:
                continue
        return []

    def _view(self) -> tuple[list[Generation], list[TableFile], dict]:
        """What a lookup reads, taken in one step: a merge or a write of waiting entries in another
        thread changes the generations, the level-0 files and the waiting entries together (under
        the lock), and a lookup reading them at different moments could miss an entry that moved
        from one to another (found by an attack: a lookup beside a thread's merge missed a key)."""
        with self._lock:
            return self._active_gens, list(self._l0.values()), self._pending_index

    def _lookup_once(self, key: bytes, tolerant: bool = False) -> list[bytes]:
        out: list[bytes] = []
        h1, h2 = _hashes(key)
        gens, l0, waiting = self._view()
        for g in gens:
            if g.v >= 2:
                bl, nb, x = g.bloom, g.nbits, h1
                for _ in range(g.k):  # Generation.may_hold, inline
                    p = x % nb
                    if not (bl[p >> 3] >> (p & 7)) & 1:
                        break
                    x = (x + h2) & _M64
                else:
                    out.extend(self._find_in_block(g, key, tolerant))
                continue
            out.extend(self._bucket(g, _bucket_of(key, g.nbuckets), tolerant).find(key))
        for tf in l0:
            out.extend(tf.find(key))
        out.extend(_index_values(waiting, key))
        if len(out) > 1:
            out = list(dict.fromkeys(out))
        return out

    def lookup_cached(self, key: bytes) -> list[bytes] | None:
        """Lookup without any I/O beyond buckets already in memory; None if unsure."""
        out: list[bytes] = []
        h1, h2 = _hashes(key)
        gens, l0, waiting = self._view()
        for g in gens:
            if g.v >= 2:
                if not g.may_hold(h1, h2):
                    continue
                b = g.block_of(key)
                tf = self._blocks.get((g.id, b)) if g.lens[b] else _EMPTY
            else:
                tf = self._buckets.get((g.id, _bucket_of(key, g.nbuckets)))
            if tf is None:
                return None
            try:
                out.extend(tf.find(key))
            except DamagedObjectError:  # a lookup that reads says so
                return None
        for tf in l0:
            out.extend(tf.find(key))
        out.extend(_index_values(waiting, key))
        return list(dict.fromkeys(out)) if len(out) > 1 else out

    def items(self, refresh: bool = True, strict: bool = True) -> Iterator[tuple[bytes, bytes]]:
        """Every entry once: generations, then level-0 files, then this writer's waiting ones.

        ``strict`` (the default) raises :class:`DamagedObjectError` if a file the
        table needs is damaged or missing, rather than return part of the table
        (gc must see every record); ``strict=False`` skips such files.
        """
        if refresh or not self._listed:
            self.refresh()
        entries: list[tuple[bytes, bytes]] = []
        for attempt in range(4):
            try:
                entries = self._items_once(tolerant=attempt == 3)
                break
            except _Vanished:
                self.refresh()
        if strict and self.damaged:
            key, reason = next(iter(sorted(self.damaged.items())))
            more = f"; {len(self.damaged) - 1} more damaged files" if len(self.damaged) > 1 else ""
            raise DamagedObjectError(key, f"{reason}{more}; this table cannot be read whole until "
                                          f"`casmon verify --repair` has run")
        yield from entries

    def _snapshot(self):
        with self._lock:
            pending = [kv for _, entries in self._batches for kv in entries] + list(self._pending)
            return list(self._active_gens), list(self._l0.values()), pending, self._grouped

    def _gen_entries(self, g: Generation, tolerant: bool) -> list[tuple[bytes, bytes]]:
        out: list[tuple[bytes, bytes]] = []
        for i in range(g.nbuckets):
            for tf in self._file_tables(g, i, tolerant)[0]:
                out.extend(tf.items())
        return out

    def _items_once(self, tolerant: bool) -> list[tuple[bytes, bytes]]:
        gens, l0, pending, grouped = self._snapshot()
        out: list[tuple[bytes, bytes]] = []
        seen: set[tuple[bytes, bytes]] = set()
        for g in gens:
            entries = self._gen_entries(g, tolerant)
            if g.id in grouped:  # its provenance overlaps another generation's: each entry once
                entries = [kv for kv in entries if not (kv in seen or seen.add(kv))]
            out.extend(entries)
        for tf in l0:
            out.extend(tf.items())
        out.extend(pending)
        return out

    def count(self) -> int:
        """How many entries :meth:`items` yields (damaged files aside), without reading them where it can."""
        if not self._listed:
            self.refresh()
        with self._lock:
            gens, l0, groups, grouped = list(self._active_gens), list(self._l0.values()), self._groups, self._grouped
            n = sum(g.count for g in gens if g.id not in grouped) + sum(len(t) for t in l0) + self.pending
        by_id = {g.id: g for g in gens}
        for group in groups:
            m = self._distinct.get(group)
            if m is None:
                seen: set[tuple[bytes, bytes]] = set()
                for gid in sorted(group):
                    seen.update(self._gen_entries(by_id[gid], tolerant=True))
                m = self._distinct[group] = len(seen)
            n += m
        return n

    def missing_segments(self) -> list[str]:
        """Level-0 files that must have existed but are gone: gaps in a writer's numbering.

        A writer numbers its level-0 files 1, 2, 3, ...; a generation records
        exactly which numbers it holds. A number below the writer's newest one
        that is neither listed nor held by a generation was deleted (or is in a
        generation whose manifest is damaged). The newest file of a writer
        leaves no trace when deleted.
        """
        first = self._gaps()
        if not first:
            return []
        second = self._gaps()  # a merge between the two listings of one refresh can look like a gap
        return [g for g in first if g in second]

    def _gaps(self) -> list[str]:
        self.refresh()
        with self._lock:
            accounted = ranges_union(ranges_of_names(self._listed_l0), *(g.accounted() for g in self._gens.values()))
        return [self._gap_name(w, lo, hi) for w, lo, hi in gaps_of(accounted)]

    def _gap_name(self, w: str, lo: int, hi: int) -> str:
        if lo == hi:
            return f"{self.prefix}l0/*-{w}-{lo:06x}"
        return f"{self.prefix}l0/*-{w}-{lo:06x} to *-{w}-{hi:06x} ({hi - lo + 1} files)"

    def files(self) -> list[str]:
        """Keys of every file this table has on the backend (for stats, verify, gc)."""
        return self.backend.list(self.prefix)

    # -- merging ---------------------------------------------------------------
    @property
    def l0_count(self) -> int:
        return len(self._l0)

    def wants_merge(self) -> bool:
        # One large level-0 file as well (the last flush of a long run writes tens of thousands of
        # entries at once): every fresh reader would load and decode it whole (13 ms at 40,000
        # entries), where a generation costs it one block.
        return len(self._l0) >= L0_MERGE or sum(len(t) for t in self._l0.values()) >= L0_MERGE_ENTRIES

    def consolidate(self, min_l0: int = L0_MERGE, force: bool = False, keep=None) -> str | None:
        """Merge level-0 files (and small generations) into one generation.

        ``keep(key, value) -> bool`` drops entries (used by gc); with ``force``
        every visible file is merged. Generations whose provenance overlaps are
        merged together; files a generation already holds are deleted; damaged
        files are left alone (for ``verify --repair``). Returns the new
        generation's id, or None.
        """
        if not self.backend.supports_deletes or self.backend.read_only:
            return None
        self.refresh()
        with self._lock:
            l0_files = dict(self._l0)
            active = list(self._active_gens)
            groups = list(self._groups)
            all_gens = dict(self._gens)
            bad = {gid for gid, _ in self._bad_buckets} | {gid for gid, _ in self._bad_blocks}
            damaged = bool(self.damaged)
            # Files a generation already holds can go, unless the table is damaged: they may be the only good copy.
            extra_gens = [] if damaged else [all_gens[g] for g in self._redundant if g in all_gens]
            extra_l0 = [] if damaged else list(self._contained_l0)
        l0 = sorted(l0_files)
        if not force and len(l0) < min_l0 and not self.wants_merge():
            return None
        l0_total = sum(len(l0_files[n]) for n in l0)
        if force:
            chosen = {g.id for g in active if g.id not in bad}
        else:
            # Size-tiered: take generations smallest first while each holds at most MERGE_FACTOR times
            # what is taken so far. Sizes then grow geometrically: O(log n) generations, and an entry
            # is rewritten O(log n) times over the table's life.
            chosen, total = set(), max(l0_total, 1)
            for g in sorted((g for g in active if g.id not in bad), key=lambda g: (g.count, g.id)):
                if g.count > MERGE_FACTOR * total:
                    break
                chosen.add(g.id)
                total += g.count
            # Format-1 generations (an older casmon's) are rewritten as format 2 a bounded amount at a time.
            budget = 4 * total + FILE_ENTRIES
            for g in sorted((g for g in active if g.v < 2 and g.id not in bad | chosen), key=lambda g: g.count):
                if g.count > budget:
                    break
                chosen.add(g.id)
                budget -= g.count
        for group in groups:  # an overlap is merged whole, which ends it
            if chosen & group:
                chosen |= group - bad
        gens = [g for g in active if g.id in chosen]
        if not l0 and len(gens) <= 1 and keep is None:
            if extra_gens or extra_l0:
                self._delete(extra_l0, extra_gens)
                self.refresh()
            return None
        tables: list[TableFile] = []
        try:
            for g in gens:
                for i in range(g.nbuckets):
                    data = None
                    if g.v >= 2 or (g.id, i) not in self._buckets:
                        key = self._bucket_key(g.id, i)
                        data = self.backend.get(key)
                        if data is None:
                            raise _Vanished(key)
                    tfs, damaged = self._file_tables(g, i, False, data)
                    if damaged:
                        return None  # the next merge leaves this generation alone
                    tables.extend(tfs)
            tables.extend(l0_files[n] for n in l0)
        except _Vanished:
            return None  # someone else merged these meanwhile
        entries = Columns.of_tables(tables).sorted_unique()  # each (key, value) once
        del tables
        if keep is not None:
            kept = [i for i, (k, v) in enumerate(entries.entries()) if keep(k, v)]
            entries = entries.take(np.array(kept, dtype=np.int64))
        contains = ranges_union(*(g.contains for g in gens), ranges_of_names(l0))
        covers = ["l0:" + x for x in l0 + extra_l0] + ["gen:" + g.id for g in gens + extra_gens]
        for g in gens:  # what merged generations covered and is not deleted yet stays covered
            covers.extend(c for c in g.covers if c in self._visible)
        marks: dict[str, int] = {}
        for g in gens:
            for w, v in g.marks.items():
                marks[w] = max(marks.get(w, 0), v)
        gid = self._write_generation(entries, list(dict.fromkeys(covers)), contains, all(g.exact for g in gens), marks)
        # The new generation is visible: what it holds can go.
        self._delete(l0 + extra_l0, gens + extra_gens)
        self.refresh()
        return gid

    def _write_generation(self, entries: list[tuple[bytes, bytes]] | Columns, covers: list[str], contains: Ranges,
                          exact: bool, marks: dict[str, int]) -> str:
        """Write buckets, then the manifest (fault points between); returns the generation's id."""
        n = len(entries)
        v2 = GEN_FORMAT >= 2 and (self.format_gate is None or self.format_gate())
        nb = 1
        while nb < MAX_BUCKETS and n / nb > (FILE_ENTRIES if v2 else BUCKET_ENTRIES):
            nb *= 2
        with self._lock:
            self._gen_seq += 1
            gid = f"{time.time_ns():016x}-{self.writer}g-{self._gen_seq:06x}"  # "g": not in the level-0 numbering
        items = []
        binary = b""
        extra: dict = {}
        if v2:
            files, binary, extra = _encode_v2(entries, nb)
            items = [(self._bucket_key(gid, i), f) for i, f in enumerate(files)]
        else:
            by_bucket: list[list[tuple[bytes, bytes]]] = [[] for _ in range(nb)]
            for kv in entries.entries() if isinstance(entries, Columns) else entries:
                by_bucket[_bucket_of(kv[0], nb)].append(kv)
            for i, b in enumerate(by_bucket):
                _, frame = encode_frame(encode_table_file(b), KIND_TABLE, _ZSTD)
                items.append((self._bucket_key(gid, i), frame))
        self.backend.create_many(items)
        faultpoints.point("merge.after_buckets")
        marks = dict(marks)
        for w, spans in contains.items():
            if spans:
                marks[w] = max(marks.get(w, 0), spans[-1][1])
        m = {"count": n, "nbuckets": nb, "covers": covers, "marks": marks, "contains": ranges_json(contains), **extra}
        if not exact:
            m["exact"] = False
        payload = json.dumps(m).encode() + (b"\0" + binary if v2 else b"")
        _, frame = encode_frame(payload, KIND_TABLE, _ZSTD)
        if len(frame) > 0.9 * len(payload):  # mostly a bloom filter (random bits): every fresh reader would decompress it for nothing
            _, frame = encode_frame(payload, KIND_TABLE, _RAW)
        self.backend.create(self.prefix + "gens/" + gid, frame)
        faultpoints.point("merge.after_manifest")
        return gid

    def _delete(self, l0_names: list[str], gens: list[Generation], more_gen_ids: Iterable[str] = (),
                more_keys: Iterable[str] = ()) -> None:
        """Delete level-0 files and generations: manifests first, then their buckets."""
        gen_ids = [g.id for g in gens] + list(more_gen_ids)
        self.backend.delete_many([self.prefix + "l0/" + x for x in l0_names] + [self.prefix + "gens/" + g for g in gen_ids])
        buckets = list(more_keys)
        for g in gen_ids:
            buckets.extend(self.backend.list(f"{self.prefix}buckets/{g}/"))
        self.backend.delete_many(list(dict.fromkeys(buckets)))

    # -- verify and repair ------------------------------------------------------
    def survey(self, keep: bool = True, orphans: bool = True) -> Survey:
        """Read and check every file of the table (``verify``; ``repair`` with ``keep``, the parsed files too).

        With ``orphans``, buckets of no listed generation are checked too: if they
        hold entries no listed file shows, the generation's manifest was lost,
        and the survey reports it missing (repair then salvages the buckets).
        The pack index passes False: it is rebuilt from the packs anyway.
        """
        for attempt in range(3):
            sv = self._survey_once(keep, orphans)
            if not sv.vanished or attempt == 2:
                return sv
        raise AssertionError("unreachable")

    def _survey_once(self, keep: bool, orphans: bool = True) -> Survey:
        l0_names = self._list("l0/")
        gen_ids = self._list("gens/")
        bucket_keys: dict[str, dict[int, str]] = {}
        for k in self.backend.list(self.prefix + "buckets/"):
            parts = k[len(self.prefix) :].split("/")
            if len(parts) == 3 and NAME_RE.match(parts[1]) and BUCKET_RE.match(parts[2]):
                bucket_keys.setdefault(parts[1], {})[int(parts[2], 16)] = k
        sv = Survey(self.prefix, l0_names, gen_ids, bucket_keys)
        for key, payload in self._read_all([self.prefix + "l0/" + n for n in l0_names], sv):
            tf = self._check(key, payload, sv, lambda k, raw: TableFile(k, raw))
            if tf is not None and keep:
                sv.l0[key.rsplit("/", 1)[-1]] = tf
        for key, payload in self._read_all([self.prefix + "gens/" + g for g in gen_ids], sv):
            gid = key.rsplit("/", 1)[-1]
            g = self._check(key, payload, sv, lambda k, raw, gid=gid: parse_generation(gid, k, raw))
            if g is not None:
                sv.gens[gid] = g
            else:
                sv.bad_gens.add(gid)
        flat = [(gid, i, k) for gid, bs in sorted(bucket_keys.items()) for i, k in sorted(bs.items())]
        keys = [k for _, _, k in flat]
        where = {k: (gid, i) for gid, i, k in flat}
        for key, payload in self._read_all(keys, sv):
            tfs, problem = split_bucket(payload, key)
            if problem is not None:
                sv.damaged[key] = problem
            if keep and (tfs or problem is None):
                sv.buckets[where[key]] = tfs[0] if len(tfs) == 1 else TableFile(
                    key, encode_table_file([kv for tf in tfs for kv in tf.items()]))
        sv.view = resolve(sv.gens, l0_names)
        for g in sv.view.active:
            have = bucket_keys.get(g.id, {})
            for i in range(g.nbuckets):
                if i not in have:
                    sv.missing[self._bucket_key(g.id, i)] = f"generation {self.prefix}gens/{g.id}"
        if sv.missing and any(not self.backend.exists(self.prefix + "gens/" + g.id) for g in sv.view.active):
            sv.vanished = True  # merged meanwhile: look again
        accounted = ranges_union(ranges_of_names(l0_names), *(g.accounted() for g in sv.gens.values()))
        sv.gaps = [self._gap_name(w, lo, hi) for w, lo, hi in gaps_of(accounted)]
        lone = sorted(set(bucket_keys) - set(gen_ids))
        if orphans and lone:
            if not keep:
                return self._survey_once(True, orphans)  # the check needs the entries (rare: orphans are)
            visible = set(sv.visible_entries())
            for gid in lone:
                unseen = {kv for (g, _i), tf in sv.buckets.items() if g == gid for kv in tf.items()} - visible
                if unseen:
                    sv.missing[f"{self.prefix}gens/{gid}"] = (
                        f"its buckets hold {len(unseen)} entries no listed file shows (the manifest is lost)")
        return sv

    def _read_all(self, keys: list[str], sv: Survey, batch: int = 256):
        for i in range(0, len(keys), batch):
            part = keys[i : i + batch]
            for key, data in zip(part, self.backend.get_many(part)):
                if data is None:
                    sv.vanished = True  # deleted since it was listed (a merge): the survey is read again
                    continue
                sv.checked += 1
                yield key, data

    @staticmethod
    def _check(key: str, data, sv: Survey, parse):
        try:
            return parse(key, decode_frame(data, key)[1])
        except DamagedObjectError as e:
            sv.damaged[key] = e.reason
            return None

    def rewrite(self, sv: Survey, entries: Iterable[tuple[bytes, bytes]]) -> str:
        """Replace every file ``sv`` saw by one generation that holds exactly ``entries`` (repair).

        Its provenance is every level-0 number the survey saw or a generation
        held, from 1 up for each writer, lost numbers included: what they held
        is in ``entries`` or is lost, so the table has no gap afterwards. Files
        written after the survey stay. Leftover buckets of no generation are
        deleted once older than :data:`ORPHAN_AGE` (they may belong to a merge in
        progress), damaged ones at once.
        """
        seen = ranges_union(ranges_of_names(sv.l0_names), *(g.accounted() for g in sv.gens.values()))
        contains = {w: [(1, spans[-1][1])] for w, spans in seen.items() if spans}
        covers = ["l0:" + n for n in sv.l0_names] + ["gen:" + g for g in sv.gen_ids]
        gid = self._write_generation(list(dict.fromkeys(entries)), covers, contains, True, {})
        listed = set(sv.gen_ids)
        now = time.time()
        orphans = [g for g in sv.bucket_keys if g not in listed and now - _gen_time(g) > ORPHAN_AGE]
        self._delete(sv.l0_names, [], more_gen_ids=sv.gen_ids + orphans,
                     more_keys=[k for k in sv.damaged if "/buckets/" in k])
        with self._lock:
            self._buckets.clear()
            self._bad_buckets.clear()
            self._bad_gens.clear()
            self._bad_l0.clear()
            self.damaged.clear()
        self.refresh()
        return gid


@dataclass
class Survey:
    """Every file of one table, each read and checked (:meth:`Table.survey`)."""

    prefix: str
    l0_names: list[str]  # every level-0 file listed
    gen_ids: list[str]  # every manifest listed
    bucket_keys: dict[str, dict[int, str]]  # generation id -> bucket number -> key, as listed
    l0: dict[str, TableFile] = field(default_factory=dict)  # readable level-0 files (if kept)
    gens: dict[str, Generation] = field(default_factory=dict)  # readable manifests
    bad_gens: set[str] = field(default_factory=set)  # damaged manifests
    buckets: dict[tuple[str, int], TableFile] = field(default_factory=dict)  # readable buckets (if kept)
    damaged: dict[str, str] = field(default_factory=dict)  # key -> reason, every file that fails its checks
    missing: dict[str, str] = field(default_factory=dict)  # key -> what needs it (buckets of active generations)
    gaps: list[str] = field(default_factory=list)  # level-0 numbers deleted (or in a damaged manifest)
    view: _View | None = None
    checked: int = 0
    vanished: bool = False

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.missing and not self.gaps

    def entries(self) -> list[tuple[bytes, bytes]]:
        """The table's entries, each once. A sound table: what readers read. A damaged one: everything
        readable in any file (covered, redundant and leftover generations too), the salvage."""
        if self.ok:
            return self.visible_entries()
        out: list[tuple[bytes, bytes]] = []
        for (_gid, _i), tf in sorted(self.buckets.items()):
            out.extend(tf.items())
        for _n, tf in sorted(self.l0.items()):
            out.extend(tf.items())
        return list(dict.fromkeys(out))

    def visible_entries(self) -> list[tuple[bytes, bytes]]:
        """What a reader reads: the active generations and level-0 files (kept files only)."""
        out: list[tuple[bytes, bytes]] = []
        if self.view is None:
            return out
        for g in self.view.active:
            for i in range(g.nbuckets):
                tf = self.buckets.get((g.id, i))
                if tf is not None:
                    out.extend(tf.items())
        for n in self.view.active_l0:
            tf = self.l0.get(n)
            if tf is not None:
                out.extend(tf.items())
        return list(dict.fromkeys(out))


_EMPTY = TableFile("(damaged)", encode_table_file([]))


def writer_id() -> str:
    """A fresh id for one writer (a Store instance in one process)."""
    return f"{os.getpid():x}{os.urandom(4).hex()}"
