"""A table: one writer's view of an append-only multimap from 16-byte keys to small values.

:class:`Table` adds this writer's entries (written as level-0 files at a
flush) and reads everyone's (by the plan of :mod:`casmon.store.table.plan`);
merging (:mod:`~casmon.store.table.merge`), surveying and rewriting for ``verify --repair``
(:mod:`~casmon.store.table.survey`) live in modules of their own that a hit never loads. The package docstring describes the
protocol; :mod:`casmon.store.table.format` the bytes.
"""

from __future__ import annotations

import os
import _thread  # threading's locks, without loading threading on a hit
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Literal, TypeAlias

from casmon.errors import DamagedObjectError, warn_damage
from casmon.store.backend import Backend
from casmon.store.codec import FRAME_HEADER, KIND_TABLE, decode_frame, decode_table_block, encode_frame, read_header
from casmon.store.table.format import (BUCKET_ENTRIES, L0_LZ4_MAX, LA_FIRST, LOOKASIDE, NAME_RE, _LZ4, _M64, _ZSTD,
                                       Generation, Lookaside, TableFile, _Block, _bucket_of, _hashes, _Vanished,
                                       encode_table_file, parse_generation, parse_lookaside)
from casmon.store.table import fence
from casmon.store.table.plan import resolve
from casmon.store.table.ranges import Ranges, parse_name, ranges_has, ranges_union

if TYPE_CHECKING:
    from casmon.store.table.encode import Columns
    from casmon.store.table.format import Payload
    from casmon.store.table.survey import Survey

#: Waiting entries by key: one value as itself, more as a tuple (see _index_add).
PendingIndex: TypeAlias = dict[bytes, "bytes | tuple[bytes, ...]"]

__all__ = ["L0_MERGE", "MISS_REFRESH_INTERVAL", "LateWrite", "Table", "writer_id"]

#: A lookup that finds nothing lists the table again at most this often (seconds):
#: other writers' entries newer than this may be missed, which costs a recomputation, never a wrong answer.
MISS_REFRESH_INTERVAL = 1.0
#: Format-2 blocks a table keeps after reading them.
BLOCK_CACHE = 8
#: Generation format written (1: whole buckets; 2: blocks, block directory and bloom filter).
GEN_FORMAT = 2
#: Merge a generation with what is merged when it holds at most this many times as many entries:
#: generations grow geometrically, so a table holds O(log n) of them and an entry is rewritten O(log n) times.
MERGE_FACTOR = 1
#: Merge level-0 files once this many are visible ...
L0_MERGE = 16
#: ... or once they hold this many entries (readers load level-0 files whole).
L0_MERGE_ENTRIES = BUCKET_ENTRIES
#: Buckets without a manifest this old (seconds, by the time in their generation's id) are left
#: over (a merge killed before its manifest, or a lost manifest): repair deletes them after
#: salvaging them. Younger ones may belong to a merge in progress.
ORPHAN_AGE = 600.0
#: Manifests at least this large (bytes of payload) get a lookaside copy (:data:`~.format.LOOKASIDE`): below it a
#: whole read costs about what the copy's reads do.
LOOKASIDE_MIN = 32768


def _index_values(idx: PendingIndex, key: bytes) -> tuple[bytes, ...]:
    """The values :func:`_index_add` put under ``key``."""
    v = idx.get(key)
    return () if v is None else v if isinstance(v, tuple) else (v,)


def _index_add(idx: PendingIndex, key: bytes, value: bytes) -> None:
    """Add to a key -> value(s) index: one value as itself, more as a tuple. Not a list per key: the
    garbage collector walks every list at each full collection, and a writer's index holds
    thousands; a tuple of bytes it stops tracking."""
    old = idx.get(key)
    idx[key] = value if old is None else (old + (value,) if isinstance(old, tuple) else (old, value))


class LateWrite(Exception):
    """A level-0 file's write was slow enough that a gc may fence it (:mod:`.fence`); its batch is sealed
    again under a new name, to be checked and written again."""


class Table:
    """One table: pending entries of this writer, plus what is on the backend."""

    def __init__(self, backend: Backend, prefix: str, writer: str, bucket_cache: int = 64) -> None:
        self.backend = backend
        self.prefix = prefix if prefix.endswith("/") else prefix + "/"
        self.writer = writer
        self._seq = 0
        self._lock = _thread.RLock()
        self._refresh_lock = _thread.RLock()  # taken before _lock, never while holding it
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
        self.format_gate: Callable[[], bool] | None = None
        self._gen_seq = 0
        self._bad_gens: dict[str, str] = {}  # damaged manifests, by id
        self._bad_l0: dict[str, str] = {}  # damaged level-0 files, by name
        self._bad_buckets: set[tuple[str, int]] = set()
        #: Damaged or missing files this table needs, skipped by reads: key -> reason.
        self.damaged: dict[str, str] = {}
        self._listed = False
        self._visible: set[str] = set()
        self.last_refresh = 0.0
        #: Level-0 files a gc's fence makes late are not records (:mod:`.fence`): record tables, not the pack index.
        self.fenced = False
        self.late: list[str] = []  # level-0 files listed past: late, or superseded (fence.visible)
        self._sealed_at: dict[str, float] = {}  # sealed batch -> monotonic time of its sealing
        #: Whether lookaside copies are read and written: where a ranged read is one system call (a local folder),
        #: not a request each.
        self.lookasides = type(backend).read_kept is not Backend.read_kept
        #: Whether generations are read through their copies: a lookup's view. Merges, gc and whole reads decide
        #: from manifests only (:meth:`decide_from_manifests`), as derived data must never make them keep or drop.
        self.read_copies = self.lookasides
        self._no_lookaside: dict[str, bool] = {}  # generation -> its copy is damaged or stale (True) or missing
        self._derive: dict[str, tuple[bytes, Payload]] = {}  # generation -> (digest, payload): copies to write

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
        from casmon.store.table import batches  # rare: loaded on first use, as are those below

        return batches.take_pending(self)

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
                name = self.new_name()
                self._batches.append((name, self._pending))
                self._sealed_at[name] = time.monotonic()
                self._pending = []

    def sealed(self) -> list[tuple[str, list[tuple[bytes, bytes]]]]:
        """The sealed batches not written yet: ``[(name, entries)]``."""
        with self._lock:
            return list(self._batches)

    def replace_sealed(self, name: str, entries: list[tuple[bytes, bytes]]) -> None:
        """Change a sealed batch before it is written (:func:`.batches.replace_sealed`)."""
        from casmon.store.table import batches

        batches.replace_sealed(self, name, entries)

    def write_sealed(self) -> None:
        """Write the sealed batches, oldest first; a batch that fails stays sealed under its name.

        Raises :class:`LateWrite` when a batch's write was slow enough that a gc may have fenced it
        (:mod:`.fence`): it is sealed again under a new name (the same number, which supersedes the
        first), for the caller to check its values again and call this again."""
        while self._batches:
            name, entries = self._batches[0]
            tf = self._write_named(name, entries)  # even empty: the writer's numbering must not show a gap
            if self.fenced and self._slow(name):
                self.reseal()
                raise LateWrite(self.prefix + "l0/" + name)
            with self._lock:  # one step: no reader sees the entries both written and waiting
                self._l0[name] = tf
                self._batches.pop(0)
                self._sealed_at.pop(name, None)
                self._reindex_pending()
        if self._derive:
            self.write_lookasides()

    def write_lookasides(self) -> None:
        """Write the lookaside copies of the manifests this table read whole for want of a sound one (derived
        data: a failure is ignored, the next reader reads the manifest whole)."""
        from casmon.store.table import lookaside  # a reader's first flush after it read manifests whole

        lookaside.write_derived(self)

    def reseal(self) -> None:
        """Seal the waiting batches again now, under new names (:func:`.batches.reseal`)."""
        from casmon.store.table import batches

        batches.reseal(self)

    def l0_listed(self) -> list[str]:
        """The level-0 files the last refresh read (visible ones: late and superseded ones are not among them)."""
        with self._lock:
            return list(self._listed_l0)

    def _slow(self, name: str) -> bool:
        """After a write: it took so long (from the seal) that a gc may have marked before it landed."""
        from casmon.store import condemned  # gc's time bounds: writes only

        return time.monotonic() - self._sealed_at.get(name, time.monotonic()) > condemned.LATE_MAX / 2

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
    @property
    def listed(self) -> bool:
        """True once the table was listed (its first lookup lists it)."""
        return self._listed

    def refresh(self) -> None:
        """See what other writers added: list, load new level-0 files and manifests.

        Never raises for damage: damaged or missing files are skipped and
        remembered in :attr:`damaged` (with a warning once per process).
        """
        tries = 8
        # One refresh at a time: a slower one (listed before another thread's merge) would otherwise
        # set its older view over the newer one, forgetting the merge's generation and the level-0
        # files it read from memory: a stored key would miss until the next refresh.
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
        names = [n for n in names if NAME_RE.match(n)]
        if sub == "l0/" and self.fenced and names:
            names, hidden = fence.visible(self.prefix, names, fence.read(self.backend))
            self.late = hidden  # listed past (deleted by the next merge)
        return names

    def _refresh_once(self, tolerant: bool = False) -> None:
        # Level-0 files first: a merge writes its manifest before it deletes what it merged.
        l0_names = self._list("l0/")
        gen_ids = self._list("gens/")
        listed_gens = set(gen_ids)
        gens = {g: v for g, v in self._gens.items() if g in listed_gens}
        for g, v in list(gens.items()):
            if v.lookaside is not None and v.lookaside.failed:  # read it whole now
                self._no_lookaside[g] = True
                del gens[g]
        if self._no_lookaside:  # forget generations merged away (and the copies they no longer need)
            self._no_lookaside = {g: v for g, v in self._no_lookaside.items() if g in listed_gens}
            with self._lock:
                self._derive = {g: v for g, v in self._derive.items() if g in listed_gens}
        bad_gens = {g: r for g, r in self._bad_gens.items() if g in listed_gens}
        new_gens = [g for g in gen_ids if g not in gens and g not in bad_gens]
        if new_gens and self.read_copies:
            new_gens = self._read_lookasides(new_gens, gens)
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
                    frame, payload = decode_frame(data, key)
                    gens[g] = parse_generation(g, key, payload)
                except DamagedObjectError as e:
                    bad_gens[g] = e.reason
                    self._damage(key, e.reason)
                    continue
                if g in self._no_lookaside and gens[g].v >= 2 and len(payload) >= LOOKASIDE_MIN:
                    self._derive[g] = (frame.digest, payload)
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
            for old in was_active:
                if old.id not in live:  # merged away: close its bucket files
                    self.backend.forget(f"{self.prefix}buckets/{old.id}/")
            self._bad_buckets = {bk for bk in list(self._bad_buckets) if bk[0] in live}
            self._bad_blocks = {bk for bk in list(self._bad_blocks) if bk[0] in live}
            # What is damaged and still matters: listed manifests, level-0 files to read, buckets of active generations.
            needed = {self.prefix + "gens/" + g for g in bad_gens}
            needed |= {self.prefix + "l0/" + n for n in bad_l0 if n in keep}
            needed |= {self._bucket_key(g, i) for g, i in self._bad_buckets}
            shifts = {g.id: g.shift for g in view.active}
            needed |= {self._bucket_key(g, b >> shifts[g]) for g, b in self._bad_blocks}
            self.damaged = {k: r for k, r in self.damaged.items() if k in needed}

    def decide_from_manifests(self) -> None:
        """Read manifests whole from now on, and again those read through their copies: before a merge, gc or
        a whole read, whose decisions (what to delete, what is reachable) must rest on the manifests alone."""
        if not self.read_copies:
            return
        self.read_copies = False
        with self._refresh_lock, self._lock:
            if any(g.lookaside is not None for g in self._gens.values()):
                self._gens = {gid: g for gid, g in self._gens.items() if g.lookaside is None}
                self._listed = False  # the next read lists again, reading those manifests

    def _read_lookasides(self, gids: list[str], gens: dict[str, Generation]) -> list[str]:
        """Generations of ``gids`` read through their lookaside copies into ``gens``; returns the others (no copy,
        or one that is not sound: their manifests are read whole)."""
        rest = []
        for gid in gids:
            g = self._lookaside_gen(gid) if gid not in self._no_lookaside else None
            if g is None:
                rest.append(gid)
            else:
                gens[gid] = g
        return rest

    def _lookaside_gen(self, gid: str) -> Generation | None:
        b, key = self.backend, f"{self.prefix}buckets/{gid}/{LOOKASIDE}"
        try:
            first = b.read_kept(key, 0, LA_FIRST)
            if first is None:
                self._no_lookaside[gid] = False
                return None
            mkey = self.prefix + "gens/" + gid
            head = b.get_range(mkey, 0, FRAME_HEADER)
            if head is None:
                return None  # merged away meanwhile: the whole read says so
            digest = read_header(head, mkey).digest

            def whole() -> Payload | None:  # the manifest, checked: what a copy that fails a check is replaced by
                data = b.get(mkey)
                if data is None:
                    return None
                frame, payload = decode_frame(data, mkey)
                return payload if frame.digest == digest else None

            def bad(payload: Payload) -> None:
                with self._lock:
                    self._derive[gid] = (digest, payload)

            la = Lookaside(key, lambda start, end: b.read_kept(key, start, end), bytes(first), digest, whole, bad)
            return parse_lookaside(gid, mkey, la)
        except (DamagedObjectError, _Vanished, ValueError, KeyError, TypeError, RecursionError, OSError):
            self._no_lookaside[gid] = True
            return None

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

    def _fetch(self, g: Generation, key: str, tolerant: bool, start: int = 0,
               end: int | None = None) -> Payload | None | Literal[False]:
        """The bytes of a bucket file of ``g`` (or a range of them); None if it is gone, False if ``g`` is gone.

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
        data: Payload | None = self.backend.read_kept(key, start, start + ln)
        if data is None:
            fetched = self._fetch(g, key, tolerant, start, start + ln)
            if fetched is False:
                return _EMPTY
            data = fetched
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

    def _file_tables(self, g: Generation, i: int, tolerant: bool,
                     data: Payload | None = None) -> tuple[list[TableFile], bool]:
        """Bucket file ``i`` of ``g`` as tables (:func:`.whole.file_tables`)."""
        from casmon.store.table import whole  # reading whole: never on a lookup's path, as below

        return whole.file_tables(self, g, i, tolerant, data)

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

    def _view(self) -> tuple[list[Generation], list[TableFile], PendingIndex]:
        """What a lookup reads, taken in one step: a merge or a write of waiting entries in another
        thread changes the generations, the level-0 files and the waiting entries together (under
        the lock), and a lookup reading them at different moments could miss an entry that moved
        from one to another (a lookup beside a merge in another thread would miss a key)."""
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
                if g.lookaside is not None:  # its bloom filter is read on use: that is I/O
                    return None
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
        """Every entry once (:func:`.whole.items`); ``strict`` raises :class:`DamagedObjectError` rather than
        skip a damaged or missing file."""
        from casmon.store.table import whole

        return whole.items(self, refresh, strict)

    def _gen_entries(self, g: Generation, tolerant: bool) -> list[tuple[bytes, bytes]]:
        from casmon.store.table import whole

        return whole.gen_entries(self, g, tolerant)

    def items_beyond(self, seen: Iterable[str]) -> tuple[list[tuple[bytes, bytes]], list[tuple[bytes, bytes]],
                                                          list[str]] | None:
        """What a reader holding the entries of the files ``seen`` lacks (:func:`.whole.items_beyond`)."""
        from casmon.store.table import whole

        return whole.items_beyond(self, seen)

    def count(self) -> int:
        """How many entries :meth:`items` yields (:func:`.whole.entry_count`)."""
        from casmon.store.table import whole

        return whole.entry_count(self)

    def missing_segments(self) -> list[str]:
        """Level-0 files that must have existed but are gone (:func:`.whole.missing_segments`)."""
        from casmon.store.table import whole

        return whole.missing_segments(self)

    def _gap_name(self, w: str, lo: int, hi: int) -> str:
        from casmon.store.table import whole

        return whole.gap_name(self, w, lo, hi)

    def contents_key(self) -> tuple[tuple[str, ...], tuple[str, ...], int]:
        """What the table holds as of its last listing (:func:`.whole.contents_key`)."""
        from casmon.store.table import whole

        return whole.contents_key(self)

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

    def consolidate(self, min_l0: int = L0_MERGE, force: bool = False,
                    keep: Callable[[bytes, bytes], bool] | None = None) -> str | None:
        """Merge level-0 files (and small generations) into one generation.

        ``keep(key, value) -> bool`` drops entries (used by gc); with ``force``
        every visible file is merged. Generations whose provenance overlaps are
        merged together; files a generation already holds are deleted; damaged
        files are left alone (for ``verify --repair``). Returns the new
        generation's id, or None.
        """
        from casmon.store.table import merge  # writers and gc merge; readers never load it

        return merge.consolidate(self, min_l0, force, keep)

    def _write_generation(self, entries: list[tuple[bytes, bytes]] | Columns, covers: list[str], contains: Ranges,
                          exact: bool, marks: dict[str, int]) -> str:
        """Write buckets, then the manifest (fault points between); returns the generation's id."""
        from casmon.store.table import merge  # writers, merges and repair write generations; readers never load it

        return merge.write_generation(self, entries, covers, contains, exact, marks)

    def _delete(self, l0_names: list[str], gens: list[Generation], more_gen_ids: Iterable[str] = (),
                more_keys: Iterable[str] = ()) -> None:
        """Delete level-0 files and generations: manifests first, then their buckets."""
        from casmon.store.table import merge

        merge.delete_files(self, l0_names, gens, more_gen_ids, more_keys)

    # -- verify and repair ------------------------------------------------------
    def survey(self, keep: bool = True, orphans: bool = True) -> Survey:
        """Read and check every file of the table (``verify``; ``repair`` with ``keep``, the parsed files too).

        With ``orphans``, buckets of no listed generation are checked too: if they
        hold entries no listed file shows, the generation's manifest was lost,
        and the survey reports it missing (repair then salvages the buckets).
        The pack index passes False: it is rebuilt from the packs anyway.
        """
        from casmon.store.table import survey  # verify and repair: never on a reader's or writer's path

        return survey.survey_table(self, keep, orphans)

    def rewrite(self, sv: Survey, entries: Iterable[tuple[bytes, bytes]]) -> str:
        """Replace every file ``sv`` saw by one generation that holds exactly ``entries`` (repair;
        :func:`casmon.store.table.survey.rewrite_table`)."""
        from casmon.store.table import survey

        return survey.rewrite_table(self, sv, entries)

_EMPTY = TableFile("(damaged)", encode_table_file([]))


def writer_id() -> str:
    """A fresh id for one writer (a Store instance in one process)."""
    return f"{os.getpid():x}{os.urandom(4).hex()}"
