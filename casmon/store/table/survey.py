"""A survey: every file of one table read and checked, for ``verify`` and ``repair``.

:meth:`Table.survey <casmon.store.table.table.Table.survey>` fills it; what is
damaged, missing or lost is listed by key, and :meth:`Survey.entries` is what
``repair`` salvages (everything readable, when the table is damaged).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from casmon.errors import DamagedObjectError
from casmon.plain import Plain
from casmon.store.codec import FRAME_HEADER, MAGIC, decode_frame, read_header
from casmon.store.table.format import Generation, TableFile, byte_view
from casmon.store.table.plan import View

if TYPE_CHECKING:
    from casmon.store.table.format import Payload

__all__ = ["Survey", "split_bucket"]


def split_bucket(data: Payload, key: str) -> tuple[list[TableFile], str | None]:
    """The tables in a bucket file (one frame in format 1, its blocks' frames in format 2), found
    without the manifest; ``(readable ones, what was wrong or None)``. Past a damaged header the
    next frame is found again by its magic, so one damaged block costs only its own entries."""
    out: list[TableFile] = []
    problem = None
    mv = byte_view(data)
    n, off = len(mv), 0
    while off < n:
        where = f"{key}@{off}" if off else key
        try:
            h = read_header(mv, where, off)
            ln = FRAME_HEADER + h.stored_len
            if off + ln > n:
                raise DamagedObjectError(where, f"frame runs past the end of the file ({off + ln} > {n})")
            out.append(TableFile(where, decode_frame(mv[off : off + ln], where)[1]))
            off += ln
        except DamagedObjectError as e:
            problem = problem or e.reason
            nxt = bytes(mv[off + 1 :]).find(MAGIC)
            if nxt < 0:
                break
            off += 1 + nxt
    return out, problem


class Survey(Plain):
    """Every file of one table, each read and checked (:meth:`Table.survey`)."""

    FIELDS = ("prefix", "l0_names", "gen_ids", "bucket_keys", "l0", "gens", "bad_gens", "buckets", "damaged", "missing",
              "gaps", "view", "checked", "vanished")
    prefix: str
    l0_names: list[str]  # every level-0 file listed
    gen_ids: list[str]  # every manifest listed
    bucket_keys: dict[str, dict[int, str]]  # generation id -> bucket number -> key, as listed
    l0: dict[str, TableFile]  # readable level-0 files (if kept)
    gens: dict[str, Generation]  # readable manifests
    bad_gens: set[str]  # damaged manifests
    buckets: dict[tuple[str, int], TableFile]  # readable buckets (if kept)
    damaged: dict[str, str]  # key -> reason, every file that fails its checks
    missing: dict[str, str]  # key -> what needs it (buckets of active generations)
    gaps: list[str]  # level-0 numbers deleted (or in a damaged manifest)
    view: View | None
    checked: int
    vanished: bool

    def __init__(self, prefix: str, l0_names: list[str], gen_ids: list[str], bucket_keys: dict[str, dict[int, str]]) -> None:
        self.prefix, self.l0_names, self.gen_ids, self.bucket_keys = prefix, l0_names, gen_ids, bucket_keys
        self.l0, self.gens, self.bad_gens, self.buckets = {}, {}, set(), {}
        self.damaged, self.missing, self.gaps = {}, {}, []
        self.view, self.checked, self.vanished = None, 0, False

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
