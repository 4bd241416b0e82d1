"""The runs index: derived data that lets ``list_runs`` read a few files instead of a ref and a manifest per run.

It lives under ``runs-index/``: a *base* file of entries and small *delta* files (one per ended run, written
at its end) that the next listing folds into a new base. An entry is ``[stamp, target, manifest, ref data]``
for one ended run: the stamp its ref file had when the entry was made (the backend's
:meth:`~casmon.store.backend.base.Backend.list_stamped`), the manifest digest the ref named, and the manifest
itself (which holds the run's name and number, status, times, params, info, tags and per-metric summary).

An entry is used only while the run's ref still has that stamp (or, where the medium gives no stamps, still
names that target), so the index never disagrees with the runs: a run resumed, deleted, re-tagged, or still
running is read from its own ref and manifest, and a stale entry is dropped at the next fold. Each file
carries an xxh3 checksum; a damaged or missing one is ignored and rebuilt. Deleting ``runs-index/`` loses
nothing. A stamp is taken before the ref is read, so a ref rewritten in between gets an entry whose stamp no
longer matches anything (never one that matches the new ref with the old content).
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any

import xxhash

from casmon import faultpoints
from casmon.errors import CasmonError, DamagedObjectError
from casmon.runs.manifest import RUN_REFS, check_run_manifest

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["INDEX_DIR", "BASE", "FOLD_AT", "ENTRY_MAX", "Entry", "load", "fold", "entry", "note_ended",
           "indexable", "encode", "decode", "HEAVY", "SUMMARY_FIELDS", "summary_of"]

INDEX_DIR = "runs-index/"
BASE = INDEX_DIR + "base"
_DELTA = "d-"
_MAGIC = b"casmon-runs-index 2 "
#: New entries (runs read directly) plus delta files from which a listing writes a new base.
FOLD_AT = 32
#: A manifest larger than this (JSON bytes) is not copied into the index: the run is read directly.
ENTRY_MAX = 16384
#: The largest index file read (a crafted one is ignored, never read whole into memory).
FILE_MAX = 1 << 31

#: Manifest fields a listing does not show: left out of entries, read from the manifest when asked for
#: (:class:`~casmon.runs.listing.IndexedManifest`).
HEAVY = frozenset(("files", "env", "links", "tracking_records", "argv", "executable", "cwd", "python", "packages",
                   "output", "traceback", "patch_time", "casmon_run", "pid", "imported", "heartbeat_s", "resumes"))

#: A metric's summary in an entry: these fields, in this order.
SUMMARY_FIELDS = ("n", "last", "step", "time", "min", "max", "digest")

#: ``[stamp, target hex, manifest without HEAVY and metrics, ref data, {metric: [SUMMARY_FIELDS]}]``.
Entry = list


def encode(entries: dict[str, Entry]) -> bytes:
    body = json.dumps({"runs": entries}, separators=(",", ":")).encode()
    return _MAGIC + xxhash.xxh3_128_hexdigest(body).encode() + b"\n" + body


def decode(raw: bytes, key: str) -> dict[str, Entry]:
    """The entries of index file ``key``; :class:`DamagedObjectError` naming it if it is not one casmon wrote."""
    head = len(_MAGIC) + 33
    if not raw.startswith(_MAGIC) or len(raw) < head or raw[head - 1 : head] != b"\n":
        raise DamagedObjectError(key, "not a runs index file")
    body = raw[head:]
    if xxhash.xxh3_128_hexdigest(body).encode() != raw[len(_MAGIC) : head - 1]:
        raise DamagedObjectError(key, "its content does not match its checksum")
    try:
        runs = json.loads(body)["runs"]
    except (ValueError, KeyError, TypeError, RecursionError):
        raise DamagedObjectError(key, "not a runs index file") from None
    if not isinstance(runs, dict):
        raise DamagedObjectError(key, "not a runs index file")
    return {k: e for k, e in runs.items() if _entry_ok(k, e)}


def _entry_ok(name: Any, e: Any) -> bool:
    """An entry of the right shape whose manifest passes the checks a manifest read from the store passes."""
    if not (type(name) is str and name.startswith(RUN_REFS + "/") and type(e) is list and len(e) == 5
            and type(e[0]) is str and type(e[1]) is str and len(e[1]) == 32 and type(e[2]) is dict
            and type(e[3]) is dict and type(e[4]) is dict
            and e[2].get("status") not in ("running", "claimed", "unreadable", None)):
        return False
    try:
        check_run_manifest(e[2], f"runs index entry {name}")
    except DamagedObjectError:
        return False
    return True


def load(store: Store) -> tuple[dict[str, Entry], list[str], bool]:
    """``(entries, delta keys read, whether the base was sound)``; damaged files are left out."""
    b = store.backend
    entries: dict[str, Entry] = {}
    base_ok = False
    try:
        raw = b.get(BASE)
        if raw is not None and len(raw) <= FILE_MAX:
            entries = decode(bytes(raw), BASE)
            base_ok = True
    except (CasmonError, OSError, MemoryError):
        pass  # rebuilt by the next fold
    deltas = sorted(k for k in _list(store) if k.rsplit("/", 1)[-1].startswith(_DELTA) and ".partial" not in k)
    for k in deltas:
        try:
            raw = b.get(k)
            if raw is not None and len(raw) <= ENTRY_MAX * 4:
                entries.update(decode(bytes(raw), k))
        except (CasmonError, OSError):
            continue
    return entries, deltas, base_ok


def _list(store: Store) -> list[str]:
    try:
        return store.backend.list(INDEX_DIR)
    except OSError:
        return []


def indexable(manifest: dict[str, Any]) -> bool:
    """True for the manifest of a run that has ended (its manifest will not change while its ref stays)."""
    return manifest.get("status") not in ("running", "claimed", "unreadable", None)


def entry(stamp: str, target: str, manifest: dict[str, Any], ref_data: dict[str, Any]) -> Entry | None:
    """An index entry, or None for a manifest too large to copy (that run is read directly)."""
    try:
        size = len(json.dumps(manifest, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return None
    if size > ENTRY_MAX:
        return None
    # The ref's latest-metrics copy is the manifest's summary again once a run has ended: left out.
    slim = {k: v for k, v in manifest.items() if k not in HEAVY and k != "metrics"}
    summary = manifest.get("metrics")
    cells = {k: [v.get(f) for f in SUMMARY_FIELDS] for k, v in (summary if isinstance(summary, dict) else {}).items()
             if isinstance(v, dict)}  # lists: a fraction of the JSON a dict per metric costs to read
    return [stamp, target, slim, {k: v for k, v in ref_data.items() if k != "metrics"}, cells]


def fold(store: Store, entries: dict[str, Entry], fresh: dict[str, Entry], deltas: list[str],
         stamps: dict[str, str] | None, base_ok: bool) -> bool:
    """Write a new base (entries still current, plus ``fresh``) and delete the ``deltas`` it holds, when
    enough is new; best effort (a read-only store, a full disk: the next listing tries again)."""
    if store.read_only or not (len(fresh) + len(deltas) >= FOLD_AT or (fresh and not base_ok)):
        return False
    keep = {n: e for n, e in entries.items()
            if stamps is None or stamps.get("refs/" + n) == e[0]}  # deleted or rewritten runs' entries go
    keep.update(fresh)
    try:
        store.backend.set(BASE, encode(keep))
        faultpoints.point("index.base_written")
        for k in deltas:
            store.backend.delete(k)
    except (OSError, CasmonError):
        return False
    return True


def note_ended(store: Store, ref: str) -> None:
    """After a run's end is stored: its entry as a delta file, so listings need not read it (best effort)."""
    from casmon.runs.manifest import check_run_manifest as check
    from casmon.store.peek import load_data

    try:
        stamp = store.backend.stamp("refs/" + ref)  # before the ref is read: see the module's docstring
        r = store.get_ref(ref)
        if stamp is None or r is None or r.target is None:
            return
        manifest = load_data(store, r.target.hex(), f"run {ref}: its manifest", dict)
        check(manifest, f"run {ref}")
        if not indexable(manifest):
            return
        e = entry(stamp, r.target.hex(), manifest, r.data if isinstance(r.data, dict) else {})
        if e is None:
            return
        key = f"{INDEX_DIR}{_DELTA}{time.time_ns():016x}-{os.urandom(4).hex()}"
        store.backend.set(key, encode({ref: e}))
        faultpoints.point("index.delta_written")
    except (OSError, CasmonError):
        pass  # the index is derived: the next listing reads the run directly


def summary_of(cells: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """An entry's metric cells as a manifest's ``metrics`` holds them (odd cells left out)."""
    return {k: dict(zip(SUMMARY_FIELDS, v)) for k, v in cells.items()
            if type(k) is str and type(v) is list and len(v) == len(SUMMARY_FIELDS)}
