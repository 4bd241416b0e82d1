"""Code versions: a digest of a function's code and of everything in user code it reads.

``function_version(fn)`` covers the function's own code and, followed
recursively through its globals, its closures and the modules it reads
attributes from, **in the user's own modules** (not in the standard library or
installed packages):

* the code of the functions it calls and of the classes it uses (a class counts
  with all its methods and the code they reach in turn);
* every value it reads: scalar and non-scalar constants (``THRESH = 2``,
  ``PARAMS = {"lr": 1}``, a lookup array), module attributes (``config.THRESH``
  after ``import config``, also when the import is inside the function),
  closure cells, default argument values;
* functions and classes inside those values (``HANDLERS = {"a": helper}``).

The walk ends on any graph of classes, instances and modules: see :mod:`casmon.keys.versionwalk`.

So editing a helper or a config module invalidates the cache of every cached
function that uses it, which joblib.Memory does not do.

What counts as an edit: code is compared as a syntax tree, without comments,
formatting, docstrings or decorators. Comment-only, whitespace-only and
docstring-only edits keep cached results; any change to what the code does
invalidates them. The source is used only when it is the source of the code
that runs: when a file was edited after it was imported (and not reloaded), or
where there is no source (code typed at a prompt, ``exec``), the compiled
bytecode is compared instead, without line numbers. Two lambdas on one line
are told apart by their own text.

**Re-checked at every call, cheaply.** A :class:`VersionTracker` remembers
what the version was computed from and re-checks it before each use: that each
function still has the same ``__code__`` object (``%autoreload`` and
``f.__code__ = ...`` replace it in place), that each global, module attribute
and closure cell still holds the same object, and that each mutable value
(dict, list, array, object) still has the same content fingerprint. Only when
something changed is the version computed again. Changes a cached function
makes itself while it runs (appending to a log list) are not edits: after each
computed call the tracker takes the new content as the baseline
(:meth:`VersionTracker.observe`); the version keeps counting the content seen
before.
"""

from __future__ import annotations

import enum
import functools
import sys
import _thread  # threading's locks, without loading threading on a hit
import types
from _weakref import ref as weak_ref  # weakref's own, without loading weakref.py on a hit
from collections.abc import Callable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, cast


from casmon.keys.digest import Digest
from casmon.keys.fingerprint import Fingerprinter, canonical_module, fingerprint, qualified_name
from casmon.keys import sourcelines, versioncache, versionwalk
from casmon.keys.sourceblock import code_sig as _code_sig, def_block as _def_block
from casmon.keys.usercode import is_user_module

__all__ = [
    "function_version",
    "version_tracker",
    "VersionTracker",
    "VersionedFingerprinter",
    "versioned_fingerprint",
    "is_user_module",
    "function_name",
    "unwrap_callable",
    "canonical_module",
]

_SIMPLE = (type(None), bool, int, float, complex, str, bytes)
_MISSING = object()


# -- names ------------------------------------------------------------------------------------------------
def function_name(fn: Any) -> str:
    """``module.qualname`` of a function: what casmon records, keys and looks up.

    The main script's functions are ``__main__.f`` wherever they run (also in
    ``spawn`` workers, where the script is imported as ``__mp_main__``).
    ``functools.partial`` objects are named after their function; other
    callable objects after their class (``mod.Class.__call__``).
    """
    fn = _unwrap(fn)
    if isinstance(fn, functools.partial):
        return function_name(fn.func)
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None)
    if not isinstance(name, str):
        t = type(fn)
        return f"{canonical_module(t.__module__)}.{t.__qualname__}.__call__"
    return f"{canonical_module(getattr(fn, '__module__', None)) or '?'}.{name}"


def _unwrap(fn: Any) -> Any:
    try:
        if getattr(fn, "__wrapped__", _MISSING) is _MISSING:
            return fn  # the usual case: inspect is not loaded for it
    except Exception:  # noqa: BLE001 - a lookup that raises (an attribute-dict object)
        return fn
    import inspect

    try:
        return inspect.unwrap(fn)
    except Exception:  # noqa: BLE001 - a __wrapped__ cycle, or a lookup that raises
        return fn


def unwrap_callable(fn: Any) -> Any:
    """Follow ``__wrapped__`` through wrapper objects (cached functions, lru_cache), not through
    wrapper *functions*, whose own code counts (a decorator that doubles the result)."""
    for _ in range(100):
        if isinstance(fn, types.FunctionType) and _is_user_obj(fn):
            return fn
        try:
            w = getattr(fn, "__wrapped__", None)
        except Exception:  # noqa: BLE001 - a __getattr__ that raises KeyError
            return fn
        if w is None or not callable(w):
            return fn
        fn = w
    return fn


def _is_user_obj(obj: Any) -> bool:
    try:
        return is_user_module(getattr(obj, "__module__", None))
    except Exception:  # noqa: BLE001 - an unhashable __module__, a lookup that raises
        return False


# -- source text (parsed in casmon.keys.sourcetree, loaded by the first parse) ------------------------------
def _tree_of(src: str) -> tuple[str, Any]:
    """The syntax tree of source text ``src`` as text (docstrings and decorators stripped), and the tree."""
    from casmon.keys import sourcetree

    return sourcetree.tree_of(src)


#: Source texts (and write-only names) of the main script's code objects, by :func:`_code_key`:
#: filled where the source is readable, shipped with cached functions to worker processes, where
#: cloudpickle recreates the code without its file name (``<dynamic-code>``).
_shipped_texts: dict[bytes, tuple[str, frozenset[str]]] = {}


def _code_key(code: types.CodeType) -> bytes:
    return bytes(fingerprint((code.co_qualname, _code_sig(code))))


def texts_for_workers() -> dict[bytes, tuple[str, frozenset[str]]]:
    """The main script's source texts known here, to send along with a function pickled by value."""
    return dict(_shipped_texts)


def register_texts(texts: dict[bytes, Any] | None) -> None:
    """Accept source texts sent by :func:`texts_for_workers` (a code object matches only its own text)."""
    if texts:
        for k, v in texts.items():
            _shipped_texts.setdefault(bytes(k), (v[0], frozenset(v[1])))


_code_memo: dict[int, tuple[Any, str | None, frozenset[str]]] = {}  # id(code) -> (weakref to code, text or None, write-only names)


def _function_source(fn: types.FunctionType) -> tuple[str | None, frozenset[str]]:
    """``(text, write-only names)`` of the code ``fn`` runs; text is None if no trustworthy source exists.

    Remembered per code object: a code object's source is read once, so a file
    edited later (and not reloaded) does not change what names its code.
    """
    code = fn.__code__
    m = _code_memo.get(id(code))
    if m is not None and m[0]() is code:
        return m[1], m[2]
    sourcelines.checkcache(code.co_filename)  # as inspect does: a file edited and reloaded is read again
    found = _def_block(code)
    text: str | None
    tree: Any
    kept = None
    if found is not None:
        # Kept under the block alone where it compiles alone to this code, else (``mod.f()`` after ``import
        # mod`` compiles otherwise alone) under the whole file, which then decides.
        block = "".join(found[0])
        sig = _code_sig(code)
        keys = (versioncache.entry_key(block, code, sig),
                versioncache.entry_key(block, code, sig, "".join(sourcelines.getlines(code.co_filename))))
        kept = versioncache.lookup(code.co_filename, keys)
    if kept is not None:
        text, wo = kept  # this very block, parsed and checked against this very code by an earlier process
    else:
        from casmon.keys import sourcetree  # a parse, and its checks: a kept one needs neither

        if found is not None:
            text, tree = sourcetree.tree_of(block)
            body: Any = getattr(tree, "body", ())
            if len(body) != 1 or getattr(body[0], "name", None) != code.co_name:
                found = None  # not this one def after all: inspect decides
            elif sourcetree.block_compiles_to(found[0], code):
                kept = text, sourcetree.write_only_names(tree)
                versioncache.remember(code.co_filename, keys[0], *kept)
            elif sourcetree.code_matches_file(code):
                kept = text, sourcetree.write_only_names(tree)
                versioncache.remember(code.co_filename, keys[1], *kept)
            else:
                text, tree = None, None
        if found is None:
            text, tree = sourcetree.source_tree(fn)
            if text is not None and not sourcetree.code_matches_file(code):
                text, tree = None, None
        if text is not None and code.co_name == "<lambda>":
            text += "\nlambda:" + sourcetree.lambda_segment(code)
        if kept is not None:
            wo = kept[1]
        else:
            wo = sourcetree.write_only_names(tree) if tree is not None else sourcetree.write_only_names_code(code)
    main = canonical_module(getattr(fn, "__module__", None)) == "__main__"
    if text is not None and main:
        # Remember it for worker processes: cloudpickle ships __main__ functions without their file name.
        _shipped_texts[_code_key(code)] = (text, wo)
    elif text is None and _shipped_texts:
        known = _shipped_texts.get(_code_key(code))
        if known is not None:
            text, wo = known
    key = id(code)
    try:
        ref = weak_ref(code, functools.partial(_forget_code, key))
    except TypeError:  # pragma: no cover - code objects are weak-referenceable in CPython
        return text, wo
    _code_memo[key] = (ref, text, wo)
    return text, wo


def readable_source(fn: Any) -> str | None:
    """The source lines of function ``fn`` as written (comments and all), for people to read: a diff between two
    versions (``f.explain``). None where there is no source of the code that runs."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType) or _function_source(fn)[0] is None:
        return None
    import inspect
    import textwrap

    found = _def_block(code)
    if found is not None:
        return textwrap.dedent("".join(found[0]))
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return None


def _forget_code(key: int, _ref: object = None) -> None:
    """Drop a collected code object's memo entry (a weakref callback)."""
    _code_memo.pop(key, None)


def _function_text(fn: types.FunctionType) -> str | None:
    """The function's syntax tree as text, or None if no trustworthy source exists."""
    return _function_source(fn)[0]


def _bytecode_parts(code: types.CodeType) -> list[Any]:
    consts: list[Any] = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            consts.append(_bytecode_parts(c))
        elif isinstance(c, _SIMPLE) or (isinstance(c, (tuple, frozenset)) and all(isinstance(x, _SIMPLE) for x in c)):
            consts.append(c)
        else:
            consts.append(repr(type(c)))
    return [code.co_code, consts, code.co_names, code.co_varnames]


def _all_names(code: types.CodeType) -> list[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names.update(_all_names(c))
    return sorted(names)


# -- values ---------------------------------------------------------------------------------------------
_IMMUTABLE_SCALARS = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis))


def _is_immutable(v: Any, depth: int = 0) -> bool:
    """Values whose content cannot change while the same object is bound: identity is enough."""
    t = type(v)
    if t in _IMMUTABLE_SCALARS:
        return True
    if t in (tuple, frozenset) and depth < 3 and len(v) <= 256:
        return all(_is_immutable(x, depth + 1) for x in v)
    return False


def _is_state(v: Any) -> bool:
    """A value of a library type (a list, a dict, an array...) that code may write to without reading:
    a user object's methods could read it, so those always count."""
    t = type(v)
    return not (isinstance(v, (types.FunctionType, types.ModuleType, type)) or _is_user_obj(t))


def _quiet_type(v: Any) -> bool:
    """Unhashable values that hold no input data (locks, streams, loggers): counted by type without a warning."""
    mod = type(v).__module__ or ""
    return mod.split(".")[0] in ("_thread", "threading", "multiprocessing", "logging", "io", "_io", "casmon", "asyncio",
                                 "concurrent", "queue", "weakref", "_weakref", "tqdm")


# -- trackers ---------------------------------------------------------------------------------------------
class _Collector:
    """Walks a function or class, collecting the parts of its version and what to watch."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
        self.seen: set[Any] = set()
        # (weakref to function, code object, __defaults__, __kwdefaults__): each re-checked by identity
        self.codes: list[tuple[Any, types.CodeType, Any, Any]] = []
        self.names: list[tuple[Any, str, Any]] = []  # (mapping, key, object)
        self.cells: list[tuple[types.CellType, Any]] = []  # (cell, object)
        self.contents: list[tuple[Any, Digest, Any]] = []  # (object, fingerprint, smallpickle's check or None): mutable values, re-checked
        self.unhashable: list[tuple[str, str]] = []  # (name, type) of values counted by type only
        self.trackers: list[VersionTracker] = []  # nested trackers consulted while fingerprinting values
        # (tracker, digest fed, or None where the tracker was on this thread's walk and its name stood for it)
        self.deps: list[tuple[VersionTracker, Digest | None]] = []

    # what to watch
    def _bind(self, where: Any, v: Any) -> None:
        if where is None:
            return
        if isinstance(where, tuple):
            self.names.append((where[0], where[1], v))
        else:
            self.cells.append((where, v))

    def function(self, fn: Any, depth: int) -> None:
        if isinstance(fn, types.MethodType):
            # A bound method (``casmon.cache(obj.method)``): its object's state counts like an argument.
            if id(fn) not in self.seen:
                self.seen.add(id(fn))
                self.value("<bound to>", fn.__self__, None)
            fn = fn.__func__
        fn = unwrap_callable(fn)
        if isinstance(fn, types.MethodType):
            fn = fn.__func__
        if id(fn) in self.seen or depth > 50:
            return
        self.seen.add(id(fn))
        code = getattr(fn, "__code__", None)
        if not isinstance(fn, types.FunctionType) or code is None:
            # A builtin, a partial, a callable object: its name, and its content as a value.
            self.parts.append(("fn", function_name(fn), None))
            if isinstance(fn, functools.partial):
                self.function(fn.func, depth + 1)
                self.value("<partial args>", (fn.args, fn.keywords), None)
            elif isinstance(fn, type):
                if _is_user_obj(fn):
                    self.klass(fn, depth + 1)
            elif not isinstance(fn, types.BuiltinFunctionType) and callable(fn):
                self.klass(type(fn), depth + 1)
                self.value("<callable object>", fn, None)
            return
        self.codes.append((_weakref(fn), code, fn.__defaults__, fn.__kwdefaults__))
        text, write_only = _function_source(fn)
        self.parts.append(("fn", function_name(fn), text if text is not None else _bytecode_parts(code)))
        if not _is_user_obj(fn):
            return  # library code: its own text is enough
        if fn.__defaults__ or fn.__kwdefaults__:
            self.value("<defaults>", (fn.__defaults__, fn.__kwdefaults__), None)
        g = fn.__globals__
        names = _all_names(code)
        for n in names:
            if n in g:
                key = ("g", id(g), n)
                if key in self.seen:
                    continue
                v = g[n]
                if n in write_only and _is_state(v):
                    self._bind((g, n), v)  # written, never read here: not part of the version
                    continue
                self.seen.add(key)
                self.ref(n, v, (g, n), names, depth)
            elif "." not in n or n in sys.modules:
                mod = sys.modules.get(n)  # `import config` inside the function
                if isinstance(mod, types.ModuleType) and is_user_module(mod.__name__):
                    self.module(n, mod, names, depth)
        for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
            try:
                v = cell.cell_contents
            except ValueError:  # empty cell
                continue
            if name in write_only and _is_state(v):
                self._bind(cell, v)
                continue
            self.ref(f"<closure {name}>", v, cell, names, depth)

    def ref(self, name: str, v: Any, where: Any, names: list[str], depth: int) -> None:
        self._bind(where, v)
        try:
            self._ref(name, v, where, names, depth)
        except Exception:  # noqa: BLE001 - a user object whose lookups raise: counted by type, the walk goes on
            tname = _type_name(v)
            self.parts.append(("global", name, "<unreadable " + tname + ">"))
            self.unhashable.append((name, tname))

    def _ref(self, name: str, v: Any, where: Any, names: list[str], depth: int) -> None:
        if isinstance(v, types.FunctionType) or (callable(v) and not isinstance(v, type) and hasattr(v, "__wrapped__")):
            target = unwrap_callable(v)
            if isinstance(target, types.FunctionType) and _is_user_obj(target):
                self.function(target, depth + 1)
            else:
                self.parts.append(("lib", name, _name_of(target)))
        elif isinstance(v, type):
            if _is_user_obj(v):
                self.klass(v, depth + 1)
            else:
                self.parts.append(("lib", name, _name_of(v)))
        elif isinstance(v, types.ModuleType):
            if is_user_module(v.__name__):
                self.module(name, v, names, depth)
            else:
                self.parts.append(("module", name, v.__name__))
        elif isinstance(v, types.BuiltinFunctionType) and (v.__self__ is None or isinstance(v.__self__, types.ModuleType)):
            self.parts.append(("lib", name, _name_of(v)))
        else:
            self.value(name, v, where)

    def module(self, name: str, mod: types.ModuleType, names: list[str], depth: int) -> None:
        d = mod.__dict__
        for attr in names:
            if attr in d:
                key = ("g", id(d), attr)
                if key in self.seen:
                    continue
                self.seen.add(key)
                self.ref(f"{name}.{attr}", d[attr], (d, attr), names, depth + 1)

    def klass(self, cls: type, depth: int) -> None:
        if id(cls) in self.seen or depth > 50:
            return
        self.seen.add(id(cls))
        own = vars(cls)
        fns: list[tuple[str, Any, Any]] = []
        for attr in sorted(own):
            raw = own[attr]
            try:
                fns.extend((attr, raw, f) for f in _class_member_functions(raw))
            except Exception:  # noqa: BLE001 - its lookups raise: a data attribute, counted as a value
                pass
        # A class is its bases, its metaclass, its methods' code and its data attributes (the
        # methods' own files are read, so this works where the class's module is not importable,
        # as for a class from __main__ in a worker process).
        self.parts.append(("class", qualified_name(cls), [_name_of(b) for b in cls.__bases__], _name_of(type(cls))))
        for base in cls.__mro__[1:]:
            if base is not object and _is_user_obj(base):
                self.klass(base, depth + 1)
        meta = type(cls)
        if meta is not type and _is_user_obj(meta):
            self.klass(meta, depth + 1)  # its __call__ runs at every instantiation
        for attr, raw, f in fns:
            self._bind((own, attr), raw)
            self.parts.append(("member", attr))
            self.function(f, depth + 1)
        fn_attrs = {a for a, _r, _f in fns}
        for attr in sorted(own):
            if attr in fn_attrs or (attr.startswith("__") and attr.endswith("__")) or attr.startswith("_abc"):
                continue
            if attr == "_value2member_map_" and isinstance(cls, enum.EnumMeta):
                continue  # Python's cache of Flag combinations and _missing_ members: the members count in _member_map_
            raw = own[attr]
            if isinstance(raw, (staticmethod, classmethod, property, functools.cached_property)) or callable(raw):
                self._bind((own, attr), raw)
                continue
            self.value(f"{cls.__qualname__}.{attr}", raw, (own, attr), quiet=True)

    def value(self, name: str, v: Any, where: Any, quiet: bool = False) -> None:
        from casmon.keys.smallpickle import small_pickle  # a constant's: a kept version loads none

        if where is not None:
            self._bind(where, v)
        fp = VersionedFingerprinter()
        try:
            fp.feed_value(v, name)
        except Exception:  # noqa: BLE001 - a lock, a connection, an open file
            tname = _type_name(v)
            self.parts.append(("global", name, "<unhashable " + tname + ">"))
            if not quiet and not _quiet_type(v):
                self.unhashable.append((name, tname))
            return
        d = fp.digest()
        self.trackers.extend(fp.trackers)
        self.deps.extend(fp.deps)
        self.parts.append(("global", name, bytes(d)))
        if not _is_immutable(v):
            if fp.trackers:
                try:
                    self.contents.append(_content_watch(v))  # the code it reaches is checked through self.deps
                except Exception:  # noqa: BLE001 - cannot be checked: the version is computed again at each use
                    self.contents.append((v, d, None))
            else:
                self.contents.append((v, d, small_pickle(v)))


def _content_watch(v: Any) -> tuple[Any, Digest, Any]:
    """``(v, content digest, small pickle or None)`` to compare. The digest names user classes without their
    versions: a content check never computes one (the versions a value reached are the tracker's ``_deps``)."""
    from casmon.keys.smallpickle import small_pickle

    pk = small_pickle(v)
    return (v, _NO_DIGEST if pk is not None else fingerprint(v), pk)


_NO_DIGEST = Digest.from_raw(bytes(16))


def _class_member_functions(raw: Any) -> list[Any]:
    if isinstance(raw, (staticmethod, classmethod)):
        raw = raw.__func__
    if isinstance(raw, property):
        return [f for f in (raw.fget, raw.fset, raw.fdel) if isinstance(_unwrap(f), types.FunctionType)]
    if isinstance(raw, functools.cached_property):
        raw = raw.func
    raw = _unwrap(raw) if callable(raw) else raw
    return [raw] if isinstance(raw, types.FunctionType) else []


def _name_of(obj: Any) -> str:
    try:
        return qualified_name(obj)
    except TypeError:
        t = type(obj)
        return f"<{canonical_module(t.__module__)}.{t.__qualname__}>"


def _type_name(v: Any) -> str:
    t = type(v)
    try:
        return f"{canonical_module(t.__module__)}.{t.__qualname__}"
    except Exception:  # noqa: BLE001 - a metaclass whose lookups raise
        return "?"


def _weakref(obj: Any) -> Callable[[], Any]:
    try:
        return weak_ref(obj)
    except TypeError:
        return lambda: obj


class VersionTracker:
    """The version of one function or class, re-checked cheaply before each use."""

    __slots__ = ("_ref", "digest", "_codes", "_names", "_cells", "_contents", "_nested", "_deps", "unhashable",
                 "_lock", "computations", "parts", "__weakref__")

    def __init__(self, obj: Any) -> None:
        self._ref = _weakref(obj)
        self.digest: Digest | None = None
        self._codes: tuple[tuple[Any, types.CodeType, Any, Any], ...] = ()
        self._names: tuple[tuple[Any, str, Any], ...] = ()
        self._cells: tuple[tuple[types.CellType, Any], ...] = ()
        self._contents: list[tuple[Any, Digest, Any]] = []
        self._nested: tuple[VersionTracker, ...] = ()
        self._deps: tuple[tuple[VersionTracker, Digest | None], ...] = ()
        self.unhashable: list[tuple[str, str]] = []
        self._lock = _thread.allocate_lock()
        self.computations = 0  # how many times the version was computed (for tests and diagnostics)
        #: What the version was computed from: ``("fn", name, source or bytecode)``, ``("global", name, digest)``,
        #: ... (``f.explain`` and ``casmon cache NAME`` say which of them changed).
        self.parts: list[Any] = []

    def current(self) -> Digest:
        """The version now: the remembered one if nothing it depends on changed, else computed again."""
        d = self.digest
        # On this thread's walk its name stands for it, though another thread may have stored it meanwhile.
        if d is not None and id(self) not in versionwalk.current().busy and self.valid():
            return d
        return self._compute()

    def valid(self, deps: bool = True) -> bool:
        """True if nothing the version was computed from changed (``deps=False``: its own parts only). Never
        computes a version; checks each one it reached once, so a cycle of classes is never re-entered."""
        for fr, code, dflt, kwdflt in self._codes:
            f = fr()
            if f is None or f.__code__ is not code or f.__defaults__ is not dflt or f.__kwdefaults__ is not kwdflt:
                return False
        for m, k, v in self._names:
            if m.get(k, _MISSING) is not v:
                return False
        for cell, v in self._cells:
            try:
                if cell.cell_contents is not v:
                    return False
            except ValueError:
                return False
        for v, fp, pk in self._contents:
            try:
                if pk is not None:
                    from casmon.keys.smallpickle import pickle_matches  # a constant's: a kept version loads none

                    if not pickle_matches(v, pk):
                        return False
                elif fingerprint(v) != fp:
                    return False
            except Exception:  # noqa: BLE001 - became unhashable
                return False
        return not deps or not self._deps or self._deps_valid()

    def _deps_valid(self) -> bool:
        """The versions this one reached are unchanged: each checked once, in a loop (a chain or cycle of any
        length). One reaching a version being computed now on this thread is in its cycle: computed again."""
        now = versionwalk.current().busy
        walk, todo = {id(self)}, [self]
        while todo:
            for t, d in todo.pop()._deps:
                if id(t) in now:
                    return False
                if d is not None and t.digest != d:
                    return False
                if id(t) in walk:
                    continue
                walk.add(id(t))
                if t.digest is None or not t.valid(False):
                    return False
                if t._deps:
                    todo.append(t)
        return True

    def sources(self) -> dict[str, str]:
        """The readable source of each function the version covers (see :func:`readable_source`)."""
        out: dict[str, str] = {}
        for fr, _code, _d, _k in self._codes:
            f = fr()
            if f is not None:
                src = readable_source(f)
                if src is not None:
                    out[function_name(f)] = src
        return out

    def observe(self) -> None:
        """Take the current content of mutable values as the baseline, without changing the version.

        Called after the cached function ran: what it changed itself is not an edit."""
        seen, todo = {id(self)}, list(self._nested)
        while todo:  # each nested tracker once, in a loop: they may hold each other
            t = todo.pop()
            if id(t) not in seen:
                seen.add(id(t))
                todo.extend(t._nested)
                t._observe_own()
        self._observe_own()

    def _observe_own(self) -> None:
        if not self._contents:
            return
        new = []
        for v, fp, _pk in self._contents:
            try:
                new.append(_content_watch(v))
            except Exception:  # noqa: BLE001
                new.append((v, fp, None))
        self._contents = new

    def _compute(self) -> Digest:
        obj = self._ref()
        if obj is None:
            raise ReferenceError("the function or class of this version tracker no longer exists")
        w = versionwalk.current()
        if w.seen(id(obj)):
            # A cycle (a function whose globals hold itself, a class whose values hold its instances): the
            # walk never re-enters a version it is computing; its name stands for it here.
            w.met(id(obj))
            return fingerprint(("casmon.version.cycle", _name_of(obj)))
        return versionwalk.nested(lambda: self._walk(obj, w))

    def _walk(self, obj: Any, w: versionwalk.Walk) -> Digest:
        mark = w.enter(id(obj), self)
        try:
            c = _Collector()
            if isinstance(obj, type):
                c.klass(obj, 0)
            else:
                c.function(obj, 0)
            own = fingerprint(c.parts)
        except BaseException:
            w.abandon(id(obj), self, mark)
            raise
        cycle = w.leave(id(obj), self, mark, (own, c))
        if cycle is None:  # in a cycle that closes further up: its name stands for it until then
            return fingerprint(("casmon.version.cycle", _name_of(obj)))
        final = versionwalk.final_versions([(t, r[0]) for t, r in cycle])
        for t, (_own, t_c) in cycle:
            t._store(t_c, final)
        return self.digest  # type: ignore[return-value]  # set by _store above

    def _store(self, c: _Collector, final: dict[int, Digest]) -> None:
        # A cycle mate its name stood for is checked against its final version (see versionwalk).
        deps = {id(t): (t, final.get(id(t)) if d is None else d) for t, d in c.deps if t is not self}
        with self._lock:
            self._codes = tuple(c.codes)
            self._names = tuple(c.names)
            self._cells = tuple(c.cells)
            self._contents = c.contents
            self._nested = tuple({id(t): t for t in c.trackers if t is not self}.values())
            self._deps = tuple(deps.values())
            self.unhashable = c.unhashable
            self.parts = c.parts
            self.digest = final[id(self)]
            self.computations += 1


#: A weak reference to an object -> its tracker: a ``weakref.WeakKeyDictionary``'s own layout (a reference hashes
#: and compares as its object while that lives), without loading ``weakref.py`` on a script's first hit.
_trackers: dict[weak_ref[Any], VersionTracker] = {}
_trackers_lock = _thread.allocate_lock()


def _forget_tracker(r: weak_ref[Any]) -> None:
    # The object is gone: its entry goes (found by identity, as a dead reference keeps its hash). No lock: the
    # collector may call this on a thread holding _trackers_lock, and one dict operation is atomic.
    _trackers.pop(r, None)


def version_tracker(obj: Any) -> VersionTracker:
    """The (shared) tracker of ``obj``'s version: a function, a class or a callable object."""
    try:
        t = _trackers.get(weak_ref(obj))
    except TypeError:  # unhashable or not weak-referenceable
        return VersionTracker(obj)
    if t is None:
        with _trackers_lock:
            t = _trackers.get(weak_ref(obj))
            if t is None:
                t = VersionTracker(obj)
                _trackers[weak_ref(obj, _forget_tracker)] = t
    return t


def function_version(fn: Any) -> Digest:
    """The digest of ``fn``'s code and the user code and values it uses (see the module docstring)."""
    return version_tracker(unwrap_callable(fn)).current()


class VersionedFingerprinter(Fingerprinter):
    """A fingerprinter for cache keys: user functions and classes count by name **and** code version.

    A function passed as an argument (``apply(helper, x)``), a user object (its
    class's methods), an enum member of a user enum: editing their code changes
    the key. The trackers consulted are kept in ``trackers`` so the caller can
    :meth:`~VersionTracker.observe` them after the call.
    """

    __slots__ = ("trackers", "deps", "versions")

    def __init__(self) -> None:
        super().__init__()
        self.trackers: list[VersionTracker] = []
        # id of tracker -> (tracker, version fed): a class met once per instance (a registry of 10,000) is
        # checked once; the tracker is held, so its id is not reused (one of an unhashable class is not shared)
        self.versions: dict[int, tuple[VersionTracker, Digest]] = {}
        #: ``(tracker, digest fed)``; None where the tracker is being computed on this thread (a cycle).
        self.deps: list[tuple[VersionTracker, Digest | None]] = []

    def child(self) -> "VersionedFingerprinter":
        c = VersionedFingerprinter()
        c.stack = self.stack
        c.trackers = self.trackers
        c.deps = self.deps
        c.versions = self.versions
        return c

    def _version(self, t: VersionTracker) -> None:
        known = self.versions.get(id(t))
        if known is not None:
            d = known[1]
        else:
            d = t.current()
            self.versions[id(t)] = (t, d)
            self.trackers.append(t)
            self.deps.append((t, d if d == t.digest else None))
        self.out += b"v" + bytes(d)

    def function(self, f: Any) -> None:
        super().function(f)
        if _is_user_obj(f):
            self._version(version_tracker(f))

    def type_(self, t: type) -> None:
        super().type_(t)
        if _is_user_obj(t) and t.__module__ is not None:
            self._version(version_tracker(t))


def versioned_fingerprint(value: Any) -> Digest:
    fp = VersionedFingerprinter()
    fp.feed_value(value)
    return fp.digest()
