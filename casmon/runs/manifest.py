"""Run manifests: the record kind and refs of runs, and the checks a manifest passes before it is read.

A run manifest is JSON that casmon wrote, but a store may be damaged or crafted:
:func:`check_run_manifest` gives :class:`~casmon.errors.DamagedObjectError` for
fields of the wrong type, so readers never fail later with a ``TypeError``.
"""

from __future__ import annotations

import json
import re
import time
from typing import TYPE_CHECKING, Any, NoReturn

from casmon.errors import DamagedObjectError

if TYPE_CHECKING:
    from casmon.store.store import Store

__all__ = ["KIND_RUN", "RUN_REFS", "HEAVY", "PREFIX_RE", "claim_run_number", "check_run_manifest", "is_value_ref", "is_plain_json", "is_json"]

KIND_RUN = "run"  # one record per run, keyed by its ref: lists every value the run needs, for gc
RUN_REFS = "runs"  # refs runs/{prefix}{n} claim run numbers and point at the newest manifest
#: What a run prefix may hold (run names are ``{prefix}{n}[-{comment}]``).
#: Manifest fields a listing does not show: left out of the runs index's entries (casmon.runs.index), read from
#: the manifest when asked for (:class:`~casmon.runs.listing.IndexedManifest`).
HEAVY = frozenset(("files", "env", "links", "tracking_records", "argv", "executable", "cwd", "python", "packages",
                   "output", "traceback", "patch_time", "casmon_run", "pid", "imported", "heartbeat_s", "resumes"))

PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]*$")


def claim_run_number(store: Store, prefix: str) -> tuple[int, str]:
    """``(n, ref)``: the first free ``runs/{prefix}{n}`` above those taken, made create-if-absent (two processes
    claiming at once never get one number)."""
    taken = []
    for name in store.refs(RUN_REFS):
        tail = name[len(RUN_REFS) + 1 :]
        if tail.startswith(prefix) and tail[len(prefix) :].isdigit():
            taken.append(int(tail[len(prefix) :]))
    n = max(taken, default=0) + 1
    while True:
        ref = f"{RUN_REFS}/{prefix}{n}"
        if store.create_ref(ref, None, {"status": "claimed", "time": time.time()}):
            return n, ref
        n += 1


def is_plain_json(v: Any) -> bool:
    """True for JSON built of plain types only (no ``{"$": ...}``, which a manifest reads as a stored value).
    Walked with a stack, not recursion: parameters nested hundreds deep are plain too."""
    todo = [v]
    while todo:
        x = todo.pop()
        t = type(x)
        if t in (str, int, float, bool, type(None)):
            continue
        if t is list:
            todo.extend(x)
        elif t is dict:
            if set(x) == {"$"} or not all(type(k) is str for k in x):
                return False
            todo.extend(x.values())
        else:
            return False
    return True


def is_json(v: Any) -> bool:
    """True if ``json.dumps`` takes ``v``."""
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def is_value_ref(v: Any) -> bool:
    """True for a manifest cell that names a stored value, ``{"$": digest}``."""
    return isinstance(v, dict) and set(v) == {"$"}


_MANIFEST_TYPES: dict[str, type | tuple[type, ...]] = {"name": str, "comment": str, "status": str, "prefix": str, "git": dict, "files": dict,
                   "tracking_records": dict, "info": dict, "links": dict, "argv": list, "env": dict,
                   "start": (int, float), "end": (int, float), "duration": (int, float), "patch_time": (int, float),
                   "n": int, "output": str, "packages": str, "traceback": str, "error": str, "function": str,
                   "host": str, "user": str, "python": str, "executable": str, "cwd": str, "pid": int, "notebook": str,
                   "params": dict, "metrics": dict, "heartbeat_s": (int, float), "signal": str,
                   "signal_time": (int, float), "imported": dict, "resumes": list, "tags": list, "parent": str}
#: The fields that hold times or durations in seconds.
_MANIFEST_SECONDS = frozenset(("start", "end", "duration", "patch_time", "signal_time", "heartbeat_s"))
#: Fields a crafted manifest may hold as null that readers take as empty.
_NONE_AS: dict[str, Any] = {"git": dict, "files": dict, "tracking_records": dict, "info": dict, "links": dict,
                            "env": dict, "params": dict, "argv": list}


def check_run_manifest(m: dict, where: str) -> None:
    """Types of the fields readers use; a crafted manifest gives DamagedObjectError, not a TypeError later.
    Only the fields there are cost anything (a listing checks many slim manifests, casmon.runs.index)."""
    def bad(why: str) -> NoReturn:
        raise DamagedObjectError(where, f"not a valid run manifest: {why}")

    for k, v in m.items():
        t = _MANIFEST_TYPES.get(k)
        if t is None or v is None:
            if v is None and k in _NONE_AS:
                m[k] = _NONE_AS[k]()  # readers use m.get(k, {})
            continue
        if not isinstance(v, t) or type(v) is bool:
            bad(f"{k} is a {type(v).__name__}")
        seconds: Any = v
        if k in _MANIFEST_SECONDS and not 0 <= seconds < 1e11:  # readers turn them into dates and floats
            bad(f"{k} is {str(v)[:40]}, not a time")
    g = m.get("git")
    if g:
        for k in ("root", "commit", "branch", "patch"):
            if g.get(k) is not None and not isinstance(g[k], str):
                bad(f"git.{k} is not a string")
        for k in ("untracked", "skipped", "notes"):
            if not isinstance(g.get(k, []), list) or not all(isinstance(x, str) for x in g.get(k, [])):
                bad(f"git.{k} is not a list of strings")
    if "argv" in m and not all(isinstance(x, str) for x in m.get("argv") or []):
        bad("argv is not a list of strings")
    for path, f in (m.get("files") or {}).items():
        if (not isinstance(f, dict) or not isinstance(f.get("digest"), str) or type(f.get("size", 0)) is not int
                or type(f.get("mode", 0o644)) is not int):
            bad(f"tracked file {path[:80]!r} is not {{digest, size, mode}}")
    links = m.get("links") or {}
    if links:
        cache = links.get("cache", [])
        if not isinstance(cache, list) or not all(isinstance(e, dict) and all(isinstance(e.get(x), str)
                                                                              for x in ("fn", "key", "result"))
                                                  for e in cache):
            bad("links.cache is not a list of {fn, key, result}")
        if not isinstance(links.get("call_sessions", []), list) or not all(type(x) is int for x in links.get("call_sessions", [])):
            bad("links.call_sessions is not a list of session numbers")
