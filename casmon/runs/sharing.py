"""How much of a run's artifacts other runs and entries share: the ``shared`` figure of ``artifacts()``.

An artifact's *stored* bytes are those of every object it needs (its values, their chunks, a large
file's pieces), compressed, as the pack index and loose objects hold them. Its *shared* bytes are the
part of those that something other than this run also reaches: another run's artifacts, a cache entry,
a call record, a ref -- what would stay after deleting the run. Found with gc's own walk
(:mod:`casmon.maintenance.reach`), with this run's records left out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from casmon.errors import CasmonError
from casmon.keys.digest import Digest
from casmon.maintenance.reach import closure, open_through_store, strict_roots

if TYPE_CHECKING:
    from casmon.runs.artifacts import Artifact
    from casmon.store.store import Store

__all__ = ["needed", "object_sizes", "held_elsewhere", "sizes"]


def needed(store: Store, a: Artifact) -> set[Digest]:
    """Every object artifact ``a`` needs, as far as its manifests can be read."""
    try:
        return closure([Digest(h) for h in (a.refs or (a.digest,))], open_through_store(store)).everything
    except (CasmonError, ValueError):
        return set()


def object_sizes(store: Store, digests: Iterable[Digest]) -> dict[Digest, int]:
    """The stored (compressed) size of each object the store has; those it lacks are left out."""
    from casmon.store.objects import loose_key

    out: dict[Digest, int] = {}
    loose: list[Digest] = []
    for d in digests:
        loc = store.objects.locate(d, refresh=False)
        if loc is not None:
            out[d] = loc.length
        else:
            loose.append(d)
    if loose:
        try:
            got = store.backend.getsize_many([loose_key(d) for d in loose])
        except (OSError, CasmonError):
            got = []  # gone meanwhile: counted as nothing
        out.update((d, n) for d, n in zip(loose, got) if isinstance(n, int) and n > 0)
    return out


def held_elsewhere(store: Store, ref: str) -> set[Digest] | None:
    """Every object that records and refs other than run ``ref``'s reach; None if the store cannot be read
    whole (a damaged table or manifest: then nothing is claimed shared)."""
    from casmon.runs.deletion import run_keys

    without = {kind: {key} for kind, key in run_keys(ref).items()}
    try:
        roots = strict_roots(store, without=without)
        own = store.get_ref(ref)
        if own is not None and own.target is not None:
            roots.discard(own.target)  # the run's manifest goes with the run
        return closure(roots, open_through_store(store)).everything
    except (CasmonError, ValueError):
        return None


def sizes(store: Store, ref: str, arts: Iterable[Artifact], shared: bool = True) -> dict[str, tuple[int, int | None]]:
    """``name -> (stored bytes, bytes shared with other runs and entries)`` for artifacts ``arts`` of run
    ``ref``; shared is None when not asked for (``shared=False``: the walk of every record and ref of the
    store is seconds on a large one) or when the store cannot be walked whole."""
    arts = list(arts)
    if not arts:
        return {}
    elsewhere = held_elsewhere(store, ref) if shared else None
    out: dict[str, tuple[int, int | None]] = {}
    for a in arts:
        objs = object_sizes(store, needed(store, a))
        stored = sum(objs.values())
        out[a.name] = (stored, None if elsewhere is None else sum(n for d, n in objs.items() if d in elsewhere))
    return out
