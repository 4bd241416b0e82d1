"""Code versions: a digest of a function's code and of the user code it uses.

``function_version(fn)`` covers the function's own code and, followed
recursively, the functions, classes and simple constants it reaches through
its globals and closures **in the user's own modules** (not in the standard
library or installed packages). So editing a helper invalidates the cache of
every cached function that calls it, which joblib.Memory does not do.

What counts as an edit: the code is compared as a syntax tree, without
comments, formatting, docstrings or decorators. Comment-only, whitespace-only
and docstring-only edits therefore keep cached results; any change to what the
code does (a constant, an operator, a call) invalidates them. Where the source
is not available (code typed into an interactive prompt without source, or
built with ``exec``), the compiled bytecode is compared instead, without line
numbers.
"""

from __future__ import annotations

import ast
import inspect
import os
import site
import sys
import sysconfig
import textwrap
import types
from functools import lru_cache
from typing import Any

from .digest import Digest
from .fingerprint import fingerprint

__all__ = ["function_version", "is_user_module", "function_name"]

_SIMPLE = (type(None), bool, int, float, complex, str, bytes)


def function_name(fn: Any) -> str:
    """``module.qualname`` of a function (what casmon records and looks up)."""
    fn = inspect.unwrap(fn)
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', None) or getattr(fn, '__name__', repr(fn))}"


@lru_cache(maxsize=1)
def _library_paths() -> tuple[str, ...]:
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(os.path.realpath(p))
    try:
        paths.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:  # pragma: no cover - virtualenv's old site module
        pass
    try:
        paths.add(os.path.realpath(site.getusersitepackages()))
    except Exception:  # noqa: BLE001
        pass
    paths.add(os.path.realpath(os.path.dirname(os.__file__)))
    return tuple(sorted(p.rstrip(os.sep) + os.sep for p in paths))


@lru_cache(maxsize=4096)
def is_user_module(modname: str | None) -> bool:
    """True for the user's own code: not the standard library, not an installed package, not casmon."""
    if not modname:
        return False
    if modname == "__main__":
        return True
    if modname == "casmon" or modname.startswith("casmon."):
        return False
    mod = sys.modules.get(modname)
    f = getattr(mod, "__file__", None)
    if not f:
        return False  # built-in or namespace
    path = os.path.realpath(f)
    return not any(path.startswith(p) for p in _library_paths())


class _StripDocsAndDecorators(ast.NodeTransformer):
    def _strip(self, node):
        node.decorator_list = []
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def _source_text(obj: Any) -> str | None:
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    try:
        tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:  # e.g. a lambda inside a larger expression
        return "src:" + "\n".join(line.split("#", 1)[0].rstrip() for line in src.splitlines() if line.strip())
    tree = _StripDocsAndDecorators().visit(tree)
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def _bytecode_parts(code: types.CodeType) -> list:
    consts = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            consts.append(_bytecode_parts(c))
        elif isinstance(c, _SIMPLE) or (isinstance(c, (tuple, frozenset)) and all(isinstance(x, _SIMPLE) for x in c)):
            consts.append(c)
        else:
            consts.append(repr(type(c)))
    return [code.co_code, consts, code.co_names, code.co_varnames]


def _all_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _all_names(c)
    return names


def _is_simple_constant(v: Any) -> bool:
    if isinstance(v, _SIMPLE):
        return not isinstance(v, (str, bytes)) or len(v) <= 4096
    if isinstance(v, (tuple, frozenset)) and len(v) <= 64:
        return all(_is_simple_constant(x) for x in v)
    return False


def _collect(fn: Any, parts: list, seen: set[int], depth: int) -> None:
    fn = inspect.unwrap(fn)
    if id(fn) in seen or depth > 50:
        return
    seen.add(id(fn))
    code = getattr(fn, "__code__", None)
    name = function_name(fn)
    text = _source_text(fn)
    parts.append(("fn", name, text if text is not None else _bytecode_parts(code) if code else repr(fn)))
    if code is None:
        return
    g = getattr(fn, "__globals__", {})
    names = sorted(_all_names(code))
    refs: list[tuple[str, Any]] = [(n, g[n]) for n in names if n in g]
    for i, cell in enumerate(fn.__closure__ or ()):
        try:
            refs.append((f"<closure {code.co_freevars[i]}>", cell.cell_contents))
        except ValueError:  # empty cell
            pass
    owner_is_user = is_user_module(getattr(fn, "__module__", None))
    for ref_name, obj in refs:
        _collect_ref(ref_name, obj, names, parts, seen, depth, owner_is_user)


def _collect_ref(ref_name, obj, names, parts, seen, depth, owner_is_user) -> None:
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        target = obj.__func__ if isinstance(obj, types.MethodType) else obj
        target = inspect.unwrap(target)
        if is_user_module(getattr(target, "__module__", None)):
            _collect(target, parts, seen, depth + 1)
    elif isinstance(obj, type):
        if is_user_module(obj.__module__) and id(obj) not in seen:
            seen.add(id(obj))
            parts.append(("class", f"{obj.__module__}.{obj.__qualname__}", _source_text(obj)))
    elif isinstance(obj, types.ModuleType):
        if is_user_module(obj.__name__):
            for attr in names:
                sub = getattr(obj, attr, None)
                if isinstance(sub, (types.FunctionType, type)):
                    _collect_ref(f"{ref_name}.{attr}", sub, names, parts, seen, depth, owner_is_user)
    elif owner_is_user and _is_simple_constant(obj):
        parts.append(("global", ref_name, obj))
    elif owner_is_user and callable(obj) and hasattr(obj, "__wrapped__"):
        _collect_ref(ref_name, inspect.unwrap(obj), names, parts, seen, depth, owner_is_user)


def function_version(fn: Any) -> Digest:
    """The digest of ``fn``'s code and the user code it uses (see the module docstring)."""
    parts: list = []
    _collect(fn, parts, set(), 0)
    return fingerprint(parts)
