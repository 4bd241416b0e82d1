"""Crafted entries against explain's two digest forms (an older casmon's 64-bit ``a``, this one's 128-bit content
digest): a ``pc`` that is not content digests (a 64-bit digest, a wrong length, not a string) never makes a
changed parameter compare as the same, and explain_entry raises nothing."""

import time

import pytest

import casmon
from casmon.caching import KIND, edges
from casmon.caching.explain import MIXED, explain_entry
from tests.lineage.test_unified_digest import _old_digest


@pytest.fixture
def store(tmp_path):
    edges.forget_all()
    yield str(tmp_path / "store")
    edges.forget_all()


X = "a long text parameter, content-sized: " * 2
Y = "another long text parameter, content-sized: " * 2


def _restore(fn, args, **fields):
    state = fn.__casmon_cache__
    ref = fn.ref(*args)
    rec = dict(ref.entry)
    rec.update(fields)
    rec["time"] = time.time()
    state.store.append(KIND, rec, key=ref.key)
    state.store.flush()
    state.forget()


def _near(fn, args, other):
    state = fn.__casmon_cache__
    ex = explain_entry(state.store, state.name, fn.ref(*args).key)
    key = bytes(fn.ref(*other).key).hex()
    return {d.name: d.detail for n in ex.nearest if n.key == key for d in n.differences}


def test_a_pc_that_is_not_a_content_digest_never_makes_a_changed_parameter_the_same(store):
    @casmon.cache(store=store)
    def f(x, seed):
        return list(range(20))

    f(X, 1)
    f(Y, 1)
    # an older entry for Y (64-bit a), and a crafted new entry for X whose pc holds that 64-bit digest
    _restore(f, (Y, 1), a={"x": _old_digest("x", Y), "seed": _old_digest("seed", 1)})
    _restore(f, (X, 1), pc={"x": _old_digest("x", Y)})
    assert _near(f, (X, 1), (Y, 1)).get("x") in ("differs", MIXED)
    assert _near(f, (Y, 1), (X, 1)).get("x") in ("differs", MIXED)


@pytest.mark.parametrize("bad", ["0" * 16, "0" * 20, "0" * 31, 5, None, ["0" * 32], {"y": 1}])
def test_an_older_entrys_pc_of_the_wrong_form_never_hides_a_change(store, bad):
    @casmon.cache(store=store)
    def f(x, seed):
        return list(range(20))

    f(X, 1)
    f(Y, 2)
    _restore(f, (X, 1), a={"x": _old_digest("x", X), "seed": _old_digest("seed", 1)}, pc={"x": bad})
    for got in (_near(f, (Y, 2), (X, 1)), _near(f, (X, 1), (Y, 2))):
        assert got.get("seed") == "differs" and got.get("x") in ("differs", MIXED)


def test_two_of_this_casmons_entries_a_long_and_a_short_value_differ(store):
    """An entry with a short result, no upstream and no content-sized parameter records an empty ``pc``: its
    64-bit digests are short values', not an older casmon's of long ones, so against a content digest the
    parameter differs, in explain and in diff (whose index keeps no empty ``pc``)."""
    @casmon.cache(store=store)
    def g(x, y=1):
        return 1

    g(X)
    g("ab")
    e = g.ref("ab").entry
    assert e.get("pc") == {} and not {"rf", "up"} & set(e)
    for a, b in ((X, "ab"), ("ab", X)):
        assert _near(g, (b,), (a,)) == {"x": "differs"}
    with casmon.record(store=store, capture_output=False) as run_a:
        g(X, 2)
    with casmon.record(store=store, capture_output=False) as run_b:
        g("ab", 2)
    from casmon.lineage import first_difference
    for x, y in ((run_a, run_b), (run_b, run_a)):
        (p,) = first_difference(x.name, y.name, g.__casmon_cache__.store).partings
        assert [(d.name, d.detail) for d in p.differences] == [("x", "differs")]


def test_an_entry_stored_before_lineage_may_differ_from_a_content_digest_never_the_same(store):
    @casmon.cache(store=store)
    def g(x, y=1):
        return 1

    g(X)
    g("ab")
    state = g.__casmon_cache__
    rec = dict(g.ref("ab").entry)
    rec.pop("pc", None)
    rec["time"] = time.time()
    state.store.append(KIND, rec, key=g.ref("ab").key)
    state.store.flush()
    state.forget()
    assert "pc" not in g.ref("ab").entry
    for a, b in ((X, "ab"), ("ab", X)):
        assert _near(g, (b,), (a,)) == {"x": MIXED}
    assert "older casmon's and this one's" not in MIXED
