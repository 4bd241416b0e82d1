import json
import os
import pickle
import stat
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from hypothesis.extra import numpy as hnp

import casmon
from casmon import Digest
from casmon.errors import DamagedObjectError, MissingObjectError, StoreError, StoreFormatError, UntrustedStoreError
from casmon.store.objects import loose_key
from tests.conftest import ROOT, run_parallel, run_python


def same(a, b):
    if isinstance(a, np.ndarray):
        return (
            isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and _array_equal(a, b)
            and (a.flags.f_contiguous == b.flags.f_contiguous or a.ndim < 2)
        )
    if isinstance(a, dict):
        return type(a) is type(b) and list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return type(a) is type(b) and a == b


def _array_equal(a, b):
    if a.dtype.kind in "fcmM":
        return np.array_equal(a, b, equal_nan=True)
    return np.array_equal(a, b)


VALUES = [
    None, True, 0, -(2**80), 1.5, -0.0, float("inf"), "text", "é\udc80", b"", b"x" * 100, b"y" * 200_000,
    bytearray(b"z" * 70_000), (1, "a"), [1, [2, [3]]], {"a": 1, "b": [1.5, None]}, {1: "int key"}, {"s": {1, 2}},
    np.arange(10), np.float32(2.5), np.array(3.0), np.zeros((0, 5)), np.arange(24).reshape(2, 3, 4),
    np.asfortranarray(np.arange(12.0).reshape(3, 4)), np.array(["ab", "c"]), np.array([1, "x", None], dtype=object),
    np.arange(5).astype("M8[D]"), np.zeros(3, dtype=[("a", "<i4"), ("b", ">f8")]), np.arange(6, dtype=">i2"),
    {"nested": np.random.default_rng(0).random(50_000), "list": [np.arange(3)] * 3},
]


@pytest.mark.parametrize("value", VALUES, ids=lambda v: type(v).__name__)
def test_round_trip(any_store, value):
    d = any_store.put(value)
    assert same(value, any_store.get(d))
    if any_store.kind == "zip":
        any_store.close()  # one writer at a time; readable once closed
    else:
        any_store.flush()
    again = casmon.open(any_store.url, autoflush=None)
    assert same(value, again.get(d))
    assert d in again


def test_put_is_deterministic_and_deduplicates(local_store):
    a = np.random.default_rng(0).random(1_000_000)
    assert local_store.put(a) == local_store.put(a.copy())
    assert local_store.put({"a": 1}) == local_store.put({"a": 1})
    assert local_store.put([1, 2]) != local_store.put((1, 2))


def test_non_contiguous_array(local_store):
    a = np.arange(100.0).reshape(10, 10)[::2, 1::3]
    back = local_store.get(local_store.put(a))
    assert np.array_equal(a, back) and back.flags.c_contiguous


def test_returned_values_are_fresh_copies(local_store):
    a = np.arange(1_000_000.0)
    d = local_store.put(a)
    local_store.flush()
    b = local_store.get(d)
    b[0] = -1
    assert b.flags.writeable
    assert local_store.get(d)[0] == 0.0
    small = local_store.put([1, 2])
    x = local_store.get(small)
    x.append(3)
    assert local_store.get(small) == [1, 2]


def test_large_array_is_chunked_by_rows(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 20)
    a = np.random.default_rng(0).random((4096, 100))  # 800 bytes a row
    m = s.manifest(s.put(a))
    part = m.parts[0]
    assert part["cb"] % part["rb"] == 0 and part["rb"] == 800
    assert len(part["c"]) == -(-a.nbytes // part["cb"])


def test_one_changed_element_adds_one_chunk(tmp_path):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 20)
    a = np.random.default_rng(0).random(2_000_000)
    d1 = s.put(a)
    a[1_234_567] = 0
    d2 = s.put(a)
    c1, c2 = set(s.manifest(d1).chunk_digests()), set(s.manifest(d2).chunk_digests())
    assert len(c2 - c1) == 1


def test_200_puts_of_the_same_array_store_one_copy(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    a = np.random.default_rng(0).random(2 * 1024 * 1024 // 8)
    s.put(a)
    s.flush()
    one = s.stats()["stored_bytes"]
    for _ in range(199):
        s.put(a.copy())
    s.flush()
    assert s.stats()["stored_bytes"] <= one * 1.05


def test_100k_small_records_make_few_files(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    for i in range(100_000):
        s.append("call", {"i": i, "f": "g"})
        if i % 10_000 == 9_999:
            s.flush()
    s.flush()
    files = [p for p in (tmp_path / "s").rglob("*") if p.is_file()]
    assert len(files) <= 100
    assert sum(1 for _ in casmon.open(tmp_path / "s").records("call")) == 100_000


def test_unpicklable_value_names_the_part_and_writes_nothing(local_store):
    local_store.flush()
    before = sorted(p for p in Path(local_store.backend.local_root).rglob("*"))
    with pytest.raises(TypeError, match=r"args\[1\]\['f'\]|value\[1\]\['f'\]: function .*<lambda>"):
        local_store.put((np.arange(1_000_000), {"f": lambda: 1}))
    local_store.flush()
    after = sorted(p for p in Path(local_store.backend.local_root).rglob("*"))
    assert before == after


def test_missing_and_bad_digests(local_store):
    with pytest.raises(MissingObjectError, match="no value"):
        local_store.get(Digest(b"\0" * 16))
    with pytest.raises(ValueError, match="hex"):
        local_store.get("nothex")
    assert Digest(b"\0" * 16) not in local_store
    assert "garbage" not in local_store


def test_damaged_chunk_is_detected_and_named(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    a = np.random.default_rng(0).random(1_000_000)
    d = s.put(a)
    s.flush()
    chunk = next(s.manifest(d).chunk_digests())
    path = tmp_path / "s" / loose_key(chunk)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    fresh = casmon.open(tmp_path / "s")
    with pytest.raises(DamagedObjectError) as e:
        fresh.get(d)
    assert chunk.hex() in str(e.value)


def test_damaged_pack_is_detected(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put({"small": "value", "n": list(range(100))})
    s.flush()
    (pack,) = list((tmp_path / "s" / "packs").iterdir())
    data = bytearray(pack.read_bytes())
    data[-5] ^= 0x01
    pack.write_bytes(bytes(data))
    with pytest.raises(DamagedObjectError, match="packs/"):
        casmon.open(tmp_path / "s").get(d)


def test_handler_registry(local_store):
    class Box:
        def __init__(self, payload: bytes):
            self.payload = payload
            self.lock = threading.Lock()  # unpicklable: only the handler can store it

    class BoxHandler:
        name = "tests.Box"

        def encode(self, box):
            return {"len": len(box.payload)}, [box.payload]

        def decode(self, meta, buffers):
            assert len(buffers[0]) == meta["len"]
            return Box(buffers[0].tobytes())

    casmon.register_handler(Box, BoxHandler())
    try:
        d = local_store.put(Box(b"abc" * 10))
        assert local_store.get(d).payload == b"abc" * 10
        d2 = local_store.put({"inside": [Box(b"xyz")]})  # nested: stored as a value of its own
        assert local_store.get(d2)["inside"][0].payload == b"xyz"
        assert local_store.manifest(d2).children
    finally:
        casmon.unregister_handler(Box)
    assert Box not in casmon.store.serialize.handlers()
    assert np.ndarray in casmon.store.serialize.handlers()


def test_an_object_with_a_name_encode_and_decode_is_a_handler_and_one_lacking_any_is_not():
    """``isinstance(h, casmon.Handler)`` checks the protocol's members, as a runtime-checkable protocol does."""

    class Full:
        name = "tests.full"

        def encode(self, value):
            return None

        def decode(self, meta, buffers):
            return None

    class Sub(casmon.Handler):  # subclassing it, as users of a protocol may
        name = "tests.sub"

        def encode(self, value):
            return None

        def decode(self, meta, buffers):
            return None

    assert isinstance(Full(), casmon.Handler) and isinstance(Sub(), casmon.Handler)
    assert isinstance(casmon.store.serialize.ArrayHandler(), casmon.Handler)
    for lacking in ("name", "encode", "decode"):
        attrs = {k: v for k, v in vars(Full).items() if k != lacking}
        assert not isinstance(type("Partial", (), attrs)(), casmon.Handler), lacking
    assert not isinstance(object(), casmon.Handler)


def test_numpy_imported_after_casmon_still_stores_arrays_as_arrays_and_a_users_handler_wins(tmp_path):
    """casmon registers its array handler when it first sees numpy imported, not when it is imported."""
    from tests.support.processes import run_code

    r = run_code(f"""
        import sys
        import casmon
        s = casmon.open({str(tmp_path / "s")!r})
        assert s.get(s.put({{"a": 1}})) == {{"a": 1}} and "numpy" not in sys.modules
        import numpy as np
        a = np.arange(300_000, dtype="<i4").reshape(1000, 300)[:, ::2]  # strided: stored as an array, not pickled
        d = s.put({{"x": a}})
        m = s.manifest(s.manifest(d).children[0])
        assert m.tag == "array", m.tag
        assert np.array_equal(s.get(d)["x"], a)
        assert np.ndarray in casmon.handlers

        class Mine:
            name = "mine.arrays"
            def encode(self, v):
                return {{"n": len(v)}}, [v.tobytes()]
            def decode(self, meta, bufs):
                return ("mine", meta["n"])
        casmon.register_handler(np.ndarray, Mine())
        assert s.get(s.put(np.arange(5))) == ("mine", 5)
        casmon.unregister_handler(np.ndarray)
        d = s.put(np.arange(7))
        assert s.manifest(d).tag == "pickle" and list(s.get(d)) == list(range(7))
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_values_are_keyed_and_stored_while_numpy_is_half_imported_in_the_same_thread(tmp_path):
    """Code that runs inside numpy's own import (an import hook, a .pth file, a module numpy's import pulls in)
    sees a numpy module without ``ndarray`` yet: keys and saves of plain values still work, and arrays are
    handled as arrays once the import has finished."""
    from tests.support.processes import run_code

    r = run_code(f"""
        import sys, types
        import casmon
        s = casmon.open({str(tmp_path / "s")!r})
        sys.modules["numpy"] = types.ModuleType("numpy")  # what the importing thread sees half-way
        d = s.put({{"a": 1}})
        assert s.get(d) == {{"a": 1}}
        ns = types.SimpleNamespace(a=1.5)
        assert casmon.fingerprint(ns) == casmon.fingerprint(types.SimpleNamespace(a=1.5))
        del sys.modules["numpy"]
        import numpy as np
        a = np.arange(300_000, dtype="<i4")
        assert s.manifest(s.put(a)).tag == "array"
        assert casmon.fingerprint(a) != casmon.fingerprint(a.astype("<i8"))
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned > pwned.txt",))


def test_trust_false_refuses_pickles_that_could_run_code(tmp_path):
    import fractions

    s = casmon.open(tmp_path / "s")
    d_set = s.put({"obj": {1, 2}, "t": (1, "a")})
    da = s.put(np.arange(5))
    dj = s.put({"a": [1, 2.5, None]})
    d_frac = s.put(fractions.Fraction(1, 3))
    d_evil = s.put([Evil()])
    d_nested_array = s.put({"a": np.arange(100_000)})
    s.close()
    safe = casmon.open(tmp_path / "s", trust=False)
    assert np.array_equal(safe.get(da), np.arange(5))
    assert safe.get(dj) == {"a": [1, 2.5, None]}
    assert safe.get(d_set) == {"obj": {1, 2}, "t": (1, "a")}  # names no global: cannot run code
    for d, needs in [(d_frac, "fractions.Fraction"), (d_evil, "system"), (d_nested_array, "numpy")]:
        with pytest.raises(UntrustedStoreError, match=f"trust=False") as e:
            safe.get(d)
        assert needs in str(e.value) and d.hex() in str(e.value)
    assert not (tmp_path / "pwned.txt").exists()
    assert not Path("pwned.txt").exists()


def test_newer_format_is_refused(tmp_path):
    casmon.open(tmp_path / "s").close()
    (tmp_path / "s" / "casmon.json").write_text('{"format": 99}')
    with pytest.raises(StoreFormatError, match="format 99"):
        casmon.open(tmp_path / "s")


def test_bad_locations(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(StoreError, match="is a file"):
        casmon.open(f)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("x")
    with pytest.raises(StoreFormatError, match="not a casmon store"):
        casmon.open(foreign)
    with pytest.raises(TypeError):
        casmon.open(42)
    with pytest.raises(StoreError, match="cannot create store folder"):
        casmon.open(f / "below-a-file")


def test_a_store_another_process_is_creating_opens(tmp_path):
    """CI found this: four processes logging to one new folder at once; one of them saw the first's
    ``casmon.json.<uuid>.partial`` beside no ``casmon.json``, called the folder "not a casmon store"
    and lost its first calls. A creator is held with its marker written but not yet linked into place."""
    loc, points = tmp_path / "s", tmp_path / "points"
    points.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_FAULTPOINTS=f"local.partial_written@1=pause:{points}")
    code = "import sys, casmon; s = casmon.open(sys.argv[1]); s.set_ref('first', s.put('a')); s.close()"
    creator = subprocess.Popen([sys.executable, "-c", code, str(loc)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (points / "local.partial_written.reached").exists():
            assert creator.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert [p.name.endswith(".partial") for p in loc.iterdir() if p.is_file()] == [True]
        with pytest.raises(StoreError, match="empty"):  # a reader does not take the creator's file for a store
            casmon.open(loc, create=False)
        s = casmon.open(loc)  # a second writer meanwhile
        s.set_ref("second", s.put("b"))
        s.close()
        (points / "local.partial_written.go").touch()
        assert creator.wait(60) == 0
    finally:
        creator.kill()
    s = casmon.open(loc, create=False)
    assert (s.get(s.get_ref("first").target), s.get(s.get_ref("second").target)) == ("a", "b")
    assert s.verify().ok
    assert not list(loc.glob("*.partial"))


def test_a_crashed_creators_partial_marker_is_no_store(tmp_path):
    loc = tmp_path / "s"
    loc.mkdir()
    (loc / "casmon.json.0123456789abcdef0123456789abcdef.partial").write_text("{")
    with pytest.raises(StoreError, match="empty"):
        casmon.open(loc, create=False)
    s = casmon.open(loc)
    s.put("x")
    s.close()
    assert casmon.open(loc, create=False).verify().ok


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores folder permissions")
def test_unwritable_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(StoreError, match="permission denied|cannot"):
            casmon.open(ro / "store")
    finally:
        ro.chmod(0o755)


def test_read_only_store_refuses_writes(tmp_path):
    casmon.open(tmp_path / "s").close()
    ro = casmon.open(tmp_path / "s", read_only=True)
    with pytest.raises(StoreError, match="read-only"):
        ro.put(1)


def test_records_and_refs(any_store):
    d = any_store.put("payload")
    k = any_store.append("call", {"n": 1}, refs=[d])
    any_store.append("call", {"n": 2})
    key = Digest(b"k" * 16)
    any_store.append("things", {"v": 1}, key=key)
    assert [r["n"] for _, r in sorted(any_store.records("call"), key=lambda kr: kr[1]["n"])] == [1, 2]
    any_store.flush()
    assert any_store.lookup("things", key) == [{"v": 1}]
    assert any_store.lookup("call", k)[0]["_refs"] == [d.hex()]
    assert any_store.create_ref("runs/1", d, {"who": "a"})
    assert not any_store.create_ref("runs/1", d, {"who": "b"})
    assert any_store.get_ref("runs/1").data == {"who": "a"}
    if any_store.kind != "zip":
        any_store.set_ref("latest", d)
        assert any_store.get_ref("latest").target == d
    assert "runs/1" in any_store.refs()
    with pytest.raises(ValueError):
        any_store.set_ref("../escape", d)
    with pytest.raises(ValueError):
        any_store.append("Bad Kind", {})
    with pytest.raises(TypeError, match="JSON"):
        any_store.append("call", {"x": object()})


def test_records_from_many_processes_merge(tmp_path):
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    code = (
        "import casmon, sys\n"
        "s = casmon.open(sys.argv[1], autoflush=None)\n"
        "w = int(sys.argv[2])\n"
        "for i in range(3000):\n"
        "    d = s.put(('value', w, i % 50))\n"
        "    s.append('call', {'w': w, 'i': i}, refs=[d])\n"
        "    if i % 500 == 0: s.flush()\n"
        "s.close()\n"
    )
    run_parallel([["-c", code, loc, str(w)] for w in range(4)])
    s = casmon.open(loc)
    recs = [r for _, r in s.records("call")]
    assert len(recs) == 12_000
    assert sorted((r["w"], r["i"]) for r in recs) == [(w, i) for w in range(4) for i in range(3000)]
    assert s.verify().ok


def test_forked_child_is_a_new_writer(tmp_path):
    code = (
        "import casmon, os, sys\n"
        "s = casmon.open(sys.argv[1], autoflush=None)\n"
        "s.append('call', {'who': 'parent-before-fork'})\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    s.append('call', {'who': 'child'})\n"
        "    s.flush()\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "s.close()\n"
    )
    run_python(code, str(tmp_path / "s"))
    whos = sorted(r["who"] for _, r in casmon.open(tmp_path / "s").records("call"))
    assert whos == ["child", "parent-before-fork"]


def test_flush_failure_keeps_records_for_the_next_flush(local_store, monkeypatch):
    local_store.append("call", {"n": 1})
    d = local_store.put({"small": 1})
    real = local_store.backend.create

    def failing(key, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(local_store.backend, "create", failing)
    with pytest.raises(StoreError, match="No space left"):
        local_store.flush()
    monkeypatch.setattr(local_store.backend, "create", real)
    local_store.flush()
    fresh = casmon.open(local_store.url)
    assert [r for _, r in fresh.records("call")] == [{"n": 1}]
    assert fresh.get(d) == {"small": 1}
    assert fresh.verify().ok


arrays = hnp.arrays(
    dtype=st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(), hnp.unicode_string_dtypes()),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6),
)
values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary() | arrays,
    lambda c: st.lists(c, max_size=4) | st.tuples(c, c) | st.dictionaries(st.text(max_size=5), c, max_size=4),
    max_leaves=12,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(v=values)
def test_round_trip_property(local_store, v):
    back = local_store.get(local_store.put(v))
    expected = pickle.loads(pickle.dumps(v, protocol=5))  # pickle itself drops e.g. '>M8' byte order
    assert pickle.dumps(back, protocol=5) == pickle.dumps(expected, protocol=5) or same(expected, back) or same(v, back)


def test_threads_write_one_store(local_store):
    errors = []
    digests = {}

    def work(t):
        try:
            for i in range(300):
                v = {"t": t, "i": i, "a": np.full(100, i)}
                d = local_store.put(v)
                digests[(t, i)] = d
                local_store.append("call", {"t": t, "i": i}, refs=[d])
                if i % 100 == 0:
                    local_store.flush()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(6)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    local_store.flush()
    fresh = casmon.open(local_store.url)
    recs = sorted((r["t"], r["i"]) for _, r in fresh.records("call"))
    assert recs == [(t, i) for t in range(6) for i in range(300)]
    for (t, i), d in list(digests.items())[::50]:
        back = fresh.get(d)
        assert back["t"] == t and np.array_equal(back["a"], np.full(100, i))
    assert fresh.verify().ok


def test_round_trip_recursive_deep_and_huge(local_store):
    rec = [1, "x"]
    rec.append(rec)
    back = local_store.get(local_store.put(rec))
    assert back[0] == 1 and back[2] is back
    deep = current = []
    for _ in range(150):
        nxt = []
        current.append(nxt)
        current = nxt
    back = local_store.get(local_store.put(deep))
    depth = 0
    while back:
        back = back[0]
        depth += 1
    assert depth == 150
    too_deep = current = []
    for _ in range(100_000):
        nxt = []
        current.append(nxt)
        current = nxt
    with pytest.raises(TypeError, match="nested too deeply"):
        local_store.put(too_deep)
    huge = "é" * 5_000_000
    assert local_store.get(local_store.put(huge)) == huge
    assert casmon.fingerprint(huge) == casmon.fingerprint("é" * 5_000_000)


# -- waiting values across a fork and a flush in another thread ----------------------------------------------

@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_check_its_parents_waiting_values(tmp_path):
    """A child forked while a thread logged calls inherited the set of values named by
    the parent's records waiting for the parent's flush, checked them at its own flush, found them
    not stored yet (the parent writes them) and warned that N values 'were removed (by gc, or lost to
    damage)' -- a false alarm in every child forked between a parent's call and its flush."""
    import warnings

    s = casmon.open(tmp_path / "s", autoflush=None)
    s.put(0)
    s.flush()
    d = s.put([1, 2, 3])
    s.append("note", {"n": 1}, key=b"k" * 16, refs=[d])  # waits for the parent's flush
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: flush (nothing of its own) and report warnings
        code = 1
        try:
            os.close(r)
            with warnings.catch_warnings(record=True) as got:
                warnings.simplefilter("always")
                s.flush()
            os.write(w, json.dumps([str(x.message) for x in got]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        msgs = json.loads(f.read() or b"null")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert msgs == [], msgs
    s.flush()  # the parent writes its record and value
    assert casmon.open(tmp_path / "s").lookup("note", b"k" * 16) == [{"n": 1, "_refs": [d.hex()]}]


def test_get_during_a_flush_in_another_thread(tmp_path, monkeypatch):
    """Older than the kept descriptors: ``ObjectStore.flush`` emptied ``_pending`` before the pack was
    written and indexed, so another thread's ``get`` of a value put a moment ago raised MissingObjectError
    while the pack write was under way; with threads calling a cached function while one flushed, the
    cache turned it into a false "cached result ... is damaged or missing" CacheWarning. What a flush has
    taken now stays readable until it is indexed."""
    s = casmon.open(tmp_path / "s")
    d = s.put(b"hello world")
    real = s.backend.create

    def slow(key, data):
        if key.startswith("packs/"):
            time.sleep(0.4)
        return real(key, data)

    monkeypatch.setattr(s.backend, "create", slow)
    t = threading.Thread(target=s.flush)
    t.start()
    time.sleep(0.15)
    try:
        got = s.get(d)
    finally:
        t.join()
    assert got == b"hello world"


def test_a_value_in_a_truncated_pack_is_stored_again_when_it_is_put_again(tmp_path):
    """A pack cut short reads as damaged; putting the value again (a cached result recomputed) stores a good copy
    that later readers find, as it does for a pack whose bytes are damaged: no process recomputes it again."""
    s = casmon.open(tmp_path / "s")
    value = {"i": 19, "pad": os.urandom(1500).hex()}  # does not compress below the cut
    d = s.put(value)
    s.close()
    (pack,) = (tmp_path / "s" / "packs").iterdir()
    pack.write_bytes(pack.read_bytes()[:1000])
    s = casmon.open(tmp_path / "s")
    with pytest.raises(casmon.DamagedObjectError):
        s.get(d)
    assert s.put(value) == d
    s.close()
    assert casmon.open(tmp_path / "s").get(d) == value


def test_the_values_of_a_truncated_pack_are_stored_again_whole_when_put_again(tmp_path):
    """An array whose manifest and chunk both lie past a pack's cut: the first read finds the manifest cut short,
    and putting the value again stores every part of it that pack held, so one recompute heals it."""
    import numpy as np

    s = casmon.open(tmp_path / "s")
    a = np.random.default_rng(0).random(3000)  # a packed chunk and a packed manifest
    d = s.put(a)
    s.close()
    (pack,) = (tmp_path / "s" / "packs").iterdir()
    with open(pack, "r+b") as f:
        f.truncate(100)
    s = casmon.open(tmp_path / "s")
    with pytest.raises(casmon.DamagedObjectError):
        s.get(d)
    assert s.put(a) == d
    s.close()
    assert np.array_equal(casmon.open(tmp_path / "s").get(d), a)


@pytest.mark.parametrize("opts", [{"codec": c, "array_codec": c} for c in ("none", "blosc-lz4", "zstd", "lz4", "blosc-zstd")],
                         ids=lambda o: o["codec"])
def test_every_codec_a_store_can_be_opened_with_reads_its_values_back(tmp_path, opts):
    """Chunks of every size class (a short last chunk, one over the lz4 package's 1 MiB) through every codec, by
    get and by a cached call: a hit, never a false report of damage and a recompute."""
    s = casmon.open(tmp_path / "s", chunk_size=1 << 16, **opts)
    rng = np.random.default_rng(7)
    values = [np.arange((1 << 20) // 8 + 1000, dtype=np.int64) % 7, rng.random(3000),
              b"hello world " * 200_000, {"list": list(range(50_000)), "a": np.arange(70_000) % 3}]
    for v in values:
        assert same(v, s.get(s.put(v)))
    big = casmon.open(tmp_path / "big", chunk_size=4 << 20, **opts)  # chunks over 1 MiB decode through numcodecs
    v = np.arange((6 << 20) // 8 + 5, dtype=np.int64) % 5
    assert same(v, big.get(big.put(v)))
    calls = []

    @casmon.cache(store=s)
    def f(k):
        calls.append(k)
        return np.arange((1 << 20) // 8 + 1000, dtype=np.int64) % 7 + k

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(3):
            assert same(f(1), np.arange((1 << 20) // 8 + 1000, dtype=np.int64) % 7 + 1)
            s.flush()
    assert calls == [1]


@pytest.mark.parametrize("option, value, message", [
    ("trust", "false", "trust must be True or False"),
    ("read_only", "no", "read_only must be True or False"),
    ("create", "no", "create must be True or False"),
    ("durable", "yes", "durable must be True or False"),
    ("chunk_size", "1MiB", "chunk_size must be a whole number of bytes"),
    ("chunk_size", None, "chunk_size must be a whole number of bytes"),
    ("array_codec", 3, "array_codec: unknown codec 3"),
    ("codec", "gzip", "codec: unknown codec 'gzip'"),
    ("autoflush", -1, "autoflush must be a number of seconds over 0, or None"),
    ("autoflush", 0, "autoflush must be a number of seconds over 0, or None"),
    ("autoflush", float("nan"), "autoflush must be a number of seconds over 0, or None"),
    ("autoflush", float("inf"), "autoflush must be a number of seconds over 0, or None"),
    ("autoflush", 1e308, "autoflush must be a number of seconds over 0, or None"),  # a wait that overflows the clock
    ("autoflush", "5", "autoflush must be a number of seconds over 0, or None"),
    ("storage_options", {"key": "x"}, "storage_options apply to remote stores"),
])
def test_open_refuses_an_option_of_the_wrong_kind_naming_it_and_creating_nothing(tmp_path, option, value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        casmon.open(tmp_path / "s", **{option: value})
    assert not (tmp_path / "s").exists()


def test_a_zip_store_has_one_handle_for_writing_in_a_process(tmp_path):
    """A zip archive is appended to by one writer, and its entries are readable only once it is closed: a second
    handle on it (``casmon.open(p)`` beside ``@cache(store=p)``) would lose what the first wrote, so it is refused,
    naming the reason, and allowed once the first is closed."""
    p = tmp_path / "s.zip"
    casmon.open(p).close()
    a = casmon.open(p)
    da = a.put(b"A" * 5000)
    for read_only in (False, True):
        with pytest.raises(StoreError, match="already open for writing in this process"):
            casmon.open(p, read_only=read_only)
    a.close()
    b = casmon.open(p)
    db = b.put(b"B" * 5000)
    b.close()
    r = casmon.open(p, read_only=True)
    assert r.get(da) == b"A" * 5000 and r.get(db) == b"B" * 5000
    assert r.verify().ok
    r2 = casmon.open(p, read_only=True)  # readers of a closed zip are many
    assert r2.get(db) == b"B" * 5000


def test_verify_of_a_store_with_writes_not_yet_flushed_checks_them_and_finds_nothing_damaged(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)

    @casmon.cache(store=s)
    def f(x):
        return [x] * 10

    for i in range(5):
        f(i)
    report = s.verify()
    assert report.ok, report
    assert casmon.open(tmp_path / "s", read_only=True).verify().ok


def test_a_store_holding_its_derived_indexes_opens_when_its_marker_is_damaged(tmp_path):
    """The runs index and the lineage index are part of a store's layout: with them beside a damaged marker the
    store still opens (with a warning), as it does without them."""
    import warnings

    from casmon.errors import StoreDamageWarning

    root = tmp_path / "s"
    s = casmon.open(root)

    @casmon.cache(store=s)
    def stage(x):
        return list(range(x, x + 40))

    with casmon.record(store=s, capture_output=False, system_metrics=False):
        stage(stage(1)[0] + 1)
    casmon.list_runs(s)  # writes runs-index/
    casmon.used_by("stage", s)  # writes derived/
    s.close()
    assert {"runs-index", "derived"} <= {p.name for p in root.iterdir()}
    (root / "casmon.json").write_bytes(b"{damaged")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = casmon.open(root, read_only=True)
    assert any(issubclass(w.category, StoreDamageWarning) for w in caught)
    assert casmon.list_runs(again)[0].status == "ok"
    again.close()
