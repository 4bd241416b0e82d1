"""A function's source as the code version compares it: its syntax tree as text, and the names it only writes to.

Parsed only where a code version's parse is not kept already (:mod:`casmon.keys.versioncache`): a fresh
process's first hit of an unchanged function reads the kept parse, and never loads :mod:`ast`, :mod:`dis`,
:mod:`inspect` or :mod:`textwrap` (:mod:`casmon.keys.codeversion` imports this module where it parses).
"""

from __future__ import annotations

import ast
import dis
import inspect
import textwrap
import threading
import types
from typing import Any

__all__ = ["tree_of", "source_tree", "write_only_names", "write_only_names_code"]


class _StripDocsAndDecorators(ast.NodeTransformer):
    def _strip(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> ast.AST:
        node.decorator_list = []
        body = node.body
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
            node.body = body[1:] or [ast.Pass()]
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip


def source_tree(obj: Any) -> tuple[str | None, ast.AST | None]:
    """``(text, tree)``: the syntax tree of ``obj``'s source as text (docstrings and decorators
    stripped), and the tree itself; ``(None, None)`` without source."""
    try:
        src = inspect.getsource(obj)
    except (OSError, TypeError):
        return None, None
    return tree_of(src)


_PARSE_LOCK = threading.Lock()  # 3.11's ast.parse races in threads: "AST constructor recursion depth mismatch"


def tree_of(src: str) -> tuple[str, ast.AST | None]:
    """:func:`source_tree` of the source text ``src``."""
    try:
        with _PARSE_LOCK:
            tree = ast.parse(textwrap.dedent(src))
    except SyntaxError:  # e.g. a lambda inside a larger expression
        return "src:" + "\n".join(line.split("#", 1)[0].rstrip() for line in src.splitlines() if line.strip()), None
    tree = _StripDocsAndDecorators().visit(tree)
    return ast.dump(tree, annotate_fields=False, include_attributes=False), tree


#: Methods of builtin containers that change them and return None: calling one reads nothing back.
_NONE_MUTATORS = frozenset({"append", "extend", "insert", "add", "update", "clear", "appendleft", "extendleft",
                            "discard", "remove", "sort", "reverse"})
#: Methods that change a container and return something: a write only where that is thrown away.
_MUTATORS = _NONE_MUTATORS | {"pop", "popleft", "popitem", "setdefault"}


def write_only_names(tree: ast.AST | None) -> frozenset[str]:
    """Names the code only writes to: ``log.append(x)`` as a statement, ``counts[k] += 1``,
    ``state.attr = v``. What they hold cannot reach the result through this code."""
    if tree is None:
        return frozenset()
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    reads: set[str] = set()
    writes: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Name) or not isinstance(node.ctx, ast.Load):
            continue
        p = parents.get(node)
        write = False
        if isinstance(p, ast.Attribute) and p.value is node:
            if isinstance(p.ctx, (ast.Store, ast.Del)):
                write = True
            else:
                gp = parents.get(p)
                write = isinstance(gp, ast.Call) and gp.func is p and (
                    p.attr in _NONE_MUTATORS or (p.attr in _MUTATORS and isinstance(parents.get(gp), ast.Expr)))
        elif isinstance(p, ast.Subscript) and p.value is node:
            write = isinstance(p.ctx, (ast.Store, ast.Del))
        (writes if write else reads).add(node.id)
    return frozenset(writes - reads)


_LOAD_NAME_OPS = frozenset({"LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF",
                            "LOAD_FROM_DICT_OR_GLOBALS"})
_SIMPLE_LOAD_OPS = frozenset({"LOAD_CONST", "LOAD_FAST", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_SMALL_INT",
                              "LOAD_FAST_BORROW"})


def write_only_names_code(code: types.CodeType) -> frozenset[str]:
    """:func:`write_only_names` from bytecode, for code without source: ``log.append(x)``
    (a method that returns None), ``state.attr = v`` and ``table[k] = v`` with a simple key."""
    reads: set[str] = set()
    writes: set[str] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
        ins = [x for x in dis.get_instructions(c) if x.opname not in ("CACHE", "EXTENDED_ARG")]
        for i, x in enumerate(ins):
            if x.opname not in _LOAD_NAME_OPS or not isinstance(x.argval, str):
                continue
            nxt = ins[i + 1] if i + 1 < len(ins) else None
            nn = ins[i + 2] if i + 2 < len(ins) else None
            write = nxt is not None and (
                (nxt.opname in ("LOAD_METHOD", "LOAD_ATTR") and nxt.argval in _NONE_MUTATORS)
                or nxt.opname in ("STORE_ATTR", "DELETE_ATTR")
                or (nxt.opname in _SIMPLE_LOAD_OPS and nn is not None and nn.opname in ("STORE_SUBSCR", "DELETE_SUBSCR")))
            (writes if write else reads).add(x.argval)
    return frozenset(writes - reads)
