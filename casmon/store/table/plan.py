"""What a reader reads: from the listed generations' provenance alone, which generations and
level-0 files are active, which are redundant or already held, and which overlap (read as one).

See the package docstring for the rules; :class:`~casmon.store.table.table.Table` reads by
this plan, and its merges end the overlaps and delete what is redundant.
"""

from __future__ import annotations

from collections.abc import Iterable

from casmon.plain import Plain
from casmon.store.table.format import Generation
from casmon.store.table.ranges import parse_name, ranges_has, ranges_overlap, ranges_union, ranges_within

__all__ = ["View", "resolve"]


class View(Plain):
    """What a listing means: which generations and level-0 files to read."""

    FIELDS = ("gens", "active", "redundant", "active_l0", "contained_l0", "groups")
    gens: dict[str, Generation]  # every readable manifest listed
    active: list[Generation]  # the generations to read, by id
    redundant: list[str]  # generations whose provenance lies inside an active one's
    active_l0: list[str]  # level-0 files to read, by name
    contained_l0: list[str]  # level-0 files a generation already holds
    groups: list[frozenset[str]]  # active generations whose provenance overlaps (each group read as one)

    def __init__(self, gens: dict[str, Generation], active: list[Generation], redundant: list[str], active_l0: list[str],
                 contained_l0: list[str], groups: list[frozenset[str]]) -> None:
        self.gens, self.active, self.redundant = gens, active, redundant
        self.active_l0, self.contained_l0, self.groups = active_l0, contained_l0, groups


def resolve(gens: dict[str, Generation], l0_names: Iterable[str]) -> View:
    """Decide from provenance alone what a reader reads (see the module docstring)."""
    covered: set[str] = set()
    for g in gens.values():
        covered.update(g.covers)
    cands = sorted((g for g in gens.values() if "gen:" + g.id not in covered), key=lambda g: g.id)
    redundant: set[str] = set()
    for g in cands:
        if not g.exact or not g.contains:
            continue  # an older manifest's provenance is incomplete: it is never taken as redundant
        for h in cands:
            if h is g or h.id in redundant or not ranges_within(g.contains, h.contains):
                continue
            # Inside h. If both hold the same, the newer (larger id) stays.
            if not h.exact or h.id > g.id or not ranges_within(h.contains, g.contains):
                redundant.add(g.id)
                break
    active = [g for g in cands if g.id not in redundant]
    held = ranges_union(*(g.contains for g in gens.values()))
    active_l0, contained_l0 = [], []
    for n in sorted(l0_names):
        w, s = parse_name(n)
        if "l0:" + n in covered or ranges_has(held, w, s):
            contained_l0.append(n)
        else:
            active_l0.append(n)
    # Groups of active generations that overlap (union-find).
    parent = {g.id: g.id for g in active}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    if len(active) > 1:
        direct = {g.id: set(g.covers) for g in active}
        for i, a in enumerate(active):
            for b in active[i + 1 :]:
                if ranges_overlap(a.contains, b.contains) or not direct[a.id].isdisjoint(direct[b.id]):
                    parent[root(a.id)] = root(b.id)
    by_root: dict[str, set[str]] = {}
    for g in active:
        by_root.setdefault(root(g.id), set()).add(g.id)
    groups = [frozenset(s) for s in by_root.values() if len(s) > 1]
    return View(dict(gens), active, sorted(redundant), active_l0, contained_l0, groups)
