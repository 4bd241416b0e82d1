"""What a run keeps: named artifacts (values, files, folders) and checkpoints, held by the run for gc.

Every save appends an ``artifact`` record under the run's key (``fingerprint(("casmon.artifacts", ref))``,
so a reader looks one run's up without scanning the others) whose ``_refs`` name the value -- for a
folder, its listing and every file -- so gc keeps them as long as the record exists. The newest record
of a name wins: saving under a name again replaces it, and a *release* record (``released: true``,
no ``_refs``) removes it (a checkpoint retention drops). The records a newer one of their name
supersedes still hold their values until :func:`drop_superseded` drops them (``casmon gc`` does,
under the store lock, as it drops duplicate cache entries); deleting a run drops all of its records
(:mod:`casmon.runs.deletion`). Values go through ``store.put``, so equal values and equal chunks are
stored once, across runs; a large file is kept in content-defined pieces (:mod:`casmon.runs.pieces`), so
versions of it share all but the pieces around a change.
"""

from __future__ import annotations

import dataclasses
import errno
import io
import math
import operator
import os
import re
import stat
import threading
import time
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from casmon.errors import CasmonError, DamagedObjectError, StoreError
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint
from casmon.runs import pieces
from casmon.store.peek import load_data

if TYPE_CHECKING:
    from casmon.runs.recorder import Run
    from casmon.store.store import Store

__all__ = ["KIND_ARTIFACT", "CHECKPOINT", "NAME_MAX", "Artifact", "ArtifactWriteError", "Held", "check_name", "last_time", "artifacts_key", "save",
           "save_file", "release", "checkpoint", "retention", "read_artifacts", "load", "load_file", "write_artifact",
           "load_checkpoint", "superseded_plan", "drop_superseded"]

KIND_ARTIFACT = "artifact"
#: Checkpoints are artifacts named ``checkpoint/{step}``; ``run.save`` leaves the prefix to them.
CHECKPOINT = "checkpoint/"
#: The longest artifact name, in characters.
NAME_MAX = 255
_FOLDER_TAG = "casmon_folder"
_HEX32 = re.compile(r"[0-9a-f]{32}")


class ArtifactWriteError(CasmonError, OSError):
    """``load_file`` could not write where it was asked to (a folder or file in the way, no permission, ...)."""


@dataclasses.dataclass
class Artifact:
    """One artifact of a run, as its newest record says: ``kind`` is ``value``, ``file``, ``folder`` or
    ``checkpoint``; ``size`` the bytes it holds (a folder's files added up); ``digest`` the stored value."""

    name: str
    kind: str
    size: int
    digest: str
    time: float
    step: int | None = None
    mode: int | None = None
    files: int | None = None
    refs: tuple[str, ...] = ()
    pieced: bool = False  # a large bytes value kept as a file is: in content-defined pieces


class Held:
    """A run's artifacts as this process saved them: the checkpoints retention counts, and the order of saves."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last_time = 0.0
        self.seq = 0
        self.checkpoints: list[int] = []  # steps, as saved (each at most once)

    def stamp(self) -> tuple[float, int]:
        """A time and sequence number that order this process's records of a run even within one clock tick."""
        t = max(time.time(), self.last_time + 1e-6, math.nextafter(self.last_time, math.inf))  # strictly later
        self.last_time = t
        self.seq += 1
        return t, self.seq


def check_name(name: Any, what: str = "artifact name") -> str:
    """``name`` in Unicode NFC if it is a usable artifact name, else a one-line ValueError saying what is wrong
    with it. NFC: a name typed and the same name from a file system that decomposes (macOS) are one artifact."""
    if not isinstance(name, str):
        raise ValueError(f"casmon: {what} must be a string, got {type(name).__name__}")
    name = unicodedata.normalize("NFC", name)
    shown = repr(name[:80]) + ("..." if len(name) > 80 else "")
    if not name.strip():
        raise ValueError(f"casmon: {what} {name!r} is empty")
    if len(name) > NAME_MAX:
        raise ValueError(f"casmon: {what} {shown} is too long ({len(name):,} characters; at most {NAME_MAX})")
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":" and name[0].isalpha()):
        raise ValueError(f"casmon: {what} {shown} is absolute; give a relative name such as 'model.pt' or 'plots/loss.png'")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise ValueError(f"casmon: {what} {shown} contains '..'")
    if any(unicodedata.category(c) in ("Cc", "Cf", "Cs") for c in name):  # a name shown must be the name meant
        raise ValueError(f"casmon: {what} {shown} contains a control or invisible character")
    if any(p in ("", ".") for p in parts):
        raise ValueError(f"casmon: {what} {shown} has an empty or '.' part")
    return name


def artifacts_key(ref: str) -> bytes:
    """The key every artifact record of run ``ref`` is appended under."""
    return bytes(fingerprint(("casmon.artifacts", ref)))


def _ready(run: Run) -> Store:
    """The run's store, once the run is written there (its number claimed); else a StoreError."""
    if run._pid != os.getpid():
        raise CasmonError(f"casmon: saving an artifact in process {os.getpid()}, a child of process {run._pid} that "
                          f"records run {run.name}: a run's artifacts are saved by the process that records it")
    if run._ended:
        raise CasmonError(f"casmon: run {run.name} has ended; save artifacts while it goes on")
    if run.store is None or not run._started:
        rec = run._recorder
        if rec is not None:
            with run._saving:
                if run.store is None:
                    from casmon.store.store import default_store

                    run.store = default_store(rec._store_arg)
                if not run._started:
                    rec._store_start(run)  # raises if the store is still away
    return run.store


def _append(run: Run, store: Store, rec: dict[str, Any], refs: list[Digest]) -> None:
    # The points logged before a save are written before its record: one flush writes its tables in no set
    # order, and a checkpoint that outlived a kill with its points lost leaves a gap a resumed loop never fills.
    run._metrics.wait_settled(10.0)  # a batch another thread took is appended first
    store.flush()
    with run._held.lock:
        t, seq = run._held.stamp()
    store.append(KIND_ARTIFACT, {"run": run.ref, **rec, "time": t, "seq": seq}, key=artifacts_key(run.ref), refs=refs)
    # Written now: a record that waited for a later flush would leave its value unheld by any visible record.
    store.flush()


def save(run: Run, name: str, value: Any, kind: str = "value", step: int | None = None, mmap: bool = False) -> Artifact:
    """Store ``value`` as artifact ``name`` of ``run`` (replacing one of that name); ``mmap``: laid out so that
    ``load(..., mmap=True)`` maps its large arrays (:mod:`casmon.store.mapped`)."""
    name = check_name(name)
    if kind == "value" and name.startswith(CHECKPOINT):
        raise ValueError(f"casmon: artifact names under {CHECKPOINT!r} are run.checkpoint's; name it otherwise")
    store = _ready(run)
    rec: dict[str, Any]
    if type(value) is bytes and len(value) >= pieces.PIECED_MIN and not mmap:  # as a file: versions share pieces
        d, needs, size = pieces.put_stream(store, io.BytesIO(value))
        rec = {"name": name, "kind": kind, "digest": d.hex(), "size": size, "pieced": True}
    else:
        d, size = store.put_sized(value, mmap)
        needs = [d]
        rec = {"name": name, "kind": kind, "digest": d.hex(), "size": int(size)}
    if step is not None:
        rec["step"] = step
    _append(run, store, rec, needs)
    return Artifact(name, kind, int(size), d.hex(), run._held.last_time, step, refs=tuple(h.hex() for h in needs),
                    pieced=bool(rec.get("pieced")))


def save_file(run: Run, path: str | os.PathLike[str], name: str | None = None) -> Artifact:
    """Store the file or folder at ``path`` as artifact ``name`` (its file name by default): each file by
    content with its mode and size; a folder as a listing of its files (symbolic links, pipes, sockets, devices
    and version-control metadata such as ``.git/`` are left out)."""
    p = Path(os.fspath(path))
    if name is None:
        name = p.resolve().name if p.name in ("", ".", "..") else p.name
    name = check_name(name)
    if name.startswith(CHECKPOINT):
        raise ValueError(f"casmon: artifact names under {CHECKPOINT!r} are run.checkpoint's; name it otherwise")
    try:
        st = p.stat()
    except OSError as e:
        raise FileNotFoundError(f"casmon: run.save_file: cannot read {str(p)!r}: {e.strerror or e}") from None
    store = _ready(run)
    if stat.S_ISDIR(st.st_mode):
        files: dict[str, dict[str, Any]] = {}
        refs: list[Digest] = []
        from casmon.runs.folders import vcs_component

        for dirpath, dirnames, filenames in os.walk(p):
            # version-control metadata can run commands (hooks, config): load_file never writes it, so it is not kept
            dirnames[:] = sorted(d for d in dirnames if vcs_component(d) is None)
            dp = Path(dirpath)
            for fname in sorted(filenames):
                if vcs_component(fname) is not None:
                    continue  # a worktree's ".git" file, as its folder above
                full = dp / fname
                got = _put_regular(store, full, follow=False)
                if got is None:
                    continue  # a symbolic link, pipe, socket or device: not a file's content
                d, needs, n, mode = got
                refs.extend(needs)
                files[full.relative_to(p).as_posix()] = {"digest": d.hex(), "size": n, "mode": mode}
        listing = store.put({_FOLDER_TAG: 1, "files": files})
        total = sum(f["size"] for f in files.values())
        rec = {"name": name, "kind": "folder", "digest": listing.hex(), "size": total, "files": len(files)}
        _append(run, store, rec, [listing, *refs])
        return Artifact(name, "folder", total, listing.hex(), run._held.last_time, files=len(files),
                        refs=(listing.hex(), *(d.hex() for d in refs)))
    got = _put_regular(store, p, follow=True)
    if got is None:
        raise ValueError(f"casmon: run.save_file: {str(p)!r} is not a regular file or a folder (a pipe, socket or "
                         "device); save what it holds with run.save(name, data)")
    d, needs, n, mode = got
    _append(run, store, {"name": name, "kind": "file", "digest": d.hex(), "size": n, "mode": mode}, needs)
    return Artifact(name, "file", n, d.hex(), run._held.last_time, mode=mode, refs=tuple(h.hex() for h in needs))


def release(run: Run, name: str) -> None:
    """Drop artifact ``name`` from ``run`` with a release record: the run reads back without it, and once
    ``casmon gc`` drops the records it supersedes, what only it held is freed (a file a trainer deleted)."""
    name = check_name(name)
    store = _ready(run)
    if name.startswith(CHECKPOINT):
        with run._held.lock:  # retention no longer counts it
            run._held.checkpoints = [s for s in run._held.checkpoints if f"{CHECKPOINT}{s}" != name]
    _append(run, store, {"name": name, "released": True}, [])


def _put_regular(store: Store, path: Path, follow: bool) -> tuple[Digest, list[Digest], int, int] | None:
    """Store the regular file at ``path`` as it streams in (a large one in content-defined pieces,
    :mod:`casmon.runs.pieces`): ``(digest, every digest it needs, size, mode)``; None if it is something else
    (a symbolic link when not ``follow``, a pipe, socket or device). Opened without blocking and checked on the
    open file, so one swapped for a pipe or link after the folder was listed neither hangs the save nor is
    followed."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if not follow and e.errno == errno.ELOOP:
            return None
        if e.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket, or a device with nothing behind it
            return None
        raise OSError(f"casmon: run.save_file: cannot read {str(path)!r}: {e.strerror or e}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        try:
            d, needs, n = pieces.put_stream(store, f)
        except OSError as e:
            raise OSError(f"casmon: run.save_file: cannot read {str(path)!r}: {e.strerror or e}") from None
    return d, needs, n, stat.S_IMODE(st.st_mode)


def _whole(v: Any) -> int | None:
    """``v`` as an int if it is a whole number (numpy and torch integers too; never a bool or a float)."""
    if type(v) is int:
        return v
    if isinstance(v, (bool, float)) or not hasattr(v, "__index__") or getattr(v, "dtype", None) == bool:
        return None
    try:
        return operator.index(v)
    except TypeError:
        return None


def retention(v: Any, what: str) -> int | None:
    if v is None:
        return None
    n = _whole(v)
    if n is None or n < 1:
        raise ValueError(f"casmon: {what} must be a whole number of at least 1, got {v!r}")
    return n


def checkpoint(run: Run, state: Any, step: int | None = None, keep_last: int | None = None,
               keep_every: int | None = None) -> Artifact:
    """Save ``state`` as checkpoint ``step``, then release the checkpoints the retention rule no longer keeps:
    the highest step and the one just saved always, the last ``keep_last`` (by step), those whose step is a
    multiple of ``keep_every``; with neither rule, every one."""
    keep_last = retention(keep_last if keep_last is not None else run._keep[0], "keep_last")
    keep_every = retention(keep_every if keep_every is not None else run._keep[1], "keep_every")
    with run._held.lock:
        if step is None:
            step = max(run._held.checkpoints, default=-1) + 1
    whole = _whole(step)
    if whole is None:
        raise ValueError(f"casmon: run.checkpoint: step must be a whole number, got {step!r}")
    step = whole
    if step < 0:
        raise ValueError(f"casmon: run.checkpoint: step must be 0 or more, got {step}")
    art = save(run, f"{CHECKPOINT}{step}", state, kind="checkpoint", step=step)
    with run._held.lock:
        steps = sorted(set(run._held.checkpoints) | {step})
        keep = set(steps) if keep_last is None and keep_every is None else {steps[-1], step}  # never the one just saved
        if keep_last is not None:
            keep.update(steps[-keep_last:])
        if keep_every is not None:
            keep.update(s for s in steps if s % keep_every == 0)
        run._held.checkpoints = [s for s in steps if s in keep]
        gone = [s for s in steps if s not in keep]
    store = run.store
    for s in gone:
        _append(run, store, {"name": f"{CHECKPOINT}{s}", "released": True}, [])
    return art


# -- reading -------------------------------------------------------------------------------------


def _parse(rec: dict[str, Any]) -> Artifact | None:
    """The artifact a record names, or None for a release (or a record too damaged to read)."""
    if rec.get("released") is True:
        return None
    name, kind, digest, size = rec.get("name"), rec.get("kind"), rec.get("digest"), _count(rec.get("size"))
    if not (isinstance(name, str) and isinstance(kind, str) and isinstance(digest, str) and _HEX32.fullmatch(digest)
            and size is not None):
        return None
    t = _time(rec.get("time", 0.0))
    step, mode, files = rec.get("step"), rec.get("mode"), rec.get("files")
    refs = rec.get("_refs")
    return Artifact(name, kind, size, digest, t, step if type(step) is int else None,
                    mode if type(mode) is int else None, _count(files),
                    tuple(h for h in refs if isinstance(h, str)) if isinstance(refs, list) else (),
                    rec.get("pieced") is True)


def _count(n: Any) -> int | None:
    """``n`` if it is a byte or file count a store can hold (a whole number from 0 to 2**63), else None."""
    return n if type(n) is int and 0 <= n < 2**63 else None


def _time(t: Any) -> float:
    """A record's time as a finite float; 0.0 for anything else (a crafted NaN, infinity or int too large for a
    float), so ordering never raises and no stamp continues from it."""
    if type(t) is float:
        return t if math.isfinite(t) else 0.0
    if type(t) is int:
        return float(t) if abs(t) < 2**1000 else 0.0
    return 0.0


def _order(rec: dict[str, Any]) -> tuple[float, int]:
    seq = rec.get("seq")
    return _time(rec.get("time")), seq if type(seq) is int else 0


def read_artifacts(store: Store, ref: str) -> dict[str, Artifact]:
    """Run ``ref``'s artifacts by name, as their newest records say (released ones left out), sorted by name."""
    newest: dict[str, dict[str, Any]] = {}
    for rec in store.lookup(KIND_ARTIFACT, artifacts_key(ref)):
        name = rec.get("name")
        if rec.get("run") != ref or not isinstance(name, str):
            continue
        if name not in newest or _order(rec) >= _order(newest[name]):
            newest[name] = rec
    out = {}
    for name in sorted(newest):
        a = _parse(newest[name])
        if a is not None:
            out[name] = a
    return out


def last_time(store: Store, ref: str) -> float:
    """The latest time any artifact record of run ``ref`` carries, releases included: a resumed run stamps its
    records after it, so a host whose clock is behind never writes a record that an older one outranks."""
    return max((_time(r.get("time")) for r in store.lookup(KIND_ARTIFACT, artifacts_key(ref)) if r.get("run") == ref),
               default=0.0)


def _find(store: Store, ref: str, run_name: str, name: str) -> Artifact:
    arts = read_artifacts(store, ref)
    if name not in arts and isinstance(name, str):
        name = unicodedata.normalize("NFC", name)
    if name not in arts:
        from casmon.view.text import did_you_mean

        hint = did_you_mean(name, list(arts))
        raise LookupError(f"run {run_name} has no artifact {name!r}{f' ({hint})' if hint else ''}; it has: "
                          f"{', '.join(list(arts)[:50]) or 'none'}")
    return arts[name]


def load(store: Store, ref: str, run_name: str, name: str, mmap: bool = False) -> Any:
    """Artifact ``name``'s value (a file's bytes; a folder's listing ``{path: {digest, size, mode}}``)."""
    a = _find(store, ref, run_name, name)
    if a.kind == "folder":
        return _listing(store, a, run_name)
    return _value(store, a, run_name, mmap)


def _value(store: Store, a: Artifact, run_name: str, mmap: bool = False) -> Any:
    if a.kind == "file" or a.pieced:
        return pieces.read_all(store, a.digest, f"run {run_name}: artifact {a.name}", a.size)
    return store.get(a.digest, mmap=mmap)


def _listing(store: Store, a: Artifact, run_name: str) -> dict[str, dict[str, Any]]:
    got = load_data(store, a.digest, f"run {run_name}: folder artifact {a.name}", dict)
    files = got.get("files")
    if got.get(_FOLDER_TAG) != 1 or not isinstance(files, dict) or not all(
            isinstance(k, str) and isinstance(f, dict) and isinstance(f.get("digest"), str)
            and type(f.get("size")) is int and type(f.get("mode", 0o644)) is int for k, f in files.items()):
        raise DamagedObjectError(f"run {run_name}: folder artifact {a.name}", "not a listing of files")
    return files


def load_file(store: Store, ref: str, run_name: str, name: str, dest: str | os.PathLike[str]) -> Path:
    """Write artifact ``name`` to ``dest``: a file to that path (into it, under the artifact's last part, if it
    is a folder), a folder's files under that folder. Returns the path written."""
    return write_artifact(store, _find(store, ref, run_name, name), run_name, Path(os.fspath(dest)))


def write_artifact(store: Store, a: Artifact, run_name: str, out: Path) -> Path:
    """Write artifact ``a`` of run ``run_name`` to ``out`` as :func:`load_file` does; the path written."""
    try:
        return _write_out(store, a, run_name, out)
    except OSError as e:
        where = e.filename if isinstance(e.filename, str) else str(out)
        raise ArtifactWriteError(f"casmon: cannot write artifact {a.name!r} of run {run_name} to {where!r}: "
                                 f"{e.strerror or e}") from None


def _write_out(store: Store, a: Artifact, run_name: str, out: Path) -> Path:
    from casmon.runs.folders import UnsafePathError, safe_target, unsafe_path

    if a.kind == "folder":
        files = _listing(store, a, run_name)
        for rel in files:  # a crafted listing never writes outside dest, nor part of itself before it is refused
            why = unsafe_path(rel)
            if why is not None:
                raise UnsafePathError(f"casmon: folder artifact {a.name!r} of run {run_name}: refusing to write "
                                      f"{rel[:200]!r}: {why}")
        out.mkdir(parents=True, exist_ok=True)
        for rel, f in sorted(files.items()):
            target = safe_target(out, rel)  # and through no symlink found there
            _write(target, pieces.chunks(store, f["digest"], f"run {run_name}: {a.name}/{rel}", f["size"]), f.get("mode"))
        return out
    if out.is_dir():
        out = out / a.name.rsplit("/", 1)[-1]
    if a.kind == "file":
        _write(out, pieces.chunks(store, a.digest, f"run {run_name}: file artifact {a.name}", a.size), a.mode)
        return out
    if a.pieced:
        _write(out, pieces.chunks(store, a.digest, f"run {run_name}: artifact {a.name}", a.size), None)
        return out
    v = store.get(a.digest)
    if not isinstance(v, (bytes, bytearray, memoryview)):
        raise CasmonError(f"casmon: artifact {a.name!r} of run {run_name} is a {type(v).__name__}, not a file; "
                          f"load it with load_run(...).load({a.name!r})")
    _write(out, [bytes(v)], None)
    return out


def _write(path: Path, data: Iterable[bytes], mode: int | None) -> None:
    """``data`` to ``path`` whole or not at all, through a partial file of a fresh name created exclusively: a
    link planted where it goes is never followed, and a failed write leaves no partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # the name's first 64 bytes at most: a name that fits the file system's 255 bytes leaves room for the rest
    stem = os.fsencode(path.name)[:64].decode("utf-8", "ignore") if os.name != "nt" else path.name[:64]
    tmp = path.with_name(f".{stem}.{os.urandom(6).hex()}.casmon-partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0),
                 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            for b in data:  # a piece at a time: a large file is never whole in memory
                f.write(b)
        if mode is not None:
            os.chmod(tmp, mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def load_checkpoint(store: Store, ref: str, run_name: str, which: str | int = "latest") -> Any:
    """Checkpoint ``which`` (a step, or ``latest``: the highest step kept) of run ``ref``."""
    steps = {a.step: a for a in read_artifacts(store, ref).values() if a.kind == "checkpoint" and a.step is not None}
    if not steps:
        raise LookupError(f"run {run_name} has no checkpoints")
    if which == "latest":
        return _value(store, steps[max(steps)], run_name)
    step = _whole(which) if not isinstance(which, str) else int(which) if which.isascii() and which.isdigit() else None
    if step is None:
        raise ValueError(f"casmon: checkpoint: give a step or 'latest', got {which!r}")
    if step not in steps:
        raise LookupError(f"run {run_name} has no checkpoint at step {step}; it keeps steps "
                          f"{', '.join(map(str, sorted(steps)[-50:]))}")
    return _value(store, steps[step], run_name)


# -- dropping superseded records --------------------------------------------------------------------


def superseded_plan(store: Store) -> dict[tuple[bytes, bytes], tuple[bytes, float]]:
    """Artifact records a newer record of their run and name supersedes (replaced or released): ``(key, record
    bytes) -> (key, time)``. They still hold their values; :func:`drop_superseded` drops them."""
    from casmon.store.records import parse_record

    store.flush()
    newest: dict[tuple[bytes, str], tuple[tuple[float, int], bytes]] = {}
    parsed: list[tuple[bytes, bytes, str, tuple[float, int]]] = []
    for k, v in store.table(KIND_ARTIFACT).items():
        try:
            rec = parse_record(KIND_ARTIFACT, k, v)
        except DamagedObjectError:
            continue
        name = rec.get("name")
        if not isinstance(name, str):
            continue
        k, v = bytes(k), bytes(v)
        o = _order(rec)
        parsed.append((k, v, name, o))
        best = newest.get((k, name))
        if best is None or (o, v) > best:
            newest[(k, name)] = (o, v)
    return {(k, v): (k, o[0]) for k, v, name, o in parsed if newest[(k, name)][1] != v}


def drop_superseded(store: Store, plan: dict[tuple[bytes, bytes], Any] | None = None) -> int:
    """Drop the artifact records :func:`superseded_plan` names (each name keeps its newest record), under the
    store lock; the values only they held become unreachable for the gc that follows. Returns how many."""
    if plan is None:
        plan = superseded_plan(store)
    if not plan:
        return 0
    from casmon.store.lock import held

    try:
        with held(store.backend, "artifact cleanup", store.url):  # no merge may bring the dropped records back
            store.table(KIND_ARTIFACT).consolidate(force=True, keep=lambda k, v: (bytes(k), bytes(v)) not in plan)
    except OSError as e:
        raise StoreError(f"cannot drop replaced artifacts in {store.url}: {e.strerror or e}") from e
    return len(plan)
