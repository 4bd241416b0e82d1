"""Deleting a run: its ref and every record it wrote go, so gc frees what nothing else holds.

The records go by rewriting each table without them, under the store lock (as gc and cache eviction
rewrite tables): no gc or merge runs meanwhile, and no merge brings them back. The ref goes last: a
deletion cut short leaves the run listed, and deleting it again finishes it; were it first, records
left behind would pass to the next run that claims the freed number, and repair would restore the
ref from them. A run still ``running`` (or only ``claimed``) is refused unless
``force``, and one whose process is seen alive (on this host) is refused even forced: it would write the
run again. A forced deletion of a run whose writer lives on another host is undone by that writer.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from casmon import faultpoints
from casmon.errors import CasmonError, StoreError
from casmon.keys.fingerprint import fingerprint
from casmon.runs import live
from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key, read_artifacts
from casmon.runs.manifest import KIND_RUN
from casmon.runs.metrics import KIND_METRICS, metrics_key
from casmon.runs.tags import KIND_RUNEDIT, edit_key
from casmon.runs.resume import RESUME_REFS, holder_alive, resuming
from casmon.store.store import Store, default_store

if TYPE_CHECKING:
    from casmon.runs.listing import RunInfo

__all__ = ["Deleted", "delete_run", "run_keys"]


@dataclasses.dataclass
class Deleted:
    """What :func:`delete_run` removed (or, with ``dry_run``, would remove)."""

    name: str
    ref: str
    status: str
    records: int
    artifacts: int
    dry_run: bool = False


def run_keys(ref: str) -> dict[str, bytes]:
    """The record key of each kind of record run ``ref`` writes."""
    return {KIND_RUN: bytes(fingerprint(("casmon.run", ref))), KIND_METRICS: bytes(metrics_key(ref)),
            live.KIND_RUNOUT: bytes(live.output_key(ref)), KIND_ARTIFACT: artifacts_key(ref), KIND_RUNEDIT: edit_key(ref)}


def _without(key: bytes) -> Callable[[bytes, bytes], bool]:
    return lambda k, v: bytes(k) != key


def _still_deletable(s: Store, info: RunInfo, before: Any) -> None:
    """Under the lock, before anything goes: refuse if the run was written since it was read (a resume started
    it again) or a live process has claimed its resume and is about to write it; its records would come back."""
    now = s.get_ref(info.ref)
    if (now.target if now else None) != (before.target if before else None):
        raise CasmonError(f"casmon: run {info.name} was written while it was being deleted (resumed, or still "
                          f"running); nothing was deleted. Try again once it ends, or force=True")
    c = resuming(s, info)
    if c is not None:
        raise CasmonError(f"casmon: run {info.name} is being resumed by process {c.get('pid')} on {c.get('host')}; "
                          f"nothing was deleted. Try again once it ends, or force=True (`casmon rm --force`)")


def delete_run(run: Any, store: Store | str | None = None, force: bool = False, dry_run: bool = False) -> Deleted:
    """Delete ``run`` (a name, number, ``latest``, a ``RunInfo`` or a ``Run``): its ref and every record it wrote.
    What only it held is freed by the gc runs that follow (after their grace period). A ``running`` run is
    refused unless ``force`` (or it is ``lost`` or ``killed``); ``dry_run`` changes nothing."""
    from casmon.runs.listing import load_run

    s = default_store(store if store is not None else getattr(run, "store", None))
    if s.read_only and not dry_run:
        raise StoreError(f"cannot delete a run from {s.url}: it is opened read-only")
    which = getattr(run, "ref", None) or run
    if not isinstance(which, (str, int)):
        raise TypeError(f"casmon.delete_run: give a run's name or number, a RunInfo or a Run, got {type(run).__name__}")
    info: RunInfo = load_run(which, s)
    status = info.status
    if status in ("running", "claimed") and not force:
        raise CasmonError(f"casmon: run {info.name} is {status}: deleting it while it writes would leave half a run; "
                          f"wait until it ends (or is lost), or delete it anyway with force=True (`casmon rm --force`)")
    if status in ("running", "claimed") and not dry_run and holder_alive(info.manifest):
        m = info.manifest
        raise CasmonError(f"casmon: run {info.name} is {status} in process {m.get('pid')} on {m.get('host')}, which is "
                          f"still alive: it would write the run again after its deletion. Stop that process first")
    keys = run_keys(info.ref)
    before = s.get_ref(info.ref)
    s.flush()
    found = {kind: len(s.lookup(kind, key)) for kind, key in keys.items() if kind in s.record_kinds()}
    try:
        n_artifacts = len(read_artifacts(s, info.ref))
    except CasmonError:
        n_artifacts = 0
    out = Deleted(info.name, info.ref, status, sum(found.values()), n_artifacts, dry_run)
    if dry_run:
        return out
    if not s.backend.supports_deletes:
        raise StoreError(f"cannot delete a run from {s.url}: it cannot delete (a zip file)")
    from casmon.store.lock import held

    try:
        with held(s.backend, "run deletion", s.url):  # no gc marks, and no merge brings the records back, meanwhile
            if not force:
                _still_deletable(s, info, before)
            for kind in found:
                s.table(kind).consolidate(force=True, keep=_without(keys[kind]))
            faultpoints.point("delete.after_records")
            for claim in s.refs(f"{RESUME_REFS}/{info.ref.split('/', 1)[-1]}"):
                s.delete_ref(claim)  # before the ref, as the records: a deletion cut short is finished again
            s.delete_ref(info.ref)
    except OSError as e:
        raise StoreError(f"cannot delete run {info.name} from {s.url}: {e.strerror or e}") from e
    return out
