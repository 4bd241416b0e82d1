"""Edges recorded as calls happen: by identity in a process (the object itself, inside a container, a numpy view
of it), by content across processes and stores; tiny values and dead objects link to nothing; entries without
the fields, or with crafted ones, load as entries without edges."""

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import casmon
from casmon.caching import KIND, edges
from casmon.caching.files import path_digest
from casmon.lineage import lineage, stale, used_by
from casmon.lineage.index import Index
from tests.support.processes import ENV


@pytest.fixture
def store(tmp_path):
    edges.forget_all()
    yield str(tmp_path / "store")
    edges.forget_all()


def entry_of(fn, *args):
    return bytes(fn.ref(*args).key).hex()


def upstream_fns(store, fn, *args):
    ix = Index(fn.__casmon_cache__.store)  # the writer's own store: what it appended is read before a flush
    return sorted((p, ix.entries[u]["fn"].rsplit(".", 1)[-1]) for p, u in ix.upstream(entry_of(fn, *args)))


def test_values_passed_in_a_container_link_to_each_producer(store):
    @casmon.cache(store=store)
    def feats(n):
        return np.arange(n, dtype=float)

    @casmon.cache(store=store)
    def labels(n):
        return np.arange(n) % 2

    @casmon.cache(store=store)
    def train(pair):
        return float(pair[0] @ pair[1])

    f, y = feats(50), labels(50)
    train((f, y))
    assert upstream_fns(store, train, (f, y)) == [("pair", "feats"), ("pair", "labels")]


def test_a_numpy_view_of_a_result_links_to_it(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n * n, dtype=float).reshape(n, n)

    @casmon.cache(store=store)
    def total(a):
        return float(a.sum())

    a = make(8)
    for view in (a[::2], a.T, a[1:, 2]):
        total(view)
        assert upstream_fns(store, total, view) == [("a", "make")]


def test_a_hit_links_like_a_miss(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float)

    @casmon.cache(store=store)
    def double(a):
        return a * 2

    make(30)
    edges.forget_all()  # as a fresh process: the value comes from a hit
    double(make(30))
    assert upstream_fns(store, double, make(30)) == [("a", "make")]


def test_an_item_of_a_tuple_result_links_by_identity_only_a_whole_result_by_content(store):
    """As the README says: a result is one value. ``feats`` of ``feats, labels = features(n)`` links where it is the
    object itself; an equal copy of it in another process (saved to a file, loaded) links to nothing, while an
    equal copy of a whole result links by content."""

    @casmon.cache(store=store)
    def features(n):
        return np.arange(n, dtype=float) * 3, np.arange(n) % 2

    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float) * 5

    @casmon.cache(store=store)
    def total(a):
        return float(a.sum())

    @casmon.cache(store=store)
    def peak(a):
        return float(a.max())

    feats, _labels = features(40)
    total(feats)
    assert upstream_fns(store, total, feats) == [("a", "features")]
    whole = make(40)
    features.__casmon_cache__.store.flush()
    edges.forget_all()  # as another process, which loaded equal copies
    item_copy, whole_copy = np.array(feats), np.array(whole)
    peak(item_copy)
    peak(whole_copy)
    assert upstream_fns(store, peak, item_copy) == []
    assert upstream_fns(store, peak, whole_copy) == [("a", "make")]


def test_a_warm_hit_touches_no_identity_row_and_no_fingerprint_yet_its_result_and_views_link(store, monkeypatch):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n * n, dtype=float).reshape(n, n)

    @casmon.cache(store=store)
    def total(a):
        return float(a.sum())

    make(6)
    edges.forget_all()  # as a fresh process: the values below come from hits
    touched = []
    real = {n: getattr(edges, n) for n in ("_remember", "produced", "upstream", "result_fingerprint", "annotate")}
    for name, f in real.items():
        monkeypatch.setattr(edges, name, lambda *a, _n=name, _f=f, **k: (touched.append(_n), _f(*a, **k))[1])
    hits = [make(6) for _ in range(20)]
    assert touched == [] and not edges._by_id  # the hits only queued their results
    views = [hits[3][::2], hits[7].T]
    for v in views:
        total(v)  # a miss: the queued hits become rows first
        assert upstream_fns(store, total, v) == [("a", "make")]
    assert "annotate" in touched


def test_hits_queue_boundedly_and_a_dropped_hit_result_links_to_nothing(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float)

    make(40)
    edges.forget_all()
    for _ in range(3 * edges.SERVED_MAX):
        make(40)  # each result dropped at once
        assert len(edges._served) <= edges.SERVED_MAX
    gc.collect()
    url = make.__casmon_cache__.store.url
    for _ in range(50):  # new arrays, some at a dropped result's address: none is taken for it
        assert edges.upstream([np.arange(40.0)], url) == []


def test_a_warm_hit_of_small_arguments_returning_a_list_walks_nothing(store, monkeypatch):
    @casmon.cache(store=store)
    def rows(n):
        return [np.arange(4.0) + i for i in range(n)]

    rows(3)
    rows(3)  # the first hit: the hot path learns it
    walked = []
    real = edges.produced
    monkeypatch.setattr(edges, "produced", lambda *a, **k: (walked.append(a), real(*a, **k))[1])
    for _ in range(10):
        assert len(rows(3)) == 3
    assert walked == [] and not edges._served


def test_a_dead_result_is_forgotten_so_a_reused_id_links_to_nothing(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float)

    a = make(40)
    url = make.__casmon_cache__.store.url
    assert edges.upstream([a], url) == [bytes(make.ref(40).key)]
    del a
    gc.collect()
    edges._sweep()
    assert not edges._by_id  # the caller dropped the result: nothing remembered, nothing held
    for _ in range(50):  # new arrays, some at the dead one's address: none is taken for it
        assert edges.upstream([np.arange(40.0)], url) == []


def _python(code, env):
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]


STAGES = '''
import sys, numpy as np, casmon
@casmon.cache(store=sys.argv[1])
def make(n):
    return np.linspace(0, 1, n)
@casmon.cache(store=sys.argv[1])
def scale(a):
    return a * 3
'''


def test_a_value_recomputed_elsewhere_links_by_content(tmp_path, store):
    """``make`` ran in one process on this store; the same content computed in another process, on another store
    (another machine), reaches ``scale`` here through a file: linked to the entry by content."""
    env = dict(ENV, PYTHONDONTWRITEBYTECODE="1")
    (tmp_path / "stages.py").write_text(STAGES)
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    code = "import sys; sys.argv[1:] = [{!r}]; import stages, numpy as np; {}"
    _python(code.format(store, "stages.make(1000)"), env)
    _python(code.format(str(tmp_path / "elsewhere"), f"np.save({str(tmp_path / 'v.npy')!r}, stages.make(1000))"), env)
    _python(code.format(store, f"stages.scale(np.load({str(tmp_path / 'v.npy')!r}))"), env)
    ix = Index(casmon.open(store))
    (scale_key,) = [k for k, r in ix.entries.items() if r["fn"] == "stages.scale"]
    (make_key,) = [k for k, r in ix.entries.items() if r["fn"] == "stages.make"]
    assert ix.upstream(scale_key) == [("a", make_key)]
    assert {n["id"] for n in used_by("stages.make", store).to_dict()["nodes"]} == {f"entry:{make_key}",
                                                                                    f"entry:{scale_key}"}


def test_content_equality_is_the_rule_across_processes_and_tiny_values_link_to_nothing(store):
    """As the README says: an equal value links to a stored result whatever code made it (no identity edge
    names its producer); values whose key encoding is under edges.CONTENT_MIN bytes never link."""
    @casmon.cache(store=store)
    def make(n):
        return np.linspace(0, 1, n)

    @casmon.cache(store=store)
    def flag(n):
        return None

    @casmon.cache(store=store)
    def use(a, b=None):
        return float(a.sum())

    make(100)
    flag(1)
    edges.forget_all()
    unrelated = np.linspace(0, 1, 100)  # equal content, made by other code
    use(unrelated, None)
    assert upstream_fns(store, use, unrelated, None) == [("a", "make")]
    other = np.linspace(0, 2, 100)
    use(other, None)
    assert upstream_fns(store, use, other, None) == []


def test_entries_without_lineage_fields_or_with_crafted_ones_load_without_edges(store, monkeypatch):
    @casmon.cache(store=store)
    def make(n):
        return list(range(n))

    @casmon.cache(store=store)
    def head(a):
        return a[:3]

    with monkeypatch.context() as m:  # as an older casmon wrote them
        m.setattr(edges, "annotate", lambda *a, **k: None)
        head(make(20))
    s = casmon.open(store)
    crafted = {"fn": "x.crafted", "result": "0" * 32, "time": 1.0, "rf": "not hex", "pc": {"a": 7},
               "up": {"a": ["zz"], "b": "nope"}}
    s.append(KIND, crafted, key=casmon.fingerprint("crafted"))
    s.append(KIND, {"fn": "x.orphan", "result": "1" * 32, "time": 2.0, "up": {"a": ["ab" * 16]}},
             key=casmon.fingerprint("orphan"))
    s.flush()
    ix = Index(casmon.open(store))
    assert all(ix.upstream(k) == [] for k, r in ix.entries.items() if r["fn"] != "x.orphan")
    assert "rf" not in ix.entries[casmon.fingerprint("crafted").hex()]
    g = lineage(casmon.fingerprint("orphan").hex(), store).to_dict()
    assert {n["id"]: n["status"] for n in g["nodes"]}["entry:" + "ab" * 16] == "missing"
    assert stale(store).to_dict()["nodes"] == []


def test_an_intercepted_call_taking_a_cached_result_is_used_by_it(store):
    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float)

    @casmon.intercept(store=store)
    def report(a, note):
        return float(a.max())

    report(make(64), "first")
    report(np.zeros(3), "unrelated")
    casmon.flush()
    make.__casmon_cache__.store.flush()
    g = used_by("make", make.__casmon_cache__.store).to_dict()
    calls = [n for n in g["nodes"] if n["kind"] == "call"]
    assert [c["n"] for c in calls] == [1]
    assert {(e["kind"], e["label"]) for e in g["edges"] if e["to"] == calls[0]["id"]} == {("argument", "[0]")}


def test_a_long_chain_of_cached_steps_answers_without_recursion(store):
    """``state = step(state)`` cached 3,000 times, three times deeper than the interpreter's recursion limit:
    stale, lineage and used_by walk it without a RecursionError."""
    import sys

    assert sys.getrecursionlimit() < 3000

    @casmon.cache(store=store)
    def step(state):
        return state + 1.0

    @casmon.cache(store=store)
    def start(n):
        return np.zeros(n)

    s = start(8)
    for _ in range(3000):
        s = step(s)
    st = step.__casmon_cache__.store
    assert stale(st).to_dict()["nodes"] == []
    assert len(used_by("start", st).nodes) == 3001
    assert len(lineage(bytes(step.ref(s - 1.0).key).hex(), st).nodes) == 3001
    casmon.caching.clear_function(st, "start")
    assert len(stale(st).nodes) == 3000  # every step: its chain starts at a cleared entry


def test_an_edge_keeps_nothing_alive_through_gc_and_a_collected_upstream_shows_as_missing(store):
    """``double``'s entry names ``make``'s entry as its upstream; clearing ``make`` and collecting drops its record
    and its value all the same, and the lineage then shows it as missing (nothing stale, nothing raised)."""
    from casmon.caching import clear_function, evict
    from casmon.errors import MissingObjectError

    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float) * 7

    @casmon.cache(store=store)
    def double(a):
        return a * 2

    a = make(500)
    double(a)
    make_ref, double_key = make.ref(500), bytes(double.ref(a).key).hex()
    assert edges.upstream([a], make.__casmon_cache__.store.url) and double.ref(a).lineage().nodes[f"entry:{bytes(make_ref.key).hex()}"]
    s = make.__casmon_cache__.store
    clear_function(s, "make")
    evict(s)
    s.gc(grace=0)
    with pytest.raises(MissingObjectError):
        s.get(make_ref.digest)
    g = lineage(double_key, s).to_dict()
    status = {n["id"]: n["status"] for n in g["nodes"]}
    assert status == {f"entry:{double_key}": "live", f"entry:{bytes(make_ref.key).hex()}": "missing"}
    assert stale(s).to_dict()["nodes"] == []


def test_a_crafted_files_path_naming_a_device_is_never_read(store):
    """An entry whose ``files`` names /dev/zero (a crafted store) would make stale read forever: a path that is
    no regular file or folder is never read, and judges nothing."""
    s = casmon.open(store)
    s.append(KIND, {"fn": "x.load", "result": "2" * 32, "time": 3.0, "files": [["path", "/dev/zero", "3" * 32, 1]]},
             key=casmon.fingerprint("device"))
    s.flush()
    assert stale(s).to_dict()["nodes"] == []
    (f,) = lineage(casmon.fingerprint("device").hex(), s).of_kind("file")
    assert "changed" not in f.data


def test_an_argument_linked_by_identity_is_not_hashed_a_second_time(store, monkeypatch):
    @casmon.cache(store=store)
    def feats(n):
        return np.ones((n, 64))

    @casmon.cache(store=store)
    def train(pair, big):
        return float(pair[0].sum() + big.sum())

    f, big = feats(2000), feats(3000)  # big: over the key's inline limit, hashed straight from its buffer
    seen = []
    real = edges._digest_of
    monkeypatch.setattr(edges, "_digest_of", lambda v: seen.append(type(v).__name__) or real(v))
    train((f, f[:10]), big)
    assert seen == ["float"]  # the result's fingerprint only: both arguments' producers are known
    assert upstream_fns(store, train, (f, f[:10]), big) == [("big", "feats"), ("pair", "feats")]


def test_a_relative_files_path_not_found_from_here_is_unknown_not_gone(tmp_path, store, monkeypatch):
    """``load("data.txt")`` recorded from the project's folder: ``stale`` run from elsewhere cannot tell, and says
    nothing; from the project's folder it sees the change."""
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "data.txt").write_text("1 2 3\n")
    monkeypatch.chdir(proj)

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path) * 10

    load("data.txt")
    s = load.__casmon_cache__.store
    monkeypatch.chdir(tmp_path)
    assert stale(s).to_dict()["nodes"] == []
    monkeypatch.chdir(proj)
    assert stale(s).to_dict()["nodes"] == []
    old = path_digest(proj / "data.txt")[1].hex()
    (proj / "data.txt").write_text("1 2 4\n")
    new = path_digest(proj / "data.txt")[1].hex()
    (n,) = stale(s).to_dict()["nodes"]
    assert n["reason"] == f"file 'data.txt': its content changed: was {old[:8]}, now {new[:8]} (parameter 'path')"


def test_a_result_of_another_store_is_no_edge_of_this_one(tmp_path, store):
    """The producer's entry lives in another store: this store's lineage would only show it as missing."""
    @casmon.cache(store=str(tmp_path / "other"))
    def make(n):
        return np.arange(n, dtype=float) * 3

    @casmon.cache(store=store)
    def use(a):
        return float(a.sum())

    a = make(100)
    use(a)
    assert "up" not in use.ref(a).entry
    assert [n.data["status"] for n in use.ref(a).lineage().nodes.values()] == ["live"]


def test_a_small_array_results_fingerprint_needs_no_walk_and_still_links_across_stores(tmp_path, monkeypatch):
    walks = []

    class Counting(edges._Linking):
        __slots__ = ()

        def feed_value(self, value, root="value"):
            walks.append(type(value))
            super().feed_value(value, root)

    monkeypatch.setattr(edges, "_Linking", Counting)
    monkeypatch.setattr(edges, "_LinkingVersioned", Counting)
    edges.forget_all()

    @casmon.cache(store=str(tmp_path / "a"))
    def make(n):
        return np.arange(n, dtype=float) * 3

    @casmon.cache(store=str(tmp_path / "a"))
    def use(x):
        return float(x.sum())

    r = make(16)
    assert walks == []
    edges.forget_all()  # as in another process: content links it
    use(r.copy())
    ix = Index(make.__casmon_cache__.store)
    assert [u for _, u in ix.upstream(entry_of(use, r))] == [entry_of(make, 16)]


def test_a_result_whose_dtype_holds_metadata_links_by_content_after_a_plain_one_of_its_shape(store):
    md = np.dtype("f8", metadata={"unit": "m"})

    @casmon.cache(store=store)
    def plain(n):
        return np.arange(n, dtype=float)

    @casmon.cache(store=store)
    def tagged(n):
        return np.arange(n, dtype=float).astype(md) + 1

    @casmon.cache(store=store)
    def use(x):
        return float(x.sum())

    plain(16)  # an equal dtype of the same shape first: its fingerprint's start must not serve the tagged one
    r = tagged(16)
    edges.forget_all()  # as in another process: content links it
    use(r.copy())
    ix = Index(use.__casmon_cache__.store)
    assert [u for _, u in ix.upstream(entry_of(use, r))] == [entry_of(tagged, 16)]


def test_a_stage_that_returns_its_input_unchanged_does_not_vouch_for_a_stale_input(tmp_path, monkeypatch, store):
    """``clean`` finds nothing to drop and returns what ``load`` gave it: its result equals load's, but it was
    made from it, so when the file changes clean and what it fed are stale too, not held by clean's own copy."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data.txt").write_text("1 2 3 4 5 6 7 8\n")

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    @casmon.cache(store=store)
    def clean(x):
        return x[~np.isnan(x)]

    @casmon.cache(store=store)
    def fit(x, k):
        return x * k

    x = clean(load("data.txt"))
    fit(x, 2.0)
    keys = {"load": entry_of(load, "data.txt"), "clean": entry_of(clean, load("data.txt")), "fit": entry_of(fit, x, 2.0)}
    s = load.__casmon_cache__.store
    s.flush()
    edges.forget_all()
    assert stale(s).to_dict()["nodes"] == []
    (tmp_path / "data.txt").write_text("1 2 3 4 5 6 7 9\n")
    assert {n["id"] for n in stale(s).to_dict()["nodes"]} == {f"entry:{k}" for k in keys.values()}


def test_stale_lists_the_entries_stale_of_themselves_before_those_that_inherit_it(tmp_path, monkeypatch, store):
    """The causes (a changed file, changed code) come first, not buried among what they made stale."""
    monkeypatch.chdir(tmp_path)

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path) * 10

    @casmon.cache(store=store)
    def scale(x, k):
        return x * k

    for i, name in enumerate(("a.txt", "b.txt")):
        (tmp_path / name).write_text(f"{i} 2 3 4 5 6 7 8\n")
        x = load(name)
        for k in range(30):
            scale(x, k)
    load.__casmon_cache__.store.flush()
    edges.forget_all()
    for i, name in enumerate(("a.txt", "b.txt")):
        (tmp_path / name).write_text(f"{i} 2 3 4 5 6 7 9\n")
    reasons = [n["reason"] for n in stale(load.__casmon_cache__.store).to_dict()["nodes"]]
    assert len(reasons) == 62
    assert all(r.startswith("file ") for r in reasons[:2]) and not any(r.startswith("file ") for r in reasons[2:])


def test_an_involution_applied_twice_to_a_literal_is_not_stale(store):
    """``neg(neg(x))`` of a plain array: the first call's input equals the second's result, a content link to an
    entry stored after it. The value came from outside the store, so the pair holds, not a cycle found stale."""
    @casmon.cache(store=store)
    def neg(x):
        return -x

    neg(neg(np.arange(10.0)))
    s = neg.__casmon_cache__.store
    s.flush()
    edges.forget_all()
    assert stale(s).to_dict()["nodes"] == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_a_crafted_files_folder_holding_a_pipe_or_a_device_is_digested_without_reading_them(tmp_path, store):
    """A crafted entry's ``files`` names a folder in which a named pipe (its open never returns) and a link to
    /dev/zero (its read never ends) sit: ``stale`` digests the folder naming them, never opening them."""
    folder = tmp_path / "shared"
    folder.mkdir()
    (folder / "data.txt").write_text("1 2 3")
    os.mkfifo(folder / "pipe")
    os.symlink("/dev/zero", folder / "zero")
    s = casmon.open(store, create=True)
    s.append(KIND, {"fn": "x.load", "result": "2" * 32, "time": 3.0, "files": [["path", str(folder), "3" * 32, 1]]},
             key=casmon.fingerprint("folder"))
    s.flush()
    code = textwrap.dedent(f"""
        import casmon
        from casmon.lineage import stale
        (n,) = stale({store!r}).nodes.values()
        print(n.data["reason"])
    """)
    p = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "its content changed" in p.stdout


def test_a_files_folder_holding_a_broken_link_is_not_said_to_be_gone(tmp_path, store):
    """The folder is there; a link inside it points nowhere, so its digest cannot be made: nothing is judged
    from it (it is not "no longer exists")."""
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / "a.txt").write_text("1 2 3")
    os.symlink(tmp_path / "nowhere", folder / "dangling")
    s = casmon.open(store, create=True)
    s.append(KIND, {"fn": "x.load", "result": "2" * 32, "time": 3.0, "files": [["path", str(folder), "3" * 32, 1]]},
             key=casmon.fingerprint("broken"))
    s.flush()
    assert stale(s).to_dict()["nodes"] == []
    (f,) = lineage(casmon.fingerprint("broken").hex(), s).of_kind("file")
    assert "changed" not in f.data


def test_a_result_served_before_lineage_loads_still_links_to_its_entry(tmp_path):
    """A hit registers its result without loading casmon.caching.edges (a first hit never needs it); the next miss
    that takes the result loads it and links to the entry the hit served."""
    script = tmp_path / "s.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import numpy as np
        import casmon

        @casmon.cache(store=sys.argv[1])
        def make(n):
            return np.arange(n, dtype=float)

        @casmon.cache(store=sys.argv[1])
        def total(a):
            return float(a.sum())

        a = make(40)
        before = "casmon.caching.edges" in sys.modules
        if sys.argv[2] == "hit":
            total(a)
        print(json.dumps({"edges_loaded_by_make": before}))
    """))
    store = tmp_path / "store"
    run = lambda mode: subprocess.run([sys.executable, str(script), str(store), mode], capture_output=True,
                                      text=True, env=ENV, timeout=300, check=True)
    run("miss")
    out = run("hit").stdout.strip().splitlines()[-1]
    assert '"edges_loaded_by_make": false' in out, "a hit loaded the lineage code"
    s = casmon.open(str(store))
    ix = Index(s)
    (tk,) = [k.hex() for k, r in s.records(KIND) if r.get("fn", "").endswith("total")]
    assert [ix.entries[u]["fn"].rsplit(".", 1)[-1] for _p, u in ix.upstream(tk)] == ["make"]
    s.close()
