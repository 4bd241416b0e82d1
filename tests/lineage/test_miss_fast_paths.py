"""The miss path's fast ways to record edges give what the general ones give: a result's fingerprint is its key
encoding's digest whatever the value, what was stored is what it names, remembered results stay linked however
many are dropped, and the identity rows stay bounded."""

import gc
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import casmon
from casmon import fingerprint
from casmon.caching import edges
from casmon.keys.fingerprint import small_array_digest

DTYPES = st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(), hnp.unicode_string_dtypes(),
                   hnp.scalar_dtypes().map(lambda d: d.newbyteorder(">")))
ARRAYS = st.tuples(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)),
                   st.sampled_from(["C", "F", "strided"])).map(
    lambda p: p[0][::2] if p[1] == "strided" and p[0].ndim else np.asfortranarray(p[0]) if p[1] == "F" else p[0])
SCALARS = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=60), st.binary(max_size=60),
                    st.booleans(), st.none())
VALUES = st.one_of(ARRAYS, SCALARS, st.tuples(ARRAYS, SCALARS), st.lists(SCALARS, max_size=5))


@pytest.fixture
def store(tmp_path):
    edges.forget_all()
    yield str(tmp_path / "store")
    edges.forget_all()


def expected_rf(v):
    if small_array_digest(v) is not None:  # an array's fingerprint is kept however short
        return bytes(fingerprint(v)).hex()
    fp = edges._LinkingVersioned()
    fp.feed_value(v)
    if fp.fed + len(fp.out) < edges.CONTENT_MIN:
        return None
    return bytes(fingerprint(v)).hex()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(VALUES)
def test_a_results_recorded_fingerprint_is_its_key_encodings_digest_for_any_value(store, v):
    @casmon.cache(store=store)
    def give(box):
        return box[0]

    give([v])  # a fresh list: never linked by identity
    assert give.ref([v]).entry.get("rf") == expected_rf(v)


def test_a_small_arrays_digest_is_its_fingerprint_across_shapes_and_dtypes_seen_before():
    seen = [np.zeros((2, 3)), np.zeros((2, 3), np.int32), np.zeros((3, 2)), np.zeros(6), np.zeros(()),
            np.zeros((2, 3), ">f8"), np.zeros((0, 3)), np.zeros((3, 0)), np.arange(6.).reshape(2, 3)]
    for _ in range(2):  # the second time, every shape's part of the encoding is remembered
        for a in seen:
            assert small_array_digest(a) == bytes(fingerprint(a))


def test_a_result_mutated_right_after_the_call_keeps_the_fingerprint_of_what_was_stored(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float) * 2

    @casmon.cache(store=store)
    def make_list(n):
        return [np.arange(n, dtype=float), "x" * 40]

    a = make(16)
    stored = a.copy()
    a[:] = -1  # the user owns the array now
    b = make_list(8)
    stored_b = [b[0].copy(), b[1]]
    b[0][:] = 7
    b.append("more")
    s = make.__casmon_cache__.store
    rec = {r["fn"].rsplit(".", 1)[-1]: r for _, r in s.records("cache")}
    assert rec["make"]["rf"] == bytes(fingerprint(stored)).hex() == bytes(fingerprint(s.get(make.ref(16).digest))).hex()
    assert rec["make_list"]["rf"] == bytes(fingerprint(stored_b)).hex()


def test_remembered_results_stay_linked_while_dropped_ones_are_swept_and_the_rows_stay_bounded(store):
    @casmon.cache(store=store)
    def make(i):
        return np.arange(16.0) + i

    url = make.__casmon_cache__.store.url
    kept = {i: make(i) for i in range(0, 3 * edges.SWEEP, 7)}  # alive throughout, among many dropped
    for i in range(3 * edges.SWEEP):
        if i not in kept:
            make(i)
        assert len(edges._by_id) <= max(edges.SWEEP, 2 * len(kept)) + 1
    for i, a in kept.items():
        assert edges.upstream([a], url) == [bytes(make.ref(i).key)]
    del kept, a
    gc.collect()
    edges._sweep()
    assert not edges._by_id


def test_a_fresh_array_result_and_a_view_result_both_link_by_identity(store):
    @casmon.cache(store=store)
    def fresh(n):
        return np.arange(n, dtype=float) * 2  # owns its memory

    @casmon.cache(store=store)
    def view(n):
        return np.arange(2 * n, dtype=float)[::2]  # a view: its base is remembered too

    url = fresh.__casmon_cache__.store.url
    a, v = fresh(20), view(20)
    assert edges.upstream([a], url) == [bytes(fresh.ref(20).key)]
    assert edges.upstream([v], url) == [bytes(view.ref(20).key)]
    assert edges.upstream([v.base], url) == [bytes(view.ref(20).key)]
    assert edges.upstream([a[3:]], url) == [bytes(fresh.ref(20).key)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(VALUES, st.dictionaries(st.text(max_size=5), SCALARS, max_size=3)))
def test_a_one_parameter_calls_content_digests_are_what_the_general_reading_of_its_key_gives(store, v):
    @casmon.cache(store=store)
    def one(x):
        return 1

    @casmon.cache(store=store)
    def two(x, y):
        return 2

    fresh = os.urandom(16).hex()  # a miss, whatever the examples before stored
    one(fresh)  # each function's first miss reads its parameters' names: the next ones take the fast way
    two(fresh, y="y" * 30)
    one(v)
    two(v, y="y" * 30)
    for f, args, kwargs in ((one, (v,), {}), (two, (v,), {"y": "y" * 30})):
        state = f.__casmon_cache__
        spans = state.key_ctx(args, kwargs)[3]
        assert f.ref(*args, **kwargs).entry.get("pc", {}) == edges.content_digests(state, args, kwargs, spans)


def test_a_one_parameter_call_whose_value_is_hashed_or_a_file_gets_no_content_digest_of_it(store, tmp_path):
    p = tmp_path / "data.bin"
    p.write_bytes(b"x" * 100)

    @casmon.cache(store=store, hashers={"x": lambda v: v.upper()})
    def hashed(x):
        return 1

    @casmon.cache(store=store, files=["path"])
    def read(path):
        return 2

    @casmon.cache(store=store)
    def plain(x):
        return 3

    for f, arg in ((hashed, "v" * 40), (read, str(p)), (plain, "v" * 40)):
        f("w" * 40 if f is not read else str(tmp_path))  # the first call of each reads its parameters' names
        f(arg)
    assert "x" not in hashed.ref("v" * 40).entry.get("pc", {})  # empty: an entry with no lineage field to record
    assert "path" not in read.ref(str(p)).entry.get("pc", {})
    assert set(plain.ref("v" * 40).entry["pc"]) == {"x"}


def test_a_one_parameter_call_taking_a_view_or_a_container_of_a_result_links_to_it(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float) * 2

    @casmon.cache(store=store)
    def use(x):
        return 0

    a = make(40)
    for arg in (a[::2], (a, 1), [a], {"k": a}):
        use(arg)
        assert use.ref(arg).entry["up"] == {"x": [bytes(make.ref(40).key).hex()]}


def test_a_fresh_array_at_a_dead_results_address_is_not_walked_for_producers(store, monkeypatch):
    """A result dropped leaves its row until the next sweep; a fresh argument the allocator puts at its address
    (numpy reuses memory of that size at once) is no remembered result: the miss takes the fast way."""
    import weakref

    @casmon.cache(store=store)
    def make(i):
        return np.arange(16.0) + i

    @casmon.cache(store=store)
    def use(x):
        return 0

    make(-1)
    use(np.arange(16.0) - 7)  # each function's first miss reads its parameters' names
    url = make.__casmon_cache__.store.url

    class Gone:
        pass

    dead = weakref.ref(Gone())
    assert dead() is None
    walked = []
    real = edges.upstream
    monkeypatch.setattr(edges, "upstream", lambda *a, **k: walked.append(a) or real(*a, **k))
    for i in range(20):
        x = np.arange(16.0) * 3 + i
        edges._by_id[id(x)] = (dead, bytes(make.ref(-1).key), True, url)  # as a dead result's row at x's address
        use(x)
        assert "up" not in use.ref(x).entry and use.ref(x).entry["pc"]["x"] == use.ref(x).entry["a"]["x"]
    assert walked == []
