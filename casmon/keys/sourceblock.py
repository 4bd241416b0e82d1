"""Where a function's source is, and the signature of what code does.

:mod:`casmon.keys.codeversion` names a function's version by its source only when that source compiles to
the function's code: this is where the source is found, and the signature that both the check (in
:mod:`casmon.keys.sourcetree`, which a parse loads) and the parse cache (:mod:`casmon.keys.versioncache`) key on.
"""

from __future__ import annotations

import types
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any

from casmon.keys import sourcelines

__all__ = ["code_sig", "def_block", "SIG_FLAGS"]


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
