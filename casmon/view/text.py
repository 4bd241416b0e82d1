"""The one formatter of short texts: sizes, counts with their noun, cut texts and reprs, short errors.

Every layer shows these (a store's repr, a CLI line, a web page, a warning), so
they live in one leaf module that imports only the standard library: the same
size reads the same everywhere, and a change of wording happens in one place.
Nothing here raises on odd input (a view never fails because of what a store
holds).
"""

from __future__ import annotations

import math
import sys

__all__ = ["size", "plural", "cut", "short_repr", "unqualified_name", "short_error", "did_you_mean"]


_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def size(n: object, unit: str | None = None, digits: int = 1) -> str:
    """A byte count as B, KiB, MiB, GiB or TiB (``?`` for what is not a finite number).

    The unit is the largest that keeps the number under 1024, unless ``unit`` names one
    (``size(n, "MiB")``: every line of a summary in the same unit), shown with ``digits`` decimals.
    """
    try:
        if type(n) is bool:
            return "?"
        x = float(n)  # type: ignore[arg-type]  # anything float() takes; the rest is caught below
        if not math.isfinite(x):
            return "?"
    except (TypeError, ValueError, OverflowError):  # an int too large for a float: no real size
        return "?"
    if unit is not None:
        return f"{x / 1024 ** _UNITS.index(unit):.{digits}f} {unit}"
    for name in _UNITS[:-1]:
        if abs(x) < 1024:
            return f"{x:.0f} {name}" if name == "B" else f"{x:.1f} {name}"
        x /= 1024
    return f"{x:.1f} TiB"


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 function``, ``2,000 functions``: a count with its noun in the right number (``many``: an irregular plural)."""
    return f"{count:,} {one if count == 1 else (many or one + 's')}"


def cut(s: str, width: int, *, flatten: bool = False) -> str:
    """``s`` cut to ``width`` characters, ``…`` marking the cut.

    ``flatten``: a text of several lines becomes one first (its whitespace runs become single spaces),
    so that it fits a table cell or a line of output.
    """
    if flatten and "\n" in s:
        s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def short_repr(v: object, limit: int = 80, *, arrays: bool = False, qualified: bool = False) -> str:
    """``repr(v)`` cut to ``limit`` characters; never raises (a failing repr says so).

    ``arrays``: a numpy array is shown by its shape and dtype, not its values (a call log's line
    stays short however large the argument). ``qualified``: a failing repr names its type with its
    module. A string is shown as it is when ``limit`` is 10,000 or more (text for HTML, not a repr).
    """
    if arrays:
        np = sys.modules.get("numpy")  # an array exists only where numpy was imported
        if np is not None and isinstance(v, np.ndarray):
            return f"array(shape={v.shape}, dtype={v.dtype})"
    if isinstance(v, str) and limit >= 10_000:
        r = v
    else:
        try:
            r = repr(v)
        except Exception as e:  # noqa: BLE001 - a value whose repr fails (or recurses too deep) is still shown
            t = type(v)
            name = t.__name__
            if qualified:
                name = t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"
            r = f"<{name}: repr failed: {type(e).__name__}>"
    return cut(r, limit)


def unqualified_name(name: str) -> str:
    """A dotted name's last part: ``pkg.mod.Class.run`` → ``run`` (how callmonitor names a function)."""
    return name.rsplit(".", 1)[-1]


def short_error(e: BaseException, limit: int | None = None, *, first_line: bool = False, typed: bool = False) -> str:
    """An exception's message as one line, cut to ``limit`` characters (``""`` for an empty message).

    By default every line of the message is kept, its whitespace runs made single spaces;
    ``first_line``: only the first line (a remote client puts its details below it).
    ``typed``: the message follows the exception's type (``KeyError: 'x'``).
    """
    msg = f"{type(e).__name__}: {e}" if typed else str(e)
    if first_line:
        lines = msg.strip().splitlines()
        msg = lines[0] if lines else ""
    else:
        msg = " ".join(msg.split())
    return msg if limit is None else msg[:limit]


def did_you_mean(word: object, candidates: object, what: str = "") -> str:
    """``did you mean 'latest'?`` for a name given wrong, from the names there are (``''`` when none is close).

    A dotted name is also matched by its last part (``fnuc`` finds ``mod.func``) and by its tail after the
    module (``mod.fnuc`` finds ``pkg.mod.func``), as the lookups that take short names do. ``what``
    goes before the names (``did you mean run 'latest'?``)."""
    import difflib

    try:
        w = str(word)
        names = [str(c) for c in candidates]  # type: ignore[attr-defined]  # any iterable; the rest is caught
    except Exception:  # noqa: BLE001 - a hint never fails the error it is added to
        return ""
    aliases: dict[str, list[str]] = {}
    for n in dict.fromkeys(names):
        parts = n.split(".")
        for i in range(len(parts)):
            aliases.setdefault(".".join(parts[i:]), []).append(n)
    found: list[str] = []
    for alias in difflib.get_close_matches(w, list(aliases), n=6, cutoff=0.6):
        for n in aliases[alias]:
            if n not in found and n != w:
                found.append(n)
    if not found:
        return ""
    shown = [repr(n) for n in found[:3]]
    return f"did you mean {what + ' ' if what else ''}" + (shown[0] if len(shown) == 1 else
                                                          f"{', '.join(shown[:-1])} or {shown[-1]}") + "?"
