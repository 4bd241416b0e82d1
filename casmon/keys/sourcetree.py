"""A function's source as the code version compares it: its syntax tree as text, and the names it only writes to;
and whether a source is the source of the code that runs (it compiles to that code).

Parsed only where a code version's parse is not kept already (:mod:`casmon.keys.versioncache`): a fresh
process's first hit of an unchanged function reads the kept parse, and never loads :mod:`ast`, :mod:`dis`,
:mod:`inspect` or :mod:`textwrap` (:mod:`casmon.keys.codeversion` imports this module where it parses).
"""

from __future__ import annotations

import __future__
import ast
import dis
import functools
import inspect
import textwrap
import threading
import types
from typing import Any

from casmon.keys import sourcelines
from casmon.keys.sourceblock import code_sig

__all__ = ["tree_of", "source_tree", "write_only_names", "write_only_names_code", "code_matches_file",
           "block_compiles_to", "lambda_segment", "FUTURE_FLAGS"]


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


# -- whether a source is the source of the code that runs -----------------------------------------------------
_file_index: dict[str, tuple[list[str], dict[str, set[tuple[Any, ...]]] | None]] = {}
_file_index_lock = threading.Lock()


def code_matches_file(code: types.CodeType) -> bool:
    """True if compiling the source casmon would read for ``code`` gives ``code`` again.

    False when the file was edited after the code was compiled and not reloaded:
    the source on disk is then not what runs, and must not name its version.
    """
    fname = code.co_filename
    lines = sourcelines.getlines(fname)
    if not lines:
        return False
    with _file_index_lock:
        entry = _file_index.get(fname)
    if entry is None or entry[0] is not lines:
        index: dict[str, set[tuple[Any, ...]]] | None
        try:
            top = compile("".join(lines), fname, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError):
            index = None
        else:
            index = {}
            stack = [top]
            while stack:
                c = stack.pop()
                index.setdefault(c.co_qualname, set()).add(code_sig(c))
                stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
        entry = (lines, index)
        with _file_index_lock:
            _file_index[fname] = entry
    index = entry[1]
    return index is not None and code_sig(code) in index.get(code.co_qualname, ())


#: Compiler flags a ``from __future__`` import sets, which code objects carry in ``co_flags``.
FUTURE_FLAGS = functools.reduce(lambda a, n: a | getattr(__future__, n).compiler_flag, __future__.all_feature_names, 0)


def block_compiles_to(block: list[str], code: types.CodeType) -> bool:
    """True if compiling the ``def`` in ``block`` alone gives ``code`` again: the text on disk is
    what runs (cheap: one function, not the whole file as :func:`code_matches_file` compiles).
    False when unsure, e.g. a closure, or a method's mangled ``__names``: the file decides then."""
    if code.co_freevars:
        return False
    try:
        top = compile(textwrap.dedent("".join(block)), code.co_filename, "exec",
                      flags=code.co_flags & FUTURE_FLAGS, dont_inherit=True)
    except (SyntaxError, ValueError, OverflowError):
        return False
    sig = code_sig(code)
    return any(isinstance(c, types.CodeType) and c.co_name == code.co_name and code_sig(c) == sig
               for c in top.co_consts)


def lambda_segment(code: types.CodeType) -> str:
    """The lambda's own text (its body), so two lambdas on one line differ."""
    pos: list[tuple[int, int, int, int]] = []
    for line, end_line, col, end_col in code.co_positions():
        if line is not None and col is not None and end_line is not None and end_col is not None \
                and (col, end_col) != (0, 0):
            pos.append((line, end_line, col, end_col))
    if not pos:
        return ""
    start = min((p[0], p[2]) for p in pos)
    end = max((p[1], p[3]) for p in pos)
    lines = sourcelines.getlines(code.co_filename)
    if not lines or end[0] > len(lines):
        return ""
    if start[0] == end[0]:
        return lines[start[0] - 1][start[1] : end[1]]
    seg = [lines[start[0] - 1][start[1] :]] + lines[start[0] : end[0] - 1] + [lines[end[0] - 1][: end[1]]]
    return "".join(seg)
