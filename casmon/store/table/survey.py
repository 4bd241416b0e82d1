"""A survey: every file of one table read and checked, for ``verify`` and ``repair``.

:meth:`Table.survey <casmon.store.table.table.Table.survey>` fills it; what is
damaged, missing or lost is listed by key, and :meth:`Survey.entries` is what
``repair`` salvages (everything readable, when the table is damaged).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from casmon.store.table.format import Generation, TableFile
from casmon.store.table.plan import View

__all__ = ["Survey"]


@dataclass
class Survey:
    """Every file of one table, each read and checked (:meth:`Table.survey`)."""

    prefix: str
    l0_names: list[str]  # every level-0 file listed
    gen_ids: list[str]  # every manifest listed
    bucket_keys: dict[str, dict[int, str]]  # generation id -> bucket number -> key, as listed
    l0: dict[str, TableFile] = field(default_factory=dict)  # readable level-0 files (if kept)
    gens: dict[str, Generation] = field(default_factory=dict)  # readable manifests
    bad_gens: set[str] = field(default_factory=set)  # damaged manifests
    buckets: dict[tuple[str, int], TableFile] = field(default_factory=dict)  # readable buckets (if kept)
    damaged: dict[str, str] = field(default_factory=dict)  # key -> reason, every file that fails its checks
    missing: dict[str, str] = field(default_factory=dict)  # key -> what needs it (buckets of active generations)
    gaps: list[str] = field(default_factory=list)  # level-0 numbers deleted (or in a damaged manifest)
    view: View | None = None
    checked: int = 0
    vanished: bool = False

    @property
    def ok(self) -> bool:
        return not self.damaged and not self.missing and not self.gaps

    def entries(self) -> list[tuple[bytes, bytes]]:
        """The table's entries, each once. A sound table: what readers read. A damaged one: everything
        readable in any file (covered, redundant and leftover generations too), the salvage."""
        if self.ok:
            return self.visible_entries()
        out: list[tuple[bytes, bytes]] = []
        for (_gid, _i), tf in sorted(self.buckets.items()):
            out.extend(tf.items())
        for _n, tf in sorted(self.l0.items()):
            out.extend(tf.items())
        return list(dict.fromkeys(out))

    def visible_entries(self) -> list[tuple[bytes, bytes]]:
        """What a reader reads: the active generations and level-0 files (kept files only)."""
        out: list[tuple[bytes, bytes]] = []
        if self.view is None:
            return out
        for g in self.view.active:
            for i in range(g.nbuckets):
                tf = self.buckets.get((g.id, i))
                if tf is not None:
                    out.extend(tf.items())
        for n in self.view.active_l0:
            tf = self.l0.get(n)
            if tf is not None:
                out.extend(tf.items())
        return list(dict.fromkeys(out))
