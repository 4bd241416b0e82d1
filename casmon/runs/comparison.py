"""Comparing two runs: code, tracked files, metadata, info, and results for the same inputs.

Nothing is unpickled: info values are compared by digest (equal content, equal
digest) and described from their manifests; results by the cache entries and
logged calls each run used.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from typing import Any

import xxhash

from casmon.calllog import CallLog
from casmon.errors import CasmonError
from casmon.keys.fingerprint import fingerprint
from casmon.runs import sysmetrics
from casmon.runs.listing import RunInfo, info_cell, load_run, readable_run
from casmon.runs.manifest import is_value_ref
from casmon.runs.metrics import series_digest
from casmon.store.peek import compare as compare_values
from casmon.store.store import Store
from casmon.view import display

__all__ = ["diff"]


def diff(a: RunInfo | str, b: RunInfo | str, store: Store | str | None = None) -> dict[str, Any]:
    """What differs between two runs: code, tracked files, metadata, params, metrics (by digest; the last values
    of those that differ), info, and results for the same inputs."""
    ra = readable_run(a if isinstance(a, RunInfo) else load_run(a, store))
    rb = readable_run(b if isinstance(b, RunInfo) else load_run(b, store))
    ma, mb = ra.manifest, rb.manifest
    ga, gb = ma.get("git", {}), mb.get("git", {})
    out: dict[str, Any] = {"a": ra.name, "b": rb.name, "same_manifest": ra.digest == rb.digest}
    out["commit"] = {"a": ga.get("commit"), "b": gb.get("commit"), "same": ga.get("commit") == gb.get("commit")}
    same_patch = ga.get("patch") == gb.get("patch")
    out["patch"] = {"same": same_patch}
    if not same_patch:
        pa = ra.patch().decode("utf-8", "replace").splitlines(keepends=True)
        pb = rb.patch().decode("utf-8", "replace").splitlines(keepends=True)
        out["patch"]["diff"] = "".join(difflib.unified_diff(pa, pb, f"{ra.name}.patch", f"{rb.name}.patch"))
    fa, fb = ma.get("files", {}), mb.get("files", {})
    out["files"] = {
        "added": sorted(set(fb) - set(fa)),
        "removed": sorted(set(fa) - set(fb)),
        "changed": sorted(p for p in set(fa) & set(fb) if fa[p]["digest"] != fb[p]["digest"]),
    }
    meta = {}
    for k in ("notebook", "python", "host", "user", "executable", "argv", "env", "status", "function", "comment"):
        va, vb = (ra.status, rb.status) if k == "status" else (ma.get(k), mb.get(k))  # lost is read, not written
        if k == "argv":  # a kernel's command line names a temporary connection file: the notebook line says more
            va, vb = (None if ma.get("notebook") else va), (None if mb.get("notebook") else vb)
        if va != vb:
            meta[k] = {"a": va, "b": vb}
    if ma.get("packages") != mb.get("packages"):
        ka, kb = ra.packages(), rb.packages()
        meta["packages"] = {p: {"a": ka.get(p), "b": kb.get(p)} for p in sorted(set(ka) | set(kb)) if ka.get(p) != kb.get(p)}
    out["meta"] = meta
    ia, ib = ma.get("info", {}), mb.get("info", {})  # compared as stored: a digest stands for its value
    out["info"] = {k: {"a": info_cell(ra, ia.get(k)), "b": info_cell(rb, ib.get(k))} for k in sorted(set(ia) | set(ib), key=str)
                   if (k in ia) != (k in ib) or not _same_cell(ia.get(k), ib.get(k))}  # None is no absence
    for k, cell in out["info"].items():  # two stored values: how they differ (arrays element by element), nothing unpickled
        if is_value_ref(ia.get(k)) and is_value_ref(ib.get(k)) and ra.store.url == rb.store.url:
            cell["how"] = compare_values(ra.store, ia[k]["$"], ib[k]["$"])
    fa, fb = ra.flat_params(), rb.flat_params()
    out["params"] = {k: {"a": fa.get(k), "b": fb.get(k)} for k in sorted(set(fa) | set(fb))
                     if (k in fa) != (k in fb) or not _same_cell(fa.get(k), fb.get(k))}
    sa, sb = ra.metric_summary(), rb.metric_summary()
    da, db = _digests(ra, sa, sb), _digests(rb, sb, sa)
    out["metrics"] = {k: {"a": (sa.get(k) or {}).get("last"), "b": (sb.get(k) or {}).get("last"),
                          "n": [(sa.get(k) or {}).get("n"), (sb.get(k) or {}).get("n")]}
                      for k in sysmetrics.users_first(set(sa) | set(sb))  # the sampled sys/ ones last
                      if da.get(k) is None or da.get(k) != db.get(k)}
    out["results"] = _result_differences(ra, rb)
    return display.RunDiff(out, ra, rb)  # a dict that shows itself (patch in colour, info side by side)


def _digests(r: RunInfo, mine: dict[str, Any], other: dict[str, Any]) -> dict[str, str | None]:
    """Each metric's digest: the summary's, or (a run that did not end, whose summary has none) of its points,
    read only where the other run has the metric too and as many points."""
    out: dict[str, str | None] = {k: v.get("digest") for k, v in mine.items()}
    need = [k for k, v in out.items() if v is None and k in other and (other[k] or {}).get("n") == mine[k].get("n")]
    if need:
        try:
            series = r.metrics()
        except CasmonError:
            return out
        for k in need:
            s = series.get(k)
            if s is not None:
                out[k] = series_digest(xxhash.xxh3_128(s.steps.astype("<i8").tobytes()).digest(),
                                       xxhash.xxh3_128(s.values.astype("<f8").tobytes()).digest())
    return out


def _same_cell(a: Any, b: Any) -> bool:
    """Info entries compared without loading anything: stored values by digest (equal content, equal digest)."""
    if is_value_ref(a) or is_value_ref(b):
        return a == b
    try:
        return fingerprint(a) == fingerprint(b)
    except TypeError:
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
    except RecursionError:  # nested deeper than the hasher walks: JSON, compared with a stack
        return _same_json(a, b)


def _same_json(a: Any, b: Any) -> bool:
    todo = [(a, b)]
    while todo:
        x, y = todo.pop()
        if type(x) is not type(y):
            return False
        if type(x) is list:
            if len(x) != len(y):
                return False
            todo.extend(zip(x, y))
        elif type(x) is dict:
            if x.keys() != y.keys():
                return False
            todo.extend((x[k], y[k]) for k in x)
        elif x != y and not (x != x and y != y):  # NaN is NaN here, as stored
            return False
    return True


def _made_during(manifest: dict, sessions: list[int]) -> Callable[[Any], bool]:
    """Whether a logged call belongs to the run: its session, and made between the run's start and end.

    Runs recorded one after another in one process share a call-log session, so
    the session alone would pair one run's calls with another's.
    """
    start = manifest.get("start")
    end = manifest.get("end")
    lo = start if type(start) in (int, float) else float("-inf")
    hi = end if type(end) in (int, float) else float("inf")
    return lambda c: c.session in sessions and lo <= c.start <= hi


def _result_differences(ra: RunInfo, rb: RunInfo) -> list[dict]:
    """Functions that returned different results for the same inputs in the two runs."""
    out: dict[str, dict] = {}
    ca = {e["key"]: e for e in ra.manifest.get("links", {}).get("cache", [])}
    for e in rb.manifest.get("links", {}).get("cache", []):
        other = ca.get(e["key"])
        if other is not None and other["result"] != e["result"]:
            out.setdefault(e["fn"], {"function": e["fn"], "via": "cache", "calls": 0})["calls"] += 1
    sa = ra.manifest.get("links", {}).get("call_sessions", [])
    sb = rb.manifest.get("links", {}).get("call_sessions", [])
    if sa and sb:
        log = CallLog(ra.store)
        in_a, in_b = _made_during(ra.manifest, sa), _made_during(rb.manifest, sb)
        for fn in log.functions:
            by_inputs: dict[str, str] = {}
            for c in log.calls(fn):
                if in_a(c) and c.result_recorded and c.exception is None:
                    by_inputs[json.dumps([c.args_cells, c.kwargs_cells], sort_keys=True)] = json.dumps(c.result_cell, sort_keys=True)
            for c in log.calls(fn):
                if in_b(c) and c.result_recorded and c.exception is None:
                    key = json.dumps([c.args_cells, c.kwargs_cells], sort_keys=True)
                    if key in by_inputs and by_inputs[key] != json.dumps(c.result_cell, sort_keys=True):
                        out.setdefault(fn, {"function": fn, "via": "call log", "calls": 0})["calls"] += 1
    return list(out.values())

