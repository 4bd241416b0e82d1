"""A table read whole (``items``, ``items_beyond``, ``count``) beside writers that merge it: a generation merged
away between the reader's listing and its read is read again where the merge put it, never left out of the answer;
a read that cannot get a consistent listing after its tries raises a one-line StoreError naming the table, never
answers with part of the table as if it were all of it."""

import pytest

from casmon.errors import StoreError
from casmon.store.backend import open_backend
from casmon.store.table import Table
from casmon.store.table.format import _Vanished
from casmon.store.table.whole import READ_TRIES
from tests.support.tables import random_keys

PREFIX = "records/x/"


def merged_table(tmp_path, n=50):
    """A store whose table is one generation of ``n`` entries, the writer that merges it, and the keys."""
    b = open_backend(tmp_path / "s")
    w = Table(b, PREFIX, "w")
    ks = random_keys(n + 100)
    for i, k in enumerate(ks[:n]):
        w.add(k, b"v%d" % i)
    w.flush()
    w.consolidate(force=True)
    return b, w, ks


def merge_after_refreshes(r: Table, w: Table, ks, times: int) -> list[bytes]:
    """After each of ``r``'s next ``times`` listings, ``w`` adds an entry and merges the table into a new
    generation, deleting the one ``r`` just listed: ``r`` then meets a generation merged away. Returns the
    values ``w`` added."""
    real, added = r.refresh, []

    def refresh() -> None:
        real()
        if len(added) < times:
            added.append(b"late%d" % len(added))
            w.add(ks[-1 - len(added)], added[-1])
            w.flush()
            w.consolidate(force=True)

    r.refresh = refresh  # type: ignore[method-assign]
    return added


@pytest.mark.parametrize("strict", [True, False])
def test_a_generation_merged_away_before_the_last_try_reads_is_read_where_the_merge_put_it(tmp_path, strict):
    b, w, ks = merged_table(tmp_path)
    r = Table(b, PREFIX, "r")
    # A merge after the first listing and after each of the three quick re-listings: the fourth try reads a
    # generation gone meanwhile (it used to skip it quietly and answer with nothing).
    added = merge_after_refreshes(r, w, ks, 4)
    vals = sorted(v for _, v in r.items(strict=strict))
    assert vals == sorted([b"v%d" % i for i in range(50)] + added)
    assert not r.damaged


@pytest.mark.parametrize("strict", [True, False])
def test_a_read_whole_that_meets_a_merge_at_every_listing_raises_naming_the_table_never_answers_part(tmp_path,
                                                                                                     strict):
    b, w, ks = merged_table(tmp_path)
    r = Table(b, PREFIX, "r")
    merge_after_refreshes(r, w, ks, 1000)
    with pytest.raises(StoreError, match=f"table {PREFIX} of .* changed under this read {READ_TRIES} times.*"
                                         f"try again") as e:
        list(r.items(strict=strict))
    assert "\n" not in str(e.value)
    with pytest.raises(StoreError, match="changed under this read"):
        r.items_beyond(())


def test_a_read_whole_whose_every_try_finds_a_file_vanished_raises_rather_than_answer_empty(tmp_path):
    """A lookaside copy that fails its check with its manifest gone raises even on the tolerant try: the read
    then lists again, and gives up with an error, never with no entries."""
    b, w, ks = merged_table(tmp_path)
    r = Table(b, PREFIX, "r")

    def vanished(g, i, tolerant, data=None):
        raise _Vanished(f"{PREFIX}buckets/{g.id}/lookup")

    r._file_tables = vanished  # type: ignore[method-assign]
    for strict in (True, False):
        with pytest.raises(StoreError, match="changed under this read"):
            list(r.items(strict=strict))
    with pytest.raises(StoreError, match="changed under this read"):
        r.items_beyond(())


def test_items_beyond_reads_a_generation_merged_away_meanwhile_where_the_merge_put_it(tmp_path):
    b, w, ks = merged_table(tmp_path)
    r = Table(b, PREFIX, "r")
    added = merge_after_refreshes(r, w, ks, 4)
    got = r.items_beyond(())
    assert got is not None
    files, pending, names = got
    assert sorted(v for _, v in files) == sorted([b"v%d" % i for i in range(50)] + added) and not pending
    fresh = Table(b, PREFIX, "fresh")
    fresh.refresh()
    assert names == [g.id for g in fresh._active_gens] + sorted(fresh._l0)  # the files it read: the merge's


def write_l0s(t: Table, first: int, files: int, per_file: int) -> None:
    for f in range(files):
        for j in range(per_file):
            n = first + f * per_file + j
            t.add(n.to_bytes(4, "big") * 4, b"%d" % n)
        t.write_l0(t.take_pending())


def overlapping(tmp_path):
    """A table of 2,100 entries in two generations that merged some of the same level-0 files (a group:
    read to count), as two merges racing leave it."""
    b = open_backend(tmp_path / "s")
    w = Table(b, PREFIX, "w")
    write_l0s(w, 0, 20, 100)  # files 1..20
    Table(b, PREFIX, "m0").consolidate(force=True)  # G0: files 1..20
    write_l0s(w, 2000, 16, 5)  # files 21..36
    a = Table(b, PREFIX, "ma")
    a.refresh()
    write_l0s(w, 2080, 4, 5)  # files 37..40
    assert Table(b, PREFIX, "mb").consolidate()  # files 21..40; G0 is too large to take along
    a.refresh = lambda: None  # type: ignore[method-assign]  # a did not see mb's merge: G0 and files 21..36
    assert a.consolidate(force=True)
    r = Table(b, PREFIX, "r")
    r.refresh()
    assert r._groups
    return b, r


def test_counting_overlapping_generations_merged_away_meanwhile_counts_where_the_merge_put_them(tmp_path):
    b, r = overlapping(tmp_path)
    Table(b, PREFIX, "m2").consolidate(force=True)  # after r listed: both generations are merged away
    assert r.count() == 2100


def test_counting_that_finds_a_file_vanished_at_every_try_raises_rather_than_undercount(tmp_path):
    b, r = overlapping(tmp_path)

    def vanished(g, tolerant):
        raise _Vanished(f"{PREFIX}buckets/{g.id}/lookup")

    r._gen_entries = vanished  # type: ignore[method-assign]
    with pytest.raises(StoreError, match="changed under this read"):
        r.count()


def test_readers_beside_a_writer_that_merges_without_pause_get_every_entry_or_an_error_never_part(tmp_path):
    """A writer appends and merges in a loop; readers read whole meanwhile. Each answer holds every entry
    written before it began (or the read says it could not); none is a part of the table given as all of it."""
    import threading
    import time

    b, w, ks = merged_table(tmp_path, n=200)
    keys = random_keys(400, seed=1)
    written = [0]  # entries of keys[:written[0]] are in the table (flushed) from then on
    stop = threading.Event()

    def writer() -> None:
        for i, k in enumerate(keys):
            if stop.is_set():
                return
            w.add(k, b"w%d" % i)
            w.flush()
            written[0] = i + 1
            w.consolidate(force=True)

    th = threading.Thread(target=writer)
    th.start()
    try:
        while th.is_alive():
            r = Table(b, PREFIX, "r")
            real = r.refresh

            def refresh() -> None:
                real()
                time.sleep(0.001)  # let the writer merge between this listing and the read

            r.refresh = refresh  # type: ignore[method-assign]
            before = written[0]
            try:
                got = {v for _, v in r.items(strict=False)}
            except StoreError:
                continue  # it said it could not
            assert not r.damaged
            assert {b"v%d" % i for i in range(200)} <= got
            assert {b"w%d" % i for i in range(before)} <= got
    finally:
        stop.set()
        th.join(60)
    assert not th.is_alive()
    # With the writer done, a read answers, and with everything.
    assert {v for _, v in Table(b, PREFIX, "last").items()} == ({b"v%d" % i for i in range(200)}
                                                               | {b"w%d" % i for i in range(written[0])})
