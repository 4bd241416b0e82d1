"""The process's open stores (flushed at exit, reset in a forked child) are held weakly: a store closed or dropped
leaves them, one still open stays, however many come and go, and a new store that reuses a dropped one's
memory is counted once."""

from __future__ import annotations

import gc

import casmon
from casmon.store import lifecycle


def test_open_stores_hold_each_open_store_once_and_let_closed_or_dropped_ones_go(tmp_path):
    kept = casmon.open(tmp_path / "kept")
    closed = casmon.open(tmp_path / "closed")
    assert kept in list(lifecycle.open_stores) and closed in list(lifecycle.open_stores)
    lifecycle.register(kept)  # registered again: still once
    assert [s for s in lifecycle.open_stores if s is kept] == [kept]
    closed.close()
    assert closed not in list(lifecycle.open_stores)
    for i in range(50):  # dropped unclosed: each leaves as it is collected, whatever memory the next one reuses
        s = casmon.open(tmp_path / f"d{i}", autoflush=None)
        assert s in list(lifecycle.open_stores)
        s.abandon()
        lifecycle.register(s)
        del s
        gc.collect()
    live = list(lifecycle.open_stores)
    assert kept in live and len(live) == len({id(s) for s in live})
    assert bool(lifecycle.open_stores)
    lifecycle.open_stores.discard(closed)  # not there: nothing happens
    assert kept in list(lifecycle.open_stores)
    kept.close()
