"""Memory-mapped values (casmon/store/mapped.py): ``put(mmap=True)`` lays large incompressible arrays out as one raw
object, ``get(mmap=True)`` maps it read-only and checks its digest; everything else loads as a copy."""

from __future__ import annotations

import mmap
import os
import warnings
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.errors import DamagedObjectError
from casmon.store.codec import FRAME_HEADER
from casmon.store.mapped import MAP_MIN, MapFallbackWarning
from casmon.store.objects import loose_key
from tests.conftest import run_python


def random_array(nbytes: int = 4 << 20, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(nbytes // 8)


def map_of(a: np.ndarray) -> mmap.mmap | None:
    """The mmap an array's memory belongs to, following its bases; None for memory of its own."""
    x = a
    while x is not None:
        if isinstance(x, mmap.mmap):
            return x
        x = x.obj if isinstance(x, memoryview) else getattr(x, "base", None)
    return None


def object_path(store, digest) -> Path:
    """The file of the one object a value's single part is laid out in."""
    (part,) = store.manifest(digest).parts
    assert len(part["c"]) == 1, part
    return store.backend.local_root / loose_key(casmon.Digest(part["c"][0]))


def mapping_of(address: int) -> str | None:
    """The /proc/self/maps line of the mapping holding ``address`` (Linux), or None."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return line
    return None


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


def test_a_large_random_array_comes_back_as_a_read_only_map_of_its_one_stored_object(store):
    a = random_array().reshape(512, -1)
    d = store.put(a, mmap=True)
    (part,) = store.manifest(d).parts
    assert part["cb"] == part["n"] == a.nbytes and len(part["c"]) == 1  # one chunk: the whole part
    path = object_path(store, d)
    assert path.stat().st_size == FRAME_HEADER + a.nbytes  # raw: the array's bytes as they are
    b = store.get(d, mmap=True)
    assert type(b) is np.ndarray and b.shape == a.shape and b.dtype == a.dtype and np.array_equal(a, b)
    assert map_of(b) is not None and not b.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        b[0, 0] = 1.0
    with pytest.raises(ValueError):
        b.flags.writeable = True  # the map itself is read-only: this cannot be undone
    line = mapping_of(b.ctypes.data)
    assert line is not None and line.endswith(str(path))  # the memory is the stored file's
    c = store.get(d)  # without mmap: a copy of its own, as always
    assert map_of(c) is None and c.flags.writeable and np.array_equal(a, c)


def test_the_same_array_put_twice_and_inside_a_dict_is_stored_once(store):
    a = random_array(3 << 20, seed=1)
    d1 = store.put(a, mmap=True)
    d2 = store.put(a.copy(), mmap=True)
    d3 = store.put({"weights": a.copy(), "step": 7}, mmap=True)  # a pickle's buffer laid out the same way
    store.flush()
    assert d1 == d2
    big = [p for p in (store.backend.local_root / "objects").rglob("*") if p.is_file() and p.stat().st_size >= a.nbytes]
    assert big == [object_path(store, d1)]
    got = store.get(d3, mmap=True)
    assert got["step"] == 7 and np.array_equal(got["weights"], a) and map_of(got["weights"]) is not None
    assert not got["weights"].flags.writeable


def test_one_damaged_byte_makes_a_mapped_load_raise_and_a_new_put_repairs_it(store):
    a = random_array(2 << 20, seed=2)
    d = store.put(a, mmap=True)
    path = object_path(store, d)
    with open(path, "r+b") as f:
        f.seek(FRAME_HEADER + 123_457)
        byte = f.read(1)
        f.seek(FRAME_HEADER + 123_457)
        f.write(bytes([byte[0] ^ 0x01]))
    with pytest.raises(DamagedObjectError, match="does not match its digest"):
        store.get(d, mmap=True)
    with pytest.raises(DamagedObjectError):
        store.get(d)  # the copying read finds the same damage
    assert store.put(a, mmap=True) == d  # the recompute's put: the damaged object is written again
    assert np.array_equal(store.get(d, mmap=True), a)


def test_a_damaged_header_or_a_truncated_object_raises_damaged(store):
    a = random_array(2 << 20, seed=3)
    d = store.put(a, mmap=True)
    path = object_path(store, d)
    good = path.read_bytes()
    path.write_bytes(good[:-8])
    with pytest.raises(DamagedObjectError, match="truncated"):
        store.get(d, mmap=True)
    path.write_bytes(good[:10] + bytes([good[10] ^ 0xFF]) + good[11:])  # the kind byte
    with pytest.raises(DamagedObjectError):
        store.get(d, mmap=True)


def test_a_map_stays_valid_after_the_store_closes_and_another_process_deletes_the_object(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    a = random_array(4 << 20, seed=4)
    d = s.put(a, mmap=True)
    b = s.get(d, mmap=True)
    path = object_path(s, d)
    s.close()
    run_python("import os, sys; os.remove(sys.argv[1])", str(path))  # what gc's sweep does to it
    assert not path.exists()
    assert np.array_equal(b, a) and float(b.sum()) == float(a.sum())
    assert mapping_of(b.ctypes.data).endswith("(deleted)")  # still the file's inode


def test_a_second_process_maps_what_the_first_stored(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    a = random_array(2 << 20, seed=5)
    d = s.put(a, mmap=True)
    path = object_path(s, d)
    s.close()
    out = run_python(
        "import sys, casmon, numpy as np\n"
        "s = casmon.open(sys.argv[1], create=False)\n"
        "b = s.get(sys.argv[2], mmap=True)\n"
        "line = [l for l in open('/proc/self/maps') if sys.argv[3] in l]\n"
        "print(b.flags.writeable, len(line), repr(float(b.sum())))\n",
        str(tmp_path / "s"), d.hex(), str(path))
    assert out.stdout.split() == ["False", "1", repr(float(a.sum()))]


def test_small_values_compressible_arrays_and_bytes_load_as_copies(store):
    small = random_array(MAP_MIN // 2, seed=6)
    ramp = np.arange(1 << 20, dtype=np.float64)  # 8 MiB that compresses well
    blob = os.urandom(2 << 20)
    ds = store.put(small, mmap=True)
    dr = store.put(ramp, mmap=True)
    db = store.put(blob, mmap=True)
    assert len(store.manifest(dr).parts[0]["c"]) > 1  # chunked and compressed, as without mmap
    for d, want in ((ds, small), (dr, ramp)):
        got = store.get(d, mmap=True)
        assert map_of(got) is None and got.flags.writeable and np.array_equal(got, want)
    assert store.get(db, mmap=True) == blob


def test_an_array_stored_without_mmap_still_loads_with_mmap_as_a_copy(store):
    a = random_array(10 << 20, seed=7)
    d = store.put(a)  # the chunked layout: several raw chunks, one file each
    assert len(store.manifest(d).parts[0]["c"]) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = store.get(d, mmap=True)
    assert map_of(b) is None and np.array_equal(a, b)


OLD_PUT = r"""
import sys, numpy as np, casmon
s = casmon.open(sys.argv[1])
print(s.put(np.random.default_rng(8).random(1 << 20)).hex())
s.close()
"""


def test_an_array_an_older_casmon_stored_loads_with_mmap(tmp_path, old_casmon):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(old_casmon))
    p = subprocess.run([sys.executable, "-c", OLD_PUT, str(tmp_path / "s")], capture_output=True, text=True, env=env,
                       cwd=str(old_casmon), timeout=300)
    assert p.returncode == 0, p.stderr
    with casmon.open(tmp_path / "s") as s:
        b = s.get(p.stdout.strip(), mmap=True)
    assert np.array_equal(b, np.random.default_rng(8).random(1 << 20))


@pytest.mark.parametrize("where", ["memory", "s3"])
def test_a_store_with_no_files_loads_copies_and_warns_once(where, request, tmp_path):
    if where == "s3":
        _env, bucket = request.getfixturevalue("s3_env")
        loc = f"s3://{bucket}/mapped"
    else:
        loc = "memory://mapped-fallback"
    s = casmon.open(loc, autoflush=None)
    try:
        a, b = random_array(2 << 20, seed=9), random_array(2 << 20, seed=10)
        da, db = s.put(a, mmap=True), s.put(b, mmap=True)
        s.flush()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            got = [s.get(da, mmap=True), s.get(db, mmap=True), s.get(da, mmap=True)]
        notes = [w for w in seen if issubclass(w.category, MapFallbackWarning)]
        assert len(notes) == 1 and "not a local folder" in str(notes[0].message)
        assert all(map_of(g) is None and g.flags.writeable for g in got)
        assert np.array_equal(got[0], a) and np.array_equal(got[1], b)
    finally:
        s.close()


def test_an_untrusted_store_maps_arrays_too(tmp_path):
    with casmon.open(tmp_path / "s") as s:
        a = random_array(2 << 20, seed=11)
        d = s.put(a, mmap=True)
    with casmon.open(tmp_path / "s", trust=False) as s:
        b = s.get(d, mmap=True)
    assert map_of(b) is not None and np.array_equal(a, b)


def test_a_torch_tensor_shares_the_mapped_memory_copy_on_write(store):
    torch = pytest.importorskip("torch")
    t = torch.randn(512, 1024)  # 2 MiB of float32
    d = store.put(t, mmap=True)
    path = object_path(store, d)
    u = store.get(d, mmap=True)
    assert type(u) is torch.Tensor and u.dtype == t.dtype and torch.equal(u, t)
    line = mapping_of(u.data_ptr())
    assert line is not None and line.endswith(str(path))  # the tensor's memory is the stored file
    before = path.read_bytes()
    u[0, 0] = 42.0  # torch has no read-only tensors: the map is private, the write stays in this process
    assert u[0, 0].item() == 42.0
    assert path.read_bytes() == before
    assert torch.equal(store.get(d, mmap=True), t)


def test_a_value_laid_out_whole_verifies_and_verify_finds_its_damage(store):
    a = random_array(2 << 20, seed=12)
    d = store.put({"a": a, "b": a[::2].copy()}, mmap=True)
    store.set_ref("keep", d)
    store.flush()
    assert store.verify().ok  # an ordinary one-chunk part to every reader
    path = store.backend.local_root / loose_key(casmon.Digest(store.manifest(d).parts[0]["c"][0]))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x10
    path.write_bytes(bytes(data))
    report = store.verify()
    assert not report.ok and [k for k, _ in report.damaged] == [loose_key(casmon.Digest(store.manifest(d).parts[0]["c"][0]))]
