"""A lock or lock-break claim whose time no holder writes (far ahead of the taker's clock, too long for a
float, NaN) is a dead holder's, whatever its format: a crafted or flipped one never holds the store for good."""

import json
import time

import pytest

import casmon
from casmon.store import lock

FUTURE = [9999999999, 99999999999999999999, time.time() + 1e6]


def when(t):
    """A test id that is the same in every process (xdist workers collect apart): not the clock's reading."""
    return "11-days-ahead" if isinstance(t, float) else str(t)


@pytest.mark.parametrize("t", FUTURE + ["soon", None], ids=when)
@pytest.mark.parametrize("lease", [None, 120])
def test_a_lock_from_the_far_future_is_a_dead_holders(tmp_path, t, lease):
    """A lock without a lease (the format before leases) dated 2286 held the store until then: gc refused."""
    root = tmp_path / "s"
    s = casmon.open(root)
    s.set_ref("x", s.put([1, 2]))
    body = {"what": "gc", "time": t, "host": "elsewhere", "pid": 1}
    if lease is not None:
        body["lease"] = lease
    (root / "gc").mkdir(exist_ok=True)
    (root / "gc" / "lock").write_text(json.dumps(body))
    casmon.open(root).gc(grace=0)
    assert not (root / "gc" / "lock").exists()
    assert casmon.open(root).get(casmon.open(root).get_ref("x").target) == [1, 2]


@pytest.mark.parametrize("t", FUTURE, ids=when)
@pytest.mark.parametrize("lease", [None, 120])
def test_a_lock_break_claim_from_the_far_future_is_a_dead_takers(t, lease):
    body = {"what": "gc", "time": t, "host": "elsewhere", "pid": 1}
    if lease is not None:
        body["lease"] = lease
    assert lock._claim_dead(json.dumps(body).encode())
    assert not lock._claim_dead(json.dumps({**body, "time": time.time()}).encode())
