"""Where a function's source is, and whether it is the source of the code that runs.

:mod:`casmon.keys.codeversion` names a function's version by its source only when that source compiles to
the function's code: these are the reads and checks that decide it, and the signature of what code does
that both the check and the parse cache (:mod:`casmon.keys.versioncache`) key on.
"""

from __future__ import annotations

import __future__
import functools
import _thread  # threading's locks, without loading threading on a hit
import types
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.keys import sourcelines

__all__ = ["code_sig", "code_matches_file", "def_block", "block_compiles_to", "lambda_segment", "SIG_FLAGS",
           "FUTURE_FLAGS"]


def code_sig(code: types.CodeType) -> tuple[Any, ...]:
    """What a code object does, without line numbers: equal for the same source compiled alike."""
    consts = []
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            consts.append(code_sig(c))
        else:
            consts.append((type(c).__name__, repr(c)))
    return (code.co_code, tuple(consts), code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
            code.co_argcount, code.co_kwonlyargcount, code.co_posonlyargcount, code.co_flags & SIG_FLAGS)


#: ``co_flags`` that change what code does (``*args``, ``**kwargs``, generator, coroutine), not where it sits.
#: (inspect's CO_VARARGS, CO_VARKEYWORDS, CO_GENERATOR, CO_COROUTINE, CO_ITERABLE_COROUTINE, CO_ASYNC_GENERATOR:
#: written out, so a first hit does not load inspect for them.)
SIG_FLAGS = 0x04 | 0x08 | 0x20 | 0x80 | 0x100 | 0x200

_file_index: dict[str, tuple[list[str], dict[str, set[tuple[Any, ...]]] | None]] = {}
_file_index_lock = _thread.allocate_lock()


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


def def_block(code: types.CodeType) -> tuple[list[str], int] | None:
    """The lines of the ``def`` (decorators included) that compiled to ``code``, and its first
    line number: what :func:`inspect.getsource` returns, found without tokenizing.

    The block runs from ``co_firstlineno`` to the last line any of its instructions (or its
    nested code's) spans. That is the whole ``def`` only if the next line of code is no deeper
    than the ``def``: code the compiler dropped (``pass``, a trailing string, dead code) would
    end the block early, and then None sends the caller to ``inspect.getsource``.
    (``inspect`` tokenizes from the ``def``: its first use in a process costs 4-5 ms on
    Python 3.11, compiling the tokenizer's expressions, most of a first cache hit.)
    """
    if code.co_name == "<lambda>":
        return None
    lines = sourcelines.getlines(code.co_filename)
    first = code.co_firstlineno
    if not lines or not 1 <= first <= len(lines):
        return None
    head = lines[first - 1]
    stripped = head.lstrip()
    if not stripped.startswith(("def ", "def\t", "async ", "@")) or "\f" in head[: len(head) - len(stripped)]:
        return None  # a form feed resets Python's column count: indentation is not its length then
    last = first
    stack = [code]
    while stack:
        c = stack.pop()
        stack.extend(x for x in c.co_consts if isinstance(x, types.CodeType))
        for pos in c.co_positions():
            if pos[1] is not None and pos[1] > last:
                last = pos[1]
    if last > len(lines):
        return None
    indent = len(head) - len(stripped)
    for line in lines[last:]:
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        if len(line) - len(line.lstrip()) > indent or "\f" in line[: len(line) - len(line.lstrip())]:
            return None  # the def goes on past its last instruction
        break
    return lines[first - 1 : last], first


def block_compiles_to(block: list[str], code: types.CodeType) -> bool:
    """True if compiling the ``def`` in ``block`` alone gives ``code`` again: the text on disk is
    what runs (cheap: one function, not the whole file as :func:`code_matches_file` compiles).
    False when unsure, e.g. a closure, or a method's mangled ``__names``: the file decides then."""
    if code.co_freevars:
        return False
    import textwrap  # a parse: not on a first hit, which reads the kept one

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
