"""``verify``: re-hash every object of a store and follow every pointer; never writes.

It runs on any store, damaged or not, and reports every problem, not just the first:
the format marker, every file of every table, gc's condemned lists, every loose object
and every frame of every pack, then what values, records and refs need. Writers may go on
meanwhile: objects are listed first, and what a record or ref names that the listing lacks
is read through the second listing (:class:`casmon.maintenance.inventory.Latecomers`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from casmon.errors import CasmonError, DamagedObjectError
from casmon.keys.digest import Digest
from casmon.maintenance import inventory, reach
from casmon.maintenance.phases import Progress, quiet
from casmon.store import condemned, lock
from casmon.store.codec import FRAME_HEADER, KIND_VALUE, decode_frame, read_header, split_pack
from casmon.store.marker import FORMAT_KEY
from casmon.store.objects import Location, pack_key
from casmon.store.table import fence
from casmon.view.display import guarded_html, guarded_text, verify_html, verify_text

if TYPE_CHECKING:
    from pathlib import Path

    from casmon.store.store import Store

__all__ = ["VerifyReport", "verify"]


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

    def as_dict(self) -> dict[str, Any]:
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
    progress = progress or quiet
    rep = VerifyReport()
    bad_digests: dict[Digest, str] = {}  # digest -> object key, for objects that failed

    # 0. The format marker.
    problem = store.format.get("damaged") if isinstance(store.format, dict) else None
    if problem:
        rep.damaged.append((FORMAT_KEY, problem))
        rep.bad_marker = True

    # 1. Table files, every one, and what each table needs.
    for prefix, table in reach.tables(store):
        sv = table.survey(keep=False, orphans=prefix != "index/")
        rep.checked["table files"] += sv.checked
        if table.fenced and table.late:
            # Late or superseded record files (casmon.store.table.fence): never acknowledged, listed past.
            rep.checked["record files listed past (late or written again)"] += len(table.late)
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
    _verify_gc_files(store, rep)

    inv = inventory.take(store, strict=False)

    # 2. Loose objects: each re-hashed against its name.
    total = len(inv.loose) + len(inv.packs)
    done = 0
    for d, k in inv.loose.items():
        done += 1
        progress("objects", done, total)
        try:
            path = store.backend.local_path(k)
            if path is not None:
                if not _check_raw_file(path, k, d):
                    continue
            else:
                data = store.backend.get(k)
                if data is None:
                    continue
                decode_frame(data, k, expect=d)
            rep.checked["loose objects"] += 1
        except DamagedObjectError as e:
            rep.checked["loose objects"] += 1
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
    parts: dict[Digest, reach.Parts] = {}
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
        parts[d] = p = reach.parts_of(m)
        for c in p.every():
            dependents[c].append(f"value {d.hex()}")
            if c not in present:
                lacking.setdefault(d, []).append(c)

    # 5. Records and refs: what they point at must be there.
    expected_refs: dict[str, reach.RefClaim] = {}
    late: list[tuple[Digest, str]] = []  # (value, who) named but not in the inventory: checked below
    for kind in store.record_kinds():
        for rkey, rec in reach.readable_records(store, kind, lambda what, why: rep.damaged.append((what, why))):
            rep.checked["records"] += 1
            reach.note_ref_claim(expected_refs, kind, rkey, rec)
            for h in reach.named_refs(rec):
                try:
                    rd = Digest(h)
                except (ValueError, TypeError):
                    rep.damaged.append((f"record {kind}/{rkey.hex()}", f"bad digest {h!r}"))
                    continue
                dependents[rd].append(f"record {kind}/{rkey.hex()}")
                if rd not in present:
                    late.append((rd, f"record {kind}/{rkey.hex()}"))
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
    stored = inventory.Latecomers(store, present)
    for d, who in late:
        if not stored(d):
            absent("value", d, who)

    # A value that lacks a chunk is a problem only if a record or ref reaches it: gc sweeps an
    # unreachable value's pieces as each comes due (a chunk condemned before its manifest was written
    # goes first), so garbage may be partly collected for a while. That is counted, not reported.
    # Reached from the manifests just re-hashed, by the walk gc marks with.
    roots = {d for d, deps in dependents.items() if any(not x.startswith("value ") for x in deps)}
    reachable = reach.closure(roots, parts.get).values
    for d, missing in lacking.items():
        if d not in reachable:
            rep.checked["unreachable values partly collected (gc removes the rest)"] += 1
            continue
        for c in missing:
            if stored(c, c in parts[d].children):
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


def _verify_condemned_lists(store: Store, rep: VerifyReport) -> None:
    """gc's condemned lists must be readable (a damaged one only delays gc; repair deletes it)."""
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


def _verify_gc_files(store: Store, rep: VerifyReport) -> None:
    """gc's fences, lock, leases and lock-break claims must be readable: a damaged fence fences nothing and
    stops gc (repair supersedes it); a damaged lock, lease or claim counts as its dead holder's (repair
    deletes it)."""
    for k, reason in fence.read_all(store.backend):
        rep.damaged.append((k, f"{reason} (it fences nothing; gc refuses to sweep until repair replaces it)"))
        rep.bad_files.append(k)
    rep.checked["gc fences"] += sum(1 for k in store.backend.list(fence.FENCE_PREFIX) if ".partial" not in k)
    for k, reason in lock.damaged_files(store.backend):
        rep.damaged.append((k, f"{reason} (taken for a dead holder's; repair deletes it)"))
        rep.bad_files.append(k)


def _check_raw_file(path: Path, key: str, d: Digest) -> bool:
    """Check loose object ``d`` in a local file: a raw payload (up to a GiB, laid out for mapping) is hashed
    as it is read, 8 MiB at a time, never held whole; a compressed one is read and decoded. False if the file
    is gone (deleted since it was listed)."""
    import xxhash

    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        return False
    with f:
        head = f.read(FRAME_HEADER)
        frame = read_header(head, key)
        if frame.digest != d:
            raise DamagedObjectError(key, f"header names digest {frame.digest.hex()}, expected {d.hex()}")
        if frame.codec != 0:
            decode_frame(head + f.read(), key, expect=d)
            return True
        h, n, buf = xxhash.xxh3_128(), 0, bytearray(8 << 20)
        while True:
            got = f.readinto(buf)
            if not got:
                break
            h.update(memoryview(buf)[:got])
            n += got
        if n != frame.stored_len or n != frame.raw_len:
            raise DamagedObjectError(key, f"payload is {n} bytes, header says {frame.stored_len} (truncated or extended)")
        if h.digest() != bytes(d):
            raise DamagedObjectError(key, "content does not match its digest")
    return True
