"""gc beside a writer that merges a table gc reads whole (a record table, the pack index) while gc reads it: a mark
that cannot read the table whole deletes and condemns nothing and says why; the next gc goes on, and every value a
record names is still there."""

import numpy as np
import pytest

import casmon
from casmon.errors import StoreError


def stored(tmp_path):
    """A store whose record table and pack index are each one generation; the values the records name."""
    s = casmon.open(tmp_path / "s", autoflush=None)
    values = [s.put(np.full(1000, float(i))) for i in range(12)]
    for i, v in enumerate(values):
        s.append("call", {"i": i}, refs=[v])
    s.flush()
    s.table("call").consolidate(force=True)
    s.objects.index.consolidate(force=True)
    s.close()
    return values


def merge_under(gc_table, racer_table) -> None:
    """After each listing of ``gc_table``, ``racer_table`` (another process's view of the same table) takes an
    entry again and merges the table into a new generation, deleting the one just listed."""
    real = gc_table.refresh

    def refresh() -> None:
        real()
        racer_table.refresh()
        k, v = next(iter(racer_table.items()))
        racer_table.add(k, v)  # the same entry again: changes nothing a reader sees
        racer_table.flush()
        racer_table.consolidate(force=True)

    gc_table.refresh = refresh


@pytest.mark.parametrize("which", ["records", "index"])
@pytest.mark.parametrize("grace", [0, 0.5])
def test_a_gc_whose_mark_meets_a_merge_at_every_listing_deletes_and_condemns_nothing(tmp_path, min_grace, which,
                                                                                     grace):
    min_grace(0.5)
    values = stored(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "s").rglob("*")
                    if p.is_file() and "/records/" not in f"/{p.relative_to(tmp_path / 's')}"
                    and "/index/" not in f"/{p.relative_to(tmp_path / 's')}")
    g = casmon.open(tmp_path / "s", autoflush=None)
    racer = casmon.open(tmp_path / "s", autoflush=None)
    if which == "records":
        merge_under(g.table("call"), racer.table("call"))
    else:
        merge_under(g.objects.index, racer.objects.index)
    with pytest.raises(StoreError, match="changed under this read .* try again"):
        g.gc(grace=grace)
    racer.close()
    after = sorted(p.relative_to(tmp_path) for p in (tmp_path / "s").rglob("*")
                   if p.is_file() and "/records/" not in f"/{p.relative_to(tmp_path / 's')}"
                   and "/index/" not in f"/{p.relative_to(tmp_path / 's')}")
    assert after == before  # no object deleted, no condemned list, no fence
    # The next gc, with nobody merging under it, goes on; and every value a record names is still there.
    casmon.open(tmp_path / "s").gc(grace=0)
    fresh = casmon.open(tmp_path / "s")
    assert fresh.verify().ok
    assert [float(fresh.get(v)[0]) for v in values] == [float(i) for i in range(12)]
