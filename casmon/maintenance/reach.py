"""What a store's records and refs reach: the one walk that stats, verify, repair and gc share.

gc deletes what this walk does not reach, and verify calls a value's missing chunk a problem
only if this walk reaches the value, so the two must agree on what reaching is: a record
reaches the values its ``_refs`` name, a ref reaches its target, a value reaches its chunks
and, through its manifest, its children; the tables read are the pack index and every record
kind's table. Each caller brings its own way to open a value (gc reads manifests through the
store and stops at a damaged one; verify uses the manifests it has just re-hashed) and its own
answer to damage (gc raises, verify reports, repair salvages).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from casmon.errors import CasmonError, DamagedObjectError, StoreError
from casmon.keys.digest import Digest
from casmon.maintenance.phases import Progress, quiet
from casmon.store.records import parse_record

if TYPE_CHECKING:
    from casmon.store.manifest import Manifest
    from casmon.store.store import Store
    from casmon.store.table import Table

__all__ = ["Record", "RefClaim", "Without", "Parts", "parts_of", "Reached", "closure", "lost_values",
           "tables", "readable_records", "named_refs", "note_ref_claim", "ref_claims", "strict_roots",
           "open_through_store"]

#: A record as stored: a JSON object.
Record = dict[str, Any]
#: A ref a record stands behind (``_ref``): (target hex or None, the record's time, "record kind/key").
RefClaim = tuple[str | None, float, str]
#: Records to treat as gone, kind -> keys, or ``(key, time)`` for one record of a key.
Without = Mapping[str, Set[bytes | tuple[bytes, float]]]


class Parts(NamedTuple):
    """What a value reaches: its chunks, and its child values."""

    chunks: list[Digest]
    children: list[Digest]

    def every(self) -> list[Digest]:
        """Chunks, then children: everything the value needs to be read whole."""
        return [*self.chunks, *self.children]


def parts_of(m: Manifest) -> Parts:
    """The chunks and children a value's manifest names."""
    return Parts(list(m.chunk_digests()), list(m.children))


@dataclass
class Reached:
    """The result of :func:`closure`."""

    values: set[Digest]  # every value walked (the roots included, whether or not it could be opened)
    everything: set[Digest]  # the values and the chunks of those that opened


OpenValue = Callable[[Digest], "Parts | None"]


def closure(roots: Iterable[Digest], open_value: OpenValue, progress: Progress = quiet,
            phase: str = "mark values") -> Reached:
    """Everything ``roots`` reach through values' manifests.

    ``open_value(d)`` gives the parts of value ``d``, or None if it is not there
    (nothing below it is known); it may raise to stop the walk. A chunk is
    reached but never opened. ``progress(phase, ...)`` is told every 1,000 objects.
    """
    everything: set[Digest] = set()
    values: set[Digest] = set()
    todo = list(roots)
    while todo:
        d = todo.pop()
        if d in everything:
            continue
        everything.add(d)
        values.add(d)
        if len(everything) % 1000 == 0:
            progress(phase, len(everything), len(everything) + len(todo))
        parts = open_value(d)
        if parts is None:
            continue
        everything.update(parts.chunks)
        todo.extend(parts.children)
    return Reached(values, everything)


def lost_values(needs: Mapping[Digest, Sequence[Digest]], present: Set[Digest]) -> set[Digest]:
    """The present values that cannot be read whole: a chunk is not present or a child value is lost.

    ``needs``: value -> its chunks and children (:meth:`Parts.every`). The walk
    goes up from what is gone to every value above it.
    """
    bad: set[Digest] = set()
    changed = True
    while changed:
        changed = False
        for v, parts in needs.items():
            if v not in bad and v in present and any(c not in present or c in bad for c in parts):
                bad.add(v)
                changed = True
    return bad


def open_through_store(store: Store) -> OpenValue:
    """Open values with ``store.manifest``, as gc must: a damaged manifest stops the walk
    (:class:`StoreError`: gc cannot tell what lies below it), a missing one is passed over."""

    def open_value(d: Digest) -> Parts | None:
        try:
            m = store.manifest(d)
        except DamagedObjectError as e:
            raise StoreError(f"{store.url}: {e}; run `casmon verify --repair` before gc") from None
        except CasmonError:
            return None  # missing: verify reports it; nothing below it is known
        return parts_of(m)

    return open_value


# -- roots: records and refs ---------------------------------------------------------


def tables(store: Store) -> list[tuple[str, Table]]:
    """Every table of the store with its key prefix: the pack index first, then each record kind's."""
    out: list[tuple[str, Table]] = [("index/", store.objects.index)]
    out += [(f"records/{kind}/", store.table(kind)) for kind in store.record_kinds()]
    return out


def readable_records(store: Store, kind: str,
                     on_damaged: Callable[[str, str], None] | None = None) -> Iterator[tuple[Digest, Record]]:
    """``(key, record)`` of every readable record of ``kind``; damaged table files are skipped
    (verify reports them), a record that is not a JSON object is told to ``on_damaged(what, reason)``."""
    for k, v in store.table(kind).items(strict=False):
        try:
            rec = parse_record(kind, k, v)
        except DamagedObjectError as e:
            if on_damaged is not None:
                on_damaged(e.key, e.reason)
            continue
        yield Digest(k), rec


def named_refs(rec: Record) -> list[Any]:
    """What a record's ``_refs`` names, as verify and repair read it: a list, or one item alone."""
    refs = rec.get("_refs", [])
    return refs if isinstance(refs, list) else [refs]


def note_ref_claim(out: dict[str, RefClaim], kind: str, key: bytes, rec: Record) -> None:
    """Add the ref ``rec`` stands behind (``_ref``) to ``out``, the newest record winning."""
    name = rec.get("_ref")
    if isinstance(name, str):
        try:
            t = float(rec.get("time", 0) or 0)
        except (TypeError, ValueError):
            t = 0.0
        if name not in out or t >= out[name][1]:
            out[name] = (rec.get("_ref_target"), t, f"record {kind}/{bytes(key).hex()}")


def ref_claims(store: Store) -> dict[str, RefClaim]:
    """Refs that records stand behind (``_ref``): name -> (target, time, record), the newest record winning."""
    out: dict[str, RefClaim] = {}
    for kind in store.record_kinds():
        for k, rec in readable_records(store, kind):
            note_ref_claim(out, kind, k, rec)
    return out


def strict_roots(store: Store, without: Without | None = None, progress: Progress = quiet) -> set[Digest]:
    """What records and refs name, read as gc must: anything that cannot be read raises,
    since a gc that cannot see everything that is reachable must not delete anything.

    ``without``: records to treat as gone -- what an eviction or the dropping of
    duplicate cache entries previewed with ``--dry-run`` would drop, so the
    preview matches the real run.
    """
    roots: set[Digest] = set()
    kinds = store.record_kinds()
    for i, kind in enumerate(kinds):
        progress("mark records", i, len(kinds))
        t = store.table(kind)
        skip = (without or {}).get(kind, set())
        for k, rec in store.records(kind):
            if skip and (bytes(k) in skip or isinstance(rec.get("time"), (int, float)) and (bytes(k), rec["time"]) in skip):
                continue
            refs = rec.get("_refs", [])
            try:
                if not isinstance(refs, list):
                    raise ValueError("not a list")
                roots.update(Digest(h) for h in refs if isinstance(h, str))
                if any(not isinstance(h, str) for h in refs):
                    raise ValueError("holds something that is not a digest")
            except ValueError as e:
                raise DamagedObjectError(f"record {kind}/{k.hex()}", f"its _refs are damaged ({e}); gc cannot tell "
                                         f"what it needs: run `casmon verify --repair` before gc") from None
        if t.damaged:
            raise StoreError(f"{store.url}: record table {kind} has damaged files; run `casmon verify --repair` before gc")
    for name in store.refs():
        ref = store.get_ref(name)
        if ref is not None and ref.target is not None:
            roots.add(ref.target)
    progress("mark records", len(kinds), len(kinds))
    return roots
