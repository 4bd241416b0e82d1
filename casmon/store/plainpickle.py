"""A pickle of plain builtin values read without the pickle module.

:func:`loads` reads the opcodes a pickler writes for ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``,
``bytearray`` and tuples, lists, dicts, sets and frozensets of them, shared and recursive references kept as
they were. Anything else -- a global, a reduce, a persistent id, an out-of-band buffer, an unknown opcode,
truncation, a memo index out of order, a stack that does not end with exactly one value, bytes after ``STOP``
-- returns :data:`NOT_PLAIN`: the caller then loads the stream with the real unpickler, which gives it the value
or the error it always gave. So this never answers differently from ``pickle.loads``; it only declines more.

Nothing is looked up by name, so no code can run. Work and memory are bounded by the stream's length: each
opcode consumes at least one byte, every length is checked against the bytes left (a slice past the end moves
the position past it, which ends the loop), memo indices only grow one at a time, and nothing recurses.
Frames are read as CPython's unpickler reads them: a ``FRAME``'s length must fit the data left.
"""

from __future__ import annotations

import sys

__all__ = ["NOT_PLAIN", "loads"]


class _NotPlain:
    __slots__ = ()

    def __repr__(self) -> str:
        return "NOT_PLAIN"


#: What :func:`loads` returns for a stream it does not read.
NOT_PLAIN = _NotPlain()

_LITTLE = sys.byteorder == "little"
#: pickle.HIGHEST_PROTOCOL of the interpreters casmon runs on (a higher PROTO is the real unpickler's to refuse).
_HIGHEST = 5


def loads(data: bytes) -> object:
    """The value pickled in ``data``, or :data:`NOT_PLAIN` where it is not a well-formed pickle of plain values."""
    try:
        return _load(data if type(data) is bytes else bytes(data))
    except Exception:  # noqa: BLE001 - an unhashable key, bad UTF-8, a stack underflow: the real unpickler's to report
        return NOT_PLAIN


def _load(data: bytes) -> object:
    n = len(data)
    p = 0
    stack: list[object] = []
    marks: list[list[object]] = []  # the stacks below each open MARK, as pickle.py keeps them
    memo: list[object] = []
    append = stack.append
    frm = int.from_bytes
    while p < n:
        op = data[p]
        p += 1
        if op == 0x4B:  # BININT1
            append(data[p])
            p += 1
        elif op == 0x94:  # MEMOIZE
            memo.append(stack[-1])
        elif op == 0x8C:  # SHORT_BINUNICODE
            k = data[p]
            append(str(data[p + 1:p + 1 + k], "utf-8", "surrogatepass"))
            p += 1 + k
        elif op == 0x47:  # BINFLOAT: big-endian IEEE double, bits kept (-0.0, NaN payloads)
            b = data[p:p + 8]
            append(memoryview(b[::-1] if _LITTLE else b).cast("d")[0])
            p += 8
        elif op == 0x80:  # PROTO
            if data[p] > _HIGHEST:
                return NOT_PLAIN
            p += 1
        elif op == 0x95:  # FRAME
            k = frm(data[p:p + 8], "little")
            p += 8
            if p + k > n:
                return NOT_PLAIN
        elif op == 0x2E:  # STOP
            if p != n or marks or len(stack) != 1:
                return NOT_PLAIN
            return stack[0]
        elif op == 0x4A:  # BININT
            append(frm(data[p:p + 4], "little", signed=True))
            p += 4
        elif op == 0x4D:  # BININT2
            append(frm(data[p:p + 2], "little"))
            p += 2
        elif op == 0x8A:  # LONG1
            k = data[p]
            append(frm(data[p + 1:p + 1 + k], "little", signed=True))
            p += 1 + k
        elif op == 0x8B:  # LONG4
            k = frm(data[p:p + 4], "little", signed=True)
            if k < 0 or p + 4 + k > n:
                return NOT_PLAIN
            append(frm(data[p + 4:p + 4 + k], "little", signed=True))
            p += 4 + k
        elif op == 0x4E:  # NONE
            append(None)
        elif op == 0x88:  # NEWTRUE
            append(True)
        elif op == 0x89:  # NEWFALSE
            append(False)
        elif op == 0x58 or op == 0x8D:  # BINUNICODE, BINUNICODE8
            w = 4 if op == 0x58 else 8
            k = frm(data[p:p + w], "little")
            p += w
            if p + k > n:
                return NOT_PLAIN
            append(str(data[p:p + k], "utf-8", "surrogatepass"))
            p += k
        elif op == 0x43 or op == 0x42 or op == 0x8E or op == 0x96:  # SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8
            w = 1 if op == 0x43 else 4 if op == 0x42 else 8
            k = frm(data[p:p + w], "little")
            p += w
            if p + k > n:
                return NOT_PLAIN
            append(bytearray(data[p:p + k]) if op == 0x96 else data[p:p + k])
            p += k
        elif op == 0x29:  # EMPTY_TUPLE
            append(())
        elif op == 0x85:  # TUPLE1
            stack[-1] = (stack[-1],)
        elif op == 0x86 or op == 0x87:  # TUPLE2, TUPLE3
            w = op - 0x84
            if len(stack) < w:
                return NOT_PLAIN
            stack[-w:] = [tuple(stack[-w:])]
        elif op == 0x28:  # MARK
            marks.append(stack)
            stack = []
            append = stack.append
        elif op == 0x74 or op == 0x91:  # TUPLE, FROZENSET
            items = stack
            stack = marks.pop()
            append = stack.append
            append(tuple(items) if op == 0x74 else frozenset(items))
        elif op == 0x5D:  # EMPTY_LIST
            append([])
        elif op == 0x7D:  # EMPTY_DICT
            append({})
        elif op == 0x8F:  # EMPTY_SET
            append(set())
        elif op == 0x61:  # APPEND
            v = stack.pop()
            t = stack[-1]
            if type(t) is not list:
                return NOT_PLAIN  # pickle would call the object's own append
            t.append(v)
        elif op == 0x73:  # SETITEM
            v = stack.pop()
            key = stack.pop()
            t = stack[-1]
            if type(t) is not dict:
                return NOT_PLAIN  # pickle would call the object's own __setitem__
            t[key] = v
        elif op == 0x65 or op == 0x75 or op == 0x90:  # APPENDS, SETITEMS, ADDITEMS
            items = stack
            stack = marks.pop()
            append = stack.append
            t = stack[-1]
            if op == 0x65 and type(t) is list:
                t.extend(items)
            elif op == 0x90 and type(t) is set:
                t.update(items)
            elif op == 0x75 and type(t) is dict and not len(items) % 2:
                for i in range(0, len(items), 2):
                    t[items[i]] = items[i + 1]
            else:
                return NOT_PLAIN
        elif op == 0x71 or op == 0x72 or op == 0x70:  # BINPUT, LONG_BINPUT, PUT
            if op == 0x70:
                i, p = _line_index(data, p)
            else:
                w = 1 if op == 0x71 else 4
                i = frm(data[p:p + w], "little")
                p += w
            if i == len(memo):
                memo.append(stack[-1])
            elif 0 <= i < len(memo):
                memo[i] = stack[-1]
            else:
                return NOT_PLAIN  # pickle's memo would grow to the index: its own error, or its memory to spend
        elif op == 0x68 or op == 0x6A or op == 0x67:  # BINGET, LONG_BINGET, GET
            if op == 0x67:
                i, p = _line_index(data, p)
            else:
                w = 1 if op == 0x68 else 4
                i = frm(data[p:p + w], "little")
                p += w
            if not 0 <= i < len(memo):
                return NOT_PLAIN
            append(memo[i])
        elif op == 0x30:  # POP: the top item, or an empty MARK's segment (as pickle pops either)
            if stack:
                stack.pop()
            else:
                stack = marks.pop()
                append = stack.append
        elif op == 0x31:  # POP_MARK
            stack = marks.pop()
            append = stack.append
        else:
            return NOT_PLAIN
    return NOT_PLAIN  # no STOP, or an argument ran past the end


def _line_index(data: bytes, p: int) -> tuple[int, int]:
    """A text PUT/GET's memo index (ASCII digits and a newline) and the position after it; -1 if it is not one."""
    j = data.find(b"\n", p, p + 12)
    s = data[p:j]
    if j < 0 or not s or not s.isdigit():
        return -1, len(data) + 1
    return int(s), j + 1
