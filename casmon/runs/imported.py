"""Runs brought in from elsewhere (TensorBoard, MLflow): written as casmon runs with their metrics and params.

An imported run has a manifest like a recorded one, without code state, and
``imported`` naming where it came from (``{"from": "mlflow", "id": ...}``), so
importing the same source again can skip it. Its metrics are records of kind
``metrics`` as ``run.log`` writes them, in batches of at most a million points.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import xxhash

from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint
from casmon.runs.params import key_text
from casmon.runs.manifest import KIND_RUN, PREFIX_RE, claim_run_number
from casmon.runs.metrics import (KIND_METRICS, batch_summary, check_name, json_safe, metrics_key, points_cell, points_summary,
                                 series_digest)
from casmon.store.store import Store

__all__ = ["write_run", "imported_ids", "BATCH_POINTS"]

#: Points of one metric per record (a stored value) when importing.
BATCH_POINTS = 1 << 20
STATUSES = ("ok", "failed", "killed", "lost", "running")


def _cell(store: Store, v: Any, refs: list[Digest]) -> Any:
    from casmon.runs.manifest import is_plain_json

    if is_plain_json(v):
        return v
    d = store.put(v)
    refs.append(d)
    return {"$": d.hex()}


def _cells(store: Store, values: Mapping[Any, Any] | None, refs: list[Digest]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in sorted((values or {}).items(), key=lambda kv: type(kv[0]) is not str):  # str keys keep their name
        out[key_text(k, out)] = _cell(store, v, refs)
    return out


def write_run(store: Store, *, prefix: str = "", comment: str = "", status: str = "ok", start: float,
              end: float | None = None, params: Mapping[str, Any] | None = None, info: Mapping[str, Any] | None = None,
              metrics: Mapping[str, tuple[Any, Any, Any]] | None = None, source: Mapping[str, Any] | None = None,
              host: str | None = None, user: str | None = None) -> str:
    """Write one run from elsewhere; returns its name. ``metrics``: name -> (steps, values, times), equal lengths."""
    if not PREFIX_RE.match(prefix):
        raise ValueError(f"write_run: prefix may hold letters, digits, '_', '.', '-' only: {prefix!r}")
    if status not in STATUSES:
        raise ValueError(f"write_run: status must be one of {', '.join(STATUSES)}, got {status!r}")
    n, ref = claim_run_number(store, prefix)
    name = f"{prefix}{n}" + (f"-{comment}" if comment else "")
    refs: list[Digest] = []
    summary: dict[str, dict[str, Any]] = {}
    for mname, (steps, values, times) in (metrics or {}).items():
        check_name(mname, "write_run")
        st = np.ascontiguousarray(steps, dtype="<i8")
        va = np.ascontiguousarray(values, dtype="<f8")
        ti = np.ascontiguousarray(times, dtype="<f8")
        if not (st.ndim == va.ndim == ti.ndim == 1 and len(st) == len(va) == len(ti)):
            raise ValueError(f"write_run: metric {mname!r}: steps, values and times must be 1-D and of one length")
        for seq, at in enumerate(range(0, len(st), BATCH_POINTS)):
            sl = slice(at, at + BATCH_POINTS)
            data = st[sl].tobytes() + va[sl].tobytes() + ti[sl].tobytes()
            k = len(st[sl])
            mrefs: list[Digest] = []
            cell = points_cell(store, data, k, mrefs, batch_summary(st[sl], va[sl], ti[sl]))
            store.append(KIND_METRICS, {"run": ref, "seq": seq, "s": {mname: cell}}, key=metrics_key(ref), refs=mrefs)
        if len(st):
            summary[mname] = {**json_safe(points_summary(st, va, ti)),
                              "digest": series_digest(xxhash.xxh3_128(st.tobytes()).digest(),
                                                      xxhash.xxh3_128(va.tobytes()).digest())}
    manifest: dict[str, Any] = {
        "casmon_run": 1, "name": name, "n": n, "prefix": prefix, "comment": comment, "status": status,
        "function": None, "start": float(start), "patch_time": float(start),
        "git": {"root": None, "in_git": False, "commit": None, "branch": None, "dirty": False, "untracked": [],
                "skipped": [], "notes": [], "patch": None},
        "files": {}, "tracking_records": {}, "host": host or "", "user": user or "", "argv": [], "env": {},
        "info": _cells(store, info, refs),
        "params": _cells(store, params, refs),
        "metrics": dict(sorted(summary.items())), "links": {"call_sessions": [], "cache": []},
        "imported": dict(source or {}),
    }
    if end is not None:
        manifest["end"] = float(end)
        manifest["duration"] = float(end) - float(start)
    d = store.put(manifest)
    store.append(KIND_RUN, {"name": name, "manifest": d.hex(), "status": status, "time": time.time(), "_ref": ref,
                            "_ref_target": d.hex()}, key=fingerprint(("casmon.run", ref)), refs=[d, *refs])
    store.flush()
    store.set_ref(ref, d, {"name": name, "status": status, "start": float(start), "metrics": {}})
    return name


def imported_ids(store: Store, source: str) -> set[str]:
    """The ``id`` of every run already imported from ``source`` ("tensorboard", "mlflow")."""
    from casmon.runs.listing import list_runs

    out = set()
    for r in list_runs(store):
        imp = r.manifest.get("imported")
        if isinstance(imp, dict) and imp.get("from") == source and isinstance(imp.get("id"), str):
            out.add(imp["id"])
    return out
