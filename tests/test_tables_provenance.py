"""Readers never count one entry twice: generations record exactly which level-0 files they contain.

Two writers that merge the same level-0 files at once make overlapping
generations. The tests drive that race deterministically with the fault points
``merge.after_buckets`` / ``merge.after_manifest``: one merge is paused in a
thread while another merges the same files, then a third merge folds one of
the two into a new generation. Whatever the interleaving, every entry is read
exactly once (``items``, ``count``, ``lookup``, ``Store.stats``).
"""

import threading
from collections import Counter

import pytest

import casmon
from casmon import faultpoints
from casmon.store.backend import open_backend
from casmon.store.table import Table


@pytest.fixture
def points(tmp_path):
    d = tmp_path / "points"
    d.mkdir()
    yield d
    faultpoints.configure(None)


def write_l0s(t: Table, first: int, files: int, per_file: int) -> list[bytes]:
    """``files`` level-0 files of ``per_file`` entries each; entry values are their numbers."""
    keys = []
    for f in range(files):
        for j in range(per_file):
            n = first + f * per_file + j
            k = n.to_bytes(4, "big") * 4
            t.add(k, b"%d" % n)
            keys.append(k)
        t.write_l0(t.take_pending())
    return keys


def paused_merge(points, point: str, table: Table, **kw):
    """Start ``table.consolidate(**kw)`` in a thread and wait until it stops at ``point``."""
    faultpoints.configure(f"{point}@1=pause:{points}")
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("gid", table.consolidate(**kw)))
    th.start()
    reached = points / f"{point}.reached"
    for _ in range(6000):
        if reached.exists() or not th.is_alive():
            break
        th.join(0.01)
    assert reached.exists(), "the merge did not reach the fault point"

    def resume():
        (points / f"{point}.go").write_text("")
        th.join(60)
        assert not th.is_alive()
        faultpoints.configure(None)
        return out["gid"]

    return resume


def assert_exact(b, prefix: str, expected: set[int]):
    reader = Table(b, prefix, "reader")
    vals = [int(v) for _, v in reader.items()]
    dup = [v for v, c in Counter(vals).items() if c > 1]
    assert not dup, f"{len(dup)} entries read twice, e.g. {dup[:5]}"
    assert set(vals) == expected
    assert reader.count() == len(expected)
    for n in sorted(expected)[:: max(1, len(expected) // 7)]:
        assert reader.lookup(n.to_bytes(4, "big") * 4) == [b"%d" % n]


def test_racing_merges_then_a_third_merge_count_each_entry_once(tmp_path, points):
    """The case of issue 11: A merges files 1-16 (paused before its manifest); B merges 1-40 and
    deletes them; A's manifest appears. A later merge folds A's small generation with new files:
    its covers no longer name files 1-16, yet B holds them too."""
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w")
    write_l0s(w, 0, 16, 10)  # entries 0..159, files 1..16
    a = Table(b, "r/", "ma")
    resume = paused_merge(points, "merge.after_buckets", a)
    write_l0s(w, 160, 24, 100)  # files 17..40, entries 160..2559
    gb = Table(b, "r/", "mb").consolidate()
    assert gb
    ga = resume()
    assert ga and ga != gb
    expected = set(range(2560))
    assert_exact(b, "r/", expected)
    write_l0s(w, 2560, 16, 10)  # files 41..56
    assert Table(b, "r/", "mc").consolidate()
    expected |= set(range(2560, 2720))
    assert_exact(b, "r/", expected)
    # A fourth writer appends and merges again: still exact, and the overlap is gone for good.
    write_l0s(w, 2720, 16, 10)
    Table(b, "r/", "md").consolidate(force=True)
    expected |= set(range(2720, 2880))
    assert_exact(b, "r/", expected)
    assert len(b.list("r/gens/")) == 1


def test_partial_overlap_is_read_once(tmp_path, points):
    """A forced merge takes an old generation and files 1-16 (paused); a normal merge takes files
    1-20 but not the large generation. The two generations overlap partly; a third merge folds the
    small one. Readers count every entry once at every step."""
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w")
    write_l0s(w, 0, 20, 100)  # 2,000 entries in files 1..20
    Table(b, "r/", "m0").consolidate(force=True)  # G0: files 1..20
    write_l0s(w, 2000, 16, 5)  # files 21..36, 80 entries
    a = Table(b, "r/", "ma")
    resume = paused_merge(points, "merge.after_buckets", a, force=True)  # G0 + files 21..36
    write_l0s(w, 2080, 4, 5)  # files 37..40
    gb = Table(b, "r/", "mb").consolidate()  # files 21..40; G0 is too large to take along
    ga = resume()
    assert ga and gb
    expected = set(range(2100))
    assert_exact(b, "r/", expected)
    write_l0s(w, 2100, 16, 5)
    Table(b, "r/", "mc").consolidate()
    expected |= set(range(2100, 2180))
    assert_exact(b, "r/", expected)


def test_level0_files_inside_a_generation_are_ignored(tmp_path, points):
    """A merge killed (here: paused) after its manifest, before deleting what it merged: readers
    do not read the merged level-0 files twice, and the next merge deletes them."""
    b = open_backend(tmp_path / "s")
    w = Table(b, "r/", "w")
    write_l0s(w, 0, 16, 10)
    a = Table(b, "r/", "ma")
    resume = paused_merge(points, "merge.after_manifest", a)
    try:
        assert len(b.list("r/l0/")) == 16 and len(b.list("r/gens/")) == 1
        assert_exact(b, "r/", set(range(160)))
    finally:
        resume()
    assert_exact(b, "r/", set(range(160)))


def test_store_stats_count_records_exactly(tmp_path, points):
    s = casmon.open(tmp_path / "s", autoflush=None)
    for i in range(16):
        for j in range(20):
            s.append("cache", {"i": i, "j": j})
        s.table("cache").flush()
    loc = tmp_path / "s"
    a = casmon.open(loc, autoflush=None).table("cache")
    resume = paused_merge(points, "merge.after_buckets", a)
    for i in range(16, 40):
        for j in range(20):
            s.append("cache", {"i": i, "j": j})
        s.table("cache").flush()
    casmon.open(loc, autoflush=None).table("cache").consolidate()
    resume()
    for i in range(40, 56):
        s.append("cache", {"i": i})
        s.table("cache").flush()
    casmon.open(loc, autoflush=None).table("cache").consolidate()
    fresh = casmon.open(loc, autoflush=None)
    assert fresh.stats()["records"]["cache"] == 40 * 20 + 16
    assert sum(1 for _ in fresh.records("cache")) == 40 * 20 + 16
