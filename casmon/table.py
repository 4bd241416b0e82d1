"""Tables: append-only multimaps from 16-byte keys to small values, shared by many writers.

The object index (digest -> where the object lives) and every kind of record
(calls, cache entries, runs) are tables. A table is a set of immutable files
under one prefix, written without locks:

``{prefix}l0/{name}``
    *Level-0 files.* Each flush of a writer adds one, named
    ``{time_ns:016x}-{writer}-{seq:06x}``, so writers never touch each
    other's files.
``{prefix}gens/{id}`` and ``{prefix}buckets/{id}/{i:04x}``
    *Generations.* When level-0 files accumulate, a writer merges them (and
    small older generations) into a generation: its entries split into
    ``2**k`` buckets by the key's leading bits (about 8,192 entries a bucket),
    then a manifest that lists what it *covers*. The manifest is written last,
    so a visible manifest means a complete generation; the covered files are
    deleted after it.

A reader lists ``gens/`` and ``l0/``, ignores whatever a visible generation
covers, loads the level-0 files whole and, for a lookup, one bucket per
generation. If a file vanishes while it reads (merged and deleted meanwhile), it
lists again. Entries are never updated in place: a key may hold several
values, and readers decide which one counts. Two writers that merge the same
files at once produce overlapping generations; readers drop the duplicate
entries, and the next merge removes them.
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .backend import Backend
from .codec import KIND_TABLE, decode_frame, encode_frame, get_codec
from .errors import DamagedObjectError

__all__ = ["Table", "TableFile", "encode_table_file"]

_MAGIC = b"CTB1"
_COUNT = struct.Struct("<4sI")
NAME_RE = re.compile(r"^[0-9a-f]{16}-[0-9a-z]{1,40}-[0-9a-f]{1,12}$")
#: A lookup that finds nothing lists the table again at most this often (seconds):
#: other writers' entries newer than this may be missed, which costs a recomputation, never a wrong answer.
MISS_REFRESH_INTERVAL = 1.0
#: Target entries per bucket of a generation.
BUCKET_ENTRIES = 8192
#: Merge level-0 files once this many are visible ...
L0_MERGE = 16
#: ... or once they hold this many entries (readers load level-0 files whole).
L0_MERGE_ENTRIES = BUCKET_ENTRIES
_ZSTD = get_codec("zstd")


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

    __slots__ = ("name", "keys", "offs", "vals", "_index")

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
            if n and (int(self.offs[-1]) != len(self.vals) or np.any(np.diff(self.offs.astype(np.int64)) < 0)):
                raise ValueError("offsets do not match the values")
            if n > 1 and np.any(self.keys[1:] < self.keys[:-1]):
                raise ValueError("keys are not sorted")
        except (ValueError, struct.error) as e:
            raise DamagedObjectError(name, f"not a valid table file: {e}") from None
        self._index: dict[bytes, list[bytes]] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        offs = self.offs.tolist()
        vals = self.vals
        for i, k in enumerate(self.keys.tolist()):
            yield k.ljust(16, b"\0"), bytes(vals[offs[i] : offs[i + 1]])

    def index(self) -> dict[bytes, list[bytes]]:
        """A dict of the file, built once (for small files that are looked up often)."""
        if self._index is None:
            d: dict[bytes, list[bytes]] = {}
            for k, v in self.items():
                d.setdefault(k, []).append(v)
            self._index = d
        return self._index

    def find(self, key: bytes) -> list[bytes]:
        """The values under ``key``: a binary search, no per-file setup."""
        n = len(self.keys)
        if not n:
            return []
        k = np.array(key, dtype="S16")
        lo = int(np.searchsorted(self.keys, k, side="left"))
        if lo >= n or self.keys[lo] != k:
            return []
        hi = int(np.searchsorted(self.keys, k, side="right"))
        offs = self.offs
        return [bytes(self.vals[int(offs[i]) : int(offs[i + 1])]) for i in range(lo, hi)]


@dataclass
class Generation:
    id: str
    count: int
    nbuckets: int
    covers: list[str]
    marks: dict[str, int]  # writer -> highest level-0 sequence number merged into this generation


def parse_name(name: str) -> tuple[str, int]:
    """``(writer, seq)`` of a level-0 file name."""
    _t, writer, seq = name.split("-")
    return writer, int(seq, 16)


class _Vanished(Exception):
    """A file listed a moment ago is gone: list again."""


def _bucket_of(key: bytes, nbuckets: int) -> int:
    if nbuckets <= 1:
        return 0
    bits = nbuckets.bit_length() - 1
    return int.from_bytes(key[:4], "big") >> (32 - bits)


class Table:
    """One table: pending entries of this writer, plus what is on the backend."""

    def __init__(self, backend: Backend, prefix: str, writer: str, bucket_cache: int = 64) -> None:
        self.backend = backend
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.writer = writer
        self._seq = 0
        self._lock = threading.RLock()
        self._pending: list[tuple[bytes, bytes]] = []
        self._batches: list[tuple[str, list[tuple[bytes, bytes]]]] = []  # named, not yet written
        self._pending_index: dict[bytes, list[bytes]] = {}
        self._l0: dict[str, TableFile] = {}
        self._gens: dict[str, Generation] = {}
        self._active_gens: list[Generation] = []
        self._buckets: OrderedDict[tuple[str, int], TableFile] = OrderedDict()
        self._bucket_cache = bucket_cache
        self._listed = False
        self._visible: set[str] = set()
        self.last_refresh = 0.0

    # -- writing ---------------------------------------------------------------
    def add(self, key: bytes, value: bytes) -> None:
        with self._lock:
            self._pending.append((key, value))
            self._pending_index.setdefault(key, []).append(value)

    @property
    def pending(self) -> int:
        return len(self._pending) + sum(len(e) for _, e in self._batches)

    def take_pending(self) -> list[tuple[bytes, bytes]]:
        """Remove and return the entries not assigned to a batch (tests and tools)."""
        with self._lock:
            entries, self._pending = self._pending, []
            self._reindex_pending()
            return entries

    def _reindex_pending(self) -> None:
        idx: dict[bytes, list[bytes]] = {}
        for _name, entries in self._batches:
            for k, v in entries:
                idx.setdefault(k, []).append(v)
        for k, v in self._pending:
            idx.setdefault(k, []).append(v)
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
            self._write_named(name, entries)  # even empty: the writer's numbering must not show a gap
            with self._lock:
                self._batches.pop(0)
                self._reindex_pending()

    def new_name(self) -> str:
        with self._lock:
            self._seq += 1
            return f"{time.time_ns():016x}-{self.writer}-{self._seq:06x}"

    def write_l0(self, entries: list[tuple[bytes, bytes]]) -> str:
        """Write entries as a new level-0 file at once and return its name."""
        name = self.new_name()
        self._write_named(name, entries)
        return name

    def _write_named(self, name: str, entries: list[tuple[bytes, bytes]]) -> None:
        payload = encode_table_file(entries)
        _, frame = encode_frame(payload, KIND_TABLE, _ZSTD)
        self.backend.create(self.prefix + "l0/" + name, frame)
        tf = TableFile(name, payload)
        with self._lock:
            self._l0[name] = tf

    # -- reading ---------------------------------------------------------------
    def _read_frame(self, key: str):
        data = self.backend.get(key)
        if data is None:
            raise _Vanished(key)
        return decode_frame(data, key)[1]

    def refresh(self) -> None:
        """See what other writers added: list, load new level-0 files and manifests."""
        for _attempt in range(20):
            try:
                self._refresh_once()
                self._listed = True
                self.last_refresh = time.monotonic()
                return
            except _Vanished:
                continue
        raise DamagedObjectError(self.prefix, "table keeps changing while it is read; try again")

    def _refresh_once(self) -> None:
        gen_ids = [k.rsplit("/", 1)[-1] for k in self.backend.list(self.prefix + "gens/")]
        gen_ids = [g for g in gen_ids if NAME_RE.match(g)]
        l0_names = [k.rsplit("/", 1)[-1] for k in self.backend.list(self.prefix + "l0/")]
        l0_names = [n for n in l0_names if NAME_RE.match(n)]
        new_gens = [g for g in gen_ids if g not in self._gens]
        gens = dict(self._gens)
        if new_gens:
            datas = self.backend.get_many([self.prefix + "gens/" + g for g in new_gens])
            for g, data in zip(new_gens, datas):
                if data is None:
                    raise _Vanished(g)
                key = self.prefix + "gens/" + g
                m = json.loads(bytes(decode_frame(data, key)[1]))
                try:
                    gens[g] = Generation(g, int(m["count"]), int(m["nbuckets"]), list(m["covers"]),
                                         {str(w): int(v) for w, v in m.get("marks", {}).items()})
                except (KeyError, TypeError, ValueError) as e:
                    raise DamagedObjectError(key, f"not a valid generation manifest: {e}") from None
        listed_gens = set(gen_ids)
        gens = {g: v for g, v in gens.items() if g in listed_gens}
        covered = set()
        for g in gens.values():
            covered.update(g.covers)
        active_gens = sorted((g for g in gens.values() if "gen:" + g.id not in covered), key=lambda g: g.id)
        active_l0 = sorted(n for n in l0_names if "l0:" + n not in covered)
        new_l0 = [n for n in active_l0 if n not in self._l0]
        loaded: dict[str, TableFile] = {}
        if new_l0:
            keys = [self.prefix + "l0/" + n for n in new_l0]
            for n, key, data in zip(new_l0, keys, self.backend.get_many(keys)):
                if data is None:
                    raise _Vanished(key)
                loaded[n] = TableFile(key, decode_frame(data, key)[1])
        with self._lock:
            self._visible = {"l0:" + n for n in l0_names} | {"gen:" + g for g in gen_ids}
            self._gens = gens
            self._active_gens = active_gens
            keep = set(active_l0)
            l0 = {n: tf for n, tf in self._l0.items() if n in keep}
            l0.update(loaded)
            self._l0 = dict(sorted(l0.items()))
            live = {g.id for g in active_gens}
            for bk in [bk for bk in self._buckets if bk[0] not in live]:
                del self._buckets[bk]

    def _bucket(self, g: Generation, i: int) -> TableFile:
        bk = (g.id, i)
        tf = self._buckets.get(bk)
        if tf is not None:
            self._buckets.move_to_end(bk)
            return tf
        key = f"{self.prefix}buckets/{g.id}/{i:04x}"
        tf = TableFile(key, self._read_frame(key))
        with self._lock:
            self._buckets[bk] = tf
            while len(self._buckets) > self._bucket_cache:
                self._buckets.popitem(last=False)
        return tf

    def lookup(self, key: bytes, refresh_on_miss: bool = True) -> list[bytes]:
        """Every value stored under ``key``, oldest file first, duplicates removed."""
        if not self._listed:
            self.refresh()
        for attempt in range(2):
            try:
                out = self._lookup_once(key)
            except _Vanished:
                self.refresh()
                out = self._lookup_once(key)
            if out or not refresh_on_miss or attempt:
                return out
            if time.monotonic() - self.last_refresh < MISS_REFRESH_INTERVAL:
                return out
            self.refresh()
        return []

    def _lookup_once(self, key: bytes) -> list[bytes]:
        out: list[bytes] = []
        for g in self._active_gens:
            out.extend(self._bucket(g, _bucket_of(key, g.nbuckets)).find(key))
        for tf in list(self._l0.values()):
            out.extend(tf.find(key))
        vs = self._pending_index.get(key)
        if vs:
            out.extend(vs)
        if len(out) > 1:
            out = list(dict.fromkeys(out))
        return out

    def lookup_cached(self, key: bytes) -> list[bytes] | None:
        """Lookup without any I/O beyond buckets already in memory; None if unsure."""
        out: list[bytes] = []
        for g in self._active_gens:
            tf = self._buckets.get((g.id, _bucket_of(key, g.nbuckets)))
            if tf is None:
                return None
            out.extend(tf.find(key))
        for tf in list(self._l0.values()):
            out.extend(tf.find(key))
        vs = self._pending_index.get(key)
        if vs:
            out.extend(vs)
        return list(dict.fromkeys(out)) if len(out) > 1 else out

    def items(self, refresh: bool = True) -> Iterator[tuple[bytes, bytes]]:
        """Every entry: generations, then level-0 files, then this writer's pending ones."""
        if refresh or not self._listed:
            self.refresh()
        for _attempt in range(5):
            try:
                entries = list(self._items_once())
                break
            except _Vanished:
                self.refresh()
        else:
            raise DamagedObjectError(self.prefix, "table keeps changing while it is read; try again")
        overlap = self._overlapping()
        seen: set[tuple[bytes, bytes]] = set()
        for kv in entries:
            if overlap:
                if kv in seen:
                    continue
                seen.add(kv)
            yield kv

    def _overlapping(self) -> bool:
        covered: set[str] = set()
        for g in self._active_gens:
            if covered.intersection(g.covers):
                return True
            covered.update(g.covers)
        return False

    def _items_once(self) -> Iterator[tuple[bytes, bytes]]:
        for g in list(self._active_gens):
            for i in range(g.nbuckets):
                key = f"{self.prefix}buckets/{g.id}/{i:04x}"
                tf = self._buckets.get((g.id, i)) or TableFile(key, self._read_frame(key))
                yield from tf.items()
        for tf in list(self._l0.values()):
            yield from tf.items()
        with self._lock:
            pending = [kv for _, entries in self._batches for kv in entries] + list(self._pending)
        yield from pending

    def count(self) -> int:
        if not self._listed:
            self.refresh()
        return sum(g.count for g in self._active_gens) + sum(len(t) for t in self._l0.values()) + len(self._pending)

    def missing_segments(self) -> list[str]:
        """Level-0 files that must have existed but are gone: gaps in a writer's sequence.

        A writer numbers its level-0 files 1, 2, 3, ...; generations record the
        highest number they merged. A number above that mark, below the writer's
        newest visible file, and not visible itself, was deleted. (The newest
        file of a writer leaves no trace when deleted.)
        """
        self.refresh()
        marks: dict[str, int] = {}
        for g in self._active_gens:
            for w, v in g.marks.items():
                marks[w] = max(marks.get(w, 0), v)
        seen: dict[str, set[int]] = {}
        for name in self._l0:
            w, seq = parse_name(name)
            seen.setdefault(w, set()).add(seq)
        out = []
        for w, seqs in seen.items():
            mark = marks.get(w, 0)
            for seq in range(mark + 1, max(seqs)):
                if seq not in seqs:
                    out.append(f"{self.prefix}l0/*-{w}-{seq:06x}")
        return out

    def files(self) -> list[str]:
        """Keys of every file this table has on the backend (for stats, verify, gc)."""
        return self.backend.list(self.prefix)

    # -- merging ---------------------------------------------------------------
    @property
    def l0_count(self) -> int:
        return len(self._l0)

    def wants_merge(self) -> bool:
        return len(self._l0) >= L0_MERGE or (
            len(self._l0) > 1 and sum(len(t) for t in self._l0.values()) >= L0_MERGE_ENTRIES
        )

    def consolidate(self, min_l0: int = L0_MERGE, force: bool = False, keep=None) -> str | None:
        """Merge level-0 files (and small generations) into one generation.

        ``keep(key, value) -> bool`` drops entries (used by gc); with ``force``
        every visible file is merged. Returns the new generation's id, or None.
        """
        if not self.backend.supports_deletes or self.backend.read_only:
            return None
        self.refresh()
        l0 = sorted(self._l0)
        if not force and len(l0) < min_l0 and not self.wants_merge():
            return None
        l0_total = sum(len(self._l0[n]) for n in l0)
        gens = [g for g in self._active_gens if force or g.count <= 4 * max(l0_total, 1)]
        if not l0 and len(gens) <= 1 and keep is None:
            return None
        try:
            entries: list[tuple[bytes, bytes]] = []
            for g in gens:
                for i in range(g.nbuckets):
                    key = f"{self.prefix}buckets/{g.id}/{i:04x}"
                    entries.extend(TableFile(key, self._read_frame(key)).items())
            for n in l0:
                entries.extend(self._l0[n].items())
        except _Vanished:
            return None  # someone else merged these meanwhile
        entries = list(dict.fromkeys(entries))
        if keep is not None:
            entries = [kv for kv in entries if keep(*kv)]
        n = len(entries)
        nb = 1
        while nb < 4096 and n / nb > BUCKET_ENTRIES:
            nb *= 2
        by_bucket: list[list[tuple[bytes, bytes]]] = [[] for _ in range(nb)]
        for kv in entries:
            by_bucket[_bucket_of(kv[0], nb)].append(kv)
        self._gen_seq = getattr(self, "_gen_seq", 0) + 1
        gid = f"{time.time_ns():016x}-{self.writer}g-{self._gen_seq:06x}"  # "g": not in the level-0 sequence
        items = []
        for i, b in enumerate(by_bucket):
            _, frame = encode_frame(encode_table_file(b), KIND_TABLE, _ZSTD)
            items.append((f"{self.prefix}buckets/{gid}/{i:04x}", frame))
        self.backend.create_many(items)
        covers = ["l0:" + x for x in l0] + ["gen:" + g.id for g in gens]
        for g in gens:  # what merged generations covered and is not deleted yet stays covered
            covers.extend(c for c in g.covers if c in self._visible)
        covers = list(dict.fromkeys(covers))
        marks: dict[str, int] = {}
        for g in gens:
            for w, v in g.marks.items():
                marks[w] = max(marks.get(w, 0), v)
        for x in l0:
            w, seq = parse_name(x)
            marks[w] = max(marks.get(w, 0), seq)
        manifest = json.dumps({"count": n, "nbuckets": nb, "covers": covers, "marks": marks}).encode()
        _, frame = encode_frame(manifest, KIND_TABLE, _ZSTD)
        self.backend.create(self.prefix + "gens/" + gid, frame)
        # The new generation is visible: what it covers can go.
        doomed = [self.prefix + "l0/" + x for x in l0] + [self.prefix + "gens/" + g.id for g in gens]
        for g in gens:
            doomed.extend(self.backend.list(f"{self.prefix}buckets/{g.id}/"))
        self.backend.delete_many(doomed)
        self.refresh()
        return gid


def writer_id() -> str:
    """A fresh id for one writer (a Store instance in one process)."""
    return f"{os.getpid():x}{os.urandom(4).hex()}"
