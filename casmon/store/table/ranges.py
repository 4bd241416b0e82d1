"""Provenance arithmetic: per writer, sorted ranges of level-0 sequence numbers.

A generation's manifest records exactly which level-0 files' entries it holds
(``contains``), as ranges per writer; readers decide what to read from these
alone, never from timing (see :mod:`casmon.store.table.plan`). Level-0 file
names carry the writer and number (:func:`parse_name`).
"""

from __future__ import annotations

from collections.abc import Iterable
TYPE_CHECKING = False  # typing's flag without importing typing (~2 ms of a first hit)
if TYPE_CHECKING:
    from typing import Any, TypeAlias

__all__ = ["Ranges", "gaps_of", "parse_contains", "parse_name", "ranges_has", "ranges_json", "ranges_of_names",
           "ranges_overlap", "ranges_union", "ranges_within"]

_INF = float("inf")  # math.inf, without loading math

#: writer -> sorted, disjoint, non-adjacent inclusive spans ``[(lo, hi), ...]``
Ranges: TypeAlias = dict[str, list[tuple[int, int]]]


def _last_from(spans: list[tuple[int, int]], seq: int) -> int:
    """The index of the last span starting at or below ``seq`` (-1 if none): ``bisect_right(spans, (seq, inf)) - 1``
    in Python, since loading ``_bisect`` (a shared library) costs a first hit more than these few steps."""
    lo, hi = 0, len(spans)
    while lo < hi:
        mid = (lo + hi) >> 1
        if seq < spans[mid][0]:
            hi = mid
        else:
            lo = mid + 1
    return lo - 1


def _norm(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1] + 1:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def ranges_union(*rs: Ranges) -> Ranges:
    acc: dict[str, list[tuple[int, int]]] = {}
    for r in rs:
        for w, spans in r.items():
            acc.setdefault(w, []).extend(spans)
    return {w: _norm(s) for w, s in acc.items()}


def ranges_of_names(names: Iterable[str]) -> Ranges:
    """The provenance of level-0 files by name."""
    acc: dict[str, list[tuple[int, int]]] = {}
    for n in names:
        w, s = parse_name(n)
        acc.setdefault(w, []).append((s, s))
    return {w: _norm(s) for w, s in acc.items()}


def ranges_has(r: Ranges, writer: str, seq: int) -> bool:
    spans = r.get(writer)
    if not spans:
        return False
    i = _last_from(spans, seq)
    return i >= 0 and spans[i][0] <= seq <= spans[i][1]


def ranges_overlap(a: Ranges, b: Ranges) -> bool:
    for w, sa in a.items():
        sb = b.get(w)
        if not sb:
            continue
        i = j = 0
        while i < len(sa) and j < len(sb):
            if sa[i][1] < sb[j][0]:
                i += 1
            elif sb[j][1] < sa[i][0]:
                j += 1
            else:
                return True
    return False


def ranges_within(a: Ranges, b: Ranges) -> bool:
    """Every number of ``a`` is in ``b``."""
    for w, sa in a.items():
        sb = b.get(w)
        if not sb:
            if sa:
                return False
            continue
        for lo, hi in sa:
            i = _last_from(sb, lo)
            if i < 0 or sb[i][1] < hi:
                return False
    return True


def ranges_json(r: Ranges) -> dict[str, list[list[int]]]:
    return {w: [[lo, hi] for lo, hi in s] for w, s in sorted(r.items())}


def parse_contains(obj: Any) -> Ranges:
    """A manifest's ``contains`` (JSON: writer -> [[lo, hi], ...]), every range checked."""
    if not isinstance(obj, dict):
        raise ValueError("contains is not a map of writers to ranges")
    out = {}
    for w, spans in obj.items():
        if not isinstance(spans, list):
            raise ValueError("contains is not a map of writers to ranges")
        pairs = []
        for s in spans:
            if not (isinstance(s, list) and len(s) == 2 and all(type(x) is int for x in s) and 1 <= s[0] <= s[1]):
                raise ValueError(f"bad range {s!r} in contains")
            pairs.append((s[0], s[1]))
        out[str(w)] = _norm(pairs)
    return out


def parse_name(name: str) -> tuple[str, int]:
    """``(writer, seq)`` of a level-0 file name."""
    _t, writer, seq = name.split("-")
    return writer, int(seq, 16)


def gaps_of(r: Ranges) -> list[tuple[str, int, int]]:
    """``(writer, lo, hi)`` for every run of numbers from 1 to a writer's highest that ``r`` lacks."""
    out = []
    for w, spans in sorted(r.items()):
        nxt = 1
        for lo, hi in spans:
            if lo > nxt:
                out.append((w, nxt, lo - 1))
            nxt = max(nxt, hi + 1)
    return out
