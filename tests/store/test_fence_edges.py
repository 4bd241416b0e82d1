"""gc's fence at its edges: two in one nanosecond, one named or dated in the future (a gc host whose clock ran
ahead), an old unchecksummed one beside a checked one, and checked ones whose fields are nonsense."""

import json
import time
import warnings

import pytest

import casmon
from casmon.maintenance import repair
from casmon.store import condemned, metafile
from casmon.store.table import fence

OLD_L0 = "00000000000000a0-aa-1"  # sealed in 1970: late for any checked fence that does not name it


def _names(b):
    return sorted(k for k in b.list(fence.FENCE_PREFIX) if ".partial" not in k)


def test_a_fence_published_by_a_gc_whose_clock_ran_a_year_ahead_is_superseded_for_good(tmp_path):
    """Repair wrote its fence-nothing fence just after the future one's name: it stayed the newest for a year,
    so no later gc's fence decided anything (late record files were records again), and verify said sound."""
    s = casmon.open(tmp_path / "s")
    b = s.backend
    ahead = time.time() + 365 * 86400
    fence.publish(b, ahead, {"records/call/": []})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(casmon.StoreError, match="gc/fence/"):
            s.gc(grace=0)
        assert repair(s)["ok"]
        s.put([1, 2, 3])
        s.flush()
        s.gc(grace=0)
    newest = fence.read(b)
    assert not newest.damaged and newest.time > time.time() - 600, newest
    assert newest.late("records/call/", OLD_L0)
    assert s.verify().ok


def test_a_checked_fence_named_in_the_future_is_damage(tmp_path):
    """Whatever its body says, a fence whose name sorts after every fence gc will write decides for good."""
    b = casmon.open(tmp_path / "s").backend
    b.create(f"{fence.FENCE_PREFIX}{int((time.time() + 86400) * 1e9):016x}-ab", metafile.seal({"time": 0.0, "seen": {}}))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert fence.read(b).damaged
    assert [r for _k, r in fence.read_all(b)] == [r for _k, r in fence.read_all(b)] != []


def test_two_fences_in_one_nanosecond_both_read_and_the_later_decides(tmp_path):
    b = casmon.open(tmp_path / "s").backend
    t = time.time() - 100
    fence.publish(b, t, {"records/call/": [OLD_L0]})
    fence.publish(b, t, {"records/call/": []})
    a, c = _names(b)
    assert a[:len(fence.FENCE_PREFIX) + 16] == c[:len(fence.FENCE_PREFIX) + 16]  # one nanosecond
    assert fence.read_all(b) == []
    f = fence.read(b)
    assert not f.damaged and f.time == pytest.approx(t)


def test_an_unchecksummed_fence_beside_a_checked_one(tmp_path):
    """Only the newest decides: an old-format fence that is newest fences nothing; one that is older is ignored."""
    b = casmon.open(tmp_path / "s").backend
    now = time.time()
    old_name = f"{fence.FENCE_PREFIX}{int((now - 50) * 1e9):016x}-old"
    b.create(old_name, json.dumps({"time": now - 50, "seen": {}}).encode())
    fence.publish(b, now - 10, {"records/call/": []})
    assert fence.read(b).late("records/call/", OLD_L0)
    b.create(f"{fence.FENCE_PREFIX}{int(now * 1e9):016x}-old", json.dumps({"time": now, "seen": {}}).encode())
    f = fence.read(b)
    assert not f.damaged and not f.late("records/call/", OLD_L0)


@pytest.mark.parametrize("body", [{"time": -1.0, "seen": {}}, {"time": "1700000000", "seen": {}},
                                  {"time": None, "seen": {}}, {"time": True, "seen": {}}, {"seen": {}},
                                  {"time": 1.7e9, "seen": []}, {"time": 1.7e9, "seen": {"records/call/": "x"}},
                                  {"time": 1.7e9, "seen": {"records/call/": [1, 2]}},
                                  {"time": 1.7e9, "seen": {"records/call/": ["x" * 20] * 50_000}}])
def test_a_checked_fence_with_nonsense_fields_is_damage(tmp_path, body):
    b = casmon.open(tmp_path / "s").backend
    name = f"{fence.FENCE_PREFIX}{int((time.time() - 5) * 1e9):016x}-ab"
    b.create(name, metafile.seal(body))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = fence.read(b)
    assert f.damaged.startswith(name) and not f.late("records/call/", OLD_L0)
    assert [k for k, _r in fence.read_all(b)] == [name]


def test_a_fence_whose_time_disagrees_with_its_name_is_damage(tmp_path):
    """A flipped bit in the name moves a fence among the others; its body says when its gc marked."""
    b = casmon.open(tmp_path / "s").backend
    t = time.time() - 1000
    name = f"{fence.FENCE_PREFIX}{int((t + 500) * 1e9):016x}-ab"
    b.create(name, metafile.seal({"time": t, "seen": {}}))
    assert [k for k, _r in fence.read_all(b)] == [name]
