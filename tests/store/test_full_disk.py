"""A full disk: cached, logged and recorded calls go on, gc runs to free space, errors name the store."""

import os
import warnings

import numpy as np
import pytest

import casmon
from casmon.store import reserve
from tests.conftest import fill_disk
from tests.support.cli import cli_process as run_cli

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::casmon.CacheWarning",
                                        "ignore::casmon.RunWarning")


def test_calls_go_on_when_the_disk_is_full(small_disk):
    disk = small_disk("8m")
    s = casmon.open(disk / "s", autoflush=None)
    calls = []

    @casmon.cache(store=s)
    def f(x):
        calls.append(x)
        return np.full(50_000, x)

    @casmon.intercept(store=s)
    def g(x):
        return x * 2

    assert f(1)[0] == 1
    s.flush()
    fill_disk(disk)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        with casmon.record(store=s, capture_output=False) as run:
            run.info["x"] = 1
            assert [f(x)[0] for x in (1, 2, 3)] == [1, 2, 3]
            assert [g(x) for x in range(20)] == [x * 2 for x in range(20)]
        try:
            s.flush()
        except casmon.StoreError as e:
            assert "No space left" in str(e) and str(disk) in str(e)
    assert calls == [1, 2, 3] or calls == [1, 2, 3, 1], calls
    assert all(not isinstance(m.message, OSError) for m in w)


def test_gc_runs_on_a_full_disk_and_frees_it(small_disk):
    disk = small_disk("8m")
    loc = disk / "s"
    s = casmon.open(loc, autoflush=None)
    assert (loc / reserve.RESERVE_KEY).stat().st_size == reserve.RESERVE_BYTES
    for i in range(3):
        s.put(np.random.default_rng(i).random(100_000))  # garbage: no record names them
    s.flush()
    s.close()
    filler = fill_disk(disk)
    before = os.statvfs(disk).f_bavail
    r = run_cli("gc", "--store", str(loc), "--now", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert os.statvfs(disk).f_bavail > before + 500, "the garbage is gone"
    assert (loc / reserve.RESERVE_KEY).exists(), "the reserve is back once there is room"
    filler.unlink()
    assert casmon.open(loc).verify().ok


def test_gc_on_a_full_disk_without_room_says_so(small_disk):
    disk = small_disk("4m")
    loc = disk / "s"
    casmon.open(loc).close()
    os.unlink(loc / reserve.RESERVE_KEY)  # a store made before the reserve
    fill_disk(disk)
    r = run_cli("gc", "--store", str(loc), "--now", check=False)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "No space left" in r.stdout + r.stderr and str(loc) in r.stdout + r.stderr


@pytest.mark.parametrize("name", [".", "a/./b", "x" * 5000, "a/" + "y" * 300])
def test_a_ref_name_the_medium_cannot_hold_is_a_clear_error(tmp_path, name):
    s = casmon.open(tmp_path / "s")
    with pytest.raises(ValueError, match="ref name"):
        s.set_ref(name, None, {"a": 1})


def test_gc_frees_a_full_disk_again_and_again(small_disk):
    """The reserve comes back after each gc, smaller if gc freed less: a disk refilled with garbage is freed
    by the next gc too."""
    disk = small_disk("6m")
    loc = disk / "s"
    for round_ in range(3):
        s = casmon.open(loc, autoflush=None)
        s.put(np.random.default_rng(round_).random(20_000))  # 160 KB of garbage, less than the reserve
        s.flush()
        s.close()
        filler = fill_disk(disk)
        r = run_cli("gc", "--store", str(loc), "--now", check=False)
        assert r.returncode == 0, (round_, r.stdout + r.stderr)
        assert (loc / reserve.RESERVE_KEY).exists(), round_
        filler.unlink()


def test_calls_logged_on_a_full_durable_store_are_logged_once(small_disk):
    disk = small_disk("8m")
    loc = disk / "s"
    s = casmon.open(loc, durable=True)

    @casmon.intercept(store=s)
    def g(x):
        return x * 2

    assert g(0) == 0
    filler = fill_disk(disk)
    assert [g(x) for x in range(1, 6)] == [2, 4, 6, 8, 10]  # each call's flush fails: the calls wait
    filler.unlink()
    assert g(6) == 12
    s.close()
    calls = casmon.load(casmon.open(loc)).calls()
    assert sorted(c.inputs()[0][0] for c in calls) == list(range(7)), "each call once"


def test_reading_a_store_on_a_full_disk_raises_nothing_though_its_tables_want_a_merge(small_disk, monkeypatch):
    """A merge only tidies: on a full disk the flush that would merge (a reader's, with nothing to write, as
    ``casmon.load`` makes) leaves the tables as they are for a later flush, and the reader reads."""
    from casmon.store.table import L0_MERGE, Table

    disk = small_disk("8m")
    with monkeypatch.context() as m:
        m.setattr(Table, "wants_merge", lambda self: False)  # writers that never got to merge
        for i in range(L0_MERGE + 2):  # a level-0 file of the call log's tables each
            w = casmon.open(disk / "s", autoflush=None)

            @casmon.intercept(store=w)
            def g(x):
                return x * 2

            g(i)
            w.close()
    fill_disk(disk)
    s = casmon.open(disk / "s", autoflush=None)
    s.table("calls").refresh()
    assert s.table("calls").wants_merge()
    s.flush()  # nothing to write; the merge cannot take its lock on the full disk
    log = casmon.load(s)
    (name,) = log.functions
    assert sorted(c.inputs()[0][0] for c in log.calls(name)) == list(range(L0_MERGE + 2))
