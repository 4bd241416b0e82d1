"""``repair`` (``casmon verify --repair``): salvage everything intact, drop only what lost data.

* every pack frame carries its digest, kind and lengths, so the pack index is
  **rebuilt from the packs** (frames after a damaged one are found again by
  their magic); an index file's damage loses nothing;
* a damaged pack's good frames move to a new pack; damaged loose objects go;
* a value is dropped only if a chunk or child of it is lost;
* each record table is rebuilt from every readable file (level-0 files,
  buckets of every generation, including one whose manifest is lost);
  a record is kept if every value it names is there, else a per-kind salvager
  (:func:`casmon.store.records.register_salvager`) keeps what it can (the call log
  keeps the calls of a batch that do not need a lost value), else it is dropped;
* refs are restored from the records that stand behind them; a damaged or
  missing ``casmon.json`` is written again.

Repair takes the gc lock, so no gc runs meanwhile; writers may go on (a merge
that races the rebuild is read correctly; at worst a second repair is needed).
What a record or ref names is lost only if it cannot be read whole now
(:class:`casmon.maintenance.inventory.Latecomers`).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any, Literal

from casmon.errors import CasmonError, DamagedObjectError
from casmon.keys.digest import Digest
from casmon.maintenance import inventory, reach
from casmon.maintenance.check import VerifyReport, verify
from casmon.maintenance.gclock import gc_lock
from casmon.maintenance.phases import Progress, quiet
from casmon.store import lock
from casmon.store.codec import FRAME_HEADER, KIND_VALUE, MAGIC, Frame, decode_frame, read_header
from casmon.store.manifest import decode_manifest
from casmon.store.marker import FORMAT_KEY, marker_bytes, parse_marker
from casmon.store.objects import Location, loose_key, pack_key
from casmon.store.records import parse_record, salvage as salvage_record
from casmon.store.table import fence
from casmon.store.table.survey import Survey

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from casmon.store.records import Ref
    from casmon.store.store import Store

__all__ = ["repair", "salvage_frames"]

#: What repair did: lists of keys and names, counts, flags, and the final verify's report.
Done = dict[str, Any]


def _ref_now(store: Store, name: str) -> Ref | None | Literal[False]:
    try:
        return store.get_ref(name)
    except (DamagedObjectError, ValueError):
        return False


def repair(store: Store, progress: Progress | None = None) -> Done:
    """Salvage everything intact, drop only what lost data, until ``verify`` is clean.

    See the module docstring for what is kept. Takes the gc lock (no gc runs
    meanwhile). Returns what was done; ``done["ok"]`` is the final verify.
    """
    if not store.backend.supports_deletes or store.read_only:
        raise CasmonError(f"cannot repair {store.url}: it cannot delete (a zip file, or opened read-only)")
    progress = progress or quiet
    with gc_lock(store, "repair"):
        return _repair(store, progress)


def _repair(store: Store, progress: Progress) -> Done:
    done: Done = {"deleted_files": [], "dropped_index_entries": 0, "dropped_values": 0, "dropped_records": 0,
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


def _repair_round(store: Store, rep: VerifyReport, done: Done, progress: Progress) -> None:
    if rep.bad_marker:
        data = marker_bytes({"repaired": time.time()})
        store.backend.set(FORMAT_KEY, data)
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
        elif key.startswith((lock.LEASE_PREFIX, lock.BREAK_PREFIX)):
            store.backend.delete(key)  # already read as a dead holder's: nothing holds it
            done["deleted_files"].append(key)
    fences = [k for k in rep.bad_files if k.startswith(fence.FENCE_PREFIX)]
    if fences:
        # A damaged fence already fences nothing: a sound one that fences nothing says the same, and lets gc run.
        fence.supersede(store.backend, fences)
        done["deleted_files"].extend(fences)
    store.objects.clear_caches()
    store.forget_manifests()
    present = _rebuild_index(store, done, progress)
    store.objects.clear_caches()
    store.forget_manifests()
    # Writers go on beside repair: what a record or ref names that the listing of packs lacks may
    # have been written since; it is lost only if it cannot be read, whole, now.
    stored = inventory.Latecomers(store, present)
    _repair_records(store, stored, done, progress)
    _repair_refs(store, stored, done)


def salvage_frames(data: bytes | bytearray | memoryview | npt.NDArray[np.uint8], key: str) -> tuple[list[tuple[int, int, Frame, bytes]], bool]:
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


def _rebuild_index(store: Store, done: Done, progress: Progress) -> set[Digest]:
    """Index every sound frame of every pack, except values that lost a chunk or child; returns what is present."""
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
    loose_keys: list[str] = []
    for key in store.backend.list("objects/"):
        parts = key.split("/")
        if len(parts) == 3 and inventory.is_object_name(parts[2]):
            loose.add(Digest(parts[2]))
            loose_keys.append(key)
    heads = store.backend.get_ranges([(key, 0, FRAME_HEADER) for key in loose_keys]) if loose_keys else []
    for key, h in zip(loose_keys, heads):
        try:
            if h is None or read_header(h, key).kind != KIND_VALUE:
                continue
            d = Digest(key.rsplit("/", 1)[-1])
            data = store.backend.get(key)
            if data is None:  # gone since the listing: as unusable as damage
                raise DamagedObjectError(key, "vanished")
            m = decode_manifest(d, decode_frame(data, key, expect=d)[1])
            needs[d] = reach.parts_of(m).every()
        except (DamagedObjectError, TypeError):
            loose.discard(Digest(key.rsplit("/", 1)[-1]))
    # Every pack, every frame.
    frames: dict[Digest, Location] = {}
    rescue: dict[Digest, tuple[bytes, int, int]] = {}  # good frames of damaged packs
    damaged_packs: list[str] = []
    names = sorted(k.split("/")[1] for k in store.backend.list("packs/") if inventory.is_object_name(k.split("/")[-1]))
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
                needs[d] = reach.parts_of(m).every()
            loc = Location(name, off, ln, fr.kind, size)
            if damaged:
                rescue.setdefault(d, (bytes(data[off : off + ln]), fr.kind, size))
            elif d not in frames or loc in old.get(d, ()):
                frames[d] = loc  # where the index said, if it said
    for d in frames:
        rescue.pop(d, None)
    present = set(frames) | set(rescue) | loose
    # A value is lost if a chunk is missing or a child value is lost.
    bad = reach.lost_values(needs, present)
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


def _repair_records(store: Store, stored: inventory.Latecomers, done: Done, progress: Progress) -> None:
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
                rec = parse_record(kind, k, v)
                digests = [Digest(h) for h in reach.named_refs(rec)]
            except (ValueError, TypeError, DamagedObjectError):
                done["dropped_records"] += 1
                changed = True
                continue
            lost = {d for d in digests if not stored(d)}
            if not lost:
                out.append((k, v))
                continue
            changed = True
            fixed = salvage_record(kind, rec, lost)
            if fixed is None:
                done["dropped_records"] += 1
            else:
                done["salvaged_records"] += 1
                out.append((k, json.dumps(fixed, separators=(",", ":"), allow_nan=True).encode()))
        if changed:
            t.rewrite(sv, out)
            done["rebuilt_tables"].append(sv.prefix)


def _repair_refs(store: Store, stored: inventory.Latecomers, done: Done) -> None:
    stored.reread()
    refs: dict[str, Ref | None | Literal[False]] = {}  # False: damaged
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
    expected = reach.ref_claims(store)
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
