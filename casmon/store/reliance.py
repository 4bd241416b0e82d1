"""Values records rely on: what a flush checks so that no record it writes names a value gc removed.

A writer relies on a value it stored (or found stored) for :data:`~casmon.store.condemned.RELY_MAX`
after it last checked it; gc condemns before it deletes and waits longer than that. A flush checks
again the values its sealed records name that were last checked earlier, the waiting manifests put
earlier, and, while a slow write is in flight, what a new condemned list names; a condemned value is
copied into the next pack (revived), a value gone is kept out of the records (they are trimmed by
their kind's salvager or dropped, with a warning). See docs/ARCHITECTURE.md, the write protocol.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)

from casmon.errors import DamagedObjectError, MissingObjectError
from casmon.keys.digest import Digest
from casmon.store import condemned, lifecycle
from casmon.store.records import trim_sealed

if TYPE_CHECKING:
    from casmon.store.store import Store
    from casmon.store.table import Table

__all__ = ["start_keeper", "keep_while_waiting", "protect_held", "check_pending_values", "needs_check", "check_values",
           "check_value", "drop_records_needing"]


def start_keeper(store: Store) -> None:
    """Keep ``store``'s held values from gc while no flush runs for longer than ``VIEW_MAX``: a thread that, every
    ``VIEW_MAX`` seconds, copies what a new condemned list names and writes the copies."""
    with store._lock:
        if store._keeper is not None or lifecycle.exiting():
            return
        import threading
        import weakref

        ref = weakref.ref(store)
        stop = lifecycle.stop_flushers

        def keep() -> None:
            while not stop.wait(condemned.VIEW_MAX):
                s = ref()
                if s is None or s._closed:
                    return
                try:
                    if s._held and s._flush_lock.acquire(timeout=condemned.VIEW_MAX):
                        try:
                            copied = s.objects.revived
                            protect_held(s)
                            if s.objects.revived != copied:
                                s._write_objects()  # the copies: objects before any record, as always
                        finally:
                            s._flush_lock.release()
                except Exception as e:  # noqa: BLE001 - the next round (or flush) tries again
                    import logging

                    logging.getLogger("casmon").info("keeping held values of %s failed: %s", s.url, e)
                del s

        store._keeper = threading.Thread(target=keep, name="casmon-keep", daemon=True)
        try:
            store._keeper.start()
        except RuntimeError:  # the interpreter is exiting
            store._keeper = None


def keep_while_waiting(store: Store) -> None:
    """While a write is in flight for longer than ``VIEW_MAX`` (a held PUT, a throttled one): copy what a new
    condemned list names among the values this flush's records and the held values need, into memory; the
    flush writes the copies before its records (W6 checks again after a slow write). It writes nothing."""
    if store._keeping:
        return
    store._keeping = True
    try:
        digests = {Digest.from_raw(r) for r in list(store._in_flight)} | set(list(store._held))
        if not digests:
            return
        vt = store.objects.refresh_view()
        if not store.objects.any_condemned():
            return
        seen: set[Digest] = set()
        for d in digests:
            check_value(store, d, vt, seen)
    finally:
        store._keeping = False


def protect_held(store: Store) -> None:
    """Copy values put and not yet named by any record (a running call's arguments) that gc condemned."""
    vt = store.objects.view()
    lists = store.objects.condemned_lists()
    if lists == store._held_lists:
        return
    store._held_lists = lists
    if not store.objects.any_condemned():
        return
    for d in list(store._held):
        check_value(store, d, vt, set())  # copies what is condemned into the next pack


def check_pending_values(store: Store) -> set[Digest]:
    """Waiting manifests put longer than ``RELY_MAX`` ago: their chunks are checked again before they are written.

    A value whose chunk gc removed meanwhile is not written at all (it would be a manifest naming a
    missing object); returns such values, so records naming them are kept out too.
    """
    old = store.objects.stale_waiting_values(condemned.RELY_MAX)
    if not old:
        return set()
    vt = store.objects.refresh_view()
    lost: set[Digest] = set()
    for d in old:
        try:
            m = store.manifest(d)
            ok = all(store.objects.check_stored(c, vt) for c in m.chunk_digests())
            ok = ok and all(check_value(store, c, vt, set()) for c in m.children)
        except (MissingObjectError, DamagedObjectError):
            ok = False
        if ok:
            store.objects.renew_waiting(d, vt)
        elif store.objects.drop_waiting(d):
            lost.add(d)
    return lost


def needs_check(store: Store, d: bytes) -> bool:
    return time.monotonic() - store.objects.reliance(d) > condemned.RELY_MAX


def check_values(store: Store, digests: Iterable[Digest], force: bool = False) -> set[Digest]:
    """Check values (manifest, chunks, children) stored and not condemned, under a fresh view.

    Condemned objects are copied to the next pack. Returns the values that
    are not stored (whole or in part): no record may name them.
    """
    todo = [d for d in digests if force or needs_check(store, d)]
    if not todo:
        return set()
    vt = store.objects.refresh_view()
    return {d for d in todo if not check_value(store, d, vt, set())}


def check_value(store: Store, d: Digest, vt: float, seen: set[Digest]) -> bool:
    if d in seen:
        return True
    seen.add(d)
    try:
        if not store.objects.check_stored(d, vt):
            return False
        m = store.manifest(d)
    except (MissingObjectError, DamagedObjectError):
        return False
    for c in m.chunk_digests():
        try:
            if not store.objects.check_stored(c, vt):
                return False
        except (MissingObjectError, DamagedObjectError):
            return False
    return all(check_value(store, c, vt, seen) for c in m.children)


def drop_records_needing(store: Store, bad: set[Digest], tables: Iterable[tuple[str, Table]]) -> None:
    """Keep sealed records from naming lost values: trim them (a salvager) or drop them, and warn."""
    dropped, trimmed = trim_sealed(tables, bad)
    store.dropped_records += dropped
    warnings.warn(
        f"casmon: {len(bad)} value(s) were removed from {store.url} (by gc, or lost to damage) while this "
        f"process still needed them; {dropped} record(s) that named them were not written"
        + (f" and {trimmed} were written without them (e.g. calls cut from a call-log batch)" if trimmed else ""),
        RuntimeWarning, stacklevel=3)
