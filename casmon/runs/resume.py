"""Resuming a run: ``casmon.record(resume=RUN)`` continues a killed, lost or failed run as the same run.

The resumed run keeps its name, number and ref. Before it writes anything, the
resumer claims the resume with a create-if-absent ref ``resumes/{run}/{k}``
(``k`` one above the claims made so far), as run numbers are claimed: of two
processes resuming one run at once exactly one creates it; the other is told
who holds the run. A claim the manifest does not list yet is a resume under
way; it is passed over only once its holder is seen dead (same host, no such
process) or is older than a lost run's heartbeats.

What carries over: the run's start, name, comment and parent; its params (those given
to ``record`` win over the stored ones of the same name); its info; its metrics
(the step counter continues after the highest step flushed; a point of a
metric at or below that metric's highest flushed step is skipped with a
warning, so a loop replayed from an earlier checkpoint logs each step once);
its output (the earlier output, a line saying the run was resumed, then this
process's); its artifacts and checkpoints (``run.checkpoint_latest()``). The
code state, host, pid, argv and environment are this process's. The manifest's
``resumes`` lists each resume: when, where, the status the run had, and the
manifest it had then (kept by gc with the run).
"""

from __future__ import annotations

import math
import os
import socket
import time
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import xxhash

from casmon import faultpoints
from casmon.errors import CasmonError
from casmon.runs import artifacts, live
from casmon.runs.manifest import RUN_REFS
from casmon.runs.metrics import KIND_METRICS, metrics_key, points_summary

if TYPE_CHECKING:
    from casmon.runs.listing import RunInfo
    from casmon.runs.recorder import Run
    from casmon.store.store import Store

__all__ = ["RESUME_REFS", "ResumeError", "check_which", "attach", "whole_output", "claim_refs", "resuming", "holder_alive"]

RESUME_REFS = "resumes"


class ResumeError(CasmonError):
    """A run cannot be resumed (it runs elsewhere, another process resumes it, it ended ok, ...)."""


def check_which(which: Any) -> Any:
    """``record(resume=...)``'s argument checked: a name, a number, ``latest``, or a RunInfo."""
    if which is None or isinstance(which, (str, int)) and not isinstance(which, bool):
        if isinstance(which, str) and not which.strip():
            raise ValueError("casmon.record: resume= is empty; give a run's name or number, or 'latest'")
        return which
    if isinstance(getattr(which, "ref", None), str) and hasattr(which, "manifest"):
        return which
    raise TypeError(f"casmon.record: resume= takes a run's name or number, 'latest' or a RunInfo, "
                    f"got {type(which).__name__}")


def claim_refs(store: Store, ref: str) -> dict[int, dict[str, Any]]:
    """The resume claims of run ``ref``: claim number -> the claim's data."""
    base = f"{RESUME_REFS}/{ref.split('/', 1)[-1]}"
    out: dict[int, dict[str, Any]] = {}
    for name in store.refs(base):
        tail = name[len(base) + 1:]
        if tail.isdigit():
            r = store.get_ref(name)
            out[int(tail)] = r.data if r is not None and isinstance(r.data, dict) else {}
    return out


def _alive(host: Any, pid: Any) -> bool | None:
    """Whether process ``pid`` on ``host`` lives: None when that cannot be told from here (another host)."""
    if host != socket.gethostname() or type(pid) is not int or pid <= 0:
        return None
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # someone else's process (or a crafted pid: no claim that it is gone)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] != b"Z"  # a zombie is dead: killed, not yet reaped
    except (OSError, IndexError):
        return True


def holder_alive(manifest: dict[str, Any]) -> bool:
    """Whether the process a run's manifest names is known to live (on this host; another host's cannot be told)."""
    return _alive(manifest.get("host"), manifest.get("pid")) is True


def _stale(claim: dict[str, Any], every: float) -> bool:
    t = claim.get("time")
    if claim.get("pid") == os.getpid() and claim.get("host") == socket.gethostname():
        return True  # this process's own resume that failed after its claim: a resume is done in one call
    if _alive(claim.get("host"), claim.get("pid")) is False:
        return True
    fresh = isinstance(t, (int, float)) and math.isfinite(t) and time.time() - t <= live.LOST_AFTER * every
    return not fresh


def _holder_check(info: RunInfo, resume_ok: bool) -> str:
    """The status the run has, after refusing what cannot be resumed."""
    m, status = info.manifest, info.status
    if info.error is not None:
        raise ResumeError(f"casmon: cannot resume run {info.name}: it cannot be read ({info.error})")
    if status == "running":
        alive = _alive(m.get("host"), m.get("pid"))
        if alive is not False:
            hb = info.heartbeat
            ago = f", last heartbeat {time.time() - hb:.0f} s ago" if hb is not None else ""
            raise ResumeError(f"casmon: cannot resume run {info.name}: it is running in process {m.get('pid')} on "
                              f"{m.get('host')}{ago}; resume it once that process has ended (or the run is lost)")
        status = "lost"  # its process is gone: killed before it could say so
    elif status == "claimed":
        raise ResumeError(f"casmon: cannot resume run {info.name}: it is only claimed, its start not yet written")
    elif status == "ok" and not resume_ok:
        raise ResumeError(f"casmon: run {info.name} ended ok; to continue it anyway pass resume_ok=True")
    return status


def resuming(store: Store, info: RunInfo, every: float | None = None) -> dict[str, Any] | None:
    """The claim of a resume of ``info`` under way in another live process (claimed, not yet in the manifest),
    or None. ``every``: the heartbeat period its age is judged by (this process's by default)."""
    m = info.manifest
    done = {e["claim"] for e in m.get("resumes") or [] if isinstance(e, dict) and type(e.get("claim")) is int}
    for k, c in claim_refs(store, info.ref).items():
        if c.get("start") == m.get("start") and k not in done \
                and not _stale(c, live.heartbeat_seconds() if every is None else every):
            return c
    return None


def _claim(store: Store, info: RunInfo, every: float, status: str) -> int:
    """Claim the next resume of ``info`` (read before the claims are listed): its number, or a ResumeError."""
    m = info.manifest
    c = resuming(store, info, every)
    if c is not None:
        raise ResumeError(f"casmon: cannot resume run {info.name}: process {c.get('pid')} on {c.get('host')} "
                          f"is resuming it")
    claims = {k: c for k, c in claim_refs(store, info.ref).items() if c.get("start") == m.get("start")}
    k = max(claims, default=0) + 1
    data = {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time(), "start": m.get("start"),
            "status": status}
    if not store.create_ref(f"{RESUME_REFS}/{info.ref.split('/', 1)[-1]}/{k}", None, data):
        got = store.get_ref(f"{RESUME_REFS}/{info.ref.split('/', 1)[-1]}/{k}")
        c = got.data if got is not None and isinstance(got.data, dict) else {}
        raise ResumeError(f"casmon: cannot resume run {info.name}: process {c.get('pid')} on {c.get('host')} "
                          f"resumes it (it claimed the resume first)")
    return k


def _carry_tags(run: Run, store: Store, info: Any) -> None:
    """The resumed run keeps its tags (the manifest's first ones and every edit since); tags the resume adds
    are one more edit, so no older edit that removed them removes them again."""
    from casmon.runs import tags

    old = info.manifest.get("tags")
    run.manifest["tags"] = old if isinstance(old, list) else []
    now = info.tags
    new = [t for t in run.tags if t not in now]
    if new:
        tags.append_edit(store, info.ref, info.manifest.get("start"), add=new)
    run._tags = tags.RunTags(run, (*now, *new))


def attach(run: Run, which: Any, resume_ok: bool, params: dict[str, Any]) -> None:
    """Make ``run`` (not yet written) the continuation of run ``which``: claim it, then carry over its name,
    start, params, info, metrics, output and checkpoints (see the module's text)."""
    from casmon.runs.listing import load_run

    store = run.store
    if store is None:
        raise ResumeError(f"casmon: cannot resume run {which}: the store cannot be opened")
    info = load_run(which.ref if hasattr(which, "manifest") else which, store)
    status = _holder_check(info, resume_ok)
    prior = store.get_ref(info.ref)
    k = _claim(store, info, run._heartbeat_s, status)
    faultpoints.point("resume.after_claim")
    now = store.get_ref(info.ref)
    if (now.target if now else None) != (prior.target if prior else None):
        raise ResumeError(f"casmon: cannot resume run {info.name}: another process wrote it meanwhile")
    old = info.manifest
    m = run.manifest
    entry: dict[str, Any] = {"claim": k, "time": time.time(), "host": m["host"], "pid": m["pid"], "status": status,
                             "manifest": prior.target.hex() if prior and prior.target else None}
    for f in ("signal", "error"):
        if isinstance(old.get(f), str):
            entry[f] = old[f]
    for f in ("n", "prefix", "comment", "start", "function", "parent"):  # a nested run stays its parent's child
        if f in old:
            m[f] = old[f]
    m["name"] = info.name
    _carry_tags(run, store, info)
    m["resumes"] = [e for e in old.get("resumes") or [] if isinstance(e, dict)] + [entry]
    run.name, run.n, run.ref = info.name, m.get("n", 0), info.ref
    run._refs_extra = [prior.target] if prior and prior.target else []
    try:
        run.params = {**info.params(), **params}
        run.info = dict(info.info())
    except CasmonError as e:
        from casmon.runs.recorder import RunWarning

        warnings.warn(f"casmon.record: resuming run {info.name}: its params or info cannot be read ({e}); "
                      "they start empty", RunWarning, stacklevel=4)
    _seed_metrics(run, store, info)
    run._out_seq = 1 + max((r.get("seq") for r in store.lookup(live.KIND_RUNOUT, live.output_key(info.ref))
                            if type(r.get("seq")) is int), default=-1)
    try:
        run._prior_output = info.output()
    except CasmonError:
        run._prior_output = ""
    run._resume_line = (f"--- casmon: run {info.name} resumed ({len(m['resumes'])}) on {m['host']} by process "
                        f"{m['pid']} at {time.strftime('%Y-%m-%d %H:%M:%S')}, after it was {status} ---\n")
    held = artifacts.read_artifacts(store, info.ref)
    run._held.checkpoints = sorted(a.step for a in held.values() if a.kind == "checkpoint" and a.step is not None)
    run._held.last_time = artifacts.last_time(store, info.ref)
    # Checked again after the carry-over: a deletion meanwhile (claims first, then the ref) must not be undone by
    # this run's first write.
    base = f"{RESUME_REFS}/{info.ref.split('/', 1)[-1]}"
    now = store.get_ref(info.ref)
    if store.get_ref(f"{base}/{k}") is None or (now.target if now else None) != (prior.target if prior else None):
        raise ResumeError(f"casmon: cannot resume run {info.name}: it was deleted or written by another process "
                          f"while it was being resumed")
    run.resumed_from = info
    faultpoints.point("resume.after_attach")


def _seed_metrics(run: Run, store: Store, info: RunInfo) -> None:
    """The run's metric log continues the flushed points: summaries, digests, batch numbers and step counter."""
    log = run._metrics
    seqs = [r.get("seq") for r in store.lookup(KIND_METRICS, metrics_key(info.ref)) if r.get("run") == info.ref]
    series = info.metrics()
    with log.lock:
        log.seq = log.hash_next = 1 + max((s for s in seqs if type(s) is int), default=-1)
        top = -1
        for name, s in series.items():
            log.names.add(name)
            h = log.hashers[name] = (xxhash.xxh3_128(), xxhash.xxh3_128())
            h[0].update(s.steps.astype("<i8").tobytes())
            h[1].update(s.values.astype("<f8").tobytes())
            if len(s):
                log.summary[name] = points_summary(s.steps, s.values, s.times)
                log.last_seq[name] = log.seq - 1
                log.floor[name] = int(np.max(s.steps))
                if not name.startswith("sys/"):  # system metrics count their own steps (runs.sysmetrics)
                    top = max(top, log.floor[name])
        log.step = top + 1


def whole_output(run: Run, text: str | None) -> str | None:
    """What the run's manifest keeps as its output: a resumed run's earlier output, then this process's."""
    prior = getattr(run, "_prior_output", None)
    if prior is None:
        return text
    sep = "" if not prior or prior.endswith("\n") else "\n"
    return prior + sep + run._resume_line + (text or "")
