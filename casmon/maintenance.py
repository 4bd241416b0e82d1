"""Maintenance: ``stats``, ``verify`` and ``gc`` over a whole store.

All three walk the same inventory: loose objects, packs and their index
entries, table files, records and refs. ``verify`` re-hashes every object and
follows every pointer; ``gc`` marks what records and refs reach and removes the
rest once it has stayed unreachable for a grace period (see :func:`gc`).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .codec import FRAME_HEADER, KIND_CHUNK, KIND_VALUE, decode_frame, read_header, split_pack
from .digest import Digest
from .errors import CasmonError, DamagedObjectError
from .objects import Location, pack_key
from .table import NAME_RE, TableFile

if TYPE_CHECKING:
    from .store import Store

__all__ = ["stats", "verify", "repair", "VerifyReport", "inventory"]

_HEX = re.compile(r"^[0-9a-f]{32}$")
Progress = Callable[[str, int, int], None]  # (phase, done, total)


def _noop(phase: str, done: int, total: int) -> None:
    pass


@dataclass
class Inventory:
    loose: dict[Digest, str]  # digest -> key
    packs: set[str]
    packed: dict[Digest, Location]  # digest -> newest location
    all_keys: list[str]


def inventory(store: Store) -> Inventory:
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
    for d, v in store.objects.index.items():
        packed[Digest(d)] = Location.decode(v)
    return Inventory(loose, packs, packed, keys)


def _table_prefixes(store: Store) -> list[str]:
    return ["index/"] + [f"records/{k}/" for k in store.record_kinds()]


def stats(store: Store, progress: Progress | None = None) -> dict:
    """Counts and sizes of what the store holds.

    ``logical_bytes``: the sizes of all distinct values added up.
    ``chunk_bytes``: the distinct chunks' raw sizes (what is left after dedup).
    ``stored_bytes``: bytes on the backend, every file counted.
    """
    progress = progress or _noop
    store.flush()
    inv = inventory(store)
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
    progress("sizes", 0, len(inv.all_keys))
    sizes = store.backend.getsize_many(inv.all_keys)
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
    return {
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
    }


@dataclass
class VerifyReport:
    """What ``verify`` found. ``ok`` is True when nothing is damaged or missing."""

    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    damaged: list[tuple[str, str]] = field(default_factory=list)  # (object key, reason)
    missing: list[tuple[str, str]] = field(default_factory=list)  # (what, needed by)
    affected: dict[str, list[str]] = field(default_factory=dict)  # damaged/missing -> what depends on it
    bad_objects: dict[Digest, str] = field(default_factory=dict, repr=False)  # digests that cannot be trusted
    bad_files: list[str] = field(default_factory=list, repr=False)  # damaged table files and refs
    bad_packs: set[str] = field(default_factory=set, repr=False)  # packs with any damaged byte

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


def verify(store: Store, progress: Progress | None = None) -> VerifyReport:
    """Re-hash every object and follow every pointer; never modifies the store."""
    progress = progress or _noop
    rep = VerifyReport()
    bad_digests: dict[Digest, str] = {}  # digest -> object key, for objects that failed

    # 1. Table files (the index first: everything else is found through it).
    for prefix in _table_prefixes(store):
        files = store.backend.list(prefix)
        for k in files:
            name = k.rsplit("/", 1)[-1]
            if ".partial" in name or not (NAME_RE.match(name) or re.match(r"^[0-9a-f]{4}$", name)):
                continue
            data = store.backend.get(k)
            if data is None:
                continue  # merged and removed meanwhile
            rep.checked["table files"] += 1
            try:
                raw = decode_frame(data, k)[1]
                if "/gens/" in k:
                    json.loads(bytes(raw))
                else:
                    TableFile(k, raw)
            except (DamagedObjectError, ValueError) as e:
                rep.damaged.append((k, getattr(e, "reason", str(e))))
                rep.bad_files.append(k)
    if rep.bad_files:
        # The tables cannot be read whole: report what else is damaged on its own, then stop.
        for name in store.refs():
            try:
                store.get_ref(name)
            except DamagedObjectError as e:
                rep.damaged.append((e.key, e.reason))
                rep.bad_files.append(e.key)
        return rep
    try:
        inv = inventory(store)
    except CasmonError as e:
        rep.damaged.append(("index/", str(e)))
        return rep
    for prefix in _table_prefixes(store):
        t = store.objects.index if prefix == "index/" else store.table(prefix.split("/")[1])
        for gap in t.missing_segments():
            rep.missing.append((gap, f"table {prefix} (a writer's sequence has a gap)"))

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
    for name in sorted(inv.packs | set(entries_by_pack)):
        done += 1
        progress("objects", done, total)
        key = pack_key(name)
        data = store.backend.get(key) if name in inv.packs else None
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
                decode_frame(data[off : off + ln], f"{key}@{off}")
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

    # 4. Values: their chunks and children must be there and sound.
    dependents: dict[Digest, list[str]] = defaultdict(list)
    present = set(inv.loose) | set(inv.packed)
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
        for c in [*m.chunk_digests(), *m.children]:
            dependents[c].append(f"value {d.hex()}")
            if c not in present:
                rep.missing.append((f"object {c.hex()}", f"value {d.hex()}"))
                bad_digests.setdefault(c, f"object {c.hex()}")
    # A value with a bad chunk is bad too.
    for c in list(bad_digests):
        for dep in dependents.get(c, []):
            vd = Digest(dep.split()[-1])
            bad_digests.setdefault(vd, dep)

    # 5. Records and refs: what they point at must be there.
    expected_refs: dict[str, tuple[str | None, float, str]] = {}
    for kind in store.record_kinds():
        try:
            for k, rec in store.records(kind):
                rep.checked["records"] += 1
                _note_expected_ref(expected_refs, kind, k, rec)
                for h in rec.get("_refs", []):
                    try:
                        rd = Digest(h)
                    except ValueError:
                        rep.damaged.append((f"record {kind}/{k.hex()}", f"bad digest {h!r}"))
                        continue
                    dependents[rd].append(f"record {kind}/{k.hex()}")
                    if rd not in present:
                        rep.missing.append((f"value {h}", f"record {kind}/{k.hex()}"))
        except DamagedObjectError as e:
            rep.damaged.append((e.key, e.reason))
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
                rep.missing.append((f"value {ref.target.hex()}", f"ref {name}"))

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


def expected_refs_of(store: Store) -> dict[str, tuple[str | None, float, str]]:
    """Refs that records stand behind (``_ref``): name -> (target, time, record), the newest record winning."""
    out: dict[str, tuple[str | None, float, str]] = {}
    for kind in store.record_kinds():
        try:
            for k, rec in store.records(kind):
                _note_expected_ref(out, kind, k, rec)
        except DamagedObjectError:
            continue
    return out


def _note_expected_ref(out: dict, kind: str, key: bytes, rec: dict) -> None:
    name = rec.get("_ref")
    if isinstance(name, str):
        t = float(rec.get("time", 0) or 0)
        if name not in out or t >= out[name][1]:
            out[name] = (rec.get("_ref_target"), t, f"record {kind}/{bytes(key).hex()}")


def repair(store: Store, progress: Progress | None = None) -> dict:
    """Drop what cannot be trusted, until ``verify`` is clean.

    Damaged table files and refs are deleted; damaged loose objects are
    deleted; the index forgets damaged or missing objects and every value that
    needs one; records and refs that need a dropped value are dropped. What is
    dropped is lost, but never returned wrong: a cache recomputes, a call log
    loses those calls. Returns what was done.
    """
    if not store.backend.supports_deletes or store.read_only:
        raise CasmonError(f"cannot repair {store.url}: it cannot delete (a zip file, or opened read-only)")
    done = {"deleted_files": [], "dropped_index_entries": 0, "dropped_records": 0, "dropped_refs": [], "rounds": 0}
    for _round in range(5):
        rep = verify(store, progress)
        if rep.ok:
            break
        done["rounds"] += 1
        for key in rep.bad_files:
            if key.startswith("refs/"):
                done["dropped_refs"].append(key[len("refs/") :])
            store.backend.delete(key)
            done["deleted_files"].append(key)
        for d, key in rep.bad_objects.items():
            if key.startswith("objects/"):
                store.backend.delete(key)
                done["deleted_files"].append(key)
        store.objects.clear_caches()
        store._manifests.clear()
        for t in [store.objects.index, *store._tables.values()]:
            t._buckets.clear()
            t.refresh()
        for t in [store.objects.index, *(store.table(k) for k in store.record_kinds())]:
            if t.missing_segments():
                t.consolidate(force=True)  # the lost segment's entries are gone: close the gap
        if rep.bad_files:
            continue  # read the tables again before judging their entries
        bad = set(rep.bad_objects)
        # Packs with damage are rewritten: their good objects move to a new pack, the old one goes.
        inv = inventory(store)
        for name in rep.bad_packs:
            data = store.backend.get(pack_key(name))
            for d, loc in inv.packed.items():
                if loc.pack != name or d in bad or data is None:
                    continue
                frame = bytes(data[loc.offset : loc.offset + loc.length])
                try:
                    decode_frame(frame, pack_key(name), expect=d)
                except DamagedObjectError:
                    bad.add(d)
                    continue
                store.objects.adopt(d, frame, loc.kind, loc.size)
        store.objects.flush()
        before = store.objects.index.count()
        dropped_packs = set(rep.bad_packs)
        store.objects.index.consolidate(
            force=True, keep=lambda k, v: Digest(k) not in bad and Location.decode(v).pack not in dropped_packs)
        for name in dropped_packs:
            store.backend.delete(pack_key(name))
            done["deleted_files"].append(pack_key(name))
        done["dropped_index_entries"] += before - store.objects.index.count()
        inv = inventory(store)
        present = set(inv.loose) | set(inv.packed)

        def needs_only_present(k, v) -> bool:
            try:
                return all(Digest(h) in present for h in json.loads(v).get("_refs", []))
            except (ValueError, TypeError, AttributeError):
                return False

        for kind in store.record_kinds():
            t = store.table(kind)
            n = t.count()
            t.consolidate(force=True, keep=needs_only_present)
            done["dropped_records"] += n - t.count()
        for name in store.refs():
            try:
                ref = store.get_ref(name)
            except DamagedObjectError:
                ref = None
            if ref is None or (ref.target is not None and ref.target not in present):
                store.delete_ref(name)
                done["dropped_refs"].append(name)
        existing = set(store.refs())
        for name, (target, _t, _who) in expected_refs_of(store).items():
            if name not in existing and (target is None or Digest(target) in present):
                store.set_ref(name, Digest(target) if target else None, {"restored_by": "casmon verify --repair"})
                done.setdefault("restored_refs", []).append(name)
    done["ok"] = verify(store, progress).ok
    return done
