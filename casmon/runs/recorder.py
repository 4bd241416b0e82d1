"""Experiment records: ``casmon.record`` keeps what a run was, to compare by hash and restore.

A run is a small JSON value (the *run manifest*) pointing at values in the
store: the patch of uncommitted changes, every tracked file, the console
output, the list of installed packages, the user's ``info``. Named
``{prefix}{n}`` or ``{prefix}{n}-{comment}``; the number is claimed with a
create-if-absent ref ``runs/{prefix}{n}``, so two runs started at the same
moment in two processes never share one. The ref points at the newest
manifest (``running`` while the run goes on, then ``ok`` or ``failed``), and a
``run`` record lists every value the run needs so gc keeps them.

Stored by content, an unchanged config file or an unchanged package list costs
nothing in the next run.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import getpass
import inspect
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from casmon.view import display
from casmon.caching.memoize import observers as cache_observers
from casmon.calllog.log import CallLog, recorders as call_recorders, _short as short_repr
from casmon.keys.codeversion import function_name
from casmon.keys.digest import Digest
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError, StoreFormatError, UntrustedStoreError
from casmon.keys.fingerprint import fingerprint
from casmon.runs.gitstate import UNTRACKED_MAX, CodeState, capture_code_state
from casmon.runs.capture import OutputCapture
from casmon.store.peek import Described, as_digest, compare as compare_values, describe, load_data, peek
from casmon.scrub import looks_secret, scrub as _scrub, scrub_argv, scrub_env, scrub_output
from casmon.store.store import Store, default_store

__all__ = ["record", "record_context", "Run", "RunInfo", "list_runs", "load_run", "diff", "restore", "export", "RunWarning"]

KIND_RUN = "run"
RUN_REFS = "runs"
#: Environment variables recorded by default: never credentials.
DEFAULT_ENV = (
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "PYTHONHASHSEED", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_NODELIST",
    "PBS_JOBID", "LSB_JOBID", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV", "CASMON_STORE",
)
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]*$")
#: Folders of version control systems: restore and export never write into one (any case, any depth).
VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr", "_darcs", "cvs", ".jj", ".pijul", ".fslckout", "_fossil_", ".fossil"})
# characters macOS (HFS+) and Windows ignore in names, so ".g\u200cit" or ".git." would still be ".git"
_IGNORABLE = re.compile("[\u200b-\u200f\u202a-\u202e\u2060-\u2064\u206a-\u206f\ufeff]")


class RunWarning(UserWarning):
    """Something about a run could not be recorded; the run itself goes on."""


def scrub(text: str) -> str:
    """Remove credentials (``s3://key:secret@host`` -> ``s3://***@host``); see :mod:`casmon.scrub`."""
    return _scrub(text, whole=True)


def _json_or_value(store: Store, v: Any, refs: list[Digest]) -> Any:
    """JSON values stay in the manifest; anything else is stored and referenced."""
    if type(v) in (str, int, float, bool, type(None)) or (type(v) in (list, dict) and _is_plain_json(v)):
        text = json.dumps(v, allow_nan=True)
        if len(text) <= 4096:
            return v
    d = store.put(v)
    refs.append(d)
    return {"$": d.hex()}


class Run:
    """A run while it goes on: fill ``run.info`` with whatever you want kept."""

    def __init__(self, store: Store, name: str, n: int, ref: str) -> None:
        self.store = store
        self.name = name
        self.n = n
        self.ref = ref
        self.info: dict[str, Any] = {}
        self.manifest: dict[str, Any] = {}
        self.cache_links: list[dict] = []
        self._lock = threading.Lock()

    # ``run["k"] = v`` is ``run.info["k"] = v``: FineCache's record_context yields a dict, and its users write so.
    def __setitem__(self, key: str, value: Any) -> None:
        self.info[key] = value

    def __getitem__(self, key: str) -> Any:
        return self.info[key]

    def __contains__(self, key: object) -> bool:
        return key in self.info

    @display.guarded_text("run")
    def __repr__(self) -> str:
        return display.run_text(self)

    @display.guarded_html("run")
    def _repr_html_(self) -> str:
        return display.run_html(self)

    def _cache_observer(self, store, fn, key, result, hit) -> None:
        if store is self.store:
            with self._lock:
                if len(self.cache_links) < 100_000:
                    self.cache_links.append({"fn": fn, "key": key.hex(), "result": result.hex(), "hit": hit})


class record:
    """Record a run: a context manager (``with casmon.record(...) as run:``) or a decorator.

    ``comment``: part of the run's name. ``track``: regexes of files (paths
    relative to the repository root) to keep with the run. ``capture_output``:
    True or "python" (sys.stdout/sys.stderr), "fd" (file descriptors: C
    extensions and subprocesses too), or False. ``prefix``: run names are
    ``{prefix}{n}[-{comment}]``. ``env``: more environment variables to record
    (names that look like secrets are refused). The code state is captured when
    the run starts, before your code runs.

    FineCache's names are accepted too: ``increment_dir`` (its ``dir_prefix``
    becomes the prefix), ``tracking_files``, ``save_output``.
    """

    def __init__(self, comment: str = "", track: Iterable[str] = (), capture_output: bool | str = True,
                 store: Store | str | None = None, prefix: str = "", env: Iterable[str] = (),
                 untracked_max: int = UNTRACKED_MAX, *, increment_dir: Any = None,
                 tracking_files: Iterable[str] | None = None, save_output: bool | None = None,
                 code_state: CodeState | None = None) -> None:
        if tracking_files is not None:
            track = list(track) + list(tracking_files)
        if save_output is not None:
            capture_output = save_output
        if increment_dir is not None and not prefix:
            prefix = getattr(increment_dir, "dir_prefix", "") or ""
        self.patterns = []
        for pat in track:
            try:
                self.patterns.append((pat, re.compile(pat)))
            except re.error as e:
                raise ValueError(f"casmon.record: track={pat!r} is not a valid regular expression: {e}") from None
        if capture_output is True:
            capture_output = "python"
        if capture_output not in (False, None, "python", "fd"):
            raise ValueError(f"casmon.record: capture_output must be True, False, 'python' or 'fd', got {capture_output!r}")
        if not PREFIX_RE.match(prefix):
            raise ValueError(f"casmon.record: prefix may hold letters, digits, '_', '.', '-' only: {prefix!r}")
        env = list(env)
        for var in env:
            if looks_secret(var):
                raise ValueError(f"casmon.record: refusing to record environment variable {var!r}: it looks like a secret")
        self.comment = comment
        self.capture_mode = capture_output or None
        self._store_arg = store
        self.prefix = prefix
        self.env = list(DEFAULT_ENV) + env
        self.untracked_max = untracked_max
        self.code_state = code_state  # taken earlier (FineCache takes it when it is created)
        self.code_time: float | None = None
        self._stack: list[tuple[Run, OutputCapture | None]] = []

    # -- as a context manager -------------------------------------------------------
    def __enter__(self) -> Run:
        run = self._start(function=None)
        return run

    def __exit__(self, exc_type, exc, tb) -> bool:
        self._finish(exc_type, exc, tb)
        return False

    # -- as a decorator -----------------------------------------------------------------
    def __call__(self, fn: Callable) -> Callable:
        rec = self

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            rec._start(function=function_name(fn))  # __mp_main__ is __main__
            try:
                result = fn(*args, **kwargs)
            except BaseException:
                rec._finish(*sys.exc_info())
                raise
            rec._finish(None, None, None)
            return result

        return wrapper

    # -- the run ---------------------------------------------------------------------------
    def _start(self, function: str | None) -> Run:
        store = default_store(self._store_arg)
        started = time.time()
        exclude = [str(store.backend.local_root)] if store.backend.local_root else []
        code = self.code_state or capture_code_state(exclude=exclude + [".casmon"], untracked_max=self.untracked_max)
        for u in code.skipped:
            warnings.warn(f"casmon.record: untracked file {u} is larger than {self.untracked_max:,} bytes and is "
                          "left out of the patch", RunWarning, stacklevel=3)
        for note in code.notes:
            if not note.startswith("detached HEAD"):
                warnings.warn(f"casmon.record: {note}", RunWarning, stacklevel=3)
        refs: list[Digest] = []
        patch = None
        if code.patch:
            d = store.put(code.patch)
            refs.append(d)
            patch = d.hex()
        files, tracking = self._track(store, Path(code.root or os.getcwd()), store.backend.local_root, refs)
        n, ref = self._claim(store)
        name = f"{self.prefix}{n}" + (f"-{self.comment}" if self.comment else "")
        run = Run(store, name, n, ref)
        packages = _packages()
        pd = store.put(packages)
        refs.append(pd)
        run.manifest = {
            "casmon_run": 1,
            "name": name,
            "n": n,
            "prefix": self.prefix,
            "comment": self.comment,
            "status": "running",
            "function": function,
            "start": started,
            "patch_time": self.code_time or started,
            "git": {"root": code.root, "in_git": code.git, "commit": code.commit, "branch": code.branch,
                    "dirty": code.dirty, "untracked": code.untracked, "skipped": code.skipped, "notes": code.notes,
                    "patch": patch},
            "files": files,
            "tracking_records": tracking,
            "host": socket.gethostname(),
            "user": _user(),
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "argv": scrub_argv(sys.argv),
            **({"notebook": nb} if (nb := notebook_path()) else {}),  # a kernel's argv names a temporary file
            "cwd": os.getcwd(),
            "packages": pd.hex(),
            "env": scrub_env({k: os.environ[k] for k in self.env if k in os.environ}),
            "output_mode": self.capture_mode,
        }
        run._refs = refs
        self._write(run)
        capture = OutputCapture(self.capture_mode).start() if self.capture_mode else None
        cache_observers.append(run._cache_observer)
        self._stack.append((run, capture))
        return run

    def _track(self, store: Store, root: Path, store_root, refs: list[Digest]):
        files: dict[str, dict] = {}
        tracking: dict[str, list[str]] = {}
        if not self.patterns:
            return files, tracking
        skip = {Path(store_root).resolve()} if store_root else set()
        skip |= {Path(p).resolve() for p in getattr(self, "exclude_dirs", ())}  # e.g. FineCache's run folders
        for dirpath, dirnames, filenames in os.walk(root):
            dp = Path(dirpath)
            dirnames[:] = [d for d in dirnames if d != ".git" and d != ".casmon" and (dp / d).resolve() not in skip]
            for fname in filenames:
                full = dp / fname
                rel = full.relative_to(root).as_posix()
                matched = [pat for pat, rx in self.patterns if rx.search(rel)]
                if not matched or full.is_symlink():
                    continue
                try:
                    data = full.read_bytes()
                    mode = full.stat().st_mode
                except OSError as e:
                    warnings.warn(f"casmon.record: cannot read tracked file {rel}: {e}", RunWarning, stacklevel=4)
                    continue
                d = store.put(data)
                refs.append(d)
                files[rel] = {"digest": d.hex(), "size": len(data), "mode": stat.S_IMODE(mode)}
                for pat in matched:
                    tracking.setdefault(pat, []).append(str(full))
        return files, tracking

    def _claim(self, store: Store) -> tuple[int, str]:
        taken = []
        for name in store.refs(RUN_REFS):
            tail = name[len(RUN_REFS) + 1 :]
            if tail.startswith(self.prefix) and tail[len(self.prefix) :].isdigit():
                taken.append(int(tail[len(self.prefix) :]))
        n = max(taken, default=0) + 1
        while True:
            ref = f"{RUN_REFS}/{self.prefix}{n}"
            if store.create_ref(ref, None, {"status": "claimed", "time": time.time()}):
                return n, ref
            n += 1

    def _write(self, run: Run) -> None:
        store = run.store
        d = store.put(run.manifest)
        # "_ref" names the ref this record stands behind: verify reports it missing, repair restores it.
        store.append(KIND_RUN, {"name": run.name, "manifest": d.hex(), "status": run.manifest["status"], "time": time.time(),
                                "_ref": run.ref, "_ref_target": d.hex()},
                     key=fingerprint(("casmon.run", run.ref)), refs=[d, *run._refs])
        # The record first: it names every value the manifest names by digest (gc follows records, not the
        # digests inside a JSON manifest), so the ref never points at a manifest whose values are unprotected.
        store.flush()
        store.set_ref(run.ref, d, {"name": run.name, "status": run.manifest["status"], "start": run.manifest["start"]})

    def _finish(self, exc_type, exc, tb) -> None:
        run, capture = self._stack.pop()
        try:
            cache_observers.remove(run._cache_observer)
        except ValueError:
            pass
        try:
            output = capture.stop() if capture is not None else None
        except Exception as e:  # noqa: BLE001
            output = None
            warnings.warn(f"casmon.record: could not stop capturing output: {e}", RunWarning, stacklevel=3)
        try:
            store = run.store
            m = run.manifest
            end = time.time()
            m["end"] = end
            m["duration"] = end - m["start"]
            if exc_type is None:
                m["status"] = "ok"
                m["traceback"] = None
            else:
                m["status"] = "failed"
                m["traceback"] = scrub_output("".join(traceback.format_exception(exc_type, exc, tb)))
                m["error"] = scrub_output(f"{exc_type.__name__}: {exc}")
            if output is not None:
                od = store.put(scrub_output(output).encode("utf-8", "surrogateescape"))
                run._refs.append(od)
                m["output"] = od.hex()
            m["info"] = {str(k): _json_or_value(store, v, run._refs) for k, v in run.info.items()}
            rec = call_recorders.get(id(store))
            m["links"] = {
                "call_sessions": [rec.session] if rec is not None and rec.session is not None and rec.store is store else [],
                "cache": run.cache_links,
            }
            self._write(run)
        except Exception as e:  # noqa: BLE001 - never hide the user's own exception
            warnings.warn(f"casmon.record: could not save run {run.name}: {e}", RunWarning, stacklevel=3)


def record_context(increment_dir: Any = None, comment: str = "", tracking_files: Iterable[str] | None = None,
                   save_output: bool = True, store: Store | str | None = None) -> record:
    """FineCache's ``record_context`` parameters, on casmon's :class:`record`."""
    return record(comment=comment, store=store, increment_dir=increment_dir, tracking_files=tracking_files or (),
                  save_output=save_output)


def notebook_path() -> str | None:
    """The notebook this process runs, if it is a Jupyter kernel whose front end says which; else None.

    Sources, first found wins: ``__vsc_ipynb_file__`` in the kernel's namespace (VS Code
    sets it to the notebook's absolute path); the ``JPY_SESSION_NAME`` environment variable
    (Jupyter Server 2 sets it when it starts a kernel for a notebook: JupyterLab, Notebook 7;
    the path is relative to the server's root folder in some versions); ``__session__`` in
    the kernel's namespace (ipykernel copies ``JPY_SESSION_NAME`` there). Only inside a
    kernel: a script started from a notebook (``!python x.py``) inherits the variable but is
    not the notebook. Kernels started without a server (nbclient, nbconvert, papermill) know
    no path unless their caller sets ``JPY_SESSION_NAME``.
    """
    if "ipykernel" not in sys.modules or "IPython" not in sys.modules:
        return None
    try:
        shell = sys.modules["IPython"].get_ipython()
        ns = getattr(shell, "user_ns", None) if shell is not None and hasattr(shell, "kernel") else None
    except Exception:  # noqa: BLE001 - an odd shell: no notebook
        return None
    if not isinstance(ns, dict):
        return None
    for v in (ns.get("__vsc_ipynb_file__"), os.environ.get("JPY_SESSION_NAME"), ns.get("__session__")):
        if isinstance(v, str) and v.strip():
            return scrub(v.strip())[:4096]
    return None


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001
        return str(os.getuid()) if hasattr(os, "getuid") else "?"


@functools.lru_cache(maxsize=1)
def _packages() -> dict[str, str]:
    out = {}
    import importlib.metadata  # here, not at import: it costs tens of ms and only a run needs it

    for dist in importlib.metadata.distributions():
        try:
            out[dist.metadata["Name"]] = dist.version
        except Exception:  # noqa: BLE001
            continue
    return dict(sorted(out.items(), key=lambda kv: (kv[0] or "").lower()))


# ---------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class RunInfo:
    """A recorded run, as read back from the store."""

    store: Store
    ref: str
    manifest: dict
    #: Why the run's manifest could not be read (damaged, or a pickle that would run code); None if it was.
    error: CasmonError | None = None

    @property
    def name(self) -> str:
        return self.manifest.get("name", self.ref.rsplit("/", 1)[-1])

    @property
    def status(self) -> str:
        return self.manifest.get("status", "?")

    @property
    def digest(self) -> str:
        """The run's manifest digest: two runs with equal digests recorded the same thing."""
        ref = self.store.get_ref(self.ref)
        return ref.target.hex() if ref and ref.target else ""

    # Patches, output, tracked files and package lists are data casmon wrote: they load without ever
    # running code, whatever the store's trust (peek.load_data), and must be of their type.
    def patch(self) -> bytes:
        h = self.manifest.get("git", {}).get("patch")
        return bytes(load_data(self.store, h, f"run {self.name}: the patch", (bytes, bytearray))) if h else b""

    def output(self) -> str:
        h = self.manifest.get("output")
        if not h:
            return ""
        return bytes(load_data(self.store, h, f"run {self.name}: the output", (bytes, bytearray))).decode("utf-8", "surrogateescape")

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
            out[k] = self.store.get(as_digest(v["$"], f"run {self.name}: info {k}")) if _is_value_ref(v) else v
        return out

    def info_peek(self) -> dict[str, Any]:
        """The run's ``info`` without running code: a pickle that names a global stays a :class:`~casmon.store.peek.Described`."""
        out = {}
        for k, v in self.manifest.get("info", {}).items():
            out[k] = peek(self.store, as_digest(v["$"], f"run {self.name}: info {k}")) if _is_value_ref(v) else v
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
            info[k] = v if _is_json(v) else repr(v)
        return info

    def info_cells(self) -> dict[str, Any]:
        """The run's ``info`` for display, nothing loaded: JSON values as they are, stored values described."""
        out: dict[str, Any] = {}
        for k, v in self.manifest.get("info", {}).items():
            try:
                out[k] = _info_cell(self, v) if _is_value_ref(v) else v
            except CasmonError as e:  # one bad entry does not hide the others
                out[k] = Described(Digest(bytes(16)), f"<unreadable: {e}>")
        return out

    @display.guarded_text("run")
    def __repr__(self) -> str:
        return display.run_text(self)

    @display.guarded_html("run")
    def _repr_html_(self) -> str:
        return display.run_html(self)


def _iso(t: float | None) -> str | None:
    if t is None:
        return None
    import datetime as _dt

    return str(_dt.datetime.fromtimestamp(t))


def _is_plain_json(v: Any) -> bool:
    t = type(v)
    if t in (str, int, float, bool, type(None)):
        return True
    if t is list:
        return all(_is_plain_json(x) for x in v)
    if t is dict:
        return all(type(k) is str and _is_plain_json(x) for k, x in v.items()) and set(v) != {"$"}
    return False


def _is_json(v: Any) -> bool:
    try:
        json.dumps(v)
        return True
    except (TypeError, ValueError):
        return False


def list_runs(store: Store | str | None = None) -> list[RunInfo]:
    """Every run in the store, oldest first.

    Run manifests are data: they load without ever running code, and each is
    checked (:class:`DamagedObjectError` names a malformed one).
    """
    s = default_store(store, create=False)  # reading creates nothing
    out = []
    for name in s.refs(RUN_REFS):
        ref = s.get_ref(name)
        if ref is None:
            continue
        error = None
        if ref.target is not None:
            try:
                manifest = load_data(s, ref.target.hex(), f"run {name}: its manifest", dict)
                check_run_manifest(manifest, f"run {name} (manifest {ref.target.hex()})")
            except (DamagedObjectError, UntrustedStoreError, MissingObjectError, StoreFormatError) as e:
                # one bad run does not hide the others: it is listed as unreadable, and says why when used
                error = e
                data = ref.data if isinstance(ref.data, dict) else {}
                t = data.get("start")
                manifest = {"name": name.rsplit("/", 1)[-1], "status": "unreadable", "error": _short_error(e),
                            "start": t if type(t) in (int, float) else None}
        else:
            data = ref.data if isinstance(ref.data, dict) else {}
            t = data.get("time")
            manifest = {"name": name.rsplit("/", 1)[-1], "status": str(data.get("status", "claimed")),
                        "start": t if type(t) in (int, float) else None}
        out.append(RunInfo(s, name, manifest, error))
    out.sort(key=lambda r: (r.manifest.get("start") or 0, r.ref))
    return display.RunList(out)  # a list that shows itself as a table and has to_pandas()


def _short_error(e: BaseException) -> str:
    return " ".join(str(e).split())[:500]


def _readable(r: RunInfo) -> RunInfo:
    if r.error is not None:
        raise r.error
    return r


_MANIFEST_TYPES = {"name": str, "comment": str, "status": str, "prefix": str, "git": dict, "files": dict,
                   "tracking_records": dict, "info": dict, "links": dict, "argv": list, "env": dict,
                   "start": (int, float), "end": (int, float), "duration": (int, float), "patch_time": (int, float),
                   "n": int, "output": str, "packages": str, "traceback": str, "error": str, "function": str,
                   "host": str, "user": str, "python": str, "executable": str, "cwd": str, "pid": int, "notebook": str}


def check_run_manifest(m: dict, where: str) -> None:
    """Types of the fields readers use; a crafted manifest gives DamagedObjectError, not a TypeError later."""
    def bad(why: str):
        raise DamagedObjectError(where, f"not a valid run manifest: {why}")

    for k in ("git", "files", "tracking_records", "info", "links", "env"):
        if k in m and m[k] is None:
            m[k] = {}  # readers use m.get(k, {})
    if m.get("argv", 0) is None:
        m["argv"] = []
    for k, t in _MANIFEST_TYPES.items():
        v = m.get(k)
        if v is not None and (not isinstance(v, t) or type(v) is bool):
            bad(f"{k} is a {type(v).__name__}")
    g = m.get("git") or {}
    for k in ("root", "commit", "branch", "patch"):
        if g.get(k) is not None and not isinstance(g[k], str):
            bad(f"git.{k} is not a string")
    for k in ("untracked", "skipped", "notes"):
        if not isinstance(g.get(k, []), list) or not all(isinstance(x, str) for x in g.get(k, [])):
            bad(f"git.{k} is not a list of strings")
    if not all(isinstance(x, str) for x in m.get("argv") or []):
        bad("argv is not a list of strings")
    for path, f in (m.get("files") or {}).items():
        if (not isinstance(f, dict) or not isinstance(f.get("digest"), str) or type(f.get("size", 0)) is not int
                or type(f.get("mode", 0o644)) is not int):
            bad(f"tracked file {path[:80]!r} is not {{digest, size, mode}}")
    links = m.get("links") or {}
    cache = links.get("cache", [])
    if not isinstance(cache, list) or not all(isinstance(e, dict) and all(isinstance(e.get(x), str) for x in ("fn", "key", "result"))
                                              for e in cache):
        bad("links.cache is not a list of {fn, key, result}")
    if not isinstance(links.get("call_sessions", []), list) or not all(type(x) is int for x in links.get("call_sessions", [])):
        bad("links.call_sessions is not a list of session numbers")


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
    raise LookupError(f"no run {w!r}; runs: {', '.join(r.name for r in runs[-20:])}")


# ---------------------------------------------------------------------------
# Compare, restore, export
# ---------------------------------------------------------------------------


def diff(a: RunInfo | str, b: RunInfo | str, store: Store | str | None = None) -> dict[str, Any]:
    """What differs between two runs: code, tracked files, metadata, info, and results for the same inputs."""
    ra = _readable(a if isinstance(a, RunInfo) else load_run(a, store))
    rb = _readable(b if isinstance(b, RunInfo) else load_run(b, store))
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
        if k == "argv" and ma.get("notebook") and mb.get("notebook"):
            continue  # two kernels' command lines differ only in their temporary connection files
        if ma.get(k) != mb.get(k):
            meta[k] = {"a": ma.get(k), "b": mb.get(k)}
    if ma.get("packages") != mb.get("packages"):
        pa, pb = ra.packages(), rb.packages()
        meta["packages"] = {p: {"a": pa.get(p), "b": pb.get(p)} for p in sorted(set(pa) | set(pb)) if pa.get(p) != pb.get(p)}
    out["meta"] = meta
    ia, ib = ma.get("info", {}), mb.get("info", {})  # compared as stored: a digest stands for its value
    out["info"] = {k: {"a": _info_cell(ra, ia.get(k)), "b": _info_cell(rb, ib.get(k))} for k in sorted(set(ia) | set(ib), key=str)
                   if not _same_cell(ia.get(k), ib.get(k))}
    for k, cell in out["info"].items():  # two stored values: how they differ (arrays element by element), nothing unpickled
        if _is_value_ref(ia.get(k)) and _is_value_ref(ib.get(k)) and ra.store.url == rb.store.url:
            cell["how"] = compare_values(ra.store, ia[k]["$"], ib[k]["$"])
    out["results"] = _result_differences(ra, rb)
    return display.RunDiff(out, ra, rb)  # a dict that shows itself (patch in colour, info side by side)


def _short(v: Any) -> Any:
    return v if _is_json(v) and len(json.dumps(v)) < 200 else short_repr(v, 80)


def _is_value_ref(v: Any) -> bool:
    return isinstance(v, dict) and set(v) == {"$"}


def _info_cell(r: RunInfo, v: Any) -> Any:
    """An info entry for display, without loading a stored value (its description instead)."""
    return Described(as_digest(v["$"], f"run {r.name}: info"), describe(r.store, v["$"], 80)) if _is_value_ref(v) else _short(v)


def _same_cell(a: Any, b: Any) -> bool:
    """Info entries compared without loading anything: stored values by digest (equal content, equal digest)."""
    if _is_value_ref(a) or _is_value_ref(b):
        return a == b
    try:
        return fingerprint(a) == fingerprint(b)
    except TypeError:
        return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


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


class UnsafePathError(CasmonError, ValueError):
    """A run names a path that restore or export must not write (outside the folder, or VCS metadata)."""


def vcs_component(rel: str) -> str | None:
    """The version-control folder (``.git``, ``.hg``, ``.svn``, ...) a path goes through, in any case, or None.

    Names are compared as macOS and Windows would: case-folded, ignorable
    Unicode characters removed, trailing dots and spaces dropped, ``git~1``
    taken for ``.git``; both ``/`` and ``\\`` separate components.
    """
    for part in re.split(r"[/\\]", rel):
        norm = _IGNORABLE.sub("", part).rstrip(" .").casefold()
        base = norm.split(":", 1)[0].rstrip(" .")  # NTFS alternate data streams: ".git::$INDEX_ALLOCATION"
        if norm in VCS_DIRS or base in VCS_DIRS or norm.startswith("git~"):
            return part
    return None


def safe_target(root: Path, rel: str) -> Path:
    """``root / rel``, refusing absolute paths, ``..``, paths through symlinks, and VCS metadata (``.git/``)."""
    if not isinstance(rel, str) or not rel or "\0" in rel:
        raise UnsafePathError(f"refusing to write {str(rel)[:200]!r}: not a file name")
    vcs = vcs_component(rel)
    if vcs is not None:
        raise UnsafePathError(f"refusing to write {rel!r}: it is inside version-control metadata ({vcs}/), which can "
                              "run commands (hooks, config); casmon never restores or exports it")
    p = Path(rel)
    if p.is_absolute() or rel.startswith(("/", "\\")) or any(part == ".." for part in re.split(r"[/\\]", rel)) \
            or re.match(r"^[A-Za-z]:", rel):
        raise UnsafePathError(f"refusing to write {rel!r}: it would escape the target folder")
    target = root / p
    cur = root
    for part in p.parts[:-1]:
        cur = cur / part
        if cur.is_symlink():
            raise UnsafePathError(f"refusing to write {rel!r}: {cur} is a symlink")
    if target.is_symlink():
        raise UnsafePathError(f"refusing to write {rel!r}: it is a symlink")
    resolved = target.resolve()
    if resolved != root.resolve() and root.resolve() not in resolved.parents:
        raise UnsafePathError(f"refusing to write {rel!r}: it would escape the target folder")
    return target


def _prepare_dir(target: str | os.PathLike) -> Path:
    root = Path(target)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty; restore and export write into a new or empty folder")
    root.mkdir(parents=True, exist_ok=True)
    return root.resolve()


def restore(run: RunInfo | str, target: str | os.PathLike, store: Store | str | None = None, repo: str | None = None) -> Path:
    """Write the run's code into ``target``: the commit's tree, the patch applied, the tracked files.

    The commit is read from the repository the run was recorded in (or ``repo``).
    """
    r = _readable(run if isinstance(run, RunInfo) else load_run(run, store))
    for rel in r.manifest.get("files", {}):  # refuse before anything is written
        safe_target(Path(target).resolve(), rel)
    patch = r.patch()
    if patch:
        _check_patch_paths(Path(target).resolve(), patch, r.name)
    root = _prepare_dir(target)
    g = r.manifest.get("git", {})
    if g.get("commit"):
        import git

        repo_path = repo or g.get("root")
        try:
            gr = git.Repo(repo_path, search_parent_directories=True)
            gr.commit(g["commit"])
        except Exception as e:  # noqa: BLE001
            raise CasmonError(f"run {r.name}: commit {g['commit'][:12]} is not in repository {repo_path} ({e}); "
                              "pass repo= the repository that has it") from None
        with tempfile.TemporaryFile() as tf:
            gr.archive(tf, treeish=g["commit"], format="tar")
            tf.seek(0)
            with tarfile.open(fileobj=tf) as tar:
                members = []
                for m in tar.getmembers():
                    safe_target(root, m.name)  # raises on anything escaping
                    members.append(m)
                if hasattr(tarfile, "data_filter"):
                    tar.extractall(root, members=members, filter="data")
                else:  # pragma: no cover - Python < 3.11.4
                    tar.extractall(root, members=members)
    if patch:
        _apply_patch(root, patch, r.name)
    for rel, meta in r.manifest.get("files", {}).items():
        dest = safe_target(root, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = r.file(rel)
        dest.write_bytes(data)
        os.chmod(dest, meta.get("mode", 0o644) & 0o777)
    return root


_PATCH_PATH_LINES = ("+++ ", "--- ", "diff --git ", "rename from ", "rename to ", "copy from ", "copy to ",
                     "rename old ", "rename new ")


def _unquote(tok: str) -> str:
    """A path as git quotes it (``"a/\\056git/config"``: C escapes, octal bytes) in plain text."""
    if len(tok) >= 2 and tok[0] == tok[-1] == '"':
        body = tok[1:-1]
        try:
            return body.encode("latin-1", "backslashreplace").decode("unicode_escape").encode("latin-1").decode("utf-8", "replace")
        except (UnicodeDecodeError, UnicodeEncodeError):
            return body
    return tok


def _patch_paths(patch: bytes) -> list[str]:
    """Every path a patch names in its headers, unquoted (a first look; git's own list is checked too)."""
    out = []
    for line in patch.decode("utf-8", "replace").splitlines():
        if not line.startswith(_PATCH_PATH_LINES):
            continue
        rest = line.split(" ", 2)[2] if line.startswith(("diff --git ", "rename ", "copy ")) else line[4:]
        toks = re.findall(r'"(?:[^"\\]|\\.)*"|\S+', rest)
        for tok in toks:
            tok = _unquote(tok)
            if tok == "/dev/null" or tok.startswith("--"):
                continue
            out.append(tok[2:] if tok[:2] in ("a/", "b/") and line.startswith(("+++", "---", "diff")) else tok)
    return out


def _git_apply_env(root: Path) -> dict:
    # no repository above the target is discovered, no user or system config is read (no hooks, no filters)
    return dict(os.environ, GIT_CEILING_DIRECTORIES=str(root.parent), GIT_CONFIG_NOSYSTEM="1",
                GIT_CONFIG_GLOBAL=os.devnull, HOME=str(root.parent))


def _check_patch_paths(root: Path, patch: bytes, name: str) -> None:
    """Refuse a patch that touches a path outside ``root`` or inside VCS metadata, as we and git read it."""
    paths = _patch_paths(patch)
    with tempfile.TemporaryDirectory(prefix="casmon-patch-") as tmp:
        pf = os.path.join(tmp, "run.patch")
        with open(pf, "wb") as f:
            f.write(patch)
        p = subprocess.run(["git", "apply", "--numstat", "--summary", "-z", pf], cwd=tmp, env=_git_apply_env(Path(tmp)),
                           capture_output=True)
        if p.returncode == 0:
            for field in p.stdout.split(b"\0"):
                field = field.decode("utf-8", "surrogateescape")
                if "\t" in field:  # "added\tdeleted\tpath" (a rename's two paths follow as fields of their own)
                    field = field.split("\t", 2)[2]
                if field and not field.startswith((" create mode", " delete mode", " mode change", " rename", " copy")):
                    paths.append(field)
    for rel in paths:
        try:
            safe_target(root, rel)
        except UnsafePathError as e:
            raise UnsafePathError(f"run {name}: the patch is refused: {e}") from None


def _apply_patch(root: Path, patch: bytes, name: str) -> None:
    _check_patch_paths(root, patch, name)
    with tempfile.NamedTemporaryFile(suffix=".patch", delete=False) as f:
        f.write(patch)
        pf = f.name
    try:
        p = subprocess.run(["git", "apply", "--binary", "--whitespace=nowarn", pf], cwd=root, env=_git_apply_env(root),
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise CasmonError(f"run {name}: the patch does not apply: {p.stderr.strip()}")
    finally:
        os.unlink(pf)


def export(run: RunInfo | str, target: str | os.PathLike, store: Store | str | None = None,
           progress: Callable[[str, int, int], None] | None = None) -> Path:
    """Write the plain folder FineCache users know: information.json, current_changes.patch, console.log, tracked files.

    ``progress(phase, done, total)`` is told of each tracked file written (``casmon export`` draws a bar).
    """
    r = _readable(run if isinstance(run, RunInfo) else load_run(run, store))
    for rel in r.manifest.get("files", {}):  # refuse before anything is written
        safe_target(Path(target).resolve(), rel)
    root = _prepare_dir(target)
    (root / "information.json").write_text(json.dumps(r.information(), indent=2, ensure_ascii=False), encoding="utf-8")
    (root / "current_changes.patch").write_bytes(r.patch())
    if r.manifest.get("output") is not None:
        (root / "console.log").write_text(r.output(), encoding="utf-8", errors="surrogateescape")
    files = list(r.manifest.get("files", {}))
    for i, rel in enumerate(files):
        if progress is not None:
            progress("export files", i, len(files))
        dest = safe_target(root, rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(r.file(rel))
    if progress is not None:
        progress("export files", len(files), len(files))
    return root
