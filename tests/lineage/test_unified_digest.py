"""One digest per parameter: a miss hashes each parameter's part of the key's encoding once, and that digest is
both explain's (``a``) and lineage's content digest (``pc``). Entries stored before (a 64-bit ``a`` of every
span, name included) still explain and link: explain names the right parameter against them and across them,
and lineage links through their ``pc``."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import xxhash

import casmon
from casmon.caching import KIND, edges, explain
from casmon.caching.explain import explain_entry
from casmon.keys.codeversion import VersionedFingerprinter
from casmon.keys.fingerprint import Fingerprinter
from casmon.lineage import first_difference
from casmon.lineage.index import Index
from tests.support.processes import ENV


@pytest.fixture
def store(tmp_path):
    edges.forget_all()
    yield str(tmp_path / "store")
    edges.forget_all()


def _counting(monkeypatch, calls):
    """Count every call of the span hashes, wherever the caching modules keep one."""
    for mod in (edges, explain):
        for name, real in (("_h128", xxhash.xxh3_128_hexdigest), ("_hex64", xxhash.xxh3_64_hexdigest)):
            def counted(b, real=real):
                calls.append(bytes(b))
                return real(b)
            monkeypatch.setattr(mod, name, counted, raising=False)


def test_a_miss_hashes_each_parameters_span_once(store, monkeypatch):
    @casmon.cache(store=store)
    def one(x):
        return 0

    @casmon.cache(store=store)
    def two(x, seed, label="a label long enough to be content"):
        return 0

    calls = []
    _counting(monkeypatch, calls)
    for i in range(3):  # a function's first miss and the later ones take different ways
        calls.clear()
        one(np.arange(16.0) + i)
        assert len(calls) == 1
        calls.clear()
        two(np.arange(16.0) + i, i)
        assert len(calls) == 3, "x, seed and label: once each"
        e = two.ref(np.arange(16.0) + i, i).entry
        assert e["pc"]["x"] == e["a"]["x"] and e["pc"]["label"] == e["a"]["label"]  # one digest serves both
        assert len(e["a"]["seed"]) == 16 and "seed" not in e["pc"]  # too short to link: the 64-bit one, as before


def _old_digest(name, value):
    """The ``a`` digest casmon gave a parameter before its content digest served explain: xxh3-64 of the
    parameter's part of the key's encoding, its name included."""
    nfp = Fingerprinter()
    nfp.str_(name)
    fp = VersionedFingerprinter()
    fp.feed_value(value, name)
    assert not fp.fed, "a value the key encodes whole"
    return xxhash.xxh3_64_hexdigest(bytes(nfp.out) + bytes(fp.out))


def _store_as_before(fn, args, lineage=True, age=0.0, kwargs=None):
    """Store ``fn(*args)``'s entry again as casmon stored it before: every span parameter's ``a`` the old 64-bit
    digest (and, with ``lineage``, the ``pc`` it recorded then; without, neither ``pc`` nor ``rf``)."""
    state = fn.__casmon_cache__
    kwargs = kwargs or {}
    ref = fn.ref(*args, **kwargs)
    rec = dict(ref.entry)
    vals = {p.name: v for p, v in zip(state.params, state.bind(args, kwargs))}
    # only a content digest's form changed: a short span's digest, a *args item's, are as they were
    rec["a"] = {n: _old_digest(n, vals[n]) if len(d) == 32 else d for n, d in rec["a"].items()}
    if not lineage:
        rec.pop("pc", None)
        rec.pop("rf", None)
    rec["time"] = time.time() - age
    state.store.append(KIND, rec, key=ref.key)
    state.store.flush()
    state.forget()


X = "a long text parameter, content-sized: its digest is lineage's " * 2


def test_explain_names_the_changed_parameter_against_new_and_older_entries(store):
    @casmon.cache(store=store)
    def f(x, seed):
        return 1

    f(X, 1)
    assert [(d.name, d.detail) for d in f.explain(X, 2).differences] == [("seed", "differs")]
    assert [(d.name, d.detail) for d in f.explain(X + "!", 1).differences] == [("x", "differs")]
    for lineage in (True, False):  # an older entry; one stored before lineage recorded anything
        _store_as_before(f, (X, 1), lineage)
        assert len(f.ref(X, 1).entry["a"]["x"]) == 16
        assert [(d.name, d.detail) for d in f.explain(X, 2).differences] == [("seed", "differs")]
        assert [(d.name, d.detail) for d in f.explain(X + "!", 1).differences] == [("x", "differs")]


def test_explain_of_a_function_with_star_args_names_the_changed_parameter_against_an_older_entry(store):
    @casmon.cache(store=store)
    def g(x, *rest, **kw):
        return 1

    g(X, 1, k=2)
    _store_as_before(g, (X, 1), kwargs={"k": 2})
    assert g.ref(X, 1, k=2).entry["a"].keys() == {"x", "rest[0]", "k"}
    assert len(g.ref(X, 1, k=2).entry["a"]["x"]) == 16
    assert [(d.name, d.detail) for d in g.explain(X, 1, k=3).differences] == [("k", "differs")]
    assert [(d.name, d.detail) for d in g.explain(X + "!", 1, k=2).differences] == [("x", "differs")]


def test_an_older_entry_and_a_new_one_compare_by_parameter_in_explain_entry_and_diff(store):
    @casmon.cache(store=store)
    def f(x, seed):
        return 1

    with casmon.record(store=store, capture_output=False) as run_a:
        f(X, 1)
    _store_as_before(f, (X, 1), age=5.0)
    with casmon.record(store=store, capture_output=False) as run_b:
        f(X, 2)
        f(X + "!", 1)
    s = f.__casmon_cache__.store
    s.flush()
    new = f.ref(X, 2)
    ex = explain_entry(s, f.__casmon_cache__.name, new.key)
    near = {n.key: [(d.name, d.detail) for d in n.differences] for n in ex.nearest}
    assert near[bytes(f.ref(X, 1).key).hex()] == [("seed", "differs")]
    parting = first_difference(run_a.name, run_b.name, s).partings
    got = {(p.b, tuple((d.name, d.detail) for d in p.differences)) for p in parting}
    assert (bytes(new.key).hex(), (("seed", "differs"),)) in got
    assert (bytes(f.ref(X + "!", 1).key).hex(), (("x", "differs"),)) in got


def test_an_older_entry_whose_content_digest_is_unknown_may_differ_never_differs(store):
    @casmon.cache(store=store)
    def f(x, seed):
        return 1

    f(X, 1)
    f(X, 2)
    _store_as_before(f, (X, 1), lineage=False, age=5.0)  # stored before lineage: nothing gives x's content digest
    s = f.__casmon_cache__.store
    ex = explain_entry(s, f.__casmon_cache__.name, f.ref(X, 2).key)
    assert [(d.name, d.detail.split(":")[0]) for d in ex.nearest[0].differences] == [("seed", "differs")]
    ex = explain_entry(s, f.__casmon_cache__.name, f.ref(X, 1).key)
    assert [d.name for d in ex.nearest[0].differences] == ["seed"]


STAGES = '''
import sys, numpy as np, casmon
@casmon.cache(store=sys.argv[1])
def make(n):
    return np.arange(16.0) * n
@casmon.cache(store=sys.argv[1])
def count(n):
    return n + 1
@casmon.cache(store=sys.argv[1])
def use(x):
    return 0
'''


def test_lineage_links_across_processes_through_the_one_digest_and_not_for_a_short_value(tmp_path, store):
    """``make`` and ``count`` ran in one process; another computes equal values itself and passes them to ``use``:
    the 128-byte array links by its content digest (the same one explain keeps), the small int does not (its
    encoding is under CONTENT_MIN bytes, as the README says)."""
    env = dict(ENV, PYTHONDONTWRITEBYTECODE="1")
    (tmp_path / "stages.py").write_text(STAGES)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    code = "import sys; sys.argv[1:] = [{!r}]; import stages, numpy as np; {}"
    for body in ("stages.make(3); stages.count(6)", "stages.use(np.arange(16.0) * 3); stages.use(7)"):
        p = subprocess.run([sys.executable, "-c", textwrap.dedent(code.format(store, body))], env=env,
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
    ix = Index(casmon.open(store))
    keys = {}
    for k, r in ix.entries.items():
        keys.setdefault(r["fn"], []).append(k)
    (make_key,) = keys["stages.make"]
    by_arg = {ix.entry(k)["a"]["x"]: k for k in keys["stages.use"]}
    linked = [k for k in keys["stages.use"] if ix.upstream(k)]
    assert [ix.upstream(k) for k in linked] == [[("x", make_key)]]
    e = ix.entry(linked[0])
    assert e["pc"]["x"] == e["a"]["x"] == ix.entry(make_key)["rf"]
    (short,) = set(by_arg.values()) - set(linked)
    assert "pc" not in ix.entry(short) and len(ix.entry(short)["a"]["x"]) == 16


def test_an_older_entry_links_by_its_pc_beside_new_ones(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(16.0) * n

    @casmon.cache(store=store)
    def use(x, seed):
        return 0

    make(3)
    edges.forget_all()  # no identity edge: content links it
    use(np.arange(16.0) * 3, 1)
    use(np.arange(16.0) * 3, 2)
    _store_as_before(use, (np.arange(16.0) * 3, 1))
    ix = Index(use.__casmon_cache__.store)
    make_key = bytes(make.ref(3).key).hex()
    for seed in (1, 2):
        assert ix.upstream(bytes(use.ref(np.arange(16.0) * 3, seed).key).hex()) == [("x", make_key)]
    assert len(ix.entry(bytes(use.ref(np.arange(16.0) * 3, 1).key).hex())["a"]["x"]) == 16
