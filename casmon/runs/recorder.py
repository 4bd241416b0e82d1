"""Recording runs: ``casmon.record`` keeps what a run was, to compare by hash and restore.

A run is a small JSON value (the *run manifest*) pointing at values in the
store: the patch of uncommitted changes, every tracked file, the console
output, the list of installed packages, the user's ``info``. Named
``{prefix}{n}`` or ``{prefix}{n}-{comment}``; the number is claimed with a
create-if-absent ref ``runs/{prefix}{n}``, so two runs started at the same
moment in two processes never share one. The ref points at the newest
manifest (``running`` while the run goes on, then ``ok`` or ``failed``), and a
``run`` record lists every value the run needs so gc keeps them.

Stored by content, an unchanged config file or an unchanged package list costs
nothing in the next run. Reading runs back is :mod:`~casmon.runs.listing`,
comparing them :mod:`~casmon.runs.comparison`, writing one into a folder
:mod:`~casmon.runs.folders`, the manifest's checks :mod:`~casmon.runs.manifest`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import stat
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from casmon.keys.names import keep_flat_names
from casmon.caching import observers as cache_observers
from casmon.calllog import find_recorder
from casmon.errors import CasmonError, NoActiveRunError, RunSignal, StoreError
from casmon.keys.codeversion import function_name
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import fingerprint
from casmon.runs import artifacts, live, signals, sysmetrics
from casmon.runs import tags as run_tags
from casmon.runs import resume as resuming
from casmon.runs.capture import OutputCapture
from casmon.runs.cells import a_dict, cells
from casmon.runs.environment import notebook_path, packages, user
from casmon.runs.gitstate import UNTRACKED_MAX, CodeState, capture_code_state
from casmon.runs.manifest import KIND_RUN, PREFIX_RE, claim_run_number
from casmon.runs import index as runs_index
from casmon.runs.compaction import COMPACT_OVER, compact_run
from casmon.runs.metrics import KIND_METRICS, NO_VALUE, MetricLog, call_metrics, metrics_key
from casmon.scrub import looks_secret, scrub as _scrub, scrub_argv, scrub_env, scrub_output
from casmon.store.store import Store, default_store
from casmon.view import display
from casmon.view.text import short_repr

__all__ = ["record", "record_context", "Run", "RunWarning", "notebook_path", "DEFAULT_ENV", "log", "active_run",
           "EXIT_RETRY_S"]

#: Environment variables recorded by default: never credentials.
DEFAULT_ENV = (
    "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
    "PYTHONHASHSEED", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_NODELIST",
    "PBS_JOBID", "LSB_JOBID", "CONDA_DEFAULT_ENV", "VIRTUAL_ENV", "CASMON_STORE",
)


#: How long a run's end waits for a batch of points another thread is appending (a few lines of work).
SETTLE_S = 10.0

#: At interpreter exit, how long (seconds) casmon keeps trying to save a run whose end the store refused.
EXIT_RETRY_S = 30.0


class RunWarning(UserWarning):
    """Something about a run could not be recorded; the run itself goes on."""


def scrub(text: str) -> str:
    """Remove credentials (``s3://key:secret@host`` -> ``s3://***@host``); see :mod:`casmon.scrub`."""
    return _scrub(text, whole=True)


class Run:
    """A run while it goes on: ``run.log(loss=...)`` its metrics, ``run.params`` its configuration, ``run.info``
    whatever else you want kept."""

    #: Ended by its ``with`` block or decorator; a run of ``start_run`` (casmon.runs.session) is not, so a
    #: signal saves it from the handler rather than raising into code that may be no block of it.
    _by_block = True

    def __init__(self, store: Store | None, name: str, n: int, ref: str) -> None:
        self.store: Any = store  # None while the store could not be opened (see record._start)
        self.name = name
        self.n = n
        self.ref = ref
        self._info: dict[str, Any] = {}
        self._params: dict[str, Any] = {}
        self._metrics = MetricLog()
        self._signal: tuple[str, float] | None = None  # a signal that ends the run: its name and time
        self._capture: OutputCapture | None = None
        self._out_seq = 0
        self._hooked = False
        self._ref_lock = threading.Lock()  # the heartbeat and the run's own writes set its ref in turn
        self._target: Digest | None = None  # the manifest the ref points at
        self._heartbeat_s = live.heartbeat_seconds()
        self._beat_at = 0.0
        self._beat_lag = 0.0  # how long the last heartbeat took to write: readers allow for it
        self._params_written: str | None = None
        self._thread = threading.get_ident()
        self._pid = os.getpid()
        self.manifest: dict[str, Any] = {}
        self.cache_links: list[dict] = []
        self._refs: list[Digest] = []  # every value the manifest names, listed in the run's record for gc
        self._lock = threading.Lock()
        # What is written again when the store was away (see _retry_unsaved):
        self._recorder: record | None = None
        self._code: CodeState | None = None
        self._packages: dict[str, str] = {}
        self._output: str | None = None
        self._started = False  # its start (and number) is in the store
        self._saving = threading.RLock()  # one attempt at a time: a flush's retry and the run's own end
        self._ended = False
        self._ending = False
        self._held = artifacts.Held()  # what this process saved of the run's artifacts (casmon.runs.artifacts)
        self._keep: tuple[int | None, int | None] = (None, None)  # checkpoint retention: keep_last, keep_every
        #: The run this one continues, as it was read when resumed (``record(resume=...)``); None for a new run.
        self.resumed_from: Any = None
        self._refs_extra: list[Digest] = []  # the manifests the run had before its resumes
        self._prior_output: str | None = None
        self._resume_line = ""
        self._tags = run_tags.RunTags(self, ())

    @property
    def tags(self) -> run_tags.RunTags:
        """The run's tags, a live set: ``run.tags.add("baseline")``, ``run.tags.discard("x")`` (kept at once)."""
        return self._tags

    @tags.setter
    def tags(self, value: Iterable[str]) -> None:
        self._tags.replace(value)

    @property
    def info(self) -> dict[str, Any]:
        """Whatever else you want kept with the run: a dict (``run.info["acc"] = 0.9``, or a new dict)."""
        return self._info

    @info.setter
    def info(self, value: dict[str, Any]) -> None:
        self._info = a_dict(value, "run.info")

    @property
    def params(self) -> dict[str, Any]:
        """What the run was configured with (nested dicts become ``cfg.lr`` columns); kept apart from metrics."""
        return self._params

    @params.setter
    def params(self, value: dict[str, Any]) -> None:
        self._params = a_dict(value, "run.params")

    def log(self, metrics: Mapping[str, Any] | str | None = None, value: Any = NO_VALUE, /, *more: Any,
            step: int | None = None, **named: Any) -> None:
        """Log metrics at one step: ``run.log({"loss": 0.3}, step=5)``, ``run.log("loss", 0.3, step=5)`` or
        ``run.log(loss=0.3, acc=0.9)``.

        ``step`` defaults to the run's own counter (0, 1, 2, ... counted up by each call without a step); a call
        with a step sets the counter to it, so a helper's ``casmon.log`` right after lands on the same step. Values are numbers (numpy and torch scalars too); each point keeps
        its step, value and wall time. Points reach the store in batches, seconds apart, and are read back by
        ``load_run(...).metric(name)``. Wrong input raises at once, naming the metric; nothing of the call is
        logged then. Once the run's end is being stored (another thread still logging), a call logs nothing.
        """
        if type(metrics) is str and value is not NO_VALUE and not more and not named:
            metrics = {metrics: value}  # log_metric's shape, as cheap as the dict
        elif value is not NO_VALUE or more or (metrics is not None and (named or type(metrics) is not dict)):
            metrics = call_metrics("run.log", metrics, value, more, named)
        if self._pid != os.getpid():
            raise CasmonError(f"casmon: run.log in process {os.getpid()}, a child of process {self._pid} that records run "
                              f"{self.name}: a run's metrics are logged by the process that records it (return them to it, "
                              "or record a run in the child)")
        self._metrics.log(metrics, step, named)

    def save(self, name: str, value: Any, *, mmap: bool = False) -> artifacts.Artifact:
        """Keep ``value`` (anything ``store.put`` takes) with the run as artifact ``name``, replacing one of that
        name; gc keeps it as long as the run exists. ``load_run(...).load(name)`` reads it back; ``mmap=True``
        lays its large incompressible arrays out so ``load(name, mmap=True)`` maps them instead of copying."""
        return artifacts.save(self, name, value, mmap=mmap)

    def save_file(self, path: str | os.PathLike[str], name: str | None = None) -> artifacts.Artifact:
        """Keep the file or folder at ``path`` with the run, by content, as artifact ``name`` (its file name by
        default), with its files' names, modes and sizes; ``load_run(...).load_file(name, dest)`` writes it back."""
        return artifacts.save_file(self, path, name)

    def checkpoint(self, state: Any, step: int | None = None, *, keep_last: int | None = None,
                   keep_every: int | None = None) -> artifacts.Artifact:
        """Keep ``state`` as checkpoint ``step`` (the last one's plus one by default) and release those the
        retention rule (``keep_last``, ``keep_every``; given here or to ``record``) no longer keeps."""
        return artifacts.checkpoint(self, state, step, keep_last, keep_every)

    def checkpoint_latest(self) -> Any:
        """The run's latest checkpoint (the one a resumed run continues from); LookupError if it has none."""
        if self.store is None or not self.ref:
            raise LookupError(f"run {self.name} has no checkpoints: it is not in a store yet")
        return artifacts.load_checkpoint(self.store, self.ref, self.name, "latest")

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

    def _flush_hook(self, store: Store) -> None:
        """At each flush of the run's store: its waiting points and output become records (written by that flush)."""
        if store is not self.store or not self._started or not self.ref or self._pid != os.getpid():
            return  # a forked child's copy of the run writes nothing: its parent writes the run
        _append_batch(store, self, self._metrics.take(store))
        _flushing.__dict__.setdefault("summaries", {})[id(self)] = (self, self._metrics.snapshot())
        cap = self._capture
        if cap is not None and not self._ended:
            with self._lock:  # two flushes at once (the live thread's, the user's) keep the batches in order
                text = cap.sink.take_live()
                seq = self._out_seq
                self._out_seq += bool(text)
            if text:
                rec, refs = live.output_record(store, self.ref, seq, scrub_output(text))
                store.append(live.KIND_RUNOUT, rec, key=live.output_key(self.ref), refs=refs)

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
    (names that look like secrets are refused). ``params``: what the run is
    configured with (also ``run.params``; nested dicts are shown as ``cfg.lr``).
    ``keep_last``, ``keep_every``: which of ``run.checkpoint``'s checkpoints stay.
    ``resume``: a run's name or number, ``"latest"`` or a RunInfo to continue (killed, lost or failed; an ``ok``
    one only with ``resume_ok=True``): see :mod:`casmon.runs.resume`. ``system_metrics``: sample CPU, memory,
    disk, network and GPUs into ``sys/...`` metrics every ``system_metrics_s`` seconds (:mod:`~casmon.runs.sysmetrics`).
    The code state is captured when the run starts, before your code runs.

    While the run goes on, its metrics (``run.log``) and output reach the store
    every few seconds, and a heartbeat every ``CASMON_HEARTBEAT_S`` seconds; a
    run ends ``ok``, ``failed``, or ``killed`` (Ctrl-C, SIGTERM, SIGHUP: saved,
    then the process ends as it would have); one whose heartbeats stop is read
    as ``lost``.

    ``tags``: labels to find the run by (``run.tags`` changes them, ``casmon tag`` too, after its end).

    FineCache's names are accepted too: ``increment_dir`` (its ``dir_prefix``
    becomes the prefix), ``tracking_files``, ``save_output``.
    """

    def __init__(self, comment: str = "", track: Iterable[str] = (), capture_output: bool | str = True,
                 store: Store | str | None = None, prefix: str = "", env: Iterable[str] = (),
                 untracked_max: int = UNTRACKED_MAX, *, increment_dir: Any = None,
                 tracking_files: Iterable[str] | None = None, save_output: bool | None = None,
                 code_state: CodeState | None = None, params: Mapping[str, Any] | None = None,
                 keep_last: int | None = None, keep_every: int | None = None, resume: Any = None,
                 resume_ok: bool = False, tags: Iterable[str] | None = None, system_metrics: bool = True,
                 system_metrics_s: float = sysmetrics.INTERVAL_S) -> None:
        # One string is one pattern or name, not its letters ("." alone would track every file).
        track = [track] if isinstance(track, str) else list(track)
        env = [env] if isinstance(env, str) else list(env)
        if tracking_files is not None:
            track += [tracking_files] if isinstance(tracking_files, str) else list(tracking_files)
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
        for var in env:
            if looks_secret(var):
                raise ValueError(f"casmon.record: refusing to record environment variable {var!r}: it looks like a secret")
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(f"casmon.record: params must be a dict, got {type(params).__name__}")
        if params is not None and not all(type(k) is str for k in params):
            raise TypeError("casmon.record: params' names must be strings")
        self.params = dict(params or {})
        self.tags = run_tags.check_tags(tags, "casmon.record")
        self.resume, self.resume_ok = resuming.check_which(resume), bool(resume_ok)
        self.system_metrics_s = sysmetrics.interval(system_metrics, system_metrics_s, "casmon.record")
        self.keep = (artifacts.retention(keep_last, "keep_last"), artifacts.retention(keep_every, "keep_every"))
        self.comment = comment
        self.capture_mode = capture_output or None
        self._store_arg = store
        self.prefix = prefix
        self.env = list(DEFAULT_ENV) + env
        self.untracked_max = untracked_max
        self.code_state = code_state  # taken earlier (FineCache takes it when it is created)
        self.code_time: float | None = None
        self._stack: list[tuple[Run, OutputCapture | None]] = []
        self.run_type: type[Run] = Run  # casmon.runs.session's runs are ended by a call, not a block
        #: Folders :meth:`track_files` never reads (FineCache's run folders).
        self.exclude_dirs: list[Path] = []

    # -- as a context manager -------------------------------------------------------
    def __enter__(self) -> Run:
        run = self._start(function=None)
        return run

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
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
        try:
            store: Store | None = default_store(self._store_arg)
        except (CasmonError, OSError) as e:  # away at first use: the run goes on; its end tries again
            warnings.warn(f"casmon.record: cannot open the store now ({e}); the run is written when it ends if "
                          "the store answers then", RunWarning, stacklevel=3)
            store = None
        if store is not None and store.read_only:
            raise StoreError(f"casmon.record: store {store.url} is opened read-only; a run is recorded in a store "
                             f"opened for writing")
        started = time.time()
        exclude = [str(store.backend.local_root)] if store is not None and store.backend.local_root else []
        code = self.code_state or capture_code_state(exclude=exclude + [".casmon"], untracked_max=self.untracked_max)
        for u in code.skipped:
            warnings.warn(f"casmon.record: untracked file {u} is larger than {self.untracked_max:,} bytes and is "
                          "left out of the patch", RunWarning, stacklevel=3)
        for note in code.notes:
            if not note.startswith("detached HEAD"):
                warnings.warn(f"casmon.record: {note}", RunWarning, stacklevel=3)
        run = self.run_type(store, f"{self.prefix}?" + (f"-{self.comment}" if self.comment else ""), 0, "")
        run.params = dict(self.params)
        run._tags = run_tags.RunTags(run, self.tags)
        run._keep = self.keep
        run.manifest = {
            "casmon_run": 1,
            "name": run.name,
            "n": 0,
            "prefix": self.prefix,
            "comment": self.comment,
            "status": "running",
            **({"tags": list(self.tags)} if self.tags else {}),  # an untagged run's manifest is as before
            "function": function,
            "start": started,
            "patch_time": self.code_time or started,
            "git": {"root": code.root, "in_git": code.git, "commit": code.commit, "branch": code.branch,
                    "dirty": code.dirty, "untracked": code.untracked, "skipped": code.skipped, "notes": code.notes,
                    "patch": None},
            "files": {},
            "tracking_records": {},
            "host": socket.gethostname(),
            "user": user(),
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "argv": scrub_argv(sys.argv),
            **({"notebook": nb} if (nb := notebook_path()) else {}),  # a kernel's argv names a temporary file
            "cwd": os.getcwd(),
            "packages": None,
            "env": scrub_env({k: os.environ[k] for k in self.env if k in os.environ}),
            "output_mode": self.capture_mode,
            "heartbeat_s": run._heartbeat_s,
        }
        run._code = code
        run._packages = packages()
        run._recorder = self
        if self.resume is not None:
            resuming.attach(run, self.resume, self.resume_ok, self.params)  # claims it, or raises
        if store is not None:
            try:
                with run._saving:
                    self._store_start(run)
            except (CasmonError, OSError) as e:  # the store is away: the run goes on, and is written when it is back
                warnings.warn(f"casmon.record: cannot write run {run.name} to {store.url} now ({e}); a later flush "
                              "tries again (if the store is still away when the process ends, the run stays "
                              "'running')", RunWarning, stacklevel=3)
                _pending(run)
        capture = OutputCapture(self.capture_mode).start() if self.capture_mode else None
        run._capture = capture
        cache_observers.append(run._cache_observer)
        self._stack.append((run, capture))
        _activate(run)
        live.watch(id(run), functools.partial(self._tick, run), live.tick_seconds(run._heartbeat_s),
                   functools.partial(self._beat, run), min(1.0, run._heartbeat_s / 2))
        if self.system_metrics_s is not None:
            sysmetrics.start(run, self.system_metrics_s)  # sampled until live.unwatch at the run's end
        return run

    def _store_start(self, run: Run) -> None:
        """Store what the run started with and claim its number (again, after a failed attempt)."""
        store, code, m = run.store, run._code, run.manifest
        refs: list[Digest] = []
        if code is not None and code.patch:
            d = store.put(code.patch)
            refs.append(d)
            m["git"]["patch"] = d.hex()
        files, tracking = self.track_files(store, Path((code.root if code else None) or m["cwd"]),
                                           store.backend.local_root, refs)
        m["files"], m["tracking_records"] = files, tracking
        pd = store.put(run._packages)
        refs.append(pd)
        m["packages"] = pd.hex()
        m["params"] = self._params_cells(run, refs)
        refs += run._refs_extra
        if not run.ref:
            run.n, run.ref = self.claim_number(store)
            run.name = f"{self.prefix}{run.n}" + (f"-{self.comment}" if self.comment else "")
            m["name"], m["n"] = run.name, run.n
        run._refs = refs
        self._write(run)
        run._started = True
        if not run._hooked:
            run._hooked = True
            store.add_flush_hook(run._flush_hook)
            store.add_after_flush(_publish_written)

    @staticmethod
    def _params_cells(run: Run, refs: list[Digest]) -> dict[str, Any]:
        out = cells(run.store, run.params, refs, "run.params", RunWarning)
        run._params_written = _params_text(run.params)
        return out

    def track_files(self, store: Store, root: Path, store_root: str | os.PathLike | None,
                    refs: list[Digest]) -> tuple[dict[str, dict], dict[str, list[str]]]:
        """Store the files under ``root`` that ``track`` matches (appending their digests to ``refs``): ``(files,
        tracking)`` for the manifest. Folders in ``exclude_dirs`` are skipped; a subclass may set them first."""
        files: dict[str, dict] = {}
        tracking: dict[str, list[str]] = {}
        if not self.patterns:
            return files, tracking
        skip = {Path(store_root).resolve()} if store_root else set()
        skip |= {Path(p).resolve() for p in self.exclude_dirs}
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

    def claim_number(self, store: Store) -> tuple[int, str]:
        """Claim the run's number: ``(n, ref)``, the first free ``runs/{prefix}{n}`` above those taken, made
        create-if-absent (a subclass may claim its own way: FineCache also makes a run folder)."""
        return claim_run_number(store, self.prefix)

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
        with run._ref_lock:
            store.set_ref(run.ref, d, _ref_data(run))
            run._target = d
            run._beat_at = time.monotonic()

    def _tick(self, run: Run) -> None:
        """From the live thread: write the run's waiting points and output (and its start, if the store was
        away then), and new params; then publish the new summary in its ref."""
        if run._ended or run._pid != os.getpid():
            return
        store = run.store
        if store is None or not run._started:
            if store is not None and run._saving.acquire(blocking=False):  # the store was away at the start
                try:
                    if not run._started and not run._ended:
                        self._store_start(run)
                        _done(run)
                except (CasmonError, OSError):
                    pass
                finally:
                    run._saving.release()
            return
        waiting = run._metrics.has_pending() or (run._capture is not None and run._capture.sink.live)
        waiting = waiting and store.autoflush is not None  # autoflush=None: the user flushes; heartbeats go on
        if waiting:
            store.flush()
        if run._params_written != _params_text(run.params) and run._saving.acquire(blocking=False):
            try:  # new params: a new manifest, so a reader sees them while the run goes on
                if not run._ended:
                    run.manifest["params"] = self._params_cells(run, run._refs)
                    self._write(run)
            finally:
                run._saving.release()
        elif waiting:
            self._beat(run, force=True)

    @staticmethod
    def _beat(run: Run, force: bool = False) -> None:
        """From the heartbeat thread (its own, so a slow flush never delays it): rewrite the run's ref with the
        time, the summary of its metrics, and how long the last such write took."""
        if run._ended or run._pid != os.getpid() or not run._started:
            return
        if not force and time.monotonic() - run._beat_at < run._heartbeat_s:
            return
        with run._ref_lock:
            if run._ended or run._target is None:
                return
            t0 = time.monotonic()
            run.store.set_ref(run.ref, run._target, _ref_data(run), same_target=True)  # no wait for a flush
            run._beat_at = time.monotonic()
            run._beat_lag = run._beat_at - t0

    def _finish(self, exc_type, exc, tb, status: str | None = None) -> None:
        """End the innermost run: its status from the exception, or ``status`` where given (``run.end``)."""
        run, capture = self._stack.pop()
        if run._pid != os.getpid():
            return  # a forked child leaving its parent's block: the parent ends the run, not the child
        live.unwatch(id(run))
        try:
            cache_observers.remove(run._cache_observer)
        except ValueError:
            pass
        run._ending = True  # a signal from here on waits until the run is saved (see _on_signal)
        try:
            output = capture.stop() if capture is not None else None
        except Exception as e:  # noqa: BLE001
            output = None
            warnings.warn(f"casmon.record: could not stop capturing output: {e}", RunWarning, stacklevel=3)
        m = run.manifest
        end = time.time()
        m["end"] = end
        m["duration"] = end - m["start"]
        _end_status(run, exc_type, exc, tb, end)
        if status is not None:
            _force_status(m, status)
        run._output = output
        run._ended = True
        try:
            self._save_end(run)
        finally:
            left = _deactivate(run)
        if _deferred_signals and threading.current_thread() is threading.main_thread():  # came while saving
            sig = _deferred_signals[0]
            _deferred_signals.clear()
            _on_signal(sig, signals.signal_name(sig), time.time())  # raises RunSignal, or ends the process
        if isinstance(exc, RunSignal) and not _main_thread_runs():
            _save_killed(exc.signum, exc.name)  # runs of other threads, which no signal reaches
            signals.redeliver(exc.signum)  # ends the process by the signal, as it would have ended
        if not left:
            signals.uninstall()

    def _save_end(self, run: Run) -> None:
        try:
            if run.store is None:
                run.store = default_store(self._store_arg)  # away when the run started: try once more
            with run._saving:
                self._store_end(run)
        except Exception as e:  # noqa: BLE001 - never hide the user's own exception; a later flush tries again
            if run.store is None:
                warnings.warn(f"casmon.record: run not recorded: the store cannot be opened ({e})", RunWarning,
                              stacklevel=4)
                return
            warnings.warn(f"casmon.record: could not save run {run.name} now ({e}); later flushes try again, "
                          f"and at exit casmon keeps trying for up to {EXIT_RETRY_S:g} s", RunWarning, stacklevel=4)
            _pending(run)
        else:
            _done(run)
            _compact(run)
            runs_index.note_ended(run.store, run.ref)  # listings need not read this run's manifest

    def _store_end(self, run: Run) -> None:
        """Store how the run ended (again, after a failed attempt: every value is put again, which costs nothing)."""
        if not run._started:
            self._store_start(run)
        store, m = run.store, run.manifest
        refs = list(run._refs)
        if (output := resuming.whole_output(run, run._output)) is not None:
            od = store.put(scrub_output(output).encode("utf-8", "surrogateescape"))
            refs.append(od)
            m["output"] = od.hex()
        m["info"] = cells(store, run.info, refs, "run.info", RunWarning)
        m["params"] = cells(store, run.params, refs, "run.params", RunWarning)
        run._metrics.seal()  # a point another thread logs from now on would land after the summary below
        _append_batch(store, run, run._metrics.take(store))  # the last points: written by the flush below
        run._metrics.wait_settled(SETTLE_S)  # a batch the live thread took counts before the summary is kept
        m["metrics"] = run._metrics.full_summary()
        rec = find_recorder(store)
        m["links"] = {
            "call_sessions": [rec.session] if rec is not None and rec.session is not None else [],
            "cache": run.cache_links,
        }
        saved, run._refs = run._refs, refs
        try:
            self._write(run)
        except BaseException:
            run._refs = saved
            raise
        if run._hooked:
            store.remove_flush_hook(run._flush_hook)


def _end_status(run: Run, exc_type: Any, exc: BaseException | None, tb: Any, end: float) -> None:
    """How the run ended, into its manifest: ``ok``, ``failed``, or ``killed`` (by which signal, when)."""
    m = run.manifest
    noted = run._signal
    if exc_type is None:
        status, killed = "ok", None
    elif isinstance(exc, RunSignal):
        status, killed = "killed", noted or (exc.name, end)
    elif issubclass(exc_type, KeyboardInterrupt):
        status, killed = "killed", noted or ("SIGINT", end)
    elif noted is not None:  # the user's own handler ended it (sys.exit, an exception)
        status, killed = "killed", noted
    elif issubclass(exc_type, SystemExit) and getattr(exc, "code", 1) in (None, 0):
        status, killed = "ok", None
    else:
        status, killed = "failed", None
    m["status"] = status
    if killed is not None:
        m["signal"], m["signal_time"] = killed
    if exc_type is None or status == "ok":
        m["traceback"] = None
    else:
        m["traceback"] = scrub_output("".join(traceback.format_exception(exc_type, exc, tb)))
        m["error"] = scrub_output(f"{exc_type.__name__}: {exc}")


def _force_status(m: dict[str, Any], status: str) -> None:
    """The status ``run.end(status=...)`` asked for, over the one its exception (if any) gave."""
    m["status"] = status
    if status == "ok":
        m["traceback"] = None
        for k in ("error", "signal", "signal_time"):
            m.pop(k, None)
    elif status == "failed" and not m.get("error"):
        m["error"] = "ended as failed by run.end(status='failed')"


#: At its end a run's covered batches are retired (the metrics table rewritten) when they are at least
#: this fraction of the table; else gc retires them.
RETIRE_SHARE = 8


def _compact(run: Run) -> None:
    """Fold an ended run's many metric batches into one record (:mod:`casmon.runs.compaction`). Best effort:
    cut short or refused (gc holds the lock), nothing is lost and ``casmon gc`` compacts the run later."""
    if run._metrics.seq <= COMPACT_OVER:
        return
    try:
        compact_run(run.store, run.ref, share=RETIRE_SHARE)
    except CasmonError:
        pass  # the store lock is held, or a batch is damaged: gc tries again
    except Exception as e:  # noqa: BLE001 - the run is saved; a failed compaction never reaches the user's code
        warnings.warn(f"casmon.record: run {run.name}'s metrics were not compacted now ({e}); `casmon gc` does it",
                      RunWarning, stacklevel=4)


def _append_batch(store: Store, run: Run, batch: Any) -> None:
    """Append a batch of ``run``'s points as a record; on any failure the points wait for the next flush."""
    if batch is None:
        return
    try:
        store.append(KIND_METRICS, {"run": run.ref, **batch.record}, key=metrics_key(run.ref), refs=batch.refs)
    except BaseException as e:
        if not getattr(e, "record_added", False):
            run._metrics.put_back(batch)
            raise
        run._metrics.done(batch)
        raise
    run._metrics.done(batch)


#: Per thread: each run's metric summary as its flush hook saw it, until that flush has written the batches.
_flushing = threading.local()


def _publish_written(store: Store) -> None:
    """After a flush of ``store`` that wrote everything: the summaries its hooks saw may go in the runs' refs."""
    summaries: dict[int, tuple[Run, Any]] = getattr(_flushing, "summaries", {})
    for key, (run, snapshot) in list(summaries.items()):
        if run.store is store:
            del summaries[key]
            run._metrics.written_up_to(snapshot)


def _ref_data(run: Run) -> dict[str, Any]:
    """What a run's ref carries besides its manifest: enough to list it (status, heartbeat, latest metrics)."""
    m = run.manifest
    return {"name": run.name, "status": m["status"], "start": m["start"], "heartbeat": time.time(),
            "heartbeat_s": run._heartbeat_s, "heartbeat_lag": round(run._beat_lag, 3),
            "metrics": run._metrics.ref_summary()}


def _params_text(params: dict[str, Any]) -> str:
    """What the params are now, to see that they changed; never raises (the user's keys and values may)."""
    try:
        return json.dumps(dict(list(dict.items(params))), sort_keys=True, default=repr)
    except Exception:  # noqa: BLE001 - keys of several types, a value whose repr fails, ...
        return short_repr(list(dict.items(params)), 100_000)


# -- the active runs, casmon.log, and signals -------------------------------------------------------
#: Runs between their start and their end, in this process, oldest first.
_active: list[Run] = []
_active_lock = threading.Lock()
#: Signals that arrived while a run was being saved: acted on once it is.
_deferred_signals: list[int] = []


def _activate(run: Run) -> None:
    global _fork_hook
    with _active_lock:
        _active.append(run)
        if not _fork_hook and hasattr(os, "register_at_fork"):
            _fork_hook = True
            os.register_at_fork(after_in_child=_forget_runs_in_child)
    signals.on_signal, signals.on_note = _on_signal, _note_signal
    signals.install()


_fork_hook = False


def _forget_runs_in_child() -> None:
    """A forked child (a pool's worker) records none of its parent's runs, and meets signals as it would
    without casmon (``Pool.terminate`` ends its workers with SIGTERM)."""
    global _active_lock
    _active_lock = threading.Lock()  # the parent's may have been held by another thread at the fork
    _active.clear()
    live.forget_in_child()
    _deferred_signals.clear()
    signals.forget_in_child()


def _deactivate(run: Run) -> int:
    """Forget ``run``; how many runs are still active."""
    with _active_lock:
        if run in _active:
            _active.remove(run)
        return len(_active)


def active_run() -> Run | None:
    """The innermost run this thread records, else the innermost in this process, else None."""
    with _active_lock:
        runs = list(_active)
    me = threading.get_ident()
    for r in reversed(runs):
        if r._thread == me:
            return r
    return runs[-1] if runs else None


def log(metrics: Mapping[str, Any] | str | None = None, value: Any = NO_VALUE, /, *more: Any, step: int | None = None,
        **named: Any) -> None:
    """``run.log`` on the innermost active run (see :meth:`Run.log`); :class:`NoActiveRunError` outside any."""
    if type(metrics) is str and value is not NO_VALUE and not more and not named:
        metrics = {metrics: value}
    elif value is not NO_VALUE or more or (metrics is not None and (named or type(metrics) is not dict)):
        metrics = call_metrics("casmon.log", metrics, value, more, named)
    run = active_run()
    if run is None:
        raise NoActiveRunError("casmon.log: no run is being recorded; start one with `casmon.start_run(...)` (a "
                               "notebook) or `with casmon.record(...) as run:` (or @casmon.record), or use run.log")
    run.log(metrics, step=step, **named)


def _note_signal(signum: int, name: str, t: float) -> None:
    with _active_lock:
        for r in _active:
            if r._signal is None:
                r._signal = (name, t)


def _on_signal(signum: int, name: str, t: float) -> None:
    """SIGTERM or SIGHUP while runs go on: end them as ``killed`` (see :mod:`casmon.runs.signals`)."""
    main = threading.main_thread().ident
    with _active_lock:
        runs = list(_active)
    if any(r._ending and r._thread == main for r in runs):
        _deferred_signals.append(signum)  # a run of this thread is being saved: the signal waits until it is
        return
    _note_signal(signum, name, t)
    if _main_thread_runs():
        raise RunSignal(signum, name)  # its record block saves it, then the signal is sent again
    _save_killed(signum, name)  # recorded only in other threads: saved from here
    signals.redeliver(signum)


def _main_thread_runs() -> bool:
    """Whether a block of the main thread records a run: a signal raises there, and that block saves it."""
    main = threading.main_thread().ident
    with _active_lock:
        return any(r._thread == main and r._by_block for r in _active)


def _save_killed(signum: int, name: str) -> None:
    """Save every active run (of other threads: the main thread's have ended) as killed by ``signum``."""
    with _active_lock:
        runs = list(_active)
    for r in runs:
        rec = r._recorder
        if rec is None or r._ending:
            continue
        r._ending = True
        live.unwatch(id(r))
        try:
            r._output = r._capture.stop() if r._capture is not None else None
        except Exception:  # noqa: BLE001
            r._output = None
        end = time.time()
        r.manifest["end"], r.manifest["duration"] = end, end - r.manifest["start"]
        _end_status(r, RunSignal, RunSignal(signum, name), None, end)
        r._ended = True
        rec._save_end(r)
        _deactivate(r)


#: Runs whose start or end could not be written yet, per store: each later successful flush tries again.
_unsaved: dict[int, list[Run]] = {}
_unsaved_lock = threading.Lock()


def _pending(run: Run) -> None:
    from casmon.store import lifecycle

    lifecycle.before_exit_flush(_save_unsaved_at_exit)
    store = run.store
    with _unsaved_lock:
        runs = _unsaved.setdefault(id(store), [])
        if run not in runs:
            runs.append(run)
        first = len(runs) == 1
    if first:
        store.add_after_flush(_retry_unsaved)


def _done(run: Run) -> None:
    with _unsaved_lock:
        runs = _unsaved.get(id(run.store), [])
        if run in runs:
            runs.remove(run)


def _retry_unsaved(store: Store) -> None:
    """After a flush that worked: write the runs of ``store`` that could not be written before."""
    with _unsaved_lock:
        runs = list(_unsaved.get(id(store), []))
    for run in runs:
        rec = run._recorder
        if rec is None:
            continue
        try:
            with run._saving:
                if run._ended:
                    rec._store_end(run)
                elif not run._started:
                    rec._store_start(run)
        except Exception:  # noqa: BLE001 - still away: the next flush tries again
            continue
        _done(run)


def _save_unsaved_at_exit() -> None:
    """At exit: keep trying, for up to ``CASMON_EXIT_RETRY_S`` seconds, to save runs whose end the store refused
    (a blip as the run ended must not leave it ``running``)."""
    try:
        budget = float(os.environ.get("CASMON_EXIT_RETRY_S", EXIT_RETRY_S))
    except ValueError:
        budget = EXIT_RETRY_S
    deadline = time.monotonic() + budget
    wait = 0.25
    while True:
        with _unsaved_lock:
            runs = [r for rs in _unsaved.values() for r in rs if r._ended and r._recorder is not None]
        if not runs:
            return
        for run in runs:
            try:
                with run._saving:
                    run._recorder._store_end(run)  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - still away: wait and try again
                continue
            _done(run)
        if time.monotonic() + wait > deadline:
            with _unsaved_lock:
                left = [r.name for rs in _unsaved.values() for r in rs if r._ended]
            if left:
                warnings.warn(f"casmon.record: could not save run(s) {', '.join(left)} before exit: the store did not "
                              f"answer for {budget:g} s; they stay 'running' and are read as 'lost'", RunWarning,
                              stacklevel=1)
            return
        time.sleep(wait)
        wait = min(wait * 2, 4.0)


def record_context(increment_dir: Any = None, comment: str = "", tracking_files: Iterable[str] | None = None,
                   save_output: bool = True, store: Store | str | None = None) -> record:
    """FineCache's ``record_context`` parameters, on casmon's :class:`record`."""
    return record(comment=comment, store=store, increment_dir=increment_dir, tracking_files=tracking_files or (),
                  save_output=save_output)


# Pickles and keys name these types where they were before the packages (casmon/keys/names.py).
keep_flat_names([record, Run, RunWarning])
