"""``@casmon.cache(mmap=True)``: hits return large array results as read-only maps of the stored bytes (checked,
deduplicated); damage recomputes with a warning; stores with no files, and entries stored without mmap, load copies."""

from __future__ import annotations

import mmap
import pickle
import warnings

import numpy as np
import pytest

import casmon
from casmon.caching import CacheWarning
from casmon.store.codec import FRAME_HEADER
from casmon.store.mapped import MapFallbackWarning
from casmon.store.objects import loose_key
from tests.conftest import run_python


def map_of(a: np.ndarray) -> mmap.mmap | None:
    x = a
    while x is not None:
        if isinstance(x, mmap.mmap):
            return x
        x = x.obj if isinstance(x, memoryview) else getattr(x, "base", None)
    return None


def result_file(store, fn, *args):
    (part,) = store.manifest(fn.ref(*args).digest).parts
    return store.backend.local_root / loose_key(casmon.Digest(part["c"][0]))


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


def test_a_hit_returns_a_read_only_map_equal_to_the_computed_result(store):
    calls = []

    @casmon.cache(store=store, mmap=True)
    def noise(seed, n):
        calls.append(seed)
        return np.random.default_rng(seed).random(n)

    first = noise(1, 1 << 19)
    hit = noise(1, 1 << 19)
    assert calls == [1]
    assert map_of(first) is None and first.flags.writeable  # the computed result itself
    assert map_of(hit) is not None and not hit.flags.writeable and np.array_equal(hit, first)
    with pytest.raises(ValueError, match="read-only"):
        hit[0] = 0.0
    ref = noise.ref(1, 1 << 19)
    assert map_of(ref.load(mmap=True)) is not None and map_of(ref.load()) is None


def test_equal_results_of_two_calls_are_stored_once(store):
    @casmon.cache(store=store, mmap=True)
    def same(i):
        return np.random.default_rng(0).random(1 << 19)

    a, b = same(1), same(2)
    store.flush()
    assert np.array_equal(a, b)
    assert same.ref(1).digest == same.ref(2).digest
    n = a.nbytes
    big = [p for p in (store.backend.local_root / "objects").rglob("*") if p.is_file() and p.stat().st_size >= n]
    assert big == [result_file(store, same, 1)]


def test_a_damaged_result_warns_and_is_recomputed_then_maps_again(store):
    calls = []

    @casmon.cache(store=store, mmap=True)
    def noise(seed):
        calls.append(seed)
        return np.random.default_rng(seed).random(1 << 19)

    want = noise(3)
    path = result_file(store, noise, 3)
    data = bytearray(path.read_bytes())
    data[FRAME_HEADER + 1000] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.warns(CacheWarning, match="damaged or missing; recomputing"):
        again = noise(3)
    assert calls == [3, 3] and np.array_equal(again, want)
    hit = noise(3)  # the recompute stored the object again: a map of good bytes
    assert calls == [3, 3] and map_of(hit) is not None and np.array_equal(hit, want)


def test_a_second_process_hits_the_map_of_what_the_first_computed(tmp_path):
    code = (
        "import sys, mmap, numpy as np, casmon\n"
        "calls = []\n"
        "@casmon.cache(store=sys.argv[1], mmap=True, version='1')\n"
        "def noise(seed):\n"
        "    calls.append(seed)\n"
        "    return np.random.default_rng(seed).random(1 << 19)\n"
        "a = noise(4)\n"
        "x = a\n"
        "while x is not None and not isinstance(x, mmap.mmap):\n"
        "    x = x.obj if isinstance(x, memoryview) else getattr(x, 'base', None)\n"
        "print(len(calls), x is not None, a.flags.writeable, repr(float(a.sum())))\n"
    )
    first = run_python(code, str(tmp_path / "s")).stdout.split()
    second = run_python(code, str(tmp_path / "s")).stdout.split()
    assert first[:3] == ["1", "False", "True"]  # computed: the result itself
    assert second == ["0", "True", "False", first[3]]  # a hit: the map, read-only, equal


def test_an_entry_stored_without_mmap_hits_as_a_copy(store):
    calls = []

    def noise(seed):
        calls.append(seed)
        return np.random.default_rng(seed).random(1 << 20)

    plain = casmon.cache(store=store, version="1")(noise)
    mapped = casmon.cache(store=store, version="1", mmap=True)(noise)
    want = plain(5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = mapped(5)
    assert calls == [5] and map_of(got) is None and np.array_equal(got, want)


def plain_noise(seed):
    return np.random.default_rng(seed).random(1 << 19)


def test_the_option_survives_pickling_the_cached_function(store):
    noise = casmon.cache(store=store, mmap=True)(plain_noise)
    noise(6)
    store.flush()
    again = pickle.loads(pickle.dumps(noise))  # rebuilt from its options, as in a worker process
    assert again is not noise and again.__casmon_cache__.mmap
    assert map_of(again(6)) is not None


def test_a_torch_result_hits_as_a_tensor_over_the_map(store):
    torch = pytest.importorskip("torch")

    @casmon.cache(store=store, mmap=True)
    def weights(seed):
        return torch.randn(1024, 512, generator=torch.Generator().manual_seed(seed))

    want = weights(7)
    path = str(result_file(store, weights, 7))
    hit = weights(7)
    assert type(hit) is torch.Tensor and torch.equal(hit, want)
    ptr = hit.data_ptr()
    lines = [ln for ln in open("/proc/self/maps") if ln.rstrip().endswith(path)]
    spans = [tuple(int(x, 16) for x in ln.split()[0].split("-")) for ln in lines]
    assert any(lo <= ptr < hi for lo, hi in spans)  # the tensor's memory is the stored file's


def test_on_s3_hits_load_copies_with_one_warning(s3_env):
    _env, bucket = s3_env
    s = casmon.open(f"s3://{bucket}/cache", autoflush=None)
    try:
        @casmon.cache(store=s, mmap=True)
        def noise(seed):
            return np.random.default_rng(seed).random(1 << 18)

        want = [noise(1), noise(2)]
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = [noise(1), noise(2), noise(1)]
        notes = [w for w in seen if issubclass(w.category, MapFallbackWarning)]
        assert len(notes) == 1 and notes[0].filename == __file__, notes[0].filename  # the user's line
        assert all(map_of(g) is None and g.flags.writeable for g in got)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    finally:
        s.close()
