"""Where two runs' lineages part: the earliest cached calls whose code, parameters or files differ.

Both runs' upstream graphs are walked from their outputs (the entries each read or wrote) back to the calls
that made their inputs. An entry differs where one run's graph holds it and the other's does not, or both hold it
and its function was cleared between the runs; the first differences are the differing entries no other
differing entry fed, grouped by function (by entry, not by function: stages called in turn, f then g then f,
feed each other, yet their entries do not).
Each is told as ``explain`` tells a miss: which parameter, which code (with the source diff), which file.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from casmon.caching import KIND
from casmon.caching.explain import (MIXED, Difference, compare_parts, entry_alt, relabel, same_value,
                                    short_digest)
from casmon.errors import CasmonError
from casmon.lineage.graph import plain
from casmon.lineage.index import Index, bulk, short_hex

if TYPE_CHECKING:
    from casmon.runs import RunInfo
    from casmon.store.store import Store

__all__ = ["first_difference", "FirstDifference", "Parting"]


@dataclass
class Parting:
    """One function where the runs part: its entry in run A (``a``) and B (``b``) -- None where that run made no
    such call -- and what differs between them."""

    fn: str
    a: str | None
    b: str | None
    differences: list[Difference] = field(default_factory=list)
    #: Run A's name of the function where it is not ``fn`` (a script's ``__main__.f``, imported as ``train.f``).
    fn_a: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"function": self.fn, "a": self.a, "b": self.b, **({"function_a": self.fn_a} if self.fn_a else {}),
                "differences": [{"what": d.what, "name": d.name, "detail": d.detail, "diff": d.diff}
                                for d in self.differences]}


@dataclass
class FirstDifference:
    """The answer of :func:`first_difference`: ``partings`` (empty: no cached call differs)."""

    a: str
    b: str
    partings: list[Parting] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.partings)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "first_difference": [p.to_dict() for p in self.partings]}

    def __str__(self) -> str:
        if not self.partings:
            return f"first difference in lineage: none (the cached calls of {self.a} and {self.b} agree)"
        lines = ["first difference in lineage:"]
        for p in self.partings:
            ends = f"{short_hex(p.a) if p.a else '(no call)'} -> {short_hex(p.b) if p.b else '(no call)'}"
            lines.append(plain(f"  {p.fn_a + ' -> ' if p.fn_a else ''}{p.fn} ({ends}):"))
            for d in p.differences:
                lines.extend("    " + line for line in str(d).splitlines())
        return "\n".join(lines)

    __repr__ = __str__


def _closure(ix: Index, run: RunInfo) -> dict[str, str]:
    """Key -> function of every entry upstream of the run's outputs (the outputs included)."""
    out: dict[str, str] = {}
    todo = [link["key"] for link in ix.run_links(run)]
    fns = {link["key"]: link["fn"] for link in ix.run_links(run)}
    while todo:
        k = todo.pop()
        if k in out:
            continue
        r = ix.entry(k)
        out[k] = str(r.get("fn", "?")) if r is not None else fns.get(k, "?")
        todo.extend(u for _p, u in ix.upstream(k))
    return out


def _script_stem(run: RunInfo) -> str | None:
    """The module name a run's script has when imported (``train`` for ``python train.py``), if it ran one."""
    argv = run.manifest.get("argv")
    first = argv[0] if isinstance(argv, list) and argv and isinstance(argv[0], str) else ""
    return os.path.splitext(os.path.basename(first))[0] if first.endswith(".py") else None


def _one_name(ca: dict[str, str], cb: dict[str, str], ra: RunInfo, rb: RunInfo) -> dict[str, str]:
    """``{B's name: A's name}`` of each function one run called as its script's ``__main__.f`` and the other as
    the imported ``train.f`` (keyed apart, so neither run has the other's calls); ``ca`` takes B's names."""
    fa, fb = set(ca.values()), set(cb.values())
    out: dict[str, str] = {}
    for mine, theirs, run, a_side in ((fa - fb, fb - fa, ra, True), (fb - fa, fa - fb, rb, False)):
        stem = _script_stem(run)
        if stem is None:  # a notebook's or `python -c`'s __main__.f: which module's f it is, nothing says
            continue
        for name in sorted(n for n in mine if n.startswith("__main__.")):
            rest = name[len("__main__."):]
            found = [g for g in theirs if not g.startswith("__main__.") and g.endswith("." + rest)
                     and g[:-len(rest) - 1].rsplit(".", 1)[-1] == stem]
            if len(found) == 1:
                out.update({found[0]: name} if a_side else {name: found[0]})
    for k, fn in ca.items():
        for b_name, a_name in out.items():
            if fn == a_name:
                ca[k] = b_name
    return out


def _module(fn_a: str, fn_b: str) -> str:
    """The module a script is imported as, of its function's two names (``__main__.f``, ``train.f``)."""
    main, other = (fn_a, fn_b) if fn_a.startswith("__main__.") else (fn_b, fn_a)
    return other[:len(other) - len(main) + len("__main__.") - 1]


def _as_imported(parts: dict[str, Any], module: str) -> dict[str, Any]:
    """A version's parts with its script's names (``__main__.x``) as the imported module names them."""
    return {g: {(module + k[len("__main__"):] if isinstance(k, str) and k.startswith("__main__.") else k): v
                for k, v in part.items()} if isinstance(part, dict) else part for g, part in parts.items()}


def _named(a: str, fn_a: str, b: str, fn_b: str) -> Difference:
    module = _module(fn_a, fn_b)
    return Difference("name", "", f"{a} called it as {fn_a}, {b} as {fn_b}: a script run as `python "
                                  f"{module.rsplit('.', 1)[-1]}.py` names its functions __main__.NAME, imported "
                                  f"they are {module}.NAME, and the two are keyed apart")


def _alt(ix: Index, key: str | None, r: dict[str, Any]) -> dict[str, str] | None:
    """An entry's :func:`entry_alt`: the derived index keeps no empty ``pc``, so an entry that reads there as
    recording no lineage field is read from the store (only where a digest's form leaves it undecided)."""
    alt = entry_alt(r)
    if alt is None and key is not None:
        try:
            recs = ix.store.lookup(KIND, bytes.fromhex(key))
        except (CasmonError, ValueError):
            return None
        newest = max(recs, key=lambda x: x.get("time", 0), default=None)
        alt = entry_alt(newest) if newest is not None else None
    return alt


def _compare(ix: Index, fn: str, a: dict[str, Any], b: dict[str, Any], fn_a: str | None = None,
             sides: tuple[str, str] = ("A", "B"), keys: tuple[str | None, str | None] = (None, None)) -> list[Difference]:
    """What differs between run A's entry ``a`` and run B's ``b``, each side named ``in {name}``."""
    out: list[Difference] = []
    then, now = (f"in {x}" for x in sides)
    pa, pb = a.get("a"), b.get("a")
    if isinstance(pa, dict) and isinstance(pb, dict):
        for name in sorted(set(pa) | set(pb)):
            x, y = pa.get(name), pb.get(name)
            if x == y:
                continue
            if x == "~" or y == "~":
                out.append(Difference("parameter", name, "may differ: a large value, of which no digest is kept"))
                continue
            if type(x) is str and type(y) is str:
                same = same_value(x, y, entry_alt(a), entry_alt(b), name)
                if same is None:
                    same = same_value(x, y, _alt(ix, keys[0], a), _alt(ix, keys[1], b), name)
                if same:
                    continue
                if same is None:
                    out.append(Difference("parameter", name, MIXED))
                    continue
            out.append(Difference("parameter", name, f"not passed {then}" if x is None else
                                  f"not passed {now}" if y is None else "differs"))
    va, vb = a.get("v"), b.get("v")
    if va != vb:
        old, new = ix.version_parts(fn_a or fn, va), ix.version_parts(fn, vb)
        if fn_a and old is not None and new is not None:  # one function under two names: its parts named alike
            module = _module(fn_a, fn)
            old, new = (_as_imported(old, module), new) if fn_a.startswith("__main__.") else \
                (old, _as_imported(new, module))
        if old is None or new is None:
            out.append(Difference("code", "", "the code differs (the parts of a version are not recorded)"))
        else:
            # Under two names the version differs by the name alone, which the "name" difference says.
            parts = compare_parts(old, new)
            out.extend(Difference(d.what, d.name, d.detail, relabel(d.diff, d.name, then, now)) for d in parts)
            if not parts and not fn_a:
                out.append(Difference("code", "", "the version differs, in nothing its record names"))
    fa = {(p, path): d for p, path, d in _files(a)}
    fb = {(p, path): d for p, path, d in _files(b)}
    for k in sorted(set(fa) | set(fb)):
        x, y = fa.get(k), fb.get(k)
        if x != y:
            # Each side's content digest, as lineage prints a file (its first 8 hex digits).
            detail = f"not read {then}" if x is None else f"not read {now}" if y is None else \
                f"its content changed: {short_digest(x)} {then}, {short_digest(y)} {now}"
            out.append(Difference("file", k[1], f"{detail} (parameter {k[0]!r})"))
    return out


def _files(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(f[0], f[1], f[2]) for f in r.get("files") or ()
            if isinstance(f, list) and len(f) >= 3 and all(isinstance(x, str) for x in f[:3])]


def _run(which: Any, store: Any) -> RunInfo:
    from casmon.runs import RunInfo, load_run

    return which if isinstance(which, RunInfo) else load_run(which, store)


@bulk
def first_difference(run_a: Any, run_b: Any, store: Store | str | None = None) -> FirstDifference:
    """Walking both runs' upstream graphs from their outputs: the earliest cached calls whose code, parameters
    or files differ (or whose entry run A used was cleared and computed again), each with what differs."""
    from casmon.lineage.queries import open_index

    if store is None:
        store = getattr(run_a, "store", None)
    ix = open_index(store)
    ra, rb = _run(run_a, ix.store), _run(run_b, ix.store)
    ca, cb = _closure(ix, ra), _closure(ix, rb)
    a_names = _one_name(ca, cb, ra, rb)
    start_a = float(ra.manifest.get("start") or 0.0)
    start_b = float(rb.manifest.get("start") or 0.0)
    lo, hi = min(start_a, start_b), max(start_a, start_b)
    # Which entries differ: those of one run only, and those both used whose function was cleared between them.
    differs = (ca.keys() ^ cb.keys()) | {k for k in ca.keys() & cb.keys() if lo < ix.cleared.get(cb[k], 0.0) <= hi}
    # The first are those no other differing entry fed. Judged by entry, not by function: stages that feed each
    # other in turn (f, g, f again) are each upstream of the other, yet the entries form no loop. Crafted records
    # can (every differing entry fed by another): then each is named.
    first = {k for k in differs if not any(u in differs and u != k for _p, u in ix.upstream(k))} or differs
    by_fn: dict[str, tuple[set[str], set[str]]] = {}
    for keys, side in ((ca, 0), (cb, 1)):
        for k, fn in keys.items():
            if k in first:
                by_fn.setdefault(fn, (set(), set()))[side].add(k)
    out = FirstDifference(ra.name, rb.name)
    first_run, later = (ra.name, rb.name) if start_a <= start_b else (rb.name, ra.name)
    for fn in sorted(by_fn):
        ka, kb = by_fn[fn]
        for k in sorted(ka & kb):
            out.partings.append(Parting(fn, k, k, [Difference(
                "entry", "", f"cleared between the runs: {first_run} used the entry before the clear, {later} "
                             "computed it again")]))
        only_a, only_b = sorted(ka - kb), sorted(kb - ka)
        if not only_a or not only_b:
            for k in only_a:
                out.partings.append(Parting(fn, k, None, [Difference("call", "", f"made by {ra.name} only")]))
            for k in only_b:
                out.partings.append(Parting(fn, None, k, [Difference("call", "", f"made by {rb.name} only")]))
            continue
        fn_a = a_names.get(fn)
        named = [_named(ra.name, fn_a, rb.name, fn)] if fn_a else []
        for k in only_b:
            rk = ix.entry(k)
            best: tuple[int, str, list[Difference]] | None = None
            for j in only_a:
                rj = ix.entry(j)
                if rj is None or rk is None:  # collected: what differed went with it
                    gone = "both entries are" if rj is None and rk is None else \
                        f"the entry {ra.name if rj is None else rb.name} used is"
                    d = named + [Difference("entry", "", f"{gone} no longer in the store (cleared and collected): "
                                                         "what differs cannot be told")]
                    score = 1 << 30  # a pair that can be compared is the better match
                else:
                    d = named + _compare(ix, fn, rj, rk, fn_a, (ra.name, rb.name), (j, k))
                    score = len(d)
                if best is None or score < best[0]:
                    best = (score, j, d)
            assert best is not None
            diffs = best[2] or [Difference("key", "", "the key differs in something the entry does not record (the "
                                                      "object of a bound method, a value hashed by type only, or "
                                                      "the key format)")]
            out.partings.append(Parting(fn, best[1], k, diffs, fn_a))
    return out
