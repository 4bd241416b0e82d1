"""Large values at the memory floor (issue 14): raw storage of incompressible chunks, the chunk
pool, reads straight into the result, arrays inside objects (stores written before all that:
tests/store/test_format_upgrade.py)."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.store import codec
from casmon.store.codec import FRAME_HEADER, read_header
from casmon.store.objects import loose_key
from tests.support.processes import run_code_in
from tests.support.stores import loose_headers

#: The last commit before issue 14 changed how chunks are written (raw storage, the chunk pool).
MiB = 1 << 20


def stored_bytes(store_path: Path) -> int:
    return sum(p.stat().st_size for sub in ("objects", "packs") for p in (store_path / sub).rglob("*") if p.is_file())


@dataclasses.dataclass
class Holder:
    x: np.ndarray
    label: str


# -- raw storage of incompressible data, compression of the rest -------------------------------------------


def test_random_floats_are_stored_raw_and_read_back_exactly(tmp_path):
    a = np.random.default_rng(0).random(3 * MiB // 8 * 4)  # 12 MiB: three 4 MiB chunks
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(a)
    s.flush()
    heads = loose_headers(tmp_path / "s")
    assert len(heads) == 3 and all(h.codec == 0 and h.raw_len == h.stored_len for h in heads)
    b = casmon.open(tmp_path / "s").get(d)
    assert b.dtype == a.dtype and b.shape == a.shape and b.tobytes() == a.tobytes()
    assert b.flags.writeable and not np.shares_memory(a, b)


def test_compressible_data_keeps_its_space_win(tmp_path):
    a = np.random.default_rng(1).integers(0, 1000, 12 * MiB // 8).astype(np.float64)
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(a)
    s.close()
    heads = loose_headers(tmp_path / "s")
    assert heads and all(h.codec == 1 for h in heads)  # blosc-lz4
    assert stored_bytes(tmp_path / "s") < a.nbytes / 2
    assert np.array_equal(casmon.open(tmp_path / "s").get(d), a)


def test_probe_reads_samples_from_the_whole_chunk():
    blosc = codec.CODECS["blosc-lz4"]
    rng = np.random.default_rng(2)
    noise = rng.random(MiB // 8).view(np.uint8)
    zeros = np.zeros(MiB, np.uint8)
    assert not codec.worth_compressing(memoryview(noise), blosc, 8)
    assert codec.worth_compressing(memoryview(zeros), blosc, 8)
    half = np.concatenate([noise[: MiB // 2], zeros[: MiB // 2]])  # the second half compresses: samples see it
    assert codec.worth_compressing(memoryview(half), blosc, 8)
    # A small chunk is always compressed (no probe); a frame that does not shrink is stored raw anyway.
    small = rng.integers(0, 256, 64 << 10, dtype=np.uint8)  # random bytes: nothing to gain
    assert codec.worth_compressing(memoryview(small), blosc, 1)
    frame = codec.encode_frame(small, codec.KIND_CHUNK, blosc, 1)[1]
    assert read_header(frame, "x").codec == 0


def test_table_files_are_not_probed():
    """Only chunks are probed: tables and manifests keep the codec they ask for whenever it shrinks them."""
    rng = np.random.default_rng(3)
    payload = np.concatenate([rng.random(64 << 10).view(np.uint8)[: 400 << 10], np.zeros(100 << 10, np.uint8)])
    frame = codec.encode_frame(payload, codec.KIND_TABLE, codec.CODECS["zstd"])[1]
    assert read_header(frame, "x").codec == 2


# -- damage is still caught on the direct read path ------------------------------------------------------------


@pytest.mark.parametrize("how", ["flip", "truncate", "extend", "swap"])
def test_damaged_raw_chunk_is_caught_when_read_into_place(tmp_path, how):
    a = np.random.default_rng(4).random(2 * MiB)  # 16 MiB: four raw chunks
    b = np.random.default_rng(5).random(2 * MiB)
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(a)
    other = s.put(b)
    s.close()
    victim = next(iter(s.manifest(d).chunk_digests()))
    path = tmp_path / "s" / loose_key(victim)
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[FRAME_HEADER + 12345] ^= 0x10
    elif how == "truncate":
        del data[-1000:]
    elif how == "extend":
        data += b"\0" * 8
    else:  # a whole, sound frame of another chunk under this name
        data = bytearray((tmp_path / "s" / loose_key(next(iter(s.manifest(other).chunk_digests())))).read_bytes())
    path.write_bytes(bytes(data))
    r = casmon.open(tmp_path / "s")
    with pytest.raises(casmon.DamagedObjectError, match=victim.hex()[:8]):
        r.get(d)
    assert np.array_equal(r.get(other), b)  # the other value is untouched
    # Putting the value again writes a good copy over the damaged chunk (self-healing on recompute).
    r.put(a)
    r.flush()
    assert casmon.open(tmp_path / "s").get(d).tobytes() == a.tobytes()


def test_missing_raw_chunk_is_a_missing_object(tmp_path):
    a = np.random.default_rng(6).random(MiB)
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(a)
    s.close()
    victim = next(iter(s.manifest(d).chunk_digests()))
    (tmp_path / "s" / loose_key(victim)).unlink()
    with pytest.raises(casmon.MissingObjectError, match=victim.hex()):
        casmon.open(tmp_path / "s").get(d)


def test_memory_store_takes_the_pooled_path_without_files():
    s = casmon.open("memory://large-values", autoflush=None)
    a = np.random.default_rng(7).random(3 * MiB)
    c = np.arange(3 * MiB, dtype=np.int64)
    da, dc = s.put(a), s.put(c)
    s.flush()
    assert s.get(da).tobytes() == a.tobytes() and np.array_equal(s.get(dc), c)


# -- arrays inside objects ----------------------------------------------------------------------------------


@pytest.mark.parametrize("wrap", ["dict", "list", "tuple", "dataclass"])
def test_arrays_inside_objects_compress_like_bare_arrays(tmp_path, wrap):
    a = np.random.default_rng(8).integers(0, 1000, 8 * MiB // 8).astype(np.float64)
    value = {"dict": {"x": a}, "list": [a, "label"], "tuple": (a, 3), "dataclass": Holder(a, "label")}[wrap]
    bare = casmon.open(tmp_path / "bare", autoflush=None)
    bare.put(a)
    bare.close()
    s = casmon.open(tmp_path / "nested", autoflush=None)
    d = s.put(value)
    s.close()
    assert stored_bytes(tmp_path / "nested") <= 1.05 * stored_bytes(tmp_path / "bare")
    back = casmon.open(tmp_path / "nested").get(d)
    inner = {"dict": lambda v: v["x"], "list": lambda v: v[0], "tuple": lambda v: v[0], "dataclass": lambda v: v.x}[wrap](back)
    assert inner.dtype == a.dtype and np.array_equal(inner, a)


def test_nested_arrays_of_mixed_dtypes_and_orders_round_trip(tmp_path):
    rng = np.random.default_rng(9)
    value = {
        "f32": rng.random(100_000).astype(np.float32),
        "i16": rng.integers(-5, 5, (300, 200)).astype(np.int16),
        "fortran": np.asfortranarray(rng.random((400, 300))),
        "complex": (rng.random(50_000) + 1j).astype(np.complex128),
        "rec": np.zeros(30_000, dtype=[("a", "i4"), ("b", "f8")]),  # 12-byte items: no shuffle
        "strided": rng.random((600, 600))[::2, ::3],
    }
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(value)
    s.close()
    back = casmon.open(tmp_path / "s").get(d)
    for k, v in value.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and back[k].tobytes() == v.tobytes(), k
    assert back["fortran"].flags.f_contiguous


# -- near-identical values stay distinct and exact --------------------------------------------------------------

_store_cache: dict = {}


def _hstore(tmp_path_factory):
    if "s" not in _store_cache:
        _store_cache["s"] = casmon.open(tmp_path_factory.mktemp("hyp") / "s", autoflush=None, chunk_size=256 << 10)
    return _store_cache["s"]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(min_value=1, max_value=200_000),
    where=st.floats(min_value=0, max_value=1, exclude_max=True),
    kind=st.sampled_from(["element", "dtype", "shape", "negzero", "nan_payload", "nested"]),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_near_identical_values_get_distinct_digests_and_exact_round_trips(tmp_path_factory, n, where, kind, seed):
    s = _hstore(tmp_path_factory)
    a = np.random.default_rng(seed).random(n)
    i = int(where * n)
    if kind == "element":
        b = a.copy()
        b[i] = np.nextafter(b[i], 2.0)
    elif kind == "dtype":
        b = a.view(np.int64)
    elif kind == "shape":
        if n < 2 or n % 2:
            a = np.append(a, 0.5) if n % 2 else np.append(a, [0.5, 0.25])
        b = a.reshape(2, -1)
    elif kind == "negzero":
        a[i] = 0.0
        b = a.copy()
        b[i] = -0.0
    elif kind == "nan_payload":
        a[i] = np.nan
        b = a.copy()
        b.view(np.uint64)[i] ^= np.uint64(1)  # another NaN, another bit pattern (numpy 1.x: not a Python int)
    else:
        b = {"x": a.copy(), "y": 1}
        b["x"][i] = np.nextafter(a[i], -1.0)
        a = {"x": a, "y": 1}
    da, db = s.put(a), s.put(b)
    assert da != db
    for v, d in ((a, da), (b, db)):
        back = s.get(d)
        if isinstance(v, dict):
            assert back["y"] == 1
            v, back = v["x"], back["x"]
        assert back.dtype == v.dtype and back.shape == v.shape and back.tobytes() == v.tobytes()


# -- the chunk pool at exit and after fork -----------------------------------------------------------------------


class _ShutDownPool:
    """A pool as it is once the interpreter exits: it refuses new work."""

    def submit(self, *a, **k):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")


@pytest.mark.parametrize("pool", ["none", "shut down"])
def test_large_values_without_the_chunk_pool(tmp_path, monkeypatch, pool):
    """No pool (threads refused at exit) or a pool that refuses work: the caller's thread does it all."""
    from casmon.store import chunkio

    monkeypatch.setattr(chunkio, "chunk_pool", (lambda: None) if pool == "none" else (lambda: _ShutDownPool()))
    a = np.random.default_rng(12).random(2 * MiB)
    c = np.arange(2 * MiB, dtype=np.int64)
    s = casmon.open(tmp_path / "s", autoflush=None)
    da, dc = s.put(a), s.put(c)
    s.close()
    r = casmon.open(tmp_path / "s")
    assert r.get(da).tobytes() == a.tobytes() and np.array_equal(r.get(dc), c)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_large_put_in_a_forked_child_after_the_parent_used_the_pool(tmp_path):
    code = """
        import os, sys
        import numpy as np
        import casmon
        s = casmon.open(sys.argv[1])
        s.put(np.random.default_rng(1).random(1 << 20))  # the parent's pool is running
        pid = os.fork()
        if pid == 0:
            d = s.put(np.random.default_rng(3).random(1 << 20))
            s.flush()
            open(sys.argv[1] + ".digest", "w").write(d.hex())
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """
    r = run_code_in(code, str(tmp_path / "s"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    d = (tmp_path / "s.digest").read_text()
    assert casmon.open(tmp_path / "s").get(d).tobytes() == np.random.default_rng(3).random(1 << 20).tobytes()


# -- the chunk pool's writes and the compression probe -------------------------------------------------------


def test_a_put_returns_only_after_its_own_chunks_are_written_whatever_other_threads_wait_for(tmp_path):
    """Thread A's large chunks are written on the chunk pool. Before the fix, thread B's put (any put:
    its wait_writes took *every* write in flight off the shared list) made A's wait_writes find
    nothing to wait for, so A's put returned with its chunks still being written: a record could be
    visible before its chunk (I1), and an array changed in place after put returned (what the call
    log's capture promises is allowed) was written under the old digest -- a damaged object."""
    import threading

    from casmon.store.backend import Backend

    store = casmon.open(tmp_path / "s", autoflush=None)
    release = threading.Event()
    a_submitted = threading.Event()
    real_create_frame = Backend.create_frame
    real_put_part = type(store)._put_part

    def slow_create_frame(self, key, header, payload):  # a slow disk: the write waits for the test
        release.wait(60)
        return real_create_frame(self, key, header, payload)

    def put_part(self, part):
        p = real_put_part(self, part)
        if threading.current_thread().name == "A":
            a_submitted.set()
            # Thread B puts a small value now, while A's chunk writes are in flight.
            tb = threading.Thread(target=lambda: store.put({"b": 1}), name="B")
            tb.start()
            while store.objects._inflight and tb.is_alive():
                time.sleep(0.001)  # B has taken the writes in flight (or finished)
        return p

    arr = np.random.default_rng(1).random(1 << 17)  # 1 MiB of random floats: one raw loose chunk
    want = arr.tobytes()
    result: dict = {}

    def a():
        d = store.put(arr)
        result["d"] = d
        result["on_disk_at_return"] = release.is_set()
        arr[:] = 0.0  # the caller may change its array once put returned
        release.set()

    import unittest.mock as um

    with um.patch.object(Backend, "create_frame", slow_create_frame), um.patch.object(type(store), "_put_part", put_part):
        ta = threading.Thread(target=a, name="A")
        ta.start()
        assert a_submitted.wait(60)
        ta.join(2.0)  # a correct put is still waiting for its chunk here (false passes only if slower)
        release.set()
        ta.join(60)
    assert result["on_disk_at_return"], "put returned before its chunk was written"
    store.flush()
    back = casmon.open(tmp_path / "s").get(result["d"])
    assert back.tobytes() == want
    assert casmon.open(tmp_path / "s").verify().ok


def _probe_starts(n: int, ts: int) -> list[int]:
    step = n // codec.PROBE_SLICES
    return [(i * step) - (i * step) % ts for i in range(codec.PROBE_SLICES)]


@pytest.mark.parametrize("fool", ["zeros_where_sampled", "random_where_sampled"])
def test_a_chunk_that_fools_the_probe_still_reads_back_exactly(tmp_path, fool):
    """Bytes compressible in exactly the probe's samples and random elsewhere (the probe says compress;
    compressing the whole saves only the sampled bytes), and the reverse (the probe says raw; the
    chunk is stored raw although it would compress). Either way: exact round trip, a header whose
    lengths are right, and verify clean. Held."""
    n = 4 << 20
    rng = np.random.default_rng(7)
    if fool == "zeros_where_sampled":
        a = rng.integers(0, 256, n, dtype=np.uint8)
        for o in _probe_starts(n, 8):
            a[o : o + codec.PROBE_SLICE] = 0
    else:
        a = np.zeros(n, dtype=np.uint8)
        for o in _probe_starts(n, 8):
            a[o : o + codec.PROBE_SLICE] = rng.integers(0, 256, codec.PROBE_SLICE, dtype=np.uint8)
    arr = a.view(np.float64)
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(arr)
    s.flush()
    heads = [codec.read_header(p.read_bytes()[: codec.FRAME_HEADER], str(p))
             for p in (tmp_path / "s/objects").rglob("*") if p.is_file()]
    assert len(heads) == 1
    h = heads[0]
    assert h.raw_len == n and h.stored_len <= n
    if fool == "random_where_sampled":
        assert h.codec == 0  # the probe saw only random samples
    r = casmon.open(tmp_path / "s")
    back = r.get(d)
    assert back.dtype == arr.dtype and back.tobytes() == arr.tobytes()
    assert r.verify().ok
