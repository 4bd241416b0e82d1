"""The columnar joins (casmon.lineage.columns, joins) answer as a plain walk over every record does."""

import os
import tempfile
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.caching import KIND, KIND_CLEAR, KIND_FN, name_digest
from casmon.keys.digest import Digest
from casmon.lineage import derived, stale, used_by
from casmon.lineage.index import Index

FNS = ["p.load", "p.clean", "p.feats", "p.train"]


# -- the oracle: every record read and joined one by one, as the queries did before the columns -----------------
class Oracle:
    def __init__(self, store, files_now):
        self.entries = {}
        for k, r in store.records(KIND, strict=False):
            derived.newest(self.entries, k.hex(), r)
        self.cleared = {}
        for _k, r in store.records(KIND_CLEAR, strict=False):
            self.cleared[r["fn"]] = max(self.cleared.get(r["fn"], 0.0), r["time"])
        self.current = {}
        for _k, r in store.records(KIND_FN, strict=False):
            if r["fn"] not in self.current or r["time"] >= self.current[r["fn"]][0]:
                self.current[r["fn"]] = (r["time"], r["version"])
        self.by_rf = {}
        for h, r in self.entries.items():
            if "rf" in r:
                self.by_rf.setdefault(r["rf"], []).append(h)
        self.files_now = files_now
        self.now = time.time()

    def status(self, k):
        r = self.entries.get(k)
        if r is None:
            return "missing"
        if r["time"] <= self.cleared.get(r["fn"], 0.0):
            return "cleared"
        if "expires" in r and r["expires"] <= self.now:
            return "expired"
        return "live"

    def groups(self, k, late_held=False):
        """``(parameter, makers)`` of each input; ``late_held``: without the content groups no maker of which was
        stored before ``k`` (the value came from outside the store: it holds)."""
        r = self.entries.get(k) or {}
        up = r.get("up") or {}
        out = [(n, [h]) for n, ks in up.items() for h in ks if h != k]
        for n, d in (r.get("pc") or {}).items():
            base = n.split("[", 1)[0]
            if base not in up:
                g = [h for h in self.by_rf.get(d, ()) if h != k]
                if g and not (late_held and all(self.entries[h]["time"] >= r["time"] for h in g)):
                    out.append((base, g))
        return out

    def edges(self):
        return {(u, h, n) for h in self.entries for n, g in self.groups(h) for u in g}

    def used_by(self, seeds):
        e = self.edges()
        done, todo = set(), list(seeds)
        while todo:
            k = todo.pop()
            if k not in done:
                done.add(k)
                todo.extend(h for u, h, _n in e if u == k)
        return done, {x for x in e if x[0] in done}

    def stale(self):
        """Settled by rounds until nothing changes: an entry is stale if its code or a file changed, or an
        input of it is held by no good entry -- good: live, not changed itself, every input held, grown from the
        entries without inputs, so no entry holds a value it was made from."""
        bad = set()
        for k, r in self.entries.items():
            cur = self.current.get(r["fn"])
            if "v" in r and cur is not None and cur[1] != r["v"] or any(
                    self.files_now.get(f[1], "unknown") not in (f[2], "unknown") for f in r.get("files", ())):
                bad.add(k)
        good = set()

        def holds(u):
            if self.status(u) == "missing" or u in good:
                return True
            rf = self.entries[u].get("rf")
            return rf is not None and any(h in good for h in self.by_rf.get(rf, ()))

        changed = True
        while changed:
            changed = False
            for k in self.entries:
                if k not in good and k not in bad and self.status(k) == "live" and all(
                        any(holds(u) for u in g) for _n, g in self.groups(k, late_held=True)):
                    good.add(k)
                    changed = True
        return {k for k in self.entries if self.status(k) == "live" and k not in good}


# -- random stores --------------------------------------------------------------------------------------------
@st.composite
def stores(draw):
    n = draw(st.integers(1, 30))
    plan = []
    for i in range(n):
        fn = draw(st.sampled_from(FNS))
        ins = draw(st.lists(st.tuples(st.integers(0, max(i - 1, 0)), st.sampled_from(["id", "content", "item", "both"])),
                            max_size=3)) if i else []
        plan.append((fn, ins, draw(st.integers(0, 3)),  # rf class: equal values made by several entries
                     draw(st.sampled_from(["none", "same", "changed", "gone"])),  # a file it read
                     draw(st.sampled_from(["none", "expired", "future"])), draw(st.booleans())))  # v changed
    clears = draw(st.lists(st.sampled_from(FNS), max_size=2))
    return plan, clears


def build(path, plan, clears, tmp):
    s = casmon.open(path, create=True)
    t0 = time.time() - 1000
    version = {fn: os.urandom(16).hex() for fn in FNS}
    keys, rfs = [], []
    files_now = {}
    for i, (fn, ins, rfc, file, exp, old_code) in enumerate(plan):
        key = os.urandom(16).hex()
        rf = f"{rfc:032x}" if rfc else os.urandom(16).hex()
        rec = {"fn": fn, "result": os.urandom(16).hex(), "time": t0 + i, "rf": rf,
               "v": os.urandom(16).hex() if old_code else version[fn], "a": {"x": os.urandom(8).hex()}}
        up, pc = {}, {}
        for j, (src, how) in enumerate(ins):
            name = f"p{j}"
            if how in ("id", "both"):
                up.setdefault(name, []).append(keys[src])
            if how in ("content", "both"):
                pc[name] = rfs[src]
            if how == "item":
                pc[f"{name}[0]"] = rfs[src]
        if up:
            rec["up"] = up
        if pc:
            rec["pc"] = pc
        if file != "none":
            p = os.path.join(tmp, f"f{i}")
            with open(p, "wb") as f:
                f.write(b"x%d" % i)
            from casmon.caching.files import path_digest

            d = path_digest(p)[1].hex()
            rec["files"] = [["path", p, d]]
            if file == "changed":
                with open(p, "wb") as f:
                    f.write(b"changed")
            elif file == "gone":
                os.remove(p)
            files_now[p] = None if file == "gone" else path_digest(p)[1].hex()
        if exp != "none":
            rec["expires"] = time.time() + (-50 if exp == "expired" else 5000)
        s.append(KIND, rec, key=Digest.from_raw(bytes.fromhex(key)))
        keys.append(key)
        rfs.append(rf)
    for fn in FNS:
        s.append(KIND_FN, {"fn": fn, "version": version[fn], "time": t0}, key=name_digest(fn))
    for j, fn in enumerate(clears):
        s.append(KIND_CLEAR, {"fn": fn, "time": t0 + len(plan) // 2 + j}, key=name_digest(fn))
    s.flush()
    return s, keys, files_now


def edge_set(g):
    return {(e.source.split(":", 1)[1], e.target.split(":", 1)[1], e.label) for e in g.edges if e.kind == "result"}


@settings(max_examples=int(os.environ.get("LINEAGE_EXAMPLES", 40)), deadline=None, suppress_health_check=list(HealthCheck))
@given(stores(), st.booleans())
def test_the_columnar_joins_answer_as_a_walk_over_every_record(case, through_index):
    plan, clears = case
    with tempfile.TemporaryDirectory() as d:
        s, keys, files_now = build(os.path.join(d, "s"), plan, clears, d)
        if through_index:
            derived.read_columns(s)  # the index is made; the answers come through it
        o = Oracle(s, files_now)
        want_stale = o.stale()
        g = stale(Index(s))
        got = {n.data["key"] for n in g.nodes.values() if n.kind == "entry"}
        assert got == want_stale
        assert all(n.data["reason"] for n in g.nodes.values())
        assert edge_set(g) == {x for x in o.edges() if x[0] in want_stale and x[1] in want_stale}
        for seed in keys[:3]:
            done, edges = o.used_by([seed])
            g = used_by(seed, Index(s))
            assert len(g) == len(done)
            assert {n.data["key"] for n in g.nodes.values()} == done
            assert edge_set(g) == edges
        s.close()


def test_an_entry_whose_input_is_held_only_by_stale_entries_downstream_of_it_is_stale(tmp_path):
    s = casmon.open(str(tmp_path / "s"), create=True)
    D, E, C, B, A = ("00" * 16, "11" * 16, "22" * 16, "33" * 16, "44" * 16)  # in key order, a walk meets D before C
    X, Y = "ab" * 16, "cd" * 16  # two values, each made by two entries
    recs = {
        A: {"fn": "p.a", "v": "a" * 32, "rf": "ee" * 16},  # its code changed since: stale
        B: {"fn": "p.b", "rf": X, "up": {"a": [A]}},
        E: {"fn": "p.e", "rf": Y},
        C: {"fn": "p.c", "rf": Y, "up": {"b": [B]}},  # B is stale; the other maker of X is D, stale too
        D: {"fn": "p.d", "rf": X, "up": {"e": [E], "a": [A]}},
    }
    for i, (k, r) in enumerate(recs.items()):
        s.append(KIND, {**r, "result": os.urandom(16).hex(), "time": 1000.0 + i}, key=Digest(bytes.fromhex(k)))
    s.append(KIND_FN, {"fn": "p.a", "version": "b" * 32, "time": 2000.0}, key=name_digest("p.a"))
    s.flush()
    got = {n.data["key"] for n in stale(s).nodes.values()}
    assert got == {A, B, C, D}


def test_a_big_answer_is_made_only_as_far_as_it_is_shown(tmp_path):
    s = casmon.open(str(tmp_path / "s"), create=True)
    prev = None
    for i in range(300):  # a chain: each entry took the last one's result
        key = Digest.from_raw(os.urandom(16))
        rec = {"fn": "p.step", "result": os.urandom(16).hex(), "time": 1000.0 + i, "rf": os.urandom(16).hex()}
        if prev is not None:
            rec["up"] = {"state": [prev]}
        s.append(KIND, rec, key=key)
        prev = bytes(key).hex()
        first = first if i else prev
    s.flush()
    g = used_by(first, Index(s))
    assert len(g) == 300 and g.pending is not None
    text = g.text(limit=10)
    assert "and 290 more nodes (300 in all" in text
    assert g.pending is not None  # counting and the first rows made no node of the rest
    assert len(g.nodes) == 300 and len(g.edges) == 299
    assert str(g).count("\n") == 300


def test_a_long_chain_is_settled_without_recursion_and_named_from_its_root(tmp_path):
    s = casmon.open(str(tmp_path / "s"), create=True)
    prev = None
    n = 3000
    for i in range(n):
        key = Digest.from_raw(os.urandom(16))
        rec = {"fn": "p.step", "result": os.urandom(16).hex(), "time": 1000.0 + i, "rf": os.urandom(16).hex(),
               "v": "a" * 32 if i == 0 else "b" * 32}
        if prev is not None:
            rec["up"] = {"state": [prev]}
        s.append(KIND, rec, key=key)
        prev = bytes(key).hex()
    s.append(KIND_FN, {"fn": "p.step", "version": "b" * 32, "time": 5000.0}, key=name_digest("p.step"))
    s.flush()
    g = stale(Index(s))
    assert len(g) == n
    last = g.nodes["entry:" + prev]
    assert last.data["reason"].endswith("which is stale (the code of p.step changed since it was stored: its "
                                        "version differs)")


def test_rows_of_keys_not_in_the_columns_are_none():
    from casmon.lineage.columns import Columns

    c = Columns.from_records({"ab" * 16: {"fn": "f", "time": 1.0}, "cd" * 16: {"fn": "f", "time": 2.0}})
    got = c.rows_of(np.array([bytes.fromhex("ab" * 16), bytes(16), b"\xff" * 16, bytes.fromhex("cd" * 16)], "S16"))
    assert got.tolist() == [0, -1, -1, 1]
    assert c.row("not hex") == -1 and c.row("AB" * 16) == -1


def _runs_store(path, n=3):
    import numpy as np

    @casmon.cache(store=path)
    def make(i):
        return np.arange(50.0) + i

    @casmon.cache(store=path)
    def use(a):
        return a * 2

    for i in range(n):
        with casmon.record(store=path, capture_output=False):
            use(make(i))
    return casmon.open(path)


def _answers(s):
    g = stale(Index(s))
    u = used_by("make", Index(s))
    return sorted(u.nodes), sorted((e.source, e.target, e.kind, e.label) for e in u.edges), sorted(g.nodes)


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_the_runs_links_are_kept_by_manifest_and_read_no_manifest_again(tmp_path, monkeypatch):
    from casmon.lineage import index

    s = _runs_store(str(tmp_path / "s"))
    want = _answers(s)
    assert any(n.startswith("run:") for n in want[0])
    assert s.backend.get(derived.LINKS_KEY)  # kept by the first query
    read = []
    monkeypatch.setattr(index, "links_of", lambda run: read.append(run) or [])
    assert _answers(s) == want and not read  # every run's links from the kept file


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_a_damaged_crafted_or_deleted_links_file_is_read_around(tmp_path):
    s = _runs_store(str(tmp_path / "s"))
    want = _answers(s)
    data = bytes(s.backend.get(derived.LINKS_KEY))
    for bad in (data[:-7], data[:40] + b"x" + data[41:], b"", derived.LINKS_MAGIC + b"[1, 2]",
                derived.LINKS_MAGIC + b'{"links": {"ab": [[1, 2, 3]]}}'):
        s.backend.set(derived.LINKS_KEY, bad)
        assert _answers(s) == want
    from casmon.store import metafile

    # crafted with a valid checksum, of the wrong shape: not used
    s.backend.set(derived.LINKS_KEY, derived.LINKS_MAGIC + metafile.seal({"links": {"x": "y"}}))
    assert _answers(s) == want
    s.backend.delete(derived.LINKS_KEY)
    assert _answers(s) == want


def test_keys_and_fingerprints_sharing_their_leading_bytes_are_told_apart():
    from casmon.lineage.columns import Columns

    same = "ab" * 8
    recs = {same + f"{i:016x}": {"fn": "f", "time": 1.0, "rf": same + f"{i % 3:016x}"} for i in range(10)}
    recs["cd" * 16] = {"fn": "f", "time": 1.0, "rf": "cd" * 16}
    c = Columns.from_records(recs)
    keys = sorted(recs)
    q = np.array([bytes.fromhex(k) for k in keys] + [bytes.fromhex(same + "f" * 16)], "S16")
    assert c.rows_of(q).tolist() == list(range(11)) + [-1]
    which, rows = c.with_rf(np.array([bytes.fromhex(same + f"{1:016x}"), bytes.fromhex("cd" * 16)], "S16"))
    got = sorted(zip(which.tolist(), (keys[r] for r in rows.tolist())))
    assert got == sorted([(0, same + f"{i:016x}") for i in (1, 4, 7)] + [(1, "cd" * 16)])
    one = Columns.from_records({k: r for k, r in recs.items() if k == "cd" * 16 or k.endswith("1")})
    assert one.rows_of(q[[1, 10, 11]]).tolist() == [0, 1, -1]


def test_crafted_cycles_and_self_links_answer_without_raising(tmp_path):
    s = casmon.open(str(tmp_path / "s"), create=True)
    A, B, C = "aa" * 16, "bb" * 16, "cc" * 16
    recs = {A: {"fn": "p.a", "v": "1" * 32, "rf": "ee" * 16, "up": {"x": [B, A]}, "pc": {"y": "ff" * 16}},
            B: {"fn": "p.b", "rf": "ff" * 16, "up": {"x": [A]}, "pc": {"z": "ee" * 16}},
            C: {"fn": "p.c", "rf": "ff" * 16, "pc": {"w": "ff" * 16, "v[0]": "ee" * 16}}}
    for i, (k, r) in enumerate(recs.items()):
        s.append(KIND, {**r, "result": os.urandom(16).hex(), "time": 1000.0 + i}, key=Digest(bytes.fromhex(k)))
    s.append(KIND_FN, {"fn": "p.a", "version": "2" * 32, "time": 2000.0}, key=name_digest("p.a"))
    s.flush()
    g = stale(s)
    assert {n.data["key"] for n in g.nodes.values()} == {A, B, C}
    assert all(n.data["reason"] for n in g.nodes.values())
    u = used_by(A, s)
    assert {n.data["key"] for n in u.nodes.values()} == {A, B, C}
    assert ("entry:" + A, "entry:" + A) not in {(e.source, e.target) for e in u.edges}


def test_crafted_records_that_link_two_entries_to_each_other_are_stale_and_say_so(tmp_path):
    """No real call makes such a pair (an identity link is to an earlier result): nothing grounds them, and the
    reason names the cycle instead of an empty cause."""
    s = casmon.open(str(tmp_path / "s"), create=True)
    A, B = "11" * 16, "22" * 16
    recs = {A: {"fn": "p.a", "rf": "aa" * 16, "up": {"x": [B]}}, B: {"fn": "p.b", "rf": "bb" * 16, "up": {"y": [A]}}}
    for i, (k, r) in enumerate(recs.items()):
        s.append(KIND, {**r, "result": os.urandom(16).hex(), "time": 1000.0 + i}, key=Digest(bytes.fromhex(k)))
    s.flush()
    reasons = {n.data["key"]: n.data["reason"] for n in stale(s).nodes.values()}
    assert set(reasons) == {A, B} and all("a cycle" in r and "()" not in r for r in reasons.values())
