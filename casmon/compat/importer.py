"""``import_path`` (the ``casmon import`` verb): keep the history callmonitor 0.3 and FineCache 0.1 left in folders.

What is read:

* a **callmonitor folder** (``call-monitor*``: ``db.pkl`` and ``{name}/{n}/``
  folders holding ``input_descriptor.pkl``, ``arg_*.npy`` and whatever a custom
  ``Handler`` saved) becomes one call-log session. Functions keep callmonitor's
  ``__name__`` (callmonitor knew no module); one ``__name__`` used with two
  signatures becomes ``sig1.name``, ``sig2.name``, so the compat ``DB`` still
  numbers them together. A custom handler's files are kept as the value, under
  the handler's name, and load again once the handler is registered
  (``REGISTRY.add``). A folder without ``db.pkl`` (a killed run) is read from its
  call folders.
* **FineCache cache files** (``*.pk``: pickled ``{func, module, args, kwargs,
  result, runtime}``) become calls of ``module.func`` with their results, one
  session per import.
* **FineCache run folders** (``{prefix}{n}[-{comment}]`` holding
  ``information.json``, ``console.log``, ``current_changes.patch`` and tracked
  files) become runs with the same name and number when the store has that
  number free (else the next free number, reported).

Values are stored by content, so an array passed a hundred times, or a config
file tracked by every run, is stored once. Each imported folder, cache file and
run is remembered by the digest of its content (a ref ``imports/{digest}``,
written once it is imported): importing the same data again adds nothing (run
one import at a time: two at the same moment can both import a folder). A run
folder ``casmon.compat.finecache`` wrote for a run the store holds is
recognised as that run.

**Pickles.** callmonitor and FineCache keep their data as pickles, and loading
a pickle can run code. By default only pickles that name nothing but
callmonitor's own classes and plain data types (numbers, strings, containers,
numpy arrays, dates, ``inspect.FullArgSpec``) are loaded -- nothing the pickle
names is called; a value that needs any other class is recorded as not stored
and reported. ``trust=True`` (``casmon import --trust``) loads everything, as
callmonitor's and FineCache's own ``load`` would: only for folders you trust.
"""

from __future__ import annotations

import _compat_pickle
import datetime as _dt
import json
import os
import pickle
import re
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from casmon.calllog import KIND_CALLFN, KIND_CALLS, KIND_SESSION, NOT_RECORDED, SESSION_REFS, INLINE_STR, SCALARS, type_name
from casmon.keys.digest import Digest
from casmon.errors import CasmonError
from casmon.keys.fingerprint import fingerprint
from casmon.runs import KIND_RUN, RUN_REFS, PREFIX_RE, vcs_component
from casmon.scrub import scrub
from casmon.store.store import Store, default_store

__all__ = ["import_path", "ImportReport", "ImportSourceError", "handler_value_name"]


def handler_value_name(module: str, qualname: str) -> str:
    """The casmon handler name a callmonitor ``Handler`` subclass stores its files under.

    Both sides use it: an import stores a custom handler's files under it, and
    ``compat.callmonitor`` registers the handler under it to load them again.
    """
    return f"callmonitor:{module}.{qualname}"


IMPORT_REFS = "imports"
_BATCH = 5_000  # calls per record
_RUN_FILES = ("information.json", "console.log", "current_changes.patch")


class ImportSourceError(CasmonError, ValueError):
    """The path holds nothing casmon can import, or something it cannot read."""


@dataclass
class ImportReport:
    """What an import did: counts, and why anything was left out."""

    source: str
    sessions: int = 0
    calls: int = 0
    cache_files: int = 0
    runs: int = 0
    values: int = 0  # argument, result and file values stored
    distinct: int = 0  # of them distinct by content (the rest were stored once: deduplicated)
    already: int = 0  # folders, cache files and runs imported before (skipped)
    not_stored: int = 0  # values that could not be loaded or stored (each says why in its call)
    renumbered: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    _seen: set = field(default_factory=set, repr=False)

    @property
    def deduplicated(self) -> int:
        return self.values - self.distinct

    def _value(self, d: Digest) -> None:
        self.values += 1
        if d not in self._seen:
            self._seen.add(d)
            self.distinct += 1

    def as_dict(self) -> dict:
        return {"source": self.source, "sessions": self.sessions, "calls": self.calls, "cache_files": self.cache_files,
                "runs": self.runs, "values": self.values, "distinct_values": self.distinct,
                "deduplicated_values": self.deduplicated, "already_imported": self.already,
                "not_stored": self.not_stored, "renumbered": self.renumbered, "notes": self.notes}

    def summary(self) -> str:
        lines = [f"imported from {self.source}: {self.calls} call(s) in {self.sessions} session(s) "
                 f"({self.cache_files} FineCache cache file(s)), {self.runs} run(s)",
                 f"values: {self.values} stored, {self.distinct} distinct ({self.deduplicated} deduplicated)"]
        if self.already:
            lines.append(f"already imported, skipped: {self.already}")
        if self.not_stored:
            lines.append(f"values not stored: {self.not_stored} (each call says why; --trust loads classes it names)")
        lines += [f"renumbered: {r}" for r in self.renumbered]
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# Reading pickles
# ---------------------------------------------------------------------------


class Unresolved:
    """Stands for an object of a class the import did not load (callmonitor's own, or one not allowed).

    Building it runs nothing: it keeps the arguments and state the pickle gives.
    Storing it fails with a message naming the class.
    """

    _module = "?"
    _qualname = "?"
    _why = ""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._args = args

    def __setstate__(self, state: Any) -> None:
        self.__dict__["_state"] = state

    @property
    def state(self) -> dict:
        st = self.__dict__.get("_state")
        if isinstance(st, tuple) and len(st) == 2:  # (dict, slots)
            st = {**(st[0] or {}), **(st[1] or {})}
        return st if isinstance(st, dict) else {}

    def __reduce__(self):
        raise TypeError(f"it needs {self._module}.{self._qualname}, {self._why}")

    def __repr__(self) -> str:
        return f"<unresolved {self._module}.{self._qualname}>"


_unresolved_types: dict[tuple[str, str, str], type] = {}


def _unresolved(module: str, name: str, why: str) -> type:
    key = (module, name, why)
    t = _unresolved_types.get(key)
    if t is None:
        t = _unresolved_types[key] = type(name.rsplit(".", 1)[-1], (Unresolved,),
                                          {"_module": module, "_qualname": name, "_why": why})
    return t


#: Globals a pickle may name without ``--trust``: constructors of plain data that run no user code.
_SAFE_GLOBALS = frozenset({
    ("builtins", "int"), ("builtins", "float"), ("builtins", "str"), ("builtins", "bool"), ("builtins", "list"),
    ("builtins", "dict"), ("builtins", "tuple"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"), ("builtins", "slice"),
    ("builtins", "range"), ("builtins", "bytearray"), ("builtins", "bytes"), ("_codecs", "encode"),
    ("collections", "OrderedDict"), ("collections", "deque"), ("inspect", "FullArgSpec"),
    ("datetime", "datetime"), ("datetime", "date"), ("datetime", "time"), ("datetime", "timedelta"),
    ("datetime", "timezone"), ("decimal", "Decimal"), ("fractions", "Fraction"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
    ("numpy", "ndarray"), ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),  # protocol 5 arrays
})


class _ImportUnpickler(pickle.Unpickler):
    """callmonitor's classes are never imported (read as :class:`Unresolved`); other globals only if trusted."""

    def __init__(self, file, trust: bool) -> None:
        super().__init__(file)
        self._trust = trust

    def find_class(self, module: str, name: str):
        # Python 2 names in protocol 0-2 streams (__builtin__.set), as pickle's own find_class maps them
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if module == "callmonitor" or module.startswith("callmonitor.") or module == "FineCache" or module.startswith("FineCache."):
            return _unresolved(module, name, "a class of the tool the data came from")
        if (module, name) in _SAFE_GLOBALS:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # numpy.core is numpy._core since 2.0
                return super().find_class(module, name)
        if not self._trust:
            return _unresolved(module, name, "which is loaded only with --trust (loading it can run its code)")
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError) as e:
            return _unresolved(module, name, f"which cannot be imported here ({type(e).__name__}: {e})")


def _load_pickle(path: Path, trust: bool) -> Any:
    with open(path, "rb") as f:
        try:
            return _ImportUnpickler(f, trust).load()
        except Exception as e:  # noqa: BLE001 - a damaged or foreign file: say which
            raise ImportSourceError(f"{path}: cannot read this pickle: {type(e).__name__}: {str(e)[:200]}") from None


# ---------------------------------------------------------------------------
# Writing
# ---------------------------------------------------------------------------


class _Writer:
    """Cells, sessions and markers in the target store."""

    def __init__(self, store: Store, report: ImportReport, progress=None) -> None:
        self.store = store
        self.report = report
        self.progress = progress or (lambda phase, done, total: None)

    def cell(self, v: Any, refs: set) -> Any:
        t = type(v)
        if t in SCALARS and (t is not str or len(v) <= INLINE_STR):
            return v
        if isinstance(v, _NotLoaded):
            self.report.not_stored += 1
            return {"!": v.type_name, "why": v.why[:200]}
        try:
            d = self.store.put(v)
        except Exception as e:  # noqa: BLE001 - one bad value costs that value, not the import
            self.report.not_stored += 1
            return {"!": type_name(v) if not isinstance(v, Unresolved) else f"{v._module}.{v._qualname}",
                    "why": scrub(str(e)[:200])}
        self.report._value(d)
        refs.add(d.hex())
        return {"$": d.hex()}

    def put_value(self, v: Any, refs: list) -> str:
        d = self.store.put(v)
        self.report._value(d)
        refs.append(d)
        return d.hex()

    def imported(self, marker: str) -> bool:
        return self.store.get_ref(f"{IMPORT_REFS}/{marker}") is not None

    def mark(self, marker: str, data: dict) -> None:
        self.store.flush()  # what the marker stands for is written first
        self.store.create_ref(f"{IMPORT_REFS}/{marker}", None, {**data, "time": time.time()})

    def session(self, info: dict) -> int:
        store = self.store
        taken = [int(n.rsplit("/", 1)[-1]) for n in store.refs(SESSION_REFS) if n.rsplit("/", 1)[-1].isdigit()]
        n = max(taken, default=0) + 1
        while not store.create_ref(f"{SESSION_REFS}/{n:06d}", None, info):
            n += 1
        store.append(KIND_SESSION, {"n": n, **info, "time": time.time(), "_ref": f"{SESSION_REFS}/{n:06d}"},
                     key=fingerprint(("casmon.session", n)))
        self.report.sessions += 1
        return n

    def function(self, name: str, session: int, params: list) -> None:
        refs = [Digest(e[2]["$"]) for e in params if len(e) > 2 and isinstance(e[2], dict) and "$" in e[2]]
        self.store.append(KIND_CALLFN, {"fn": name, "session": session, "params": params},
                          key=fingerprint(("casmon.callfn", name, session)), refs=refs)

    def calls(self, session: int, pid: int, rank: int | None, rows: list[tuple[str, list]], refs: set) -> None:
        """``rows``: (function name, [n, t0, dt, args cells, kwargs cells, result cell, exception])."""
        for i in range(0, len(rows), _BATCH):
            part = rows[i : i + _BATCH]
            names: list[str] = []
            index: dict[str, int] = {}
            c = []
            batch_refs: set[str] = set()
            for name, (n, t0, dt, a, k, res, exc) in part:
                if name not in index:
                    index[name] = len(names)
                    names.append(name)
                c.append([index[name], n, t0, dt, 0, a, k, res, exc])
                for cell in [*a, *k.values(), res]:
                    if isinstance(cell, dict) and isinstance(cell.get("$"), str):
                        batch_refs.add(cell["$"])
            record = {"session": session, "pid": pid, "rank": rank, "fns": names, "threads": {"0": [0, "MainThread"]},
                      "c": c}
            self.store.append(KIND_CALLS, record, refs=[Digest(h) for h in batch_refs])
            self.report.calls += len(part)


class _NotLoaded:
    """A value the import could not read (a missing ``.npy`` file, say)."""

    def __init__(self, type_name: str, why: str) -> None:
        self.type_name = type_name
        self.why = why


def _files_digest(root: Path, files: list[Path]) -> str:
    h = xxhash.xxh3_128()
    for p in sorted(files):
        rel = p.relative_to(root).as_posix()
        h.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        h.update(xxhash.xxh3_128_digest(p.read_bytes()))
    return h.hexdigest()


# ---------------------------------------------------------------------------
# callmonitor
# ---------------------------------------------------------------------------


def _params(spec: Any, w: _Writer, refs: set) -> list:
    """casmon's ``[name, kind, default cell?]`` from an ``inspect.FullArgSpec`` ([] if it is not one)."""
    if isinstance(spec, Unresolved) or not hasattr(spec, "args"):
        return []
    try:
        return _params_of(spec, w, refs)
    except (TypeError, ValueError, AttributeError):
        return []


def _params_of(spec: Any, w: _Writer, refs: set) -> list:
    out = []
    args = list(spec.args or [])
    defaults = tuple(spec.defaults or ())
    first_default = len(args) - len(defaults)
    for i, a in enumerate(args):
        e = [str(a), "POSITIONAL_OR_KEYWORD"]
        if i >= first_default:
            e.append(w.cell(defaults[i - first_default], refs))
        out.append(e)
    if spec.varargs:
        out.append([str(spec.varargs), "VAR_POSITIONAL"])
    kwdefaults = spec.kwonlydefaults or {}
    for a in spec.kwonlyargs or []:
        e = [str(a), "KEYWORD_ONLY"]
        if a in kwdefaults:
            e.append(w.cell(kwdefaults[a], refs))
        out.append(e)
    if spec.varkw:
        out.append([str(spec.varkw), "VAR_KEYWORD"])
    return out


def _spec_key(spec: Any) -> str:
    try:
        return repr((list(spec.args or []), spec.varargs, spec.varkw, len(spec.defaults or ()),
                     list(spec.kwonlyargs or [])))
    except Exception:  # noqa: BLE001 - not an argspec (damaged or foreign): one key for all such
        return "?"


def _handler_parts(h: Any) -> tuple[str, str, dict]:
    """(module, qualname, state) of a callmonitor handler object, resolved or not."""
    if isinstance(h, Unresolved):
        return h._module, h._qualname, h.state
    t = type(h)
    return t.__module__, t.__qualname__, dict(getattr(h, "__dict__", {}))


_BUILTIN_HANDLERS = {"DefaultHandler", "NPHandler"}


def _arg_value(h: Any, call_dir: Path, all_files: list[Path], np_files: set[str], w: _Writer, trust: bool) -> Any:
    module, qualname, state = _handler_parts(h)
    target = state.get("_target")
    if module.startswith("callmonitor") and qualname == "DefaultHandler":
        return state.get("_data")
    if module.startswith("callmonitor") and qualname == "NPHandler":
        f = call_dir / f"arg_{target}.npy"
        try:
            return np.load(f, allow_pickle=trust)
        except Exception as e:  # noqa: BLE001
            return _NotLoaded("numpy.ndarray", f"{f.name}: {type(e).__name__}: {str(e)[:150]}")
    # A custom Handler: its files are the value, stored under the handler's name (see compat.callmonitor).
    files = [p for p in all_files if p.relative_to(call_dir).as_posix() not in np_files]
    if not files:
        return _NotLoaded(f"{module}.{qualname}", "its handler saved no files")
    return _HandlerFiles(handler_value_name(module, qualname), target,
                         [(p.relative_to(call_dir).as_posix(), p.read_bytes()) for p in files])


class _HandlerFiles:
    """A custom handler's files, to be stored as a casmon handler value."""

    def __init__(self, name: str, target: Any, files: list[tuple[str, bytes]]) -> None:
        self.name, self.target, self.files = name, target, files


def _put_handler_files(store: Store, v: _HandlerFiles) -> Digest:
    from casmon.store import encode, serialize

    target = v.target if isinstance(v.target, (int, str)) else 0
    parts = [encode.as_part(data, False) for _, data in v.files]
    enc = serialize.Encoded("handler", {"handler": v.name, "meta": {"files": [f for f, _ in v.files], "target": target}},
                            parts=parts, nbytes=sum(len(d) for _, d in v.files))
    return store.put_encoded(enc)


def _folder_pid_rank(name: str) -> tuple[int, int | None]:
    m = re.search(r"-pid=(\d+)", name)
    pid = int(m.group(1)) if m else 0
    m = re.search(r"-tid=(\d+)$", name)  # callmonitor 0.2's MPI folders: -tid=<rank>
    return pid, (int(m.group(1)) if m else None)


def _callmonitor(root: Path, w: _Writer, trust: bool) -> None:
    report = w.report
    descriptors = sorted(root.glob("*/*/input_descriptor.pkl"))
    all_files = [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    marker = _files_digest(root, all_files)
    if w.imported(marker):
        report.already += 1
        return
    if not (root / "db.pkl").is_file():
        report.notes.append(f"{root.name}: no db.pkl (the run did not end normally); read from its call folders")
    calls: dict[str, list[tuple[int, Path]]] = {}
    for d in descriptors:
        name, number = d.parent.parent.name, d.parent.name
        if number.isdigit():
            calls.setdefault(name, []).append((int(number), d))
    refs: set[str] = set()
    rows: list[tuple[str, list]] = []
    fn_params: dict[str, list] = {}
    starts = []
    total, done = sum(len(v) for v in calls.values()), 0
    for name, items in sorted(calls.items()):
        items.sort()
        loaded = []
        for n, d in items:
            w.progress(f"import {root.name}", done, total)
            done += 1
            try:
                desc = _load_pickle(d, trust)
            except ImportSourceError as e:
                report.notes.append(str(e))
                continue
            if (not isinstance(desc, dict) or not isinstance(desc.get("args", []), (list, tuple))
                    or not isinstance(desc.get("kwargs", {}), dict)):
                report.notes.append(f"{d}: not a callmonitor input descriptor")
                continue
            loaded.append((n, d, desc))
        specs: dict[str, Any] = {}
        for _, _, desc in loaded:
            specs.setdefault(_spec_key(desc.get("argspec")), desc.get("argspec"))
        variant = {k: (name if len(specs) == 1 else f"sig{i}.{name}") for i, k in enumerate(specs, 1)}
        seq: dict[str, int] = {}
        prev = 0.0
        for n, d, desc in loaded:
            call_dir = d.parent
            fn = variant[_spec_key(desc.get("argspec"))]
            if fn not in fn_params:
                fn_params[fn] = _params(desc.get("argspec"), w, refs)
            files = [p for p in call_dir.rglob("*") if p.is_file() and not p.is_symlink() and p.name != "input_descriptor.pkl"]
            handlers = list(desc.get("args") or []) + list((desc.get("kwargs") or {}).values())
            np_files = {f"arg_{_handler_parts(h)[2].get('_target')}.npy" for h in handlers
                        if _handler_parts(h)[1] == "NPHandler"}

            def value(h: Any) -> Any:
                v = _arg_value(h, call_dir, files, np_files, w, trust)
                if isinstance(v, _HandlerFiles):
                    dg = _put_handler_files(w.store, v)
                    w.report._value(dg)
                    refs.add(dg.hex())
                    return {"$": dg.hex()}
                return w.cell(v, refs)

            a = [value(h) for h in desc.get("args") or []]
            k = {str(kw): value(h) for kw, h in (desc.get("kwargs") or {}).items()}
            # callmonitor wrote the descriptor as the call began: its time orders the calls (kept increasing)
            t0 = max(d.stat().st_mtime, prev + 1e-6)
            prev = t0
            starts.append(t0)
            seq[fn] = seq.get(fn, 0) + 1
            rows.append((fn, [seq[fn], t0, 0.0, a, k, NOT_RECORDED, None]))
    if not rows:
        report.notes.append(f"{root}: no calls to import")
        return
    pid, rank = _folder_pid_rank(root.name)
    info: dict[str, Any] = {"start": min(starts), "pid": pid, "rank": rank, "argv": [],
            "imported": {"format": "callmonitor 0.3", "from": str(root)}}
    session = w.session(info)
    for fn, params in fn_params.items():
        w.function(fn, session, params)
    rows.sort(key=lambda r: r[1][1])
    w.calls(session, pid, rank, rows, refs)
    w.mark(marker, {"what": "callmonitor folder", "from": str(root), "session": session})


# ---------------------------------------------------------------------------
# FineCache
# ---------------------------------------------------------------------------


def _is_finecache_entry(v: Any) -> bool:
    return isinstance(v, dict) and {"func", "args", "kwargs", "result"} <= set(v)


def _parse_time(text: Any) -> float | None:
    if not isinstance(text, str):
        return None
    try:
        return _dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _finecache_cache(root: Path, files: list[Path], w: _Writer, trust: bool) -> None:
    report = w.report
    refs: set[str] = set()
    rows: list[tuple[str, list]] = []
    new_markers = []
    for i, f in enumerate(files):
        w.progress("import cache files", i, len(files))
        marker = _files_digest(root, [f])
        if w.imported(marker):
            report.already += 1
            continue
        try:
            entry = _load_pickle(f, trust)
        except ImportSourceError as e:
            report.notes.append(str(e))
            continue
        if not _is_finecache_entry(entry):
            report.notes.append(f"{f}: not a FineCache cache file")
            continue
        func = entry.get("func") if isinstance(entry.get("func"), str) else "?"
        module = entry.get("module") if isinstance(entry.get("module"), str) else "?"
        t0 = _parse_time(entry.get("runtime")) or f.stat().st_mtime
        args = entry.get("args") if isinstance(entry.get("args"), (list, tuple)) else []
        kwargs = entry.get("kwargs") if isinstance(entry.get("kwargs"), dict) else {}
        a = [w.cell(v, refs) for v in args]
        k = {str(kk): w.cell(v, refs) for kk, v in kwargs.items()}
        res = w.cell(entry.get("result"), refs)
        rows.append((f"{module}.{func}", [0, t0, 0.0, a, k, res, None]))
        new_markers.append((marker, f))
        report.cache_files += 1
    if not rows:
        return
    rows.sort(key=lambda r: (r[1][1], r[0]))
    seq: dict[str, int] = {}
    for fn, row in rows:
        seq[fn] = seq.get(fn, 0) + 1
        row[0] = seq[fn]
    info = {"start": rows[0][1][1], "pid": 0, "rank": None, "argv": [],
            "imported": {"format": "FineCache 0.1 cache", "from": str(root)}}
    session = w.session(info)
    for fn in seq:
        w.function(fn, session, [])
    w.calls(session, 0, None, rows, refs)
    for marker, f in new_markers:
        w.mark(marker, {"what": "FineCache cache file", "from": str(f), "session": session})


_RUN_NAME = re.compile(r"^(.*?)(\d+)(?:-(.*))?$", re.S)


def _finecache_run(folder: Path, w: _Writer) -> None:
    report = w.report
    m = _RUN_NAME.match(folder.name)
    if not m or not PREFIX_RE.match(m.group(1)):
        report.notes.append(f"{folder}: not a FineCache run folder name ({{prefix}}{{n}}[-{{comment}}])")
        return
    prefix, n, comment = m.group(1), int(m.group(2)), m.group(3) or ""
    files = [p for p in folder.rglob("*") if p.is_file() and not p.is_symlink()]
    marker = _files_digest(folder, files)
    if w.imported(marker):
        report.already += 1
        return
    information: dict = {}
    if (folder / "information.json").is_file():
        try:
            information = json.loads((folder / "information.json").read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            raise ImportSourceError(f"{folder / 'information.json'}: not JSON: {type(e).__name__}: {e}") from None
        if not isinstance(information, dict):
            raise ImportSourceError(f"{folder / 'information.json'}: not a JSON object")
    else:
        report.notes.append(f"{folder.name}: no information.json (the run did not end normally): imported as 'incomplete'")
    store = w.store
    refs: list[Digest] = []
    patch = None
    if (folder / "current_changes.patch").is_file():
        data = (folder / "current_changes.patch").read_bytes()
        if data:
            patch = w.put_value(data, refs)
    output = None
    if (folder / "console.log").is_file():
        output = w.put_value((folder / "console.log").read_bytes(), refs)
    tracked = {}
    for p in sorted(files):
        rel = p.relative_to(folder).as_posix()
        if rel in _RUN_FILES:
            continue
        if vcs_component(rel) is not None:  # export and restore would refuse the run: such a file is never kept
            report.notes.append(f"{folder.name}: {rel} left out (version-control metadata)")
            continue
        data = p.read_bytes()
        tracked[rel] = {"digest": w.put_value(data, refs), "size": len(data), "mode": p.stat().st_mode & 0o777}
    start = _parse_time(information.get("run_time")) or folder.stat().st_mtime
    patch_time = _parse_time(information.get("patch_time")) or start
    standard = {"commit", "run_time", "patch_time", "project_root", "tracking_records"}
    info = {}
    for k, v in information.items():
        if k in standard:
            continue
        info[str(k)] = v if _plain(v) else {"$": w.put_value(v, refs)}
    end = _parse_time(information.get("run_end_time"))
    tracking = information.get("tracking_records")
    manifest: dict[str, Any] = {
        "casmon_run": 1, "name": "", "n": 0, "prefix": prefix, "comment": comment,
        "status": "ok" if information else "incomplete", "function": None, "start": start, "patch_time": patch_time,
        "git": {"root": information.get("project_root") if isinstance(information.get("project_root"), str) else None,
                "in_git": bool(information.get("commit")),
                "commit": information.get("commit") if isinstance(information.get("commit"), str) else None,
                "branch": None, "dirty": patch is not None, "untracked": [], "skipped": [], "notes": [], "patch": patch},
        "files": tracked,
        "tracking_records": tracking if isinstance(tracking, dict) else {},
        "argv": [], "env": {}, "info": info, "links": {"call_sessions": [], "cache": []},
        "imported": {"format": "FineCache 0.1 run folder", "from": str(folder)},
    }
    if output is not None:
        manifest["output"] = output
    if end is not None:
        manifest["end"] = end
        manifest["duration"] = max(0.0, end - start)
    if _same_run_stored(store, prefix, n, folder.name, information):
        report.already += 1  # a folder casmon.compat.finecache wrote for a run this store holds
        return
    # The run keeps its number when the store has it free; else the next free one (reported).
    want = n
    while not store.create_ref(f"{RUN_REFS}/{prefix}{n}", None, {"status": "claimed", "time": time.time()}):
        n += 1
    name = f"{prefix}{n}" + (f"-{comment}" if comment else "")
    if n != want:
        report.renumbered.append(f"{folder.name} -> {name} (run {prefix}{want} was taken)")
    manifest["name"], manifest["n"] = name, n
    ref = f"{RUN_REFS}/{prefix}{n}"
    d = store.put(manifest)
    store.append(KIND_RUN, {"name": name, "manifest": d.hex(), "status": manifest["status"], "time": time.time(),
                            "_ref": ref, "_ref_target": d.hex()},
                 key=fingerprint(("casmon.run", ref)), refs=[d, *refs])
    store.flush()  # the record first: it protects what the manifest names
    store.set_ref(ref, d, {"name": name, "status": manifest["status"], "start": start})
    report.runs += 1
    w.mark(marker, {"what": "FineCache run folder", "from": str(folder), "run": name})


def _same_run_stored(store: Store, prefix: str, n: int, name: str, information: dict) -> bool:
    """True if the store's run ``{prefix}{n}`` is the run this folder shows (the compat layer wrote the folder)."""
    from casmon.runs import load_run

    if store.get_ref(f"{RUN_REFS}/{prefix}{n}") is None or not information:
        return False
    try:
        r = load_run(f"{RUN_REFS}/{prefix}{n}", store)
        return r.error is None and r.name == name and json.loads(json.dumps(r.information())) == information
    except (LookupError, CasmonError):
        return False


def _plain(v: Any) -> bool:
    try:
        return len(json.dumps(v)) <= 4096 and not (isinstance(v, dict) and set(v) == {"$"})
    except (TypeError, ValueError):
        return False


# ---------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------


def _is_callmonitor(p: Path) -> bool:
    return (p / "db.pkl").is_file() or any(p.glob("*/*/input_descriptor.pkl"))


def _is_run_folder(p: Path) -> bool:
    return any((p / f).is_file() for f in _RUN_FILES) and bool(_RUN_NAME.match(p.name))


def _cache_file_name(name: str) -> bool:
    """FineCache's names: ``func(args;kwargs).pk`` by default (``CacheFilenameConfig`` may change the suffix)."""
    return name.endswith(".pk") or ("(" in name and ";" in name and ")" in name)


def _looks_pickled(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            head = f.read(2)
    except OSError:
        return False
    return len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5


def import_path(path: str | os.PathLike, store: Store | str | None = None, trust: bool = False,
                progress=None) -> ImportReport:
    """Import what ``path`` holds (see the module docstring) into ``store``; returns an :class:`ImportReport`.

    ``path``: a callmonitor folder, a folder holding several (``call-monitor``,
    ``call-monitor-1``, ...), a FineCache base folder (cache files and run
    folders), or one FineCache run folder. ``trust``: load every pickle (see
    the module docstring) -- only for folders you trust. ``progress(phase,
    done, total)`` is told how far it got (``casmon import`` draws a bar).
    """
    root = Path(path)
    if not root.is_dir():
        raise ImportSourceError(f"{root}: no such folder")
    if (root / "casmon.json").exists():
        raise ImportSourceError(f"{root} is a casmon store already; nothing to import")
    s = default_store(store)
    report = ImportReport(str(root))
    w = _Writer(s, report, progress)
    found = False
    if _is_callmonitor(root):
        found = True
        _callmonitor(root, w, trust)
    elif _is_run_folder(root):
        found = True
        _finecache_run(root, w)
    else:
        cache_files = []
        children = sorted(root.iterdir())
        for i, child in enumerate(children):
            w.progress("import folders", i, len(children))
            if child.name.startswith(".") or child.is_symlink():
                continue  # .casmon (the compat store), hidden folders
            if child.is_dir():
                if (child / "casmon.json").exists():
                    continue
                if _is_callmonitor(child):
                    found = True
                    _callmonitor(child, w, trust)
                elif _is_run_folder(child):
                    found = True
                    try:
                        _finecache_run(child, w)
                    except ImportSourceError as e:  # one unreadable run folder does not stop the others
                        report.notes.append(f"{child.name} not imported: {e}")
            elif child.is_file() and _cache_file_name(child.name) and _looks_pickled(child):
                cache_files.append(child)
        if cache_files:
            found = True
            _finecache_cache(root, cache_files, w, trust)
    if not found:
        raise ImportSourceError(f"nothing to import at {root}: no callmonitor folder (db.pkl, {{name}}/{{n}}/input_descriptor.pkl), "
                           "FineCache cache file (a pickle such as *.pk) or FineCache run folder (information.json, "
                           "console.log or current_changes.patch)")
    s.flush()
    return report
