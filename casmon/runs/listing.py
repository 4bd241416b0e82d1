"""Reading runs back: :class:`RunInfo`, ``list_runs`` and ``load_run``.

Run manifests are data: they load without ever running code (patches, output,
tracked files and package lists through ``peek.load_data``), each checked first;
one unreadable run is listed as such and does not hide the others.
"""

from __future__ import annotations


import dataclasses
import gc
import importlib
import json
import math
import re
import time
from collections.abc import Iterable
from typing import Any

from casmon.keys.names import keep_flat_names
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError, StoreFormatError, UntrustedStoreError
from casmon.keys.digest import Digest
from casmon.runs import live
from casmon.runs.manifest import HEAVY, RUN_REFS, check_run_manifest, is_json, is_value_ref

#: Fields the runs index leaves out of its manifests: the heavy ones and the metric summary, held apart.
HEAVY_FIELDS = HEAVY | {"metrics"}
from casmon.runs.metrics import Series, number_of, read_series, read_summary
from casmon.runs.params import MAX_DEPTH, flatten
from casmon.store.peek import Described, as_digest, describe, load_data, peek
from casmon.store.store import Store, default_store
from casmon.view import display
from casmon.view.text import did_you_mean, short_error, short_repr

__all__ = ["RunInfo", "IndexedManifest", "indexed_run", "ref_names", "list_runs", "load_run", "readable_run", "run_info", "info_cell"]


class IndexedManifest(dict):
    """A run manifest as the runs index holds it: the fields a listing shows, parsed and checked from the
    index's text when one is first read. Reading any other field, or the manifest whole (iterating,
    ``items()``, ``json.dumps``), loads the stored manifest first, once; if that fails (damaged, missing) the
    listed fields are all it holds and ``error`` says why. An entry whose fields fail the checks a stored
    manifest passes (a crafted index) is not used: the stored manifest is read instead. A dict or list field
    not parsed anew is copied when first read: the index's entry, kept for the next listing, is never changed
    through it."""

    __slots__ = ("_load", "_entry", "error", "_owned", "_slimmed", "_run")

    def __init__(self, slim: dict[str, Any] | list, store: Store, name: str, target: str) -> None:
        super().__init__()
        #: The index entry whose slim manifest is not parsed yet (or the slim manifest itself).
        self._entry: list | None = slim if type(slim) is list else [None, None, dict(slim)]
        self._load: tuple[Store, str, str] | None = (store, name, target)
        #: Why the stored manifest could not be read (the fields the index holds are all there is), if so.
        self.error: CasmonError | None = None
        self._owned: set[Any] | None = None  # fields copied already (the others may be the entry's own)
        #: The index's fields are all there: a field of a listing that is not among them is not in the manifest.
        self._slimmed = False
        #: The run listed with this manifest: told when the stored manifest turns out unreadable.
        self._run: RunInfo | None = None

    def _own(self, k: Any, v: Any) -> Any:
        if type(v) is not dict and type(v) is not list:
            return v
        if self._owned is None:
            self._owned = set()
        elif k in self._owned:
            return v
        c = _copied(v) if isinstance(v, dict) else _copied_list(v)
        dict.__setitem__(self, k, c)
        self._owned.add(k)
        return c

    def _whole(self) -> None:
        """The stored manifest read in, and every field this manifest's own."""
        self._fill()
        for k, v in list(dict.items(self)):
            self._own(k, v)

    def _slim(self) -> None:
        e, self._entry = self._entry, None
        if e is not None:
            from casmon.runs import index

            got = index.slim(e, f"runs index entry {self._load[1] if self._load else '?'}")
            if got is None:  # not what casmon wrote: the stored manifest, whole, says what the run is
                self._fill(whole=True)
            else:
                dict.update(self, got)
                self._slimmed = True
                if type(e[2]) is str:  # parsed anew from the index's text: this manifest's own already
                    self._mine(got)

    def _has(self, k: Any) -> bool:
        if self._entry is not None:
            self._slim()
        if self._load is not None and not dict.__contains__(self, k) and (
                not self._slimmed or k in HEAVY_FIELDS or type(k) is not str):
            self._fill()
        return dict.__contains__(self, k)

    def _fill(self, whole: bool = False) -> None:
        if self._entry is not None:
            self._slim()
        src, self._load = self._load, None
        if src is not None:
            s, name, target = src
            try:
                full = load_data(s, target, f"run {name}: its manifest", dict)
                check_run_manifest(full, f"run {name} (manifest {target})")
            except CasmonError as e:  # one unreadable manifest hides no run: it is listed as a direct read lists it
                self.error = e
                _unreadable.add((s.url, target))
                t = self._run.ref_data.get("start") if self._run is not None else None
                dict.update(self, {"name": name.rsplit("/", 1)[-1], "status": "unreadable",
                                   "error": short_error(e, 500), "start": t if type(t) in (int, float) else None})
                if self._run is not None:
                    self._run.error = e
                return
            except BaseException:
                self._load = src
                raise
            for k, v in full.items():
                if not dict.__contains__(self, k):
                    dict.__setitem__(self, k, v)

    def get(self, k: Any, default: Any = None) -> Any:
        return self._own(k, dict.__getitem__(self, k)) if self._has(k) else default

    def listed(self, k: str, default: Any = None) -> Any:
        """Field ``k`` as :meth:`get` gives it, without reading the stored manifest for a field the index keeps
        (all but the heavy ones and ``metrics``): one the entry lacks, the manifest lacks too."""
        from casmon.runs import index

        if k in index.HEAVY or k == "metrics":
            return self.get(k, default)
        if self._entry is not None:
            self._slim()
        return self._own(k, dict.__getitem__(self, k)) if dict.__contains__(self, k) else default

    def __getitem__(self, k: Any) -> Any:
        self._has(k)
        return self._own(k, dict.__getitem__(self, k))

    def __contains__(self, k: Any) -> bool:
        return self._has(k)

    def __delitem__(self, k: Any) -> None:
        self._fill()
        dict.__delitem__(self, k)

    def setdefault(self, k: Any, default: Any = None) -> Any:
        self._whole()
        self._mine((k,))
        return dict.setdefault(self, k, default)

    def __setitem__(self, k: Any, v: Any) -> None:
        if self._entry is not None:
            self._slim()
        self._mine((k,))
        dict.__setitem__(self, k, v)

    def update(self, *args: Any, **kw: Any) -> None:
        if self._entry is not None:
            self._slim()
        changed = dict(*args, **kw)
        self._mine(changed)
        dict.update(self, changed)

    def __ior__(self, other: Any) -> IndexedManifest:  # type: ignore[misc]  # dict's |=, through update
        self.update(other)
        return self

    def _mine(self, keys: Any) -> None:
        """Fields the caller sets are its own already (read back as they were set, never copied)."""
        if self._owned is None:
            self._owned = set()
        self._owned.update(keys)

    def pop(self, k: Any, *default: Any) -> Any:
        self._whole()
        return dict.pop(self, k, *default)

    def __iter__(self) -> Any:
        self._fill()
        return dict.__iter__(self)

    def __len__(self) -> int:
        self._fill()
        return dict.__len__(self)

    def keys(self) -> Any:
        self._fill()
        return dict.keys(self)

    def values(self) -> Any:
        self._whole()
        return dict.values(self)

    def items(self) -> Any:
        self._whole()
        return dict.items(self)

    def copy(self) -> dict[str, Any]:
        self._whole()
        return dict(dict.items(self))

    def __eq__(self, other: object) -> bool:
        self._whole()
        return dict.__eq__(self, other)

    def __bool__(self) -> bool:
        if self._entry is not None:
            self._slim()
        return dict.__len__(self) > 0 or len(self) > 0  # slim fields there: no need to read the rest

    __hash__ = None

    def __repr__(self) -> str:
        self._whole()
        return dict.__repr__(self)

    def __reduce__(self) -> Any:
        self._whole()
        return (dict, (dict(dict.items(self)),))


@dataclasses.dataclass
class RunInfo:
    """A recorded run, as read back from the store."""

    store: Store
    ref: str
    manifest: dict
    #: Why the run's manifest could not be read (damaged, or a pickle that would run code); None if it was.
    error: CasmonError | None = None
    #: What the run's ref carries besides its manifest: the heartbeat and latest metrics of a live run.
    ref_data: dict = dataclasses.field(default_factory=dict)
    _summary: dict | None = dataclasses.field(default=None, repr=False, compare=False)
    _edits: list | None = dataclasses.field(default=None, repr=False, compare=False)
    #: A runs index entry whose metric summary is read into cells when first asked for.
    _entry: list | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def manifest_digest(self) -> str | None:
        """The digest (hex) of the stored manifest the runs index listed this run from; None where it did not
        (then only the manifest says what the run holds)."""
        e = self._entry
        return e[1] if e is not None and len(e) > 1 and type(e[1]) is str else None

    # -- tags and notes (casmon.runs.tags): the manifest's tags with every later edit applied ------------
    def edits(self) -> list[dict[str, Any]]:
        """Each change of the run's tags and note, oldest first (``time``, ``who``, ``add``/``remove`` or ``note``)."""
        from casmon.runs import tags

        return tags.history(self.manifest, self._read_edits())

    @property
    def tags(self) -> tuple[str, ...]:
        """The run's tags, sorted: those it started with, and every change since (``casmon tag``, ``run.tags``)."""
        from casmon.runs import tags

        return tags.merged(self.manifest, self._read_edits())[0]

    @property
    def note(self) -> str:
        """The run's note (``casmon note``), "" if it has none."""
        from casmon.runs import tags

        return tags.merged(self.manifest, self._read_edits())[1]

    def _read_edits(self) -> list:
        if self._edits is None:
            from casmon.runs import tags

            self._edits = tags.read_edits(self.store, self.ref)
        return self._edits

    @property
    def name(self) -> str:
        return self.manifest.get("name", self.ref.rsplit("/", 1)[-1])

    @property
    def status(self) -> str:
        """``running``, ``ok``, ``failed``, ``killed``, or ``lost`` (running, but no heartbeat for
        ``live.LOST_AFTER`` heartbeats: killed by SIGKILL, out of memory, or its node died)."""
        st = self.manifest.get("status", "?")
        if st == "running" and live.is_lost(self.heartbeat, self.ref_data.get("heartbeat_s"), time.time(),
                                            self.ref_data.get("heartbeat_lag")):
            return "lost"
        return st

    @property
    def resumes(self) -> list[dict[str, Any]]:
        """Each time the run was resumed (``record(resume=...)``), oldest first: ``time``, ``host``, ``pid`` and
        the ``status`` it had then (entries of a crafted manifest that are not such are left out)."""
        out = []
        for e in self.manifest.get("resumes") or []:
            t = e.get("time") if isinstance(e, dict) else None
            if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1e11:
                out.append({"time": float(t), "host": str(e.get("host")), "pid": e.get("pid"),
                            "status": str(e.get("status"))})
        return out

    @property
    def heartbeat(self) -> float | None:
        """When the run last said it was alive (Unix seconds), if it ever did."""
        t = self.ref_data.get("heartbeat")
        if isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < 1e11:  # a crafted ref: no time
            return float(t)
        return None

    @property
    def elapsed(self) -> float | None:
        """Seconds the run went on: to its end; to now while it runs; to its last heartbeat if it was lost."""
        m = self.manifest
        start = m.get("start")
        if not isinstance(start, (int, float)):
            return None
        if type(m.get("duration")) in (int, float):
            return float(m["duration"])
        st = self.status
        if st == "running":
            return max(0.0, time.time() - start)
        hb = self.heartbeat
        return max(0.0, hb - start) if st == "lost" and hb is not None else None

    # -- metrics and parameters -----------------------------------------------------------------
    def metric_summary(self) -> dict[str, dict[str, Any]]:
        """``{name: {"n", "last", "step", "time", "min", "max", "digest"}}`` for every metric. An ended run's comes
        from its manifest (no series read); a run that has not ended (live, lost) is summarised from the metric
        records a reader finds, so the summary agrees with :meth:`metric` wherever a kill fell (no digest then).
        NaN and infinities are floats here; ``min`` and ``max`` leave NaN out (NaN if every value is NaN)."""
        if self._entry is not None:  # an ended run's, from the runs index
            at = self._entry[4]
            if type(at) is tuple:  # a row of an index file's columns
                got = at[0].summary(at[1])
            else:
                from casmon.runs import index

                got = index.summary(self._entry)  # made anew at each call: the caller's to change
            if got is not None:
                return got
            self._entry = None  # a crafted entry's columns are not used: the manifest's summary is
        if self._summary is not None:  # an ended run's, from its immutable manifest
            return {k: dict(v) for k, v in self._summary.items()}
        summary = self.manifest.get("metrics")
        ended = self.manifest.get("status") != "running" and isinstance(summary, dict)
        out = self._read_summary(summary if ended else None)
        if ended:
            self._summary = out
        return {k: dict(v) for k, v in out.items()}

    def keep_summary(self, summary: dict[str, dict[str, Any]]) -> None:
        """An ended run's metric summary, known already (from the runs index, as :meth:`metric_summary` gave
        it): kept, so reading it needs not the manifest's."""
        self._summary = summary

    def _read_summary(self, summary: Any) -> dict[str, dict[str, Any]]:
        """The manifest's ``summary``, or (None: a run that did not end) one read from the metric records, read
        again at each call as the run's points grow."""
        if summary is None:
            summary = self.ref_data.get("metrics")
            if self.error is None and self.manifest.get("status") not in ("claimed", "unreadable"):
                try:
                    summary = read_summary(self.store, self.ref, f"run {self.name}")
                except CasmonError:  # damaged records: what the ref last said (metric() names the damage)
                    pass
        if not isinstance(summary, dict):
            return {}
        out: dict[str, dict[str, Any]] = {}
        for k, v in sorted(summary.items()):  # a crafted store's odd cells are left out, never raised on
            if isinstance(k, str) and isinstance(v, dict):
                out[k] = _summary_fast(v) or {f: _summary_cell(f, v.get(f)) for f in _SUMMARY_FIELDS}
        return out

    def metrics(self, names: Iterable[str] | None = None) -> dict[str, Series]:
        """Every metric the run logged (or those of ``names`` it logged), by name: each a
        :class:`~casmon.runs.metrics.Series` of numpy arrays. Several names at once read the run's records once."""
        if self.error is not None:
            raise self.error
        return read_series(self.store, self.ref, f"run {self.name}", None if names is None else list(names))

    def metric(self, name: str) -> Series:
        """One metric: ``.steps``, ``.values``, ``.times`` as numpy arrays, ``.to_pandas()``."""
        got = read_series(self.store, self.ref, f"run {self.name}", [name]) if self.error is None else {}
        if name not in got:
            if self.error is not None:
                raise self.error
            names = sorted(self.metric_summary()) or sorted(read_series(self.store, self.ref, f"run {self.name}"))
            hint = did_you_mean(name, names)
            raise LookupError(f"run {self.name} has no metric {name!r}{f' ({hint})' if hint else ''}; "
                              f"it has: {', '.join(names[:50]) or 'none'}")
        return got[name]

    def params(self) -> dict[str, Any]:
        """The run's parameters as given (nested dicts stay nested); stored values described, never unpickled."""
        def cell(v: Any, depth: int) -> Any:
            if is_value_ref(v):
                try:
                    return info_cell(self, v)
                except CasmonError as e:
                    return Described(Digest(bytes(16)), f"<unreadable: {e}>")
            if type(v) is dict and depth < MAX_DEPTH:  # a config with a stored leaf (an Enum) stays nested
                return {k: cell(x, depth + 1) for k, x in v.items()}
            return v

        return {k: cell(v, 0) for k, v in (self.manifest.get("params") or {}).items()}

    def flat_params(self) -> dict[str, Any]:
        """The parameters with nested dicts flattened: ``{"cfg": {"lr": 0.1}}`` -> ``{"cfg.lr": 0.1}``."""
        return flatten(self.params())

    @property
    def digest(self) -> str:
        """The run's manifest digest: two runs with equal digests recorded the same thing."""
        ref = self.store.get_ref(self.ref)
        return ref.target.hex() if ref and ref.target else ""

    def lineage(self) -> Any:
        """The run's upstream graph (``casmon.lineage.lineage``): the cached calls that made its inputs, the files
        they read, its params. The lineage layer is above this one: named here, not imported."""
        return importlib.import_module("casmon.lineage").lineage(self)

    # -- artifacts and checkpoints (casmon.runs.artifacts) -----------------------------------------------
    def artifacts(self, shared: bool = True) -> list[dict[str, Any]]:
        """What the run saved: ``{name, kind, size, stored, shared, digest, step, time}`` each, by name; ``stored``
        is what the store holds for it, compressed; ``shared`` the part of that another run, cache entry or ref
        also holds (what deleting this run would not free; None if the store cannot be read whole). Finding
        ``shared`` walks every record and ref of the store; ``shared=False`` skips that (``shared`` is None)."""
        from casmon.runs import artifacts, sharing

        out = []
        arts = artifacts.read_artifacts(self.store, self.ref)
        sizes = sharing.sizes(self.store, self.ref, arts.values(), shared)
        for a in arts.values():
            stored, held = sizes[a.name]
            out.append({"name": a.name, "kind": a.kind, "size": a.size, "stored": stored, "shared": held,
                        "digest": a.digest, "step": a.step, "time": a.time,
                        **({"files": a.files} if a.files is not None else {})})
        return out

    def load(self, name: str, *, mmap: bool = False) -> Any:
        """Artifact ``name``'s value (a saved file's bytes; a folder's listing of files). ``mmap``: arrays and
        tensors saved with ``run.save(..., mmap=True)`` come back as read-only maps of the stored bytes."""
        from casmon.runs import artifacts

        return artifacts.load(self.store, self.ref, self.name, name, mmap=mmap)

    def load_file(self, name: str, dest: Any) -> Any:
        """Write artifact ``name`` to ``dest`` (a file, with its mode; a folder's files under ``dest``); the path."""
        from casmon.runs import artifacts

        return artifacts.load_file(self.store, self.ref, self.name, name, dest)

    def checkpoint(self, which: str | int = "latest") -> Any:
        """Checkpoint ``which``: a step, or ``latest`` (the highest step the run keeps)."""
        from casmon.runs import artifacts

        return artifacts.load_checkpoint(self.store, self.ref, self.name, which)

    # Patches, output, tracked files and package lists are data casmon wrote: they load without ever
    # running code, whatever the store's trust (peek.load_data), and must be of their type.
    def patch(self) -> bytes:
        h = self.manifest.get("git", {}).get("patch")
        return bytes(load_data(self.store, h, f"run {self.name}: the patch", (bytes, bytearray))) if h else b""

    def output(self) -> str:
        """The console output: whole once the run ended, else what was written in batches so far."""
        h = self.manifest.get("output")
        if not h:
            if self.error is not None or self.manifest.get("status") in (None, "claimed", "unreadable"):
                return ""
            return live.read_output(self.store, self.ref, f"run {self.name}")
        return bytes(load_data(self.store, h, f"run {self.name}: the output", (bytes, bytearray))).decode("utf-8", "surrogateescape")

    def output_tail(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of :meth:`output`."""
        return self.output()[-chars:] if chars > 0 else ""

    def file(self, path: str) -> bytes:
        return bytes(load_data(self.store, self.manifest["files"][path]["digest"], f"run {self.name}: tracked file {path}",
                               (bytes, bytearray)))

    def packages(self) -> dict[str, str]:
        h = self.manifest.get("packages")
        return load_data(self.store, h, f"run {self.name}: the package list", dict) if h else {}

    def info(self) -> dict[str, Any]:
        """The run's ``info``, values loaded (pickles only from a store opened with ``trust=True``)."""
        out = {}
        for k, v in self.manifest.get("info", {}).items():
            out[k] = self.store.get(as_digest(v["$"], f"run {self.name}: info {k}")) if is_value_ref(v) else v
        return out

    def info_peek(self) -> dict[str, Any]:
        """The run's ``info`` without running code: a pickle that names a global stays a :class:`~casmon.store.peek.Described`."""
        out = {}
        for k, v in self.manifest.get("info", {}).items():
            out[k] = peek(self.store, as_digest(v["$"], f"run {self.name}: info {k}")) if is_value_ref(v) else v
        return out

    def information(self) -> dict[str, Any]:
        """FineCache's ``information.json`` fields for this run, plus the user's info."""
        m = self.manifest
        info = {
            "commit": m.get("git", {}).get("commit"),
            "run_time": _iso(m.get("start")),
            "patch_time": _iso(m.get("patch_time")),
            "project_root": m.get("git", {}).get("root"),
        }
        if m.get("tracking_records"):
            info["tracking_records"] = m["tracking_records"]
        if m.get("function"):
            info["record_function"] = m["function"].rsplit(".", 1)[-1]
            info["run_end_time"] = _iso(m.get("end"))
        for k, v in self.info_peek().items():  # never unpickles what could run code, even from a trusted store
            info[k] = v if is_json(v) else repr(v)
        if self.status not in ("ok", "?") and "status" not in info:  # a failed, killed or lost run says so
            info["status"] = self.status
            if m.get("error") and "error" not in info:
                info["error"] = m["error"]
        params = self.flat_params()
        if params and "params" not in info:
            info["params"] = {k: v if is_json(v) else repr(v) for k, v in params.items()}
        return info

    def info_cells(self) -> dict[str, Any]:
        """The run's ``info`` for display, nothing loaded: JSON values as they are, stored values described."""
        out: dict[str, Any] = {}
        for k, v in self.manifest.get("info", {}).items():
            try:
                out[k] = info_cell(self, v) if is_value_ref(v) else v
            except CasmonError as e:  # one bad entry does not hide the others
                out[k] = Described(Digest(bytes(16)), f"<unreadable: {e}>")
        return out

    @display.guarded_text("run")
    def __repr__(self) -> str:
        return display.run_text(self)

    @display.guarded_html("run")
    def _repr_html_(self) -> str:
        return display.run_html(self)


_SUMMARY_FIELDS = ("n", "last", "step", "time", "min", "max", "digest")


_HEX32 = re.compile(r"[0-9a-f]{32}")


def _summary_fast(v: dict[str, Any]) -> dict[str, Any] | None:
    return _cell_fast(v.get("n"), v.get("last"), v.get("step"), v.get("time"), v.get("min"), v.get("max"),
                      v.get("digest"))


def _cell_fast(n: Any, last: Any, step: Any, t: Any, lo: Any, hi: Any, dg: Any) -> dict[str, Any] | None:
    """The common cell (finite floats, int count and step, a digest), as :func:`_summary_cell` would give it,
    without checking field by field; None for any other."""
    if (type(n) is int and n >= 0 and type(step) is int and type(last) is float and type(lo) is float
            and type(hi) is float and type(t) is float and 0 <= t < 1e11 and math.isfinite(last + lo + hi)
            and (dg is None or type(dg) is str and _HEX32.fullmatch(dg))):
        return {"n": n, "last": last, "step": step, "time": t, "min": lo, "max": hi, "digest": dg}
    return None


def _summary_cell(field: str, v: Any) -> Any:
    """A summary's cell as casmon writes it (counts and steps ints, times finite, values any float, the
    non-finite ones as :func:`~casmon.runs.metrics.json_number` stores them), else None."""
    if field == "digest":
        return v if isinstance(v, str) and len(v) == 32 and all(c in "0123456789abcdef" for c in v) else None
    if field in ("n", "step"):
        return v if type(v) is int and (field == "step" or v >= 0) else None
    x = number_of(v)
    if x is None or (field == "time" and not (math.isfinite(x) and 0 <= x < 1e11)):
        return None
    return x


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    import datetime as _dt

    return str(_dt.datetime.fromtimestamp(t))


def list_runs(store: Store | str | None = None) -> list[RunInfo]:
    """Every run in the store, oldest first.

    Run manifests are data: they load without ever running code, and each is
    checked (:class:`DamagedObjectError` names a malformed one). Ended runs come from the runs index
    (:mod:`casmon.runs.index`) while their refs are unchanged; the others are read from their refs.
    """
    s = default_store(store, create=False)  # reading creates nothing
    # A listing makes a few objects per run and keeps them all: the collector's full passes over them (several
    # at 10k runs) would cost a third of it and free nothing.
    paused = gc.isenabled()
    gc.disable()
    try:
        return _list_runs(s)
    finally:
        if paused:
            gc.enable()


def _list_runs(s: Store) -> list[RunInfo]:
    from casmon.runs import index

    at = time.time()  # before the stamps are taken (index.settled)
    try:
        stamps = s.backend.list_stamped(f"refs/{RUN_REFS}/")
    except OSError:
        stamps = None
    # One listing of the refs gives both their names and their stamps, where the medium gives stamps.
    names = s.refs(RUN_REFS) if stamps is None else ref_names(stamps)
    entries, deltas, base_ok = index.load(s) if names else ({}, [], True)
    fresh: dict[str, list] = {}
    out = []
    settled = index.settled
    newly = 0  # entries found settled that the file does not say are: written down at the next fold
    unreadable = {d for u, d in _unreadable if u == s.url}
    dropped = []
    for name in names:
        e = entries.get(name)
        if e is not None and unreadable and e[1] in unreadable:
            # Its manifest was found unreadable: read directly, as a listing without the index would, and
            # left out of the next base, so that other processes read it directly too.
            dropped.append(name)
            e = None
        stamp = stamps.get("refs/" + name) if stamps is not None else None
        if e is not None and stamp is not None and e[0] == stamp:
            known = len(e) > 9 and e[9]
            if settled(s, e, at):
                newly += not known and len(e) > 9 and e[9] is True
                out.append((e[5], name, indexed_run(s, name, e, e[3])))
                continue
        info, target = _read_run(s, name, e)
        if info is None:
            continue
        if e is not None and info._entry is e:  # the entry's manifest still: its text stays unparsed
            out.append((e[5], name, info))
            if stamp is not None:
                fresh[name] = index.renewed(e, stamp, info.ref_data, at)
            continue
        start = info.manifest.get("start")
        out.append((start if type(start) in (int, float) else 0, name, info))
        if stamp is not None and target is not None and info.error is None and index.indexable(info.manifest):
            got = index.entry(stamp, target, info.manifest, info.ref_data, at)
            if got is not None:
                fresh[name] = got
    if names:
        if dropped:
            entries = {k: v for k, v in entries.items() if k not in set(dropped)}
        index.fold(s, entries, fresh, deltas, stamps, base_ok, newly + index.FOLD_AT * bool(dropped))
    out.sort(key=lambda t: (t[0] or 0, t[1]))  # started first; an indexed run's start from its entry
    runs = [t[2] for t in out]
    from casmon.runs.tags import edits_by_run

    edits = edits_by_run(s)  # one read of every run's tag and note edits, not one per run
    for r in runs:
        r._edits = edits.get(r.ref, [])
    return display.RunList(runs)  # a list that shows itself as a table and has to_pandas()


#: A run ref's file name that :func:`~casmon.store.records.is_ref_name` takes, checked in one match (the others
#: are asked about one by one).
_PLAIN_REF = re.compile(r"refs/runs/(?!\.\.?$)[A-Za-z0-9_.-]{1,200}")


def ref_names(stamps: dict[str, str]) -> list[str]:
    """The run refs' names in a stamped listing of ``refs/runs/``, as :meth:`Store.refs` lists them."""
    from casmon.store.records import is_ref_name

    plain = _PLAIN_REF.fullmatch
    return sorted(k[5:] for k in stamps if plain(k) and ".partial" not in k or (
        not plain(k) and ".partial" not in k and is_ref_name(k[5:])))


def run_info(s: Store, name: str) -> RunInfo | None:
    """The run whose ref is ``name`` (``runs/...``), or None if its ref is gone; a damaged one is listed as
    unreadable, saying why."""
    return _read_run(s, name, None)[0]


def indexed_run(s: Store, name: str, e: list, ref_data: dict[str, Any]) -> RunInfo:
    """The run of index entry ``e``: its slim manifest and metric summary read from the entry when first asked
    for (the rest of the manifest read from the store when asked for). Its fields are its own copies: entries
    are kept for the next listing, which a caller's change must not reach. Should the stored manifest turn out
    unreadable when read, the run becomes what a listing without the index shows (unreadable, with the
    error); listings in this process read it directly from then on, and the next one writes a base without
    its entry, so listings in other processes do too."""
    m = IndexedManifest(e, s, name, e[1])
    r = RunInfo(s, name, m, None, dict(ref_data), _entry=e)
    m._run = r
    return r


#: ``(store url, manifest digest)`` of manifests found unreadable behind a runs index entry: such a run is read
#: directly (and listed as unreadable) by later listings of this process, whose next base leaves it out.
_unreadable: set[tuple[str, str]] = set()


def _copied(v: dict[str, Any]) -> dict[str, Any]:
    """A copy of JSON data, its dicts and lists copied too (faster than copy.deepcopy)."""
    return {k: _copied(x) if type(x) is dict else _copied_list(x) if type(x) is list else x for k, x in v.items()}


def _copied_list(v: list[Any]) -> list[Any]:
    return [_copied(x) if type(x) is dict else _copied_list(x) if type(x) is list else x for x in v]


def _read_run(s: Store, name: str, e: list | None) -> tuple[RunInfo | None, str | None]:
    """Run ``name`` read from its ref (and its manifest, unless index entry ``e`` is of that manifest), and
    the manifest digest the ref names; ``(None, None)`` if the ref is gone."""
    try:
        ref = s.get_ref(name)
    except DamagedObjectError as err:  # a damaged ref is one unreadable run, never every run hidden
        tail = name.rsplit("/", 1)[-1]
        return RunInfo(s, name, {"name": tail, "status": "unreadable", "error": short_error(err, 500),
                                 "start": None}, err), None
    if ref is None:
        return None, None
    error = None
    target = ref.target.hex() if ref.target is not None else None
    ref_data = ref.data if isinstance(ref.data, dict) else {}
    st = ref_data.get("status")
    if target is not None and e is not None and e[1] == target and (type(st) is not str or st == e[7]):
        # The ref says the run's status too: an entry saying another (a crafted one: a live run as ended) is
        # not the run's.
        return indexed_run(s, name, e, ref_data), target
    if target is not None:
        try:
            manifest = load_data(s, target, f"run {name}: its manifest", dict)
            check_run_manifest(manifest, f"run {name} (manifest {target})")
        except (DamagedObjectError, UntrustedStoreError, MissingObjectError, StoreFormatError) as err:
            # one bad run does not hide the others: it is listed as unreadable, and says why when used
            error = err
            t = ref_data.get("start")
            manifest = {"name": name.rsplit("/", 1)[-1], "status": "unreadable", "error": short_error(err, 500),
                        "start": t if type(t) in (int, float) else None}
    else:
        t = ref_data.get("time")
        manifest = {"name": name.rsplit("/", 1)[-1], "status": str(ref_data.get("status", "claimed")),
                    "start": t if type(t) in (int, float) else None}
    return RunInfo(s, name, manifest, error, ref_data), target


def readable_run(r: RunInfo) -> RunInfo:
    if r.error is not None:
        raise r.error
    return r


def load_run(which: str | int, store: Store | str | None = None) -> RunInfo:
    """A run by name (``3``, ``exp3``, ``exp3-comment``, ``runs/exp3``) or ``latest``."""
    runs = list_runs(store)
    if not runs:
        raise LookupError("no runs recorded in this store")
    w = str(which)
    if w in ("latest", "-1"):
        return runs[-1]
    for r in runs:
        if w in (r.ref, r.ref.split("/", 1)[-1], r.name) or w == str(r.manifest.get("n")) and not r.manifest.get("prefix"):
            return r
    hint = did_you_mean(w, ["latest", *(r.name for r in runs), *(r.ref.split("/", 1)[-1] for r in runs)])
    raise LookupError(f"no run {w!r}{f' ({hint})' if hint else ''}; runs: {', '.join(r.name for r in runs[-20:])}")

def short_cell(v: Any) -> Any:
    """An info entry as shown: JSON under 200 characters as it is, anything else as a short repr."""
    return v if is_json(v) and len(json.dumps(v)) < 200 else short_repr(v, 80, arrays=True, qualified=True)


def info_cell(r: RunInfo, v: Any) -> Any:
    """An info entry for display, without loading a stored value (its description instead)."""
    return Described(as_digest(v["$"], f"run {r.name}: info"), describe(r.store, v["$"], 80)) if is_value_ref(v) else short_cell(v)

# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([RunInfo])
