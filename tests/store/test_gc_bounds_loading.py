"""gc's time bounds (casmon.store.condemned) load with the first write or fence, never with a hit: the writers and
readers that use them read them then, so they agree with condemned's values, as configured, when they are used."""

from __future__ import annotations

import casmon
from casmon.store import condemned
from casmon.store.table.fence import Fence


def _name(t: float) -> str:
    return f"{int(t * 1e9):016x}-w1-0000000001"


def test_a_remote_stores_writes_wait_in_ticks_of_the_condemned_view_bound(tmp_path):
    old = condemned.MIN_GRACE
    condemned.configure(12.0)
    try:
        s = casmon.open("memory://bounds-" + tmp_path.name, autoflush=None)
        assert not s.backend.is_local
        assert s.backend.wait_tick == condemned.VIEW_MAX == 2.0
    finally:
        condemned.configure(old)


def test_a_fence_hides_exactly_the_files_sealed_over_late_max_before_its_mark():
    old = condemned.MIN_GRACE
    condemned.configure(30.0)  # LATE_MAX 10 s
    try:
        f = Fence(time=1_000_000.0)
        assert f.late("p/", _name(1_000_000.0 - condemned.LATE_MAX - 1))
        assert not f.late("p/", _name(1_000_000.0 - condemned.LATE_MAX + 1))
        seen = Fence(time=1_000_000.0, seen={"p/": {_name(1_000_000.0 - 20)}})
        assert not seen.late("p/", _name(1_000_000.0 - 20))
    finally:
        condemned.configure(old)


def test_no_fence_hides_no_file_however_old():
    assert not Fence().late("p/", _name(0.0))
    assert not Fence().late("p/", _name(1.0))
