"""The runs index: derived data that lets ``list_runs`` read a few files instead of a ref and a manifest per run.

It lives under ``runs-index/``: a *base* file of entries and small *delta* files (one per ended run, written
at its end) that the next listing folds into a new base. An entry is ``[stamp, target, manifest, ref data]``
for one ended run: the stamp its ref file had when the entry was made (the backend's
:meth:`~casmon.store.backend.base.Backend.list_stamped`), the manifest digest the ref named, the manifest
itself (which holds the run's name and number, status, times, params, info, tags and per-metric summary), and the
time the stamp was taken.

An entry is used only while the run's ref still has that stamp (or, where the medium gives no stamps, still
names that target), so the index never disagrees with the runs: a run resumed, deleted, re-tagged, or still
running is read from its own ref and manifest, and a stale entry is dropped at the next fold. Each file
carries an xxh3 checksum; a damaged or missing one is ignored and rebuilt. Deleting ``runs-index/`` loses
nothing. A stamp alone is trusted only once it is settled (the backend's
:meth:`~casmon.store.backend.base.Backend.stamp_settled`: the ref written ticks of its file clock before the
stamp was taken): two writes within one tick of a coarse clock (FAT, ext3, some NFS servers), with the inode reused, can
share a stamp, so a younger entry is checked against the ref's target (one small read). A stamp is taken
before the ref is read, so a ref rewritten in between gets an entry whose stamp no
longer matches anything (never one that matches the new ref with the old content).
"""

from __future__ import annotations

import base64
import json
import os
import re
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from casmon import faultpoints
from casmon.errors import CasmonError, DamagedObjectError
from casmon.runs.manifest import RUN_REFS, check_run_manifest
from casmon.runs.metrics import number_of

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["INDEX_DIR", "BASE", "FOLD_AT", "ENTRY_MAX", "Entry", "load", "fold", "entry", "note_ended",
           "indexable", "encode", "decode", "slim", "summary", "HEAVY", "settled", "renewed"]

INDEX_DIR = "runs-index/"
BASE = INDEX_DIR + "base"
_DELTA = "d-"
_MAGIC = b"casmon-runs-index 6 "
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

_HEX32 = re.compile(r"[0-9a-f]{32}")
_HEXES = re.compile(r"[0-9a-f]*")

#: ``[stamp, target hex, slim manifest, {"heartbeat"}, metric summary, start, name, status, time the stamp was
#: taken]``: the slim manifest (without HEAVY and metrics) as JSON text, parsed and checked only when a field of
#: it is read (:class:`~casmon.runs.listing.IndexedManifest`), so a listing pays per run only for what it shows;
#: its start, name and status also apart, for a listing's order and the UI's first page. The summary is
#: ``[names, digests, offset]`` into the file's two numeric columns: ``f``, each metric's last, time, min and max
#: (float64), and ``i``, its count and step (int64), little-endian and base64; read into cells only when asked
#: for (:func:`summary`). An entry made from a run just read holds its manifest (a dict) and summary (a dict)
#: instead.
Entry = list


def _slim_text(e: Entry) -> str:
    return e[2] if type(e[2]) is str else json.dumps(e[2], separators=(",", ":"))


def encode(entries: dict[str, Entry]) -> bytes:
    floats: list[float] = []
    ints: list[int] = []
    runs = {}
    for name, e in entries.items():
        cells = summary(e)
        if cells is None:  # a crafted entry's columns: left out, the run is read directly and indexed again
            continue
        names = sorted(cells)
        off = len(ints) // 2
        for k in names:
            c = cells[k]
            floats += [c["last"], c["time"], c["min"], c["max"]]
            ints += [c["n"], c["step"]]
        runs[name] = [e[0], e[1], _slim_text(e), e[3], [names, [cells[k]["digest"] for k in names], off], e[5], e[6],
                      e[7], e[8]]
    body = json.dumps({"runs": runs, "f": base64.b64encode(np.array(floats, "<f8").tobytes()).decode("ascii"),
                       "i": base64.b64encode(np.array(ints, "<i8").tobytes()).decode("ascii")},
                      separators=(",", ":")).encode()
    return _MAGIC + xxhash.xxh3_128_hexdigest(body).encode() + b"\n" + body


def decode(raw: bytes, key: str) -> dict[str, Entry]:
    """The entries of index file ``key`` (each of the right shape; odd ones left out; their manifests and
    summaries are checked when read: :func:`slim`, :func:`summary`); :class:`DamagedObjectError` naming it if
    it is not one casmon wrote."""
    head = len(_MAGIC) + 33
    if not raw.startswith(_MAGIC) or len(raw) < head or raw[head - 1 : head] != b"\n":
        raise DamagedObjectError(key, "not a runs index file")
    body = raw[head:]
    if xxhash.xxh3_128_hexdigest(body).encode() != raw[len(_MAGIC) : head - 1]:
        raise DamagedObjectError(key, "its content does not match its checksum")
    try:
        doc = json.loads(body)
        runs = doc["runs"]
        fa = np.frombuffer(base64.b64decode(doc["f"], validate=True), "<f8")
        ia = np.frombuffer(base64.b64decode(doc["i"], validate=True), "<i8")
    except (ValueError, KeyError, TypeError, RecursionError):
        raise DamagedObjectError(key, "not a runs index file") from None
    if not isinstance(runs, dict) or len(fa) != 2 * len(ia):
        raise DamagedObjectError(key, "not a runs index file")
    times = fa[1::4]
    if not (bool((ia[0::2] >= 0).all()) and bool(((times >= 0) & (times < 1e11)).all())):
        raise DamagedObjectError(key, "a metric's count or time is out of range")
    cols = (fa.tolist(), ia.tolist())
    prefix = RUN_REFS + "/"
    out = {}
    for k, e in runs.items():
        if (type(e) is list and len(e) == 9 and type(e[0]) is str and type(e[1]) is str and len(e[1]) == 32
                and type(e[2]) is str and type(e[3]) is dict and type(e[4]) is list and len(e[4]) == 3
                and type(e[5]) in (int, float) and 0 <= e[5] < 1e11 and type(e[6]) is str and type(e[7]) is str
                and e[7] not in ("running", "claimed", "unreadable") and type(e[8]) is float and 0 <= e[8] < 1e11
                and k.startswith(prefix)):
            e[4] = (*e[4], cols)
            out[k] = e
    return out


def slim(e: Entry, where: str) -> dict[str, Any] | None:
    """Entry ``e``'s slim manifest, checked as a manifest read from the store is (and of an ended run, starting
    when the entry says); None if it is not such (a crafted entry: the stored manifest is read instead)."""
    if type(e[2]) is dict:
        return dict(e[2])
    try:
        m = json.loads(e[2])
        if (type(m) is not dict or not indexable(m) or "metrics" in m
                or (m.get("start"), m.get("name"), m.get("status")) != (e[5], e[6], e[7])):
            return None
        check_run_manifest(m, where)
    except (ValueError, RecursionError, DamagedObjectError):
        return None
    return m


def summary(e: Entry) -> dict[str, dict[str, Any]] | None:
    """Entry ``e``'s metric summary as :meth:`~casmon.runs.listing.RunInfo.metric_summary` gives it (a new
    dict each call); None if its columns are not of the form casmon writes."""
    if type(e[4]) is dict:
        return {k: dict(v) for k, v in e[4].items()}
    names, digests, off, (f, i) = e[4]
    if not (type(names) is list and type(digests) is list and len(digests) == len(names) and type(off) is int
            and 0 <= off and 2 * (off + len(names)) <= len(i) and all(type(n) is str for n in names)):
        return None
    joined = "".join(digests) if all(type(d) is str for d in digests) else None
    if joined is None or len(joined) != 32 * len(digests) or not _HEXES.fullmatch(joined):
        if not all(d is None or type(d) is str and _HEX32.fullmatch(d) for d in digests):
            return None
    return {name: {"n": i[2 * j], "last": f[4 * j], "step": i[2 * j + 1], "time": f[4 * j + 1], "min": f[4 * j + 2],
                   "max": f[4 * j + 3], "digest": digests[j - off]}
            for j, name in enumerate(names, off)}


#: The base file last read, by store: ``(its stamp, its entries)``; a listing whose base has the same stamp
#: reads nothing (entries are not changed once read: readers copy what they change).
_read: dict[str, tuple[str, dict[str, Entry]]] = {}
_read_lock = threading.Lock()
_READ_KEPT = 4


def load(store: Store) -> tuple[dict[str, Entry], list[str], bool]:
    """``(entries, delta keys read, whether the base was sound)``; damaged files are left out."""
    b = store.backend
    entries: dict[str, Entry] = {}
    base_ok = False
    try:
        stamp = b.stamp(BASE)  # before the read: a base replaced meanwhile is kept under a stamp gone already
        with _read_lock:
            got = _read.get(store.url) if stamp is not None else None
        if got is not None and got[0] == stamp:
            entries, base_ok = dict(got[1]), True
        else:
            raw = b.get(BASE)
            if raw is not None and len(raw) <= FILE_MAX:
                entries = decode(bytes(raw), BASE)
                base_ok = True
                if stamp is not None:
                    with _read_lock:
                        _read.pop(store.url, None)
                        _read[store.url] = (stamp, dict(entries))
                        while len(_read) > _READ_KEPT:
                            _read.pop(next(iter(_read)))
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


def settled(store: Store, e: Entry, now: float) -> bool:
    """True if entry ``e``'s stamp alone says its ref is unchanged: the ref was written well before the stamp
    was taken, so no later write can share the stamp (see the module's docstring). An entry made by a clock
    ahead of this one (``now``) counts as made now."""
    return store.backend.stamp_settled(e[0], min(e[8], now))


def renewed(e: Entry, stamp: str, ref_data: dict[str, Any], at: float) -> Entry:
    """Entry ``e`` (of the manifest the ref names now) with the ref's ``stamp`` taken at time ``at``."""
    hb = ref_data.get("heartbeat")
    return [stamp, e[1], e[2], {"heartbeat": hb} if type(hb) is float else {}, e[4], e[5], e[6], e[7], at]


def entry(stamp: str, target: str, manifest: dict[str, Any], ref_data: dict[str, Any],
          at: float) -> Entry | None:
    """An index entry (``stamp`` taken at time ``at``, before the ref was read), or None for a manifest too large to copy or with a metric cell of an odd form (that
    run is read directly)."""
    try:
        size = len(json.dumps(manifest, separators=(",", ":")))
    except (TypeError, ValueError, RecursionError):
        return None
    summary = manifest.get("metrics")
    cells = _cells(summary if isinstance(summary, dict) else {})
    if size > ENTRY_MAX or cells is None:
        return None
    slim = {k: v for k, v in manifest.items() if k not in HEAVY and k != "metrics"}
    # Of the ref's data only the last heartbeat says more than the manifest once a run has ended.
    hb = ref_data.get("heartbeat")
    start: Any = slim.get("start")
    name, status = slim.get("name"), slim.get("status")
    if type(start) not in (int, float) or not 0 <= start < 1e11 or type(name) is not str or type(status) is not str:
        return None
    return [stamp, target, slim, {"heartbeat": hb} if type(hb) is float else {}, cells, start, name, status, at]


def _cells(summary: dict[str, Any]) -> dict[str, dict[str, Any]] | None:
    """A manifest's metric summary as :meth:`~casmon.runs.listing.RunInfo.metric_summary` gives it; None if
    a cell is not of the form a recorder writes."""
    out = {}
    for k in sorted(summary):
        v = summary[k]
        if type(k) is not str or not isinstance(v, dict):
            return None
        n, step, d = v.get("n"), v.get("step"), v.get("digest")
        last, t, lo, hi = (number_of(v.get(f)) for f in ("last", "time", "min", "max"))
        if (type(n) is not int or not 0 <= n < 1 << 63 or type(step) is not int or not -(1 << 63) <= step < 1 << 63
                or not all(type(x) is float for x in (last, t, lo, hi)) or not 0 <= t < 1e11  # type: ignore[operator]
                or not (d is None or type(d) is str and _HEX32.fullmatch(d))):
            return None
        out[k] = {"n": n, "last": last, "step": step, "time": t, "min": lo, "max": hi, "digest": d}
    return out


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
        at = time.time()
        stamp = store.backend.stamp("refs/" + ref)  # before the ref is read: see the module's docstring
        r = store.get_ref(ref)
        if stamp is None or r is None or r.target is None:
            return
        manifest = load_data(store, r.target.hex(), f"run {ref}: its manifest", dict)
        check(manifest, f"run {ref}")
        if not indexable(manifest):
            return
        e = entry(stamp, r.target.hex(), manifest, r.data if isinstance(r.data, dict) else {}, at)
        if e is None:
            return
        key = f"{INDEX_DIR}{_DELTA}{time.time_ns():016x}-{os.urandom(4).hex()}"
        store.backend.set(key, encode({ref: e}))
        faultpoints.point("index.delta_written")
    except (OSError, CasmonError):
        pass  # the index is derived: the next listing reads the run directly
