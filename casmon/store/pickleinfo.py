"""What a pickle stream would build, read from its opcodes: the store's views describe a pickled value
without loading it. Apart from :mod:`casmon.store.serialize` because no call runs it.
"""

from __future__ import annotations

import io
from typing import Any

from casmon.plain import Plain

__all__ = ["PickleInfo", "describe_pickle"]


class PickleInfo(Plain):
    """What a pickle stream would build, read from its opcodes (nothing is executed)."""

    FIELDS = ("type", "globals", "complete")
    type: str  # the top-level object's type, e.g. "dict", "mymod.Thing", "?" if unknown
    globals: list[str]  # every global (module.name) the stream needs, in order of first use
    complete: bool  # False if the stream was too long to read to its end

    def __init__(self, type: str, globals: list[str], complete: bool = True) -> None:
        self.type, self.globals, self.complete = type, globals, complete

    @property
    def safe(self) -> bool:
        """True if the stream names no global: it loads even from an untrusted store."""
        return self.complete and not self.globals


_SCALAR_OPS = {
    "INT": "int", "BININT": "int", "BININT1": "int", "BININT2": "int", "LONG": "int", "LONG1": "int", "LONG4": "int",
    "FLOAT": "float", "BINFLOAT": "float", "NONE": "NoneType", "NEWTRUE": "bool", "NEWFALSE": "bool",
    "STRING": "bytes", "BINSTRING": "bytes", "SHORT_BINSTRING": "bytes", "BINBYTES": "bytes", "SHORT_BINBYTES": "bytes",
    "BINBYTES8": "bytes", "BYTEARRAY8": "bytearray", "UNICODE": "str", "BINUNICODE": "str", "SHORT_BINUNICODE": "str",
    "BINUNICODE8": "str", "EMPTY_DICT": "dict", "EMPTY_LIST": "list", "EMPTY_TUPLE": "tuple", "EMPTY_SET": "set",
    "NEXT_BUFFER": "PickleBuffer",
}
_BUILDERS = {"TUPLE": "tuple", "TUPLE1": "tuple", "TUPLE2": "tuple", "TUPLE3": "tuple", "LIST": "list", "DICT": "dict",
             "FROZENSET": "frozenset"}


def describe_pickle(stream: bytes, max_ops: int = 200_000) -> PickleInfo:
    """The top-level type and the globals of a pickle stream, from its opcodes alone.

    A small symbolic run of the pickle machine that tracks only names: nothing
    is imported, constructed or called. Malformed streams give ``type="?"``.
    """
    import pickletools  # the views describe pickles; a hit does not

    stack: list[Any] = []
    marks: list[int] = []
    memo: dict[object, Any] = {}
    found: list[str] = []
    mark = object()

    def g(name: str) -> tuple[str, str]:
        if name not in found and len(found) < 100:
            found.append(name)
        return ("global", name)

    def name_of(item: object) -> str:
        if isinstance(item, tuple):
            return str(item[1] if item[0] in ("global", "obj") else item[0])
        return item if isinstance(item, str) else "?"

    def pop_mark() -> list[Any]:
        if not marks:
            raise ValueError("no mark")
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    top = "?"
    complete = False
    try:
        for n_ops, (op, arg, _pos) in enumerate(pickletools.genops(io.BytesIO(stream))):
            if n_ops >= max_ops:
                break
            name = op.name
            if name in ("PROTO", "FRAME", "READONLY_BUFFER"):
                continue
            if name == "STOP":
                top = name_of(stack[-1]) if stack else "?"
                complete = True
                break
            if name in ("UNICODE", "BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8"):
                stack.append(("str", arg))
            elif name in _SCALAR_OPS:
                stack.append(_SCALAR_OPS[name])
            elif name == "MARK":
                marks.append(len(stack))
            elif name == "GLOBAL":
                stack.append(g(str(arg).replace(" ", ".", 1)))
            elif name == "STACK_GLOBAL":
                nm, mod = stack.pop(), stack.pop()
                nm_s = nm[1] if isinstance(nm, tuple) and nm[0] == "str" else "?"
                mod_s = mod[1] if isinstance(mod, tuple) and mod[0] == "str" else "?"
                stack.append(g(f"{mod_s}.{nm_s}"))
            elif name in ("EXT1", "EXT2", "EXT4"):
                stack.append(g(f"copyreg extension {arg}"))
            elif name == "INST":
                pop_mark()
                stack.append(("obj", g(str(arg).replace(" ", ".", 1))[1]))
            elif name == "OBJ":
                items = pop_mark()
                stack.append(("obj", name_of(items[0]) if items else "?"))
            elif name in ("REDUCE", "NEWOBJ", "NEWOBJ_EX"):
                if name == "NEWOBJ_EX":
                    stack.pop()
                stack.pop()
                fn = stack.pop()
                stack.append(("obj", name_of(fn)))
            elif name in ("PERSID", "BINPERSID"):
                if name == "BINPERSID":
                    stack.pop()
                stack.append(("obj", "persistent reference"))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = stack[-1]
            elif name == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                stack.append(memo[arg])
            elif name == "DUP":
                stack.append(stack[-1])
            elif name == "POP":
                if marks and marks[-1] == len(stack):
                    marks.pop()
                else:
                    stack.pop()
            elif name == "POP_MARK":
                pop_mark()
            elif name in ("TUPLE", "LIST", "DICT", "FROZENSET"):
                pop_mark()
                stack.append(_BUILDERS[name])
            elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
                del stack[len(stack) - int(name[-1]):]
                stack.append("tuple")
            elif name in ("APPENDS", "SETITEMS", "ADDITEMS"):
                pop_mark()
            elif name == "APPEND":
                stack.pop()
            elif name == "SETITEM":
                del stack[-2:]
            elif name == "BUILD":
                stack.pop()
            else:  # an opcode this walk does not model: keep the stack's shape from pickletools' metadata
                for _ in op.stack_before:
                    stack.pop()
                stack.extend(["?"] * len(op.stack_after))
    except Exception:  # noqa: BLE001 - a malformed stream: say what was seen so far
        return PickleInfo("?", found, False)
    return PickleInfo(top if complete else "?", found, complete)
