"""FineCache 0.1.x's documented API on the casmon store.

    from casmon.compat.finecache import FineCache, CacheFilenameConfig, IncrementDir

Differences that are fixes: cache keys are content digests, not md5 of
``repr`` (two large arrays that differ in one element do not collide, and
eight arguments do not make a file name too long, as in FineCache); results are stored once
by content in ``{base_path}/.casmon``; a run records untracked files too, stores
tracked files by content instead of copying them, and two runs started at once
never share a number. Runs live in the store *and* in FineCache's folders:
``record_context`` / ``record`` create ``{dir_prefix}{n}[-{comment}]`` under the
``IncrementDir``'s base path when the run starts (the store's run number and
the folder's number are claimed together) and, when it ends, write into it the
bytes ``casmon export`` writes (``information.json``, ``current_changes.patch``,
``console.log``, tracked files). Importing this module configures no logging.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import shutil
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, wraps
from itertools import zip_longest
from pathlib import Path
from typing import Any, Callable

from casmon.caching import CacheState, cache_with
from casmon.keys.digest import Digest
from casmon.keys.fingerprint import Fingerprinter
from casmon.runs.gitstate import capture_code_state
from casmon.runs import RUN_REFS, RunWarning, export as _export, load_run as _load_run, record as _record
from casmon.store.store import default_store

__all__ = ["FineCache", "CacheFilenameConfig", "IncrementDir", "CachedCall", "PickleAgent", "HashFunc"]


class HashFunc:
    @staticmethod
    def hash(x, hash_cls=hashlib.md5):
        obj = hash_cls()
        obj.update(x.encode("utf-8"))
        return obj.hexdigest()


@dataclass
class CachedCall:
    func: Callable
    args: tuple
    kwargs: dict

    @cached_property
    def result(self):
        return self.func(*self.args, **self.kwargs)


class PickleAgent:
    """Accepted for compatibility: casmon stores results with its own serialization."""


@dataclass
class CacheFilenameConfig:
    """FineCache's cache file naming; in casmon it names the cache entry (its *label*), not a file."""

    join_list: str = ","
    join_dict: str = ","
    join_key_value: str = "="
    join_func: str = "{func_name}({args};{kwargs})"
    config_path: str | None = None
    suffix: str = ".pk"

    def get_filename(self, call: CachedCall, args_hash=None, kwargs_hash=None) -> str:
        if args_hash is None:
            args_hash = [lambda x: HashFunc.hash(repr(x))] * len(call.args)
        if kwargs_hash is None:
            kwargs_hash = [lambda x, y: (x, HashFunc.hash(repr(y)))] * len(call.kwargs)
        args = []
        for a, h in zip_longest(call.args, args_hash):
            args.append(repr(a) if h is None else repr(h(a)))
        kwargs = []
        for (k, v), h in zip_longest(call.kwargs.items(), kwargs_hash):
            if h is None:
                kwargs.append((k, repr(v)))
            else:
                k2, v2 = h(k, v)
                kwargs.append((k2, repr(v2)))
        args_string = self.join_list.join(args)
        kwargs_string = self.join_dict.join(k + self.join_key_value + v for k, v in kwargs)
        return self.join_func.format(func_name=call.func.__name__, args=args_string, kwargs=kwargs_string) + self.suffix


class IncrementDir:
    """Folders named ``{dir_prefix}{n}`` or ``{dir_prefix}{n}-{comment}``; in casmon, its prefix names runs."""

    def __init__(self, base_path: str, dir_prefix: str = "") -> None:
        self.base_path = Path(base_path)
        self.dir_prefix = dir_prefix

    @property
    def latest_dir(self) -> tuple[int | None, str | None]:
        found = self._numbered()
        return max(found, key=lambda x: x[0]) if found else (None, None)

    def _numbered(self) -> list[tuple[int, str]]:
        if not self.base_path.is_dir():
            return []
        found = []
        for d in os.listdir(self.base_path):
            if d.startswith(self.dir_prefix) and (self.base_path / d).is_dir():
                m = re.match(r"\d+", d[len(self.dir_prefix) :])
                if m:
                    found.append((int(m.group(0)), d))
        return found

    def create_new_dir(self, dir_suffix: str = "") -> str:
        """The next folder; an existing folder of the same name is never reused (FineCache's would be)."""
        n, _ = self.latest_dir
        n = 1 if n is None else n + 1
        self.base_path.mkdir(parents=True, exist_ok=True)
        while True:
            name = f"{self.dir_prefix}{n}-{dir_suffix}" if dir_suffix else f"{self.dir_prefix}{n}"
            path = self.base_path / name
            try:
                path.mkdir()
            except FileExistsError:
                n += 1
                continue
            return str(path)


class _FolderRecord(_record):
    """A casmon run that also keeps FineCache's run folder ``{dir_prefix}{n}[-{comment}]``.

    The number is claimed in the store (create-if-absent ``runs/{prefix}{n}``,
    so two processes never share one) starting above every number the store
    *and* the base path already use, and skipping numbers a folder took
    meanwhile; the folder is made as soon as the number is won.
    """

    def __init__(self, inc: Any, **kwargs: Any) -> None:
        super().__init__(increment_dir=inc, **kwargs)
        self.inc = inc
        self.folder: Path | None = None

    def track_files(self, store, root, store_root, refs):
        # FineCache never copies its own run folders into a run: skip the base path (or, when the base path
        # is the project root, the run folders in it).
        base = Path(self.inc.base_path).resolve()
        if base == Path(root).resolve() or base in Path(root).resolve().parents:
            self.exclude_dirs = [base / d for _, d in _numbered(self.inc)]
        else:
            self.exclude_dirs = [base]
        return super().track_files(store, root, store_root, refs)

    def claim_number(self, store):
        base = Path(self.inc.base_path)
        taken = []
        for name in store.refs(RUN_REFS):
            tail = name[len(RUN_REFS) + 1 :]
            if tail.startswith(self.prefix) and tail[len(self.prefix) :].isdigit():
                taken.append(int(tail[len(self.prefix) :]))
        n = max(taken + [k for k, _ in _numbered(self.inc)], default=0) + 1
        while True:
            if n in {k for k, _ in _numbered(self.inc)}:  # a folder took it (FineCache itself, or by hand)
                n += 1
                continue
            ref = f"{RUN_REFS}/{self.prefix}{n}"
            if store.create_ref(ref, None, {"status": "claimed", "time": time.time()}):
                name = f"{self.prefix}{n}" + (f"-{self.comment}" if self.comment else "")
                base.mkdir(parents=True, exist_ok=True)
                self.folder = base / name
                self.folder.mkdir(exist_ok=True)
                return n, ref
            n += 1


def _numbered(inc: Any) -> list[tuple[int, str]]:
    """``(n, folder name)`` of every run folder of ``inc`` (any IncrementDir-like object: ``base_path``, ``dir_prefix``)."""
    if isinstance(inc, IncrementDir):
        return inc._numbered()
    return IncrementDir(inc.base_path, getattr(inc, "dir_prefix", "") or "")._numbered()


def write_run_folder(store, ref: str, folder: Path) -> None:
    """Write into ``folder`` what ``casmon export`` writes for run ``ref``.

    As with FineCache, which copies the tracked files and opens ``console.log``
    when the run starts and writes ``information.json`` when it ends, a file the
    run's own code put in its folder under one of those names stays; only
    ``information.json`` is always written. The files are exported into a
    temporary folder inside ``folder`` and renamed into place, so each appears whole.
    """
    folder.mkdir(parents=True, exist_ok=True)  # made when the run started; made again if something removed it
    tmp = Path(tempfile.mkdtemp(prefix=".casmon-export-", dir=folder))
    try:
        _export(_load_run(ref, store), tmp, store)
        for src in sorted(p for p in tmp.rglob("*") if p.is_file()):
            rel = src.relative_to(tmp)
            dest = folder / rel
            if rel.as_posix() != "information.json" and (dest.exists() or dest.is_symlink()):
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _keyed_state(args_hash, kwargs_hash):
    """A cached function whose key follows FineCache's per-position hashers (``args_hash``, ``kwargs_hash``)."""

    class _FineCacheKeys(CacheState):
        def key(self, args: tuple, kwargs: dict):
            if not args_hash and not kwargs_hash:
                return super().key(args, kwargs)  # casmon's key: arguments bound to the signature
            fp = Fingerprinter()
            fp.out += self.key_prefix()
            parts: list[Any] = []
            for i, a in enumerate(args):
                h = args_hash[i] if args_hash and i < len(args_hash) else None
                parts.append(("a", h(a) if h is not None else a, f"args[{i}]"))
            for j, (k, v) in enumerate(kwargs.items()):
                h = kwargs_hash[j] if kwargs_hash and j < len(kwargs_hash) else None
                k2, v2 = h(k, v) if h is not None else (k, v)
                parts.append(("k", (k2, v2), f"kwargs[{k!r}]"))
            for tag, v, where in parts:
                try:
                    fp.feed(tag)
                    fp.feed_value(v, where)
                except Exception as e:  # noqa: BLE001
                    self.warn(("arg", where), f"casmon: {self.name}: {where} skipped, this call is not cached: {e}")
                    return None
            return fp.digest()

        def save(self, key: Digest, result: Any, seconds: float, args: tuple[Any, ...], kwargs: dict[Any, Any],
                 files: list[Any] | None = None, spans: Any = None) -> None:
            try:
                pickle.dumps(result, protocol=5)
            except Exception as e:  # noqa: BLE001 - FineCache documents a PickleError here
                raise pickle.PickleError(f"Object {result!r} is not picklable...") from e
            super().save(key, result, seconds, args, kwargs, files, spans)

    return _FineCacheKeys


def _store_at(location: str):
    """The store in ``{base_path}/.casmon``, opened again if its folder was deleted since this process opened it.

    FineCache keeps nothing in memory, so deleting the base folder (``rmtree``
    between experiments or tests) starts afresh; casmon's open store would
    otherwise go on writing into a folder that is gone.
    """
    from casmon.store.marker import FORMAT_KEY

    s = default_store(location)
    if s.backend.local_root is not None and not os.path.exists(os.path.join(location, FORMAT_KEY)):
        s.abandon()  # what it held pending belonged to the deleted folder
        s = default_store(location)
    return s


class FineCache:
    """FineCache's entry point: ``cache``, ``record_context``, ``record``; data in ``{base_path}/.casmon``."""

    def __init__(self, base_path: str | None = None, agent_class: Any = None) -> None:
        self.base_path = os.path.abspath(base_path) if base_path else os.path.abspath(os.getcwd())
        os.makedirs(self.base_path, exist_ok=True)
        self.store = _store_at(os.path.join(self.base_path, ".casmon"))
        # Like FineCache, take the code state now: a long run must record the code it started with.
        self._code = capture_code_state(exclude=[os.path.join(self.base_path, ".casmon")])
        self._code_time = time.time()
        self.commit_hash = self._code.commit
        self.project_root = self._code.root
        self.patch_content = self._code.patch.decode("utf-8", "replace")
        self.patch_time = str(datetime.fromtimestamp(self._code_time))

    def cache(self, args_hash: list | None = None, kwargs_hash: list | None = None,
              config: CacheFilenameConfig = CacheFilenameConfig(), agent: Any = None):
        """Cache a function's results; ``config``'s file name becomes the entry's label (``casmon cache``)."""

        def _cache_fn(func: Callable) -> Callable:
            def label(*args, **kwargs):
                return config.get_filename(CachedCall(func, args, kwargs), args_hash=args_hash, kwargs_hash=kwargs_hash)

            return cache_with(_keyed_state(args_hash, kwargs_hash), func, store=self.store, label=label)

        return _cache_fn

    @contextmanager
    def record_context(self, inc_dir: IncrementDir | None = None, comment: str = "", tracking_files: list | None = None,
                       save_output: bool = True, *, increment_dir: IncrementDir | None = None):
        """Record a run; yields FineCache's information dict, whose added keys are kept with the run.

        The run is kept in the store and in the folder ``{dir_prefix}{n}[-{comment}]``
        under the IncrementDir's base path (default: this FineCache's base path).
        """
        inc = increment_dir or inc_dir or IncrementDir(self.base_path)
        if re.search(r"[/\\\0]", comment) or comment in (".", ".."):
            raise ValueError(f"record_context: comment={comment!r} would not be one folder name")
        rec = _FolderRecord(inc, comment=comment, store=self.store, tracking_files=tracking_files or [],
                            save_output=save_output, code_state=self._code)
        rec.code_time = self._code_time
        run = None
        try:
            with rec as run:
                information: dict[str, Any] = {
                    "commit": self.commit_hash,
                    "run_time": str(datetime.now()),
                    "patch_time": self.patch_time,
                    "project_root": self.project_root,
                }
                if run.manifest.get("tracking_records"):
                    information["tracking_records"] = run.manifest["tracking_records"]
                fixed = dict(information)
                try:
                    yield information
                finally:
                    for k, v in information.items():
                        if k not in fixed or v != fixed[k]:
                            run.info[k] = v
            self.last_run = run
        finally:
            if run is not None and rec.folder is not None:
                try:
                    write_run_folder(self.store, run.ref, rec.folder)
                except Exception as e:  # noqa: BLE001 - the run is in the store; never hide the user's own error
                    warnings.warn(f"FineCache: could not write run folder {rec.folder}: {e}", RunWarning, stacklevel=3)

    def record(self, increment_dir: IncrementDir | None = None, comment: str = "", tracking_files: list | None = None,
               save_output: bool = True):
        """``record_context`` as a decorator; adds ``record_function`` and ``run_end_time``."""

        def record_decorator(func):
            @wraps(func)
            def new_func(*args, **kwargs):
                with self.record_context(increment_dir, comment, tracking_files, save_output) as information:
                    res = func(*args, **kwargs)
                    information["record_function"] = func.__qualname__
                    information["run_end_time"] = str(datetime.now())
                return res

            return new_func

        return record_decorator

