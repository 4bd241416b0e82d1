"""Maintenance: ``stats``, ``verify`` and ``repair`` over a whole store (gc is :mod:`casmon.maintenance.gc`).

All of them walk the same inventory: the format marker, loose objects, packs
and their index entries, table files, records and refs. ``verify`` re-hashes
every object and follows every pointer and never writes. ``repair`` salvages:

* every pack frame carries its digest, kind and lengths, so the pack index is
  **rebuilt from the packs** (frames after a damaged one are found again by
  their magic); an index file's damage loses nothing;
* a damaged pack's good frames move to a new pack; damaged loose objects go;
* a value is dropped only if a chunk or child of it is lost;
* each record table is rebuilt from every readable file (level-0 files,
  buckets of every generation, including one whose manifest is lost);
  a record is kept if every value it names is there, else a per-kind salvager
  (:func:`casmon.store.store.register_salvager`) keeps what it can (the call log
  keeps the calls of a batch that do not need a lost value), else it is dropped;
* refs are restored from the records that stand behind them; a damaged or
  missing ``casmon.json`` is written again.

Repair takes the gc lock, so no gc runs meanwhile; writers may go on (a merge
that races the rebuild is read correctly; at worst a second repair is needed).
"""

from __future__ import annotations

import json
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import xxhash

from casmon.store.codec import FRAME_HEADER, KIND_CHUNK, KIND_VALUE, MAGIC, Frame, decode_frame, read_header, split_pack
from casmon.keys.digest import Digest
from casmon.view.display import StoreStats, guarded_html, guarded_text, verify_html, verify_text
from casmon.errors import CasmonError, DamagedObjectError
from casmon.store.marker import FORMAT_KEY, marker_bytes, parse_marker
from casmon.store.objects import Location, loose_key, pack_key
from casmon.store.table import Survey, Table

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["stats", "verify", "repair", "VerifyReport", "inventory", "marker_bytes", "parse_marker"]

_HEX = re.compile(r"^[0-9a-f]{32}$")
Progress = Callable[[str, int, int], None]  # (phase, done, total)


def _noop(phase: str, done: int, total: int) -> None:
    pass


# -- inventory ----------------------------------------------------------------------


@dataclass
class Inventory:
    loose: dict[Digest, str]  # digest -> key
    packs: set[str]
    packed: dict[Digest, Location]  # digest -> newest location
    all_keys: list[str]


def inventory(store: Store, strict: bool = True) -> Inventory:
    """Every loose object, pack and indexed object. ``strict``: raise if an index file is damaged."""
    keys = store.backend.list("")
    loose: dict[Digest, str] = {}
    packs: set[str] = set()
    for k in keys:
        parts = k.split("/")
        if parts[0] == "objects" and len(parts) == 3 and _HEX.match(parts[2]):
            loose[Digest(parts[2])] = k
        elif parts[0] == "packs" and len(parts) == 2 and _HEX.match(parts[1]):
            packs.add(parts[1])
    packed: dict[Digest, Location] = {}
    for d, v in store.objects.index.items(strict=strict):
        try:
            packed[Digest(d)] = Location.decode(v)
        except Exception:  # noqa: BLE001 - an entry that does not decode is no location (its file passed its checks)
            continue
    return Inventory(loose, packs, packed, keys)


def _table_prefixes(store: Store) -> list[str]:
    return ["index/"] + [f"records/{k}/" for k in store.record_kinds()]


def _table_at(store: Store, prefix: str) -> Table:
    return store.objects.index if prefix == "index/" else store.table(prefix.split("/")[1])


def _records(store: Store, kind: str, rep: VerifyReport | None = None):
    """``(key, record)`` of every readable record of ``kind``; damaged files skipped (verify reports them)."""
    for k, v in store.table(kind).items(strict=False):
        try:
            rec = json.loads(v)
            if not isinstance(rec, dict):
                raise ValueError("not an object")
        except ValueError as e:
            if rep is not None:
                rep.damaged.append((f"record {kind}/{bytes(k).hex()}", f"not valid JSON: {e}"))
            continue
        yield Digest(k), rec


# -- stats --------------------------------------------------------------------------


def stats(store: Store, progress: Progress | None = None) -> dict:
    """Counts and sizes of what the store holds.

    ``logical_bytes``: the sizes of all distinct values added up.
    ``chunk_bytes``: the distinct chunks' raw sizes (what is left after dedup).
    ``stored_bytes``: bytes on the backend, every file counted.
    ``records``: entries per kind, each counted once. Damaged files are skipped
    (``damaged_files`` counts them; ``casmon verify`` names them).
    """
    progress = progress or _noop
    store.flush()
    inv = inventory(store, strict=False)
    values = {d: loc for d, loc in inv.packed.items() if loc.kind == KIND_VALUE}
    packed_chunks = {d: loc for d, loc in inv.packed.items() if loc.kind == KIND_CHUNK}
    loose_keys = list(inv.loose.values())
    headers = store.backend.get_ranges([(k, 0, FRAME_HEADER) for k in loose_keys]) if loose_keys else []
    loose_raw = 0
    for k, h in zip(loose_keys, headers):
        try:
            loose_raw += read_header(h, k).raw_len if h is not None else 0
        except DamagedObjectError:
            pass
    sizes: list[int] = []
    step = 4096  # batches, so that a bar moves on a store of a million files
    for i in range(0, max(len(inv.all_keys), 1), step):
        progress("sizes", i, len(inv.all_keys))
        sizes += store.backend.getsize_many(inv.all_keys[i : i + step])
    progress("sizes", len(inv.all_keys), len(inv.all_keys))
    by_area: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k, n in zip(inv.all_keys, sizes):
        area = k.split("/", 1)[0] if "/" in k else "(top)"
        by_area[area][0] += 1
        by_area[area][1] += n
    logical = sum(loc.size for loc in values.values())
    chunk_bytes = sum(loc.size for loc in packed_chunks.values()) + loose_raw
    object_bytes = by_area["objects"][1] + by_area["packs"][1]
    records = {kind: store.table(kind).count() for kind in store.record_kinds()}
    damaged = sum(len(_table_at(store, p).damaged) for p in _table_prefixes(store))
    return StoreStats({  # a dict that shows itself (sizes in MiB, ratios rounded)
        "store": store.url,
        "values": len(values),
        "chunks": len(packed_chunks) + len(inv.loose),
        "loose_objects": len(inv.loose),
        "packs": len(inv.packs),
        "logical_bytes": logical,
        "chunk_bytes": chunk_bytes,
        "stored_bytes": sum(sizes),
        "object_bytes": object_bytes,
        "dedup_ratio": (logical / chunk_bytes) if chunk_bytes else 1.0,
        "compression_ratio": (chunk_bytes / object_bytes) if object_bytes else 1.0,
        "files": len(inv.all_keys),
        "files_by_area": {a: v[0] for a, v in sorted(by_area.items())},
        "bytes_by_area": {a: v[1] for a, v in sorted(by_area.items())},
        "records": records,
        "refs": len(store.refs()),
        "damaged_files": damaged,
    })


# -- verify -------------------------------------------------------------------------


@dataclass
class VerifyReport:
    """What ``verify`` found. ``ok`` is True when nothing is damaged or missing."""

    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (object key, reason)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (what, needed by)
    affected: dict[str, list[str]] = field(default_factory=dict)  # damaged/missing -> what depends on it
    bad_objects: dict[Digest, str] = field(default_factory=dict, repr=False)  # digests that cannot be trusted
    bad_files: list[str] = field(default_factory=list, repr=False)  # damaged table files, refs, gc lists
    bad_packs: set[str] = field(default_factory=set, repr=False)  # packs with any damaged byte
    bad_tables: set[str] = field(default_factory=set, repr=False)  # table prefixes with damaged or missing files
    bad_marker: bool = False  # casmon.json is damaged or missing

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.missing

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "checked": dict(self.checked),
            "damaged": [{"object": k, "reason": r} for k, r in self.damaged],
            "missing": [{"object": k, "needed_by": n} for k, n in self.missing],
            "affected": self.affected,
        }

    @guarded_text("verify report")
    def __repr__(self) -> str:
        return verify_text(self)

    @guarded_html("verify report")
    def _repr_html_(self) -> str:
        return verify_html(self)


def verify(store: Store, progress: Progress | None = None) -> VerifyReport:
    """Re-hash every object and follow every pointer; never modifies the store.

    Runs on a damaged store too (a damaged or missing ``casmon.json``, damaged
    or missing table files): everything is checked and reported, not just the
    first problem.
    """
    progress = progress or _noop
    rep = VerifyReport()
    bad_digests: dict[Digest, str] = {}  # digest -> object key, for objects that failed

    # 0. The format marker.
    problem = store.format.get("damaged") if isinstance(store.format, dict) else None
    if problem:
        rep.damaged.append((FORMAT_KEY, problem))
        rep.bad_marker = True

    # 1. Table files, every one, and what each table needs.
    for prefix in _table_prefixes(store):
        sv = _table_at(store, prefix).survey(keep=False, orphans=prefix != "index/")
        rep.checked["table files"] += sv.checked
        for key, reason in sorted(sv.damaged.items()):
            rep.damaged.append((key, reason))
            rep.bad_files.append(key)
        for key, who in sorted(sv.missing.items()):
            rep.missing.append((key, who))
        for gap in sv.gaps:
            rep.missing.append((gap, f"table {prefix} (a writer's sequence has a gap)"))
        if not sv.ok:
            rep.bad_tables.add(prefix)
    _verify_condemned_lists(store, rep)

    inv = inventory(store, strict=False)

    # 2. Loose objects: each re-hashed against its name.
    total = len(inv.loose) + len(inv.packs)
    done = 0
    for d, k in inv.loose.items():
        data = store.backend.get(k)
        done += 1
        progress("objects", done, total)
        if data is None:
            continue
        rep.checked["loose objects"] += 1
        try:
            decode_frame(data, k, expect=d)
        except DamagedObjectError as e:
            rep.damaged.append((k, e.reason))
            bad_digests[d] = k

    # 3. Packs: every frame re-hashed; every index entry must point at a good frame.
    entries_by_pack: dict[str, list[tuple[Digest, Location]]] = defaultdict(list)
    for d, loc in inv.packed.items():
        entries_by_pack[loc.pack].append((d, loc))
    unindexed: dict[Digest, str] = {}  # sound frames no index entry names: --repair indexes them
    for name in sorted(inv.packs | set(entries_by_pack)):
        done += 1
        progress("objects", done, total)
        key = pack_key(name)
        # A pack the index names but the listing lacks may have been written after the listing
        # (the index is read after it, and writers go on): read it rather than call it missing.
        data = store.backend.get(key)
        if data is None:
            for d, _loc in entries_by_pack.get(name, []):
                rep.missing.append((f"object {d.hex()}", key))
                bad_digests[d] = key
            continue
        rep.checked["packs"] += 1
        # Walk the whole pack, so damage in frames no index entry points at is found too.
        indexed = {loc.offset for _d, loc in entries_by_pack.get(name, [])}
        try:
            frames = split_pack(data, key)
        except DamagedObjectError as e:
            rep.damaged.append((e.key, e.reason))
            rep.bad_packs.add(name)
            frames = []
        for off, ln, _h in frames:
            if off in indexed:
                continue
            try:
                fr, _raw = decode_frame(data[off : off + ln], f"{key}@{off}")
                unindexed.setdefault(fr.digest, f"{key}@{off}")
            except DamagedObjectError as e:
                rep.damaged.append((f"{key}@{off} (an object no index entry uses)", e.reason))
                rep.bad_packs.add(name)
        for d, loc in entries_by_pack.get(name, []):
            rep.checked["packed objects"] += 1
            frame = data[loc.offset : loc.offset + loc.length]
            where = f"{key}@{loc.offset}"
            try:
                if len(frame) != loc.length:
                    raise DamagedObjectError(where, "pack is shorter than its index says")
                decode_frame(frame, where, expect=d)
            except DamagedObjectError as e:
                rep.damaged.append((f"{where} (object {d.hex()})", e.reason))
                bad_digests[d] = where
                rep.bad_packs.add(name)

    present = set(inv.loose) | set(inv.packed)

    def absent(what: str, d: Digest, who: str) -> None:
        where = unindexed.get(d)
        note = f" (it is in {where}, which the index does not name: --repair indexes it)" if where else ""
        rep.missing.append((f"{what} {d.hex()}{note}", who))

    # 4. Values: their chunks and children must be there and sound.
    dependents: dict[Digest, list[str]] = defaultdict(list)
    children_of: dict[Digest, list[Digest]] = {}
    lacking: dict[Digest, list[Digest]] = {}  # value -> its chunks/children that are not stored
    values = [d for d, loc in inv.packed.items() if loc.kind == KIND_VALUE and d not in bad_digests]
    for i, d in enumerate(values):
        progress("values", i + 1, len(values))
        rep.checked["values"] += 1
        try:
            m = store.manifest(d)
        except CasmonError as e:
            rep.damaged.append((f"value {d.hex()}", str(e)))
            bad_digests[d] = f"value {d.hex()}"
            continue
        children_of[d] = list(m.children)
        for c in [*m.chunk_digests(), *m.children]:
            dependents[c].append(f"value {d.hex()}")
            if c not in present:
                lacking.setdefault(d, []).append(c)

    # 5. Records and refs: what they point at must be there.
    expected_refs: dict[str, tuple[str | None, float, str]] = {}
    late: list[tuple[Digest, str]] = []  # (value, who) named but not in the inventory: checked below
    for kind in store.record_kinds():
        for k, rec in _records(store, kind, rep):
            rep.checked["records"] += 1
            _note_expected_ref(expected_refs, kind, k, rec)
            refs = rec.get("_refs", [])
            for h in refs if isinstance(refs, list) else [refs]:
                try:
                    rd = Digest(h)
                except (ValueError, TypeError):
                    rep.damaged.append((f"record {kind}/{k.hex()}", f"bad digest {h!r}"))
                    continue
                dependents[rd].append(f"record {kind}/{k.hex()}")
                if rd not in present:
                    late.append((rd, f"record {kind}/{k.hex()}"))
    existing_refs = set(store.refs())
    for name, (_target, _t, who) in sorted(expected_refs.items()):
        if name not in existing_refs:
            rep.missing.append((f"refs/{name}", who))
    for name in existing_refs:
        rep.checked["refs"] += 1
        try:
            ref = store.get_ref(name)
        except DamagedObjectError as e:
            rep.damaged.append((e.key, e.reason))
            rep.bad_files.append(e.key)
            continue
        if ref is not None and ref.target is not None:
            dependents[ref.target].append(f"ref {name}")
            if ref.target not in present:
                late.append((ref.target, f"ref {name}"))
    # The inventory was listed before the records and refs were read: a writer that flushed
    # meanwhile wrote the values they name after it. Read those now before calling them missing.
    stored = _Latecomers(store, present)
    for d, who in late:
        if not stored(d):
            absent("value", d, who)

    # A value that lacks a chunk is a problem only if a record or ref reaches it: gc sweeps an
    # unreachable value's pieces as each comes due (a chunk condemned before its manifest was written
    # goes first), so garbage may be partly collected for a while. That is counted, not reported.
    reachable: set[Digest] = set()
    roots = {d for d, deps in dependents.items() if any(not x.startswith("value ") for x in deps)}
    todo = list(roots)
    while todo:
        d = todo.pop()
        if d in reachable:
            continue
        reachable.add(d)
        todo.extend(children_of.get(d, ()))
    for d, missing in lacking.items():
        if d not in reachable:
            rep.checked["unreachable values partly collected (gc removes the rest)"] += 1
            continue
        for c in missing:
            if stored(c, c in children_of.get(d, ())):
                continue  # stored after the listing, before its value's index entry was read
            absent("object", c, f"value {d.hex()}")
            bad_digests.setdefault(c, f"object {c.hex()}")
    if stored.found:
        rep.checked["objects written during verify"] += stored.found
    # A value with a bad chunk is bad too.
    for c in list(bad_digests):
        for dep in dependents.get(c, []):
            if dep.startswith("value "):
                bad_digests.setdefault(Digest(dep.split()[-1]), dep)

    # What depends on each bad object, transitively (chunk -> value -> records).
    for d, key in bad_digests.items():
        seen: list[str] = []
        todo = list(dependents.get(d, []))
        while todo:
            dep = todo.pop()
            if dep in seen:
                continue
            seen.append(dep)
            if dep.startswith("value "):
                todo.extend(dependents.get(Digest(dep.split()[-1]), []))
        if seen:
            rep.affected[key] = sorted(seen)
    rep.bad_objects = bad_digests
    return rep


class _Latecomers:
    """Objects a record, ref or value names that the first listing lacks, checked against the store now.

    ``verify`` and ``repair`` list objects before they read records and refs, and writers go on
    meanwhile; a writer stores a value's objects before the record or ref naming it, so what it
    wrote after the listing is read here rather than called missing. Found by an attack: ``verify``
    called a sound store damaged, and ``repair`` deleted a ref and dropped a cache entry a writer
    had just written. One second inventory, taken at the first such object after the records were
    read, answers for all of them (not a listing per object), and every object is read from the
    store and checked whole -- never from this process's memory, which may hold a value the store
    has lost. Call :meth:`reread` before reading the next batch of records or refs.
    """

    def __init__(self, store: Store, present: set[Digest]) -> None:
        self.store = store
        self.present = present
        self.found = 0  # objects the first listing lacked that are sound now
        self._fresh: Inventory | None = None
        self._batch = 0  # batches of records or refs read so far
        self._fresh_batch = -1  # the last batch read before _fresh was listed
        self._sound: dict[Digest, bool] = {}

    def reread(self) -> None:
        self._batch += 1

    def __call__(self, d: Digest, value: bool = True) -> bool:
        if d in self.present or self._sound.get(d):
            return True
        if self._fresh is None or self._fresh_batch < self._batch:
            self._fresh = inventory(self.store, strict=False)
            self._fresh_batch = self._batch
            self._sound = {k: v for k, v in self._sound.items() if v}  # a miss may be found now
        return self._check(d, value)

    def _check(self, d: Digest, value: bool) -> bool:
        from casmon.store.store import decode_manifest

        if d in self.present:
            return True
        if d in self._sound:
            return self._sound[d]
        self._sound[d] = False  # while it is being checked: a cycle proves nothing
        ok = False
        try:
            raw = self._read(d)
            if raw is not None:
                ok = True
                if value:
                    m = decode_manifest(d, raw)
                    ok = all(self._check(c, False) for c in m.chunk_digests()) and all(
                        self._check(c, True) for c in m.children)
        except CasmonError:
            ok = False
        self._sound[d] = ok
        self.found += ok
        return ok

    def _read(self, d: Digest):
        """``d``'s payload as the second inventory places it, checked against ``d``; None if absent."""
        inv = self._fresh
        key = inv.loose.get(d)
        if key is not None:
            data = self.store.backend.get(key)
            if data is not None:
                return decode_frame(data, key, expect=d)[1]
        loc = inv.packed.get(d)
        if loc is None:
            return None
        key = pack_key(loc.pack)
        frame = self.store.backend.get_range(key, loc.offset, loc.offset + loc.length)
        if frame is None or len(frame) != loc.length:
            return None
        return decode_frame(frame, f"{key}@{loc.offset}", expect=d)[1]


def _verify_condemned_lists(store: Store, rep: VerifyReport) -> None:
    """gc's condemned lists must be readable (a damaged one only delays gc; repair deletes it)."""
    try:
        from casmon.store import condemned
    except ImportError:  # pragma: no cover
        return
    keys = [k for k in store.backend.list(condemned.PREFIX) if ".partial" not in k]
    for k, data in zip(keys, store.backend.get_many(keys) if keys else []):
        if data is None:
            continue
        rep.checked["gc lists"] += 1
        try:
            condemned.decode(k.rsplit("/", 1)[-1], data)
        except DamagedObjectError as e:
            rep.damaged.append((k, e.reason))
            rep.bad_files.append(k)


def expected_refs_of(store: Store) -> dict[str, tuple[str | None, float, str]]:
    """Refs that records stand behind (``_ref``): name -> (target, time, record), the newest record winning."""
    out: dict[str, tuple[str | None, float, str]] = {}
    for kind in store.record_kinds():
        for k, rec in _records(store, kind):
            _note_expected_ref(out, kind, k, rec)
    return out


def _note_expected_ref(out: dict, kind: str, key: bytes, rec: dict) -> None:
    name = rec.get("_ref")
    if isinstance(name, str):
        try:
            t = float(rec.get("time", 0) or 0)
        except (TypeError, ValueError):
            t = 0.0
        if name not in out or t >= out[name][1]:
            out[name] = (rec.get("_ref_target"), t, f"record {kind}/{bytes(key).hex()}")


# -- repair -------------------------------------------------------------------------


def _ref_now(store: Store, name: str):
    try:
        return store.get_ref(name)
    except (DamagedObjectError, ValueError):
        return False


def repair(store: Store, progress: Progress | None = None) -> dict:
    """Salvage everything intact, drop only what lost data, until ``verify`` is clean.

    See the module docstring for what is kept. Takes the gc lock (no gc runs
    meanwhile). Returns what was done; ``done["ok"]`` is the final verify.
    """
    if not store.backend.supports_deletes or store.read_only:
        raise CasmonError(f"cannot repair {store.url}: it cannot delete (a zip file, or opened read-only)")
    from casmon.maintenance.gc import gc_lock

    progress = progress or _noop
    with gc_lock(store, "repair"):
        return _repair(store, progress)


def _repair(store: Store, progress: Progress) -> dict:
    done: dict = {"deleted_files": [], "dropped_index_entries": 0, "dropped_values": 0, "dropped_records": 0,
                  "salvaged_records": 0, "dropped_refs": [], "restored_refs": [], "rebuilt_tables": [],
                  "rewrote_marker": False, "rounds": 0}
    try:
        store.flush()
    except CasmonError:
        pass  # what cannot be written now stays pending
    for _round in range(3):
        rep = verify(store, progress)
        if rep.ok:
            break
        done["rounds"] += 1
        _repair_round(store, rep, done, progress)
    final = verify(store, progress)
    done["ok"] = final.ok
    if not final.ok:
        done["left"] = final.as_dict()
    return done


def _repair_round(store: Store, rep: VerifyReport, done: dict, progress: Progress) -> None:
    if rep.bad_marker:
        from casmon.store.store import FORMAT_KEY as key

        data = marker_bytes({"repaired": time.time()})
        store.backend.set(key, data)
        store.format = parse_marker(data)[0]
        done["rewrote_marker"] = True
    for _d, key in rep.bad_objects.items():
        if key.startswith("objects/"):
            store.backend.delete(key)
            done["deleted_files"].append(key)
    for key in rep.bad_files:
        if key.startswith("gc/condemned/"):
            store.backend.delete(key)  # a damaged list only delays gc: the next gc condemns those objects again
            done["deleted_files"].append(key)
    store.objects.clear_caches()
    store._manifests.clear()
    present = _rebuild_index(store, done, progress)
    store.objects.clear_caches()
    store._manifests.clear()
    # Writers go on beside repair: what a record or ref names that the listing of packs lacks may
    # have been written since; it is lost only if it cannot be read, whole, now.
    stored = _Latecomers(store, present)
    _repair_records(store, stored, done, progress)
    _repair_refs(store, stored, done)


def salvage_frames(data, key: str) -> tuple[list[tuple[int, int, Frame, bytes]], bool]:
    """Every frame of a pack that decodes: ``([(offset, length, header, raw)], damaged)``.

    Frames are walked from the start; a frame whose header is sound but whose
    payload is not is skipped by its length; past a damaged header the walk
    goes on at the next frame magic whose frame decodes.
    """
    raw = bytes(data)
    n = len(raw)
    good: list[tuple[int, int, Frame, bytes]] = []
    damaged = False
    off = 0
    chained = True  # off is where the previous frame said the next one starts
    while off < n:
        try:
            h = read_header(raw, key, off)
            ln = FRAME_HEADER + h.stored_len
            if off + ln > n:
                raise DamagedObjectError(key, "frame runs past the end")
        except DamagedObjectError:
            damaged = True
            nxt = raw.find(MAGIC, off + 1)
            if nxt < 0:
                break
            off, chained = nxt, False
            continue
        try:
            fr, payload = decode_frame(raw[off : off + ln], f"{key}@{off}")
        except DamagedObjectError:
            damaged = True
            if chained:
                off += ln  # the header passed its check: trust its length
            else:
                nxt = raw.find(MAGIC, off + 1)
                if nxt < 0:
                    break
                off = nxt
            continue
        good.append((off, ln, fr, bytes(payload)))
        off += ln
        chained = True
    return good, damaged


def _rebuild_index(store: Store, done: dict, progress: Progress) -> set[Digest]:
    """Index every sound frame of every pack, except values that lost a chunk or child; returns what is present."""
    from casmon.store.store import decode_manifest

    idx = store.objects.index
    sv = idx.survey(keep=True, orphans=False)  # listed before the packs: a pack any index file names is older than the listing
    old: dict[Digest, set[Location]] = defaultdict(set)
    for k, v in sv.entries():
        try:
            old[Digest(k)].add(Location.decode(v))
        except Exception:  # noqa: BLE001
            continue
    needs: dict[Digest, list[Digest]] = {}  # value -> its chunks and children
    # Loose objects (damaged ones were deleted): large chunks, and now and then a large manifest.
    loose: set[Digest] = set()
    loose_keys = []
    for k in store.backend.list("objects/"):
        parts = k.split("/")
        if len(parts) == 3 and _HEX.match(parts[2]):
            loose.add(Digest(parts[2]))
            loose_keys.append(k)
    heads = store.backend.get_ranges([(k, 0, FRAME_HEADER) for k in loose_keys]) if loose_keys else []
    for k, h in zip(loose_keys, heads):
        try:
            if h is None or read_header(h, k).kind != KIND_VALUE:
                continue
            d = Digest(k.rsplit("/", 1)[-1])
            data = store.backend.get(k)
            m = decode_manifest(d, decode_frame(data, k, expect=d)[1])
            needs[d] = [*m.chunk_digests(), *m.children]
        except (DamagedObjectError, TypeError):
            loose.discard(Digest(k.rsplit("/", 1)[-1]))
    # Every pack, every frame.
    frames: dict[Digest, Location] = {}
    rescue: dict[Digest, tuple[bytes, int, int]] = {}  # good frames of damaged packs
    damaged_packs: list[str] = []
    names = sorted(k.split("/")[1] for k in store.backend.list("packs/") if _HEX.match(k.split("/")[-1]))
    for i, name in enumerate(names):
        progress("rebuild index", i + 1, len(names))
        key = pack_key(name)
        data = store.backend.get(key)
        if data is None:
            continue
        good, damaged = salvage_frames(data, key)
        if damaged:
            damaged_packs.append(name)
        for off, ln, fr, raw in good:
            d = fr.digest
            size = fr.raw_len
            if fr.kind == KIND_VALUE:
                try:
                    m = decode_manifest(d, raw)
                except DamagedObjectError:
                    continue
                size = m.nbytes
                needs[d] = [*m.chunk_digests(), *m.children]
            loc = Location(name, off, ln, fr.kind, size)
            if damaged:
                rescue.setdefault(d, (bytes(data[off : off + ln]), fr.kind, size))
            elif d not in frames or loc in old.get(d, ()):
                frames[d] = loc  # where the index said, if it said
    for d in frames:
        rescue.pop(d, None)
    present = set(frames) | set(rescue) | loose
    # A value is lost if a chunk is missing or a child value is lost.
    bad: set[Digest] = set()
    changed = True
    while changed:
        changed = False
        for v, parts in needs.items():
            if v not in bad and v in present and any(c not in present or c in bad for c in parts):
                bad.add(v)
                changed = True
    present -= bad
    done["dropped_values"] += len(bad)
    done["dropped_index_entries"] += len([d for d in old if d not in present])
    for d, (frame, kind, size) in rescue.items():
        if d not in bad:
            store.objects.adopt(d, frame, kind, size)
    store.objects.flush()  # a new pack for what damaged packs still held, and its own index entries
    idx.rewrite(sv, [(bytes(d), loc.encode()) for d, loc in frames.items() if d not in bad])
    done["rebuilt_tables"].append("index/")
    for name in damaged_packs:
        store.backend.delete(pack_key(name))
        done["deleted_files"].append(pack_key(name))
    for d in bad:
        if d in loose:  # a large manifest whose chunks are gone
            store.backend.delete(loose_key(d))
            done["deleted_files"].append(loose_key(d))
    return present


def _repair_records(store: Store, stored: _Latecomers, done: dict, progress: Progress) -> None:
    from casmon.store.store import salvage

    kinds = store.record_kinds()
    for i, kind in enumerate(kinds):
        progress("records", i + 1, len(kinds))
        t = store.table(kind)
        stored.reread()
        sv: Survey = t.survey(keep=True)
        changed = not sv.ok
        out: list[tuple[bytes, bytes]] = []
        for k, v in sv.entries():
            try:
                rec = json.loads(v)
                if not isinstance(rec, dict):
                    raise ValueError("not an object")
                refs = rec.get("_refs", [])
                digests = [Digest(h) for h in (refs if isinstance(refs, list) else [refs])]
            except (ValueError, TypeError):
                done["dropped_records"] += 1
                changed = True
                continue
            lost = {d for d in digests if not stored(d)}
            if not lost:
                out.append((k, v))
                continue
            changed = True
            fixed = salvage(kind, rec, lost)
            if fixed is None:
                done["dropped_records"] += 1
            else:
                done["salvaged_records"] += 1
                out.append((k, json.dumps(fixed, separators=(",", ":"), allow_nan=True).encode()))
        if changed:
            t.rewrite(sv, out)
            done["rebuilt_tables"].append(sv.prefix)


def _repair_refs(store: Store, stored: _Latecomers, done: dict) -> None:
    stored.reread()
    refs = {}
    for name in store.refs():
        try:
            refs[name] = store.get_ref(name)
        except DamagedObjectError:
            refs[name] = False
        except ValueError:
            continue  # not a ref name casmon writes
    for name, ref in refs.items():
        if ref is None:
            continue  # deleted meanwhile
        if ref is False or (ref.target is not None and not stored(ref.target)):
            if ref is not False and _ref_now(store, name) != ref:
                continue  # a writer pointed it elsewhere meanwhile
            store.backend.delete("refs/" + name)
            done["dropped_refs"].append(name)
    stored.reread()
    expected = expected_refs_of(store)
    existing = set(store.refs())
    for name, (target, _t, _who) in expected.items():
        if name in existing:
            continue
        try:
            d = Digest(target) if target else None
        except (ValueError, TypeError):
            continue
        if d is not None and not stored(d):
            continue
        try:
            store.set_ref(name, d, {"restored_by": "casmon verify --repair"})
        except (CasmonError, ValueError):
            continue
        done["restored_refs"].append(name)
