"""``first_difference`` names where two runs part even where their functions feed each other in turn (a loop of
stages), and says an entry collected from the store is gone, not that its key differs in something unrecorded."""

import numpy as np
import pytest

import casmon
from casmon.caching import clear_function, edges, evict
from casmon.lineage import first_difference

pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


def test_stages_that_feed_each_other_in_turn_still_part_at_the_changed_call(tmp_path, monkeypatch):
    """``f`` then ``g`` then ``f`` again: each function is upstream of the other, so no function is first among
    those that differ -- the entries are, and the one changed call is the first difference."""
    monkeypatch.chdir(tmp_path)
    store = str(tmp_path / "s")

    @casmon.cache(store=store)
    def start(n):
        return np.arange(n, dtype=float)

    @casmon.cache(store=store)
    def f(x, lr):
        return x * lr + 1

    @casmon.cache(store=store)
    def g(x):
        return x * 2 + 3

    for lr in (0.1, 0.2):
        with casmon.record(store=store, capture_output=False):
            g(f(g(f(start(100), 0.5)), lr))
    f.__casmon_cache__.store.flush()
    edges.forget_all()
    fd = first_difference("1", "2", store)
    assert [p.fn.rsplit(".", 1)[-1] for p in fd.partings] == ["f"]
    (p,) = fd.partings
    assert [(d.what, d.name) for d in p.differences] == [("parameter", "lr")]


def test_entries_collected_from_the_store_are_said_to_be_gone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    store = str(tmp_path / "s")

    @casmon.cache(store=store)
    def g(x):
        return np.arange(40.0) * x

    for i in range(2):
        with casmon.record(store=store, capture_output=False):
            g(i)
    s = g.__casmon_cache__.store
    s.flush()
    clear_function(s, "g")
    evict(s)
    s.gc(grace=0)
    fd = first_difference("1", "2", store)
    (p,) = fd.partings
    (d,) = p.differences
    assert d.what == "entry" and "no longer in the store" in d.detail
    assert "the key differs" not in str(fd)



def test_crafted_records_where_every_differing_entry_is_fed_by_another_still_name_partings(tmp_path, monkeypatch):
    """Each run's entry and a crafted one of its own feed each other (no real call makes such records): no
    differing entry is first, so each is named, never "none (the cached calls agree)"."""
    import time

    from casmon.caching import KIND
    from casmon.keys.digest import Digest

    monkeypatch.chdir(tmp_path)
    store = str(tmp_path / "s")

    @casmon.cache(store=store)
    def f(x):
        return np.arange(40.0) * x

    for i in range(2):
        with casmon.record(store=store, capture_output=False):
            f(i)
    s = f.__casmon_cache__.store
    s.flush()
    ka, kb = (bytes(f.ref(i).key).hex() for i in range(2))
    loops = {ka: "a1" * 16, kb: "b1" * 16}
    for k, other in loops.items():
        rec = dict(f.ref(0 if k == ka else 1).entry)
        s.append(KIND, {**rec, "time": time.time(), "up": {"x": [other]}}, key=Digest(bytes.fromhex(k)))
        s.append(KIND, {**rec, "time": time.time(), "up": {"x": [k]}}, key=Digest(bytes.fromhex(other)))
    s.flush()
    fd = first_difference("1", "2", casmon.open(store))
    assert fd
    assert {p.a for p in fd.partings} | {p.b for p in fd.partings} <= {ka, kb, *loops.values(), None}


def test_a_crafted_file_digest_is_said_quoted_never_as_control_bytes():
    from casmon.lineage.difference import _compare

    a = {"v": "1", "files": [["path", "d.txt", "7df76ab0fc545c09"]]}
    b = {"v": "1", "files": [["path", "d.txt", "\x1b[2J\nab"]]}
    (d,) = _compare(None, "f", a, b, sides=("1", "2"))  # type: ignore[arg-type]
    assert d.detail == "its content changed: 7df76ab0 in 1, '\\x1b[2J\\nab' in 2 (parameter 'path')"
    assert "\x1b" not in str(d) and "\n" not in str(d)
