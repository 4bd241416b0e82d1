"""A cached function's parameters and a call's arguments bound to them, for its keys.

A plain function's parameters are read from its code (``co_varnames``, ``co_argcount``,
``co_posonlyargcount``, ``co_kwonlyargcount``, the ``*args``/``**kwargs`` flags) and its
``__defaults__``/``__kwdefaults__``, as :func:`inspect.signature` reads them, without importing
:mod:`inspect` (with the modules it pulls in, a good part of a fresh process's first hit). Any other
callable -- a ``functools.partial``, a class, a callable object, a builtin, a function that names
another (``functools.wraps``'s ``__wrapped__``) or carries its own ``__signature__`` -- is read by
:mod:`inspect`. Either way the parameters are the same list, so a call binds to the same values and
keys the same.

:meth:`Binder.bind` binds a call as Python does; a call that Python or :mod:`inspect` would refuse
(a missing or unexpected argument, a positional-only name passed by keyword) is bound by
``inspect.Signature.bind``, which says what is wrong, or binds it as the keys always did.
"""

from __future__ import annotations

import types
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, NamedTuple

__all__ = ["Binder", "Param", "EMPTY", "POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD", "VAR_POSITIONAL", "KEYWORD_ONLY",
           "VAR_KEYWORD", "is_async", "is_generator", "unwrap"]

#: Parameter kinds: the values of ``inspect.Parameter``'s (an IntEnum: they compare and hash equal).
POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD, VAR_POSITIONAL, KEYWORD_ONLY, VAR_KEYWORD = range(5)
_POSITIONAL = (POSITIONAL_ONLY, POSITIONAL_OR_KEYWORD)
_CO_VARARGS, _CO_VARKEYWORDS = 0x04, 0x08
_CO_GENERATOR, _CO_COROUTINE, _CO_ASYNC_GENERATOR = 0x20, 0x80, 0x200


class _Empty:
    """No default."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<no default>"


EMPTY: Any = _Empty()
_NO_ATTR = object()

if TYPE_CHECKING:
    Param = NamedTuple("Param", [("name", str), ("kind", int), ("default", Any)])
else:
    try:
        from _collections import _tuplegetter  # namedtuple's own field reader
    except ImportError:  # pragma: no cover - an interpreter without it
        def _tuplegetter(i: int, doc: str) -> Any:
            return property(lambda self: self[i], doc=doc)

    class Param(tuple):
        """``(name, kind, default)``, its fields read by name too: what ``namedtuple`` would make, written out
        (namedtuple builds its class from source, ~80 µs of a fresh process's first hit)."""

        __slots__ = ()
        name = _tuplegetter(0, "The parameter's name")
        kind = _tuplegetter(1, "Its kind (POSITIONAL_ONLY ... VAR_KEYWORD)")
        default = _tuplegetter(2, "Its default, or EMPTY")

        def __new__(cls, name: str, kind: int, default: Any) -> Param:
            return tuple.__new__(cls, (name, kind, default))

        def __getnewargs__(self) -> tuple[Any, ...]:
            return tuple(self)

        def __repr__(self) -> str:
            return f"Param(name={self[0]!r}, kind={self[1]!r}, default={self[2]!r})"

#: Attributes by which a function asks :mod:`inspect` to read it otherwise than from its code (3.13 names a
#: partialmethod ``__partialmethod__``, 3.12 ``_partialmethod``; ``__text_signature__`` is read from functions too).
_ASKS_INSPECT = ("__wrapped__", "__signature__", "_partialmethod", "__partialmethod__", "__text_signature__",
                 "_is_coroutine_marker")


def _plain(fn: Any) -> bool:
    """Whether ``fn`` is a function :mod:`inspect` reads from its code alone."""
    if type(fn) is not types.FunctionType:
        return False
    d = fn.__dict__
    return not d or not any(a in d for a in _ASKS_INSPECT)


def _from_code(fn: types.FunctionType) -> list[Param] | None:
    """``inspect.signature(fn)``'s parameters, read as it reads them (``_signature_from_function``); None where
    they would not be read as Python binds calls (more positional defaults than positional parameters)."""
    code = fn.__code__
    names = code.co_varnames
    npos, nposonly, nkw = code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount
    defaults = fn.__defaults__ or ()
    kwdefaults = fn.__kwdefaults__
    if type(defaults) is not tuple or len(defaults) > npos or (kwdefaults is not None and type(kwdefaults) is not dict):
        return None
    first_default = npos - len(defaults)
    out = [Param(names[i], POSITIONAL_ONLY if i < nposonly else POSITIONAL_OR_KEYWORD,
                 defaults[i - first_default] if i >= first_default else EMPTY) for i in range(npos)]
    at = npos + nkw
    if code.co_flags & _CO_VARARGS:
        out.append(Param(names[at], VAR_POSITIONAL, EMPTY))
        at += 1
    for name in names[npos : npos + nkw]:
        out.append(Param(name, KEYWORD_ONLY, EMPTY if kwdefaults is None else kwdefaults.get(name, EMPTY)))
    if code.co_flags & _CO_VARKEYWORDS:
        out.append(Param(names[at], VAR_KEYWORD, EMPTY))
    return out


def _code_params(fn: Any) -> list[Param] | None:
    """The parameters of a plain function, or of a method bound to one (its first parameter taken by the
    object, as :mod:`inspect` drops it); None where :mod:`inspect` must read ``fn``."""
    if type(fn) is types.MethodType:
        f: Any = fn.__func__
        if not _plain(f):
            return None
        ps = _from_code(f)
        if not ps or ps[0].kind not in _POSITIONAL:
            return None  # *args first, or nothing to take the object: inspect says what it makes of it
        return ps[1:]
    return _from_code(fn) if _plain(fn) else None


def _inspect_params(fn: Any) -> tuple[list[Param], Any]:
    import inspect  # odd callables only: a plain function's first hit never loads it

    sig = inspect.signature(fn)
    empty = inspect.Parameter.empty
    return [Param(p.name, int(p.kind), EMPTY if p.default is empty else p.default)
            for p in sig.parameters.values()], sig


class Binder:
    """The parameters of ``fn`` (``params``: name, kind, default in order) and :meth:`bind`."""

    __slots__ = ("fn", "params", "_sig", "_n", "_npos", "_varargs", "_varkw", "_index", "_posonly", "simple",
                 "_defaults")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        ps = _code_params(fn)
        self._sig: Any = None  # inspect's Signature, made where it is needed
        if ps is None:
            ps, self._sig = _inspect_params(fn)
        self.params = ps
        self._n = len(ps)
        self._npos = sum(1 for p in ps if p.kind in _POSITIONAL)
        self._varargs = next((i for i, p in enumerate(ps) if p.kind == VAR_POSITIONAL), -1)
        self._varkw = next((i for i, p in enumerate(ps) if p.kind == VAR_KEYWORD), -1)
        #: Names a keyword argument binds to (not positional-only ones, not *args/**kwargs).
        self._index = {p.name: i for i, p in enumerate(ps) if p.kind in (POSITIONAL_OR_KEYWORD, KEYWORD_ONLY)}
        self._posonly = {p.name: i for i, p in enumerate(ps) if p.kind == POSITIONAL_ONLY}
        #: No *args and no **kwargs: every parameter takes one argument.
        self.simple = self._varargs < 0 and self._varkw < 0
        self._defaults = [p.default for p in ps]

    def bind(self, args: tuple, kwargs: dict) -> list:
        """The call's values in parameter order, defaults applied, ``*args`` a tuple and ``**kwargs`` a dict in
        key order; a call that cannot bind raises ``TypeError`` saying why."""
        vals = self._fast(args, kwargs)
        return vals if vals is not None else self._inspect_bind(args, kwargs)

    def _fast(self, args: tuple, kwargs: dict) -> list | None:
        n, npos = len(args), self._npos
        if n <= npos:
            vals = list(args)
            vals.extend([EMPTY] * (self._n - n))
            if self._varargs >= 0:
                vals[self._varargs] = ()
        elif self._varargs >= 0:  # *args follows the positional parameters
            vals = list(args[:npos])
            vals.append(args[npos:])
            vals.extend([EMPTY] * (self._n - npos - 1))
        else:
            return None  # too many positional arguments
        extra: dict[str, Any] | None = None
        if kwargs:
            index, varkw = self._index, self._varkw
            for k, v in kwargs.items():
                i = index.get(k)
                if i is not None:
                    if vals[i] is not EMPTY:
                        return None  # multiple values for one parameter
                    vals[i] = v
                    continue
                j = self._posonly.get(k)
                if varkw < 0 or (j is not None and j >= n):
                    return None  # unexpected, or a positional-only name not given by position: inspect decides
                if extra is None:
                    extra = {}
                extra[k] = v
        defaults = self._defaults
        for i in range(n if n <= npos else npos + 1, self._n):
            if vals[i] is EMPTY:
                d = defaults[i]
                if d is EMPTY:
                    if i == self._varkw:
                        continue
                    return None  # a required argument is missing
                vals[i] = d
        if self._varkw >= 0:
            vals[self._varkw] = dict(sorted(extra.items())) if extra else {}
        return vals

    def _inspect_bind(self, args: tuple, kwargs: dict) -> list:
        sig = self._sig
        if sig is None:  # the parameters read from the code, not the function now: its __code__ may be another
            import inspect

            P = inspect.Parameter
            kinds = (P.POSITIONAL_ONLY, P.POSITIONAL_OR_KEYWORD, P.VAR_POSITIONAL, P.KEYWORD_ONLY, P.VAR_KEYWORD)
            sig = self._sig = inspect.Signature([P(p.name, kinds[p.kind], default=P.empty if p.default is EMPTY
                                                   else p.default) for p in self.params])
        try:
            (ba := sig.bind(*args, **kwargs)).apply_defaults()
        except TypeError as e:  # inspect's message names no function: say which, as Python's own does
            from casmon.keys.codeversion import function_name

            raise TypeError(f"{function_name(self.fn)}: {e}") from None
        vals = []
        for p in self.params:
            v = ba.arguments.get(p.name, EMPTY)
            if v is EMPTY:  # 3.13's inspect binds ``f(a=1)`` of ``def f(a, /, **kw)`` into kw, leaving a unbound
                from casmon.keys.codeversion import function_name

                raise TypeError(f"{function_name(self.fn)}: missing a required argument: {p.name!r}")
            if p.kind == VAR_KEYWORD:
                v = dict(sorted(v.items()))
            vals.append(v)
        return vals


def unwrap(fn: Any) -> Any:
    """``inspect.unwrap(fn)``: the function at the end of its ``__wrapped__`` chain (``fn`` itself on a cycle or a
    lookup that raises); :mod:`inspect` is loaded only where there is a chain."""
    try:
        if getattr(fn, "__wrapped__", _NO_ATTR) is _NO_ATTR:
            return fn
    except Exception:  # noqa: BLE001 - a __getattr__ that raises
        return fn
    import inspect

    try:
        return inspect.unwrap(fn)
    except Exception:  # noqa: BLE001 - a __wrapped__ cycle, or a lookup that raises
        return fn


def _flags(fn: Any) -> int | None:
    """``fn``'s code flags where it is a plain function or a method of one, else None (inspect decides)."""
    f = fn.__func__ if type(fn) is types.MethodType else fn
    return f.__code__.co_flags if _plain(f) else None


def is_generator(fn: Any) -> bool:
    """``inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)``."""
    flags = _flags(fn)
    if flags is not None:
        return bool(flags & (_CO_GENERATOR | _CO_ASYNC_GENERATOR))
    import inspect

    return inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn)


def is_async(fn: Any) -> bool:
    """``inspect.iscoroutinefunction(fn)``."""
    flags = _flags(fn)
    if flags is not None:
        return bool(flags & _CO_COROUTINE)
    import inspect

    return inspect.iscoroutinefunction(fn)
