"""A large value's chunks: each hashed and written by one job, so no pass over the whole value hashes it before
the writes begin; the stored bytes and digests are what they were."""

from __future__ import annotations

import glob
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import casmon
from casmon.store import objects
from casmon.store.codec import KIND_CHUNK, decode_frame, encode_frame_parts

DEADLINE_S = 20


def test_a_large_values_first_chunk_is_written_before_its_last_chunk_is_hashed(tmp_path, monkeypatch):
    s = casmon.open(tmp_path / "s")
    n = (s.chunk_size * 6) // 8
    a = np.arange(n, dtype=np.float64)  # six distinct chunks
    last_head = a[-(s.chunk_size // 8):][:4].tobytes()
    wrote = threading.Event()
    waited = []
    real_hash = objects._hash

    def hash_(mv):
        if bytes(memoryview(mv)[:32]) == last_head:
            waited.append(wrote.wait(DEADLINE_S))  # the old code hashed every chunk before it wrote one
        return real_hash(mv)

    real_write = s.objects._write_loose

    def write(*args):
        real_write(*args)
        wrote.set()

    monkeypatch.setattr(objects, "_hash", hash_)
    s.objects._write_loose = write
    d = s.put(a)
    assert waited == [True]
    s.flush()
    assert np.array_equal(casmon.open(tmp_path / "s").get(d), a)


# Digests computed by the code before chunks were hashed and written in one job (keys and manifests unchanged).
PINNED = {"tensor": "727f0c9486bd757d4c6f6fcad2c6690d", "rows": "a98018fda5b8b03a7fb0c78d36bd263d",
          "zeros": "6091d761b5b43c4dbdfacc1e57f657c4"}


def _values():
    torch = pytest.importorskip("torch")
    return {"tensor": (torch.arange(9 << 20, dtype=torch.float32) * 0.37).sin(),
            "rows": np.arange(3 << 20, dtype=np.float64).reshape(-1, 3) * 1.5,  # a short last chunk: packed
            "zeros": np.zeros(6 << 20, np.uint8)}


def test_large_values_keep_their_digests_and_each_loose_object_is_its_chunks_frame(tmp_path):
    values = _values()
    for name, v in values.items():
        s = casmon.open(tmp_path / name)
        assert s.put(v).hex() == PINNED[name]
        s.flush()
        flat = np.ascontiguousarray(v.numpy() if hasattr(v, "numpy") else v)
        typesize, raw = flat.dtype.itemsize, flat.reshape(-1).view(np.uint8).tobytes()
        files = glob.glob(os.path.join(tmp_path, name, "objects", "*", "*"))
        assert files and not any(f.endswith(".partial") for f in files)
        with ThreadPoolExecutor(1) as ex:  # framed off the main thread, as the pool frames them
            for f in files:
                data = open(f, "rb").read()
                h, payload = decode_frame(data, f)
                assert h.raw_len >= objects.LOOSE_MIN  # a short last chunk goes to a pack, not a file of its own
                assert bytes(payload) in raw
                _, head, body = ex.submit(encode_frame_parts, bytes(payload), KIND_CHUNK, s.array_codec, typesize,
                                          h.digest).result()
                assert head + bytes(body) == data


def test_a_value_put_again_writes_no_chunk_and_a_damaged_chunk_is_rewritten(tmp_path):
    s = casmon.open(tmp_path / "s")
    a = np.random.default_rng(0).random(s.chunk_size // 8 * 3)
    d = s.put(a)
    s.flush()
    writes = []
    real_write = s.objects._write_loose
    s.objects._write_loose = lambda *args: (writes.append(args[0]), real_write(*args))
    assert s.put(a.copy()) == d
    assert writes == []
    files = sorted(glob.glob(os.path.join(tmp_path, "s", "objects", "*", "*")))
    victim = files[0]
    blob = bytearray(open(victim, "rb").read())
    blob[-1] ^= 0xFF
    open(victim, "wb").write(bytes(blob))
    s2 = casmon.open(tmp_path / "s")
    with pytest.raises(casmon.errors.DamagedObjectError):
        s2.get(d)
    assert s2.put(a) == d  # the chunk found damaged is written again, through put's own path
    s2.flush()
    assert np.array_equal(casmon.open(tmp_path / "s").get(d), a)


def test_a_condemned_chunk_of_a_large_value_is_stored_again_not_relied_on(tmp_path):
    s = casmon.open(tmp_path / "s")
    a = np.random.default_rng(1).random(s.chunk_size // 8 * 3)
    d = s.put(a)
    s.flush()
    chunks = s.manifest(d).parts[0]["c"]
    from casmon.keys.digest import Digest

    s.objects._condemned = {Digest(bytes.fromhex(chunks[1]))}  # as if a gc list this writer sees named it
    before = s.objects.revived
    assert s.put(a.copy()) == d
    assert s.objects.revived == before + 1  # a new copy, through put's own path, not a skip
    s.flush()
    assert s.objects.locate(Digest(bytes.fromhex(chunks[1]))) is not None  # the new copy is packed and indexed


def test_threads_putting_one_large_value_at_once_store_it_once_and_leave_no_partial_files(tmp_path):
    s = casmon.open(tmp_path / "s")
    a = np.random.default_rng(2).random(s.chunk_size // 8 * 4)
    with ThreadPoolExecutor(4) as ex:
        got = list(ex.map(lambda _: s.put(a), range(4)))
    assert len(set(got)) == 1
    s.flush()
    files = glob.glob(os.path.join(tmp_path, "s", "objects", "*", "*"))
    assert len(files) == 4 and not any(f.endswith(".partial") for f in files)
    assert np.array_equal(casmon.open(tmp_path / "s").get(got[0]), a)
