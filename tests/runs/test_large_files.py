"""Large file artifacts: kept in content-defined pieces, streamed in and out, checked, shared across runs."""

import time
import tracemalloc

import numpy as np
import pytest

import casmon
from casmon.errors import DamagedObjectError
from casmon.runs import sharing
from casmon.runs.artifacts import read_artifacts
from casmon.runs.pieces import PIECED_MIN
from casmon.store.objects import loose_key

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def _data(n, seed=1):
    return np.random.default_rng(seed).bytes(n)


def _objects_bytes(store, run_name, name):
    r = casmon.load_run(run_name, store)
    a = read_artifacts(store, r.ref)[name]
    return sharing.object_sizes(store, sharing.needed(store, a))


def test_a_large_file_and_one_in_a_folder_read_back_whole_from_their_pieces(store, tmp_path):
    big = _data(3 * PIECED_MIN + 12345)
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "big.bin").write_bytes(big)
    (tmp_path / "d" / "sub" / "big.bin").write_bytes(big[::-1])
    (tmp_path / "d" / "small.txt").write_bytes(b"hi")
    (tmp_path / "edge.bin").write_bytes(big[:PIECED_MIN])  # exactly the size pieces start at
    with casmon.record(store=store, capture_output=False) as run:
        a = run.save_file(tmp_path / "big.bin")
        run.save_file(tmp_path / "d")
        run.save_file(tmp_path / "edge.bin")
    assert len(a.refs) > 5  # the piece list and its pieces, all held by the record
    r = casmon.load_run("latest", store)
    assert r.load("big.bin") == big and r.load("edge.bin") == big[:PIECED_MIN]
    out = r.load_file("d", tmp_path / "out")
    assert (out / "sub" / "big.bin").read_bytes() == big[::-1] and (out / "small.txt").read_bytes() == b"hi"
    assert r.load_file("big.bin", tmp_path / "copy.bin").read_bytes() == big
    sizes = {x["name"]: x["size"] for x in r.artifacts()}
    assert sizes == {"big.bin": len(big), "d": len(big) + 2, "edge.bin": PIECED_MIN}


def test_a_file_with_bytes_inserted_near_its_start_stored_again_adds_little(store, tmp_path):
    data = _data(48 << 20, seed=5)
    f = tmp_path / "model.bin"
    f.write_bytes(data)
    with casmon.record(store=store, capture_output=False, comment="a") as run:
        run.save_file(f)
    f.write_bytes(data[: 1 << 20] + _data(1024, seed=6) + data[1 << 20:])
    with casmon.record(store=store, capture_output=False, comment="b") as run:
        run.save_file(f)
    first = _objects_bytes(store, "1-a", "model.bin")
    second = _objects_bytes(store, "2-b", "model.bin")
    added = sum(n for d, n in second.items() if d not in first)
    assert added <= 2 << 20, added
    (b,) = casmon.load_run("2-b", store).artifacts()
    assert b["shared"] == sum(second.values()) - added and b["stored"] == sum(second.values())


def test_a_damaged_piece_is_a_damage_error_and_leaves_no_partial_file(store, tmp_path):
    data = _data(2 * PIECED_MIN, seed=7)
    (tmp_path / "f.bin").write_bytes(data)
    with casmon.record(store=store, capture_output=False) as run:
        a = run.save_file(tmp_path / "f.bin")
    piece = a.refs[3]
    chunk = next(store.manifest(piece).chunk_digests())
    p = tmp_path / "s" / loose_key(chunk)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    p.write_bytes(bytes(raw))
    store.objects.clear_caches()
    r = casmon.load_run("latest", store)
    with pytest.raises(DamagedObjectError):
        r.load("f.bin")
    with pytest.raises(DamagedObjectError):
        r.load_file("f.bin", tmp_path / "out" / "f.bin")
    assert not list((tmp_path / "out").iterdir())


def test_a_crafted_piece_list_is_a_damage_error(store, tmp_path):
    from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key

    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
        ref = run.ref
    small = store.put(b"abc")
    for listing in ({"casmon_pieces": 1, "size": 5, "pieces": [[small.hex(), 3]]},
                    {"casmon_pieces": 1, "size": 4, "pieces": [[small.hex(), 4]]},
                    {"casmon_pieces": 1, "size": 3, "pieces": [["zz", 3]]},
                    {"casmon_pieces": 2, "size": 3, "pieces": [[small.hex(), 3]]}):
        d = store.put(listing)
        store.append(KIND_ARTIFACT, {"run": ref, "name": "f", "kind": "file", "digest": d.hex(), "size": 3,
                                     "time": time.time() + 100, "seq": 0}, key=artifacts_key(ref), refs=[d, small])
        store.flush()
        with pytest.raises(DamagedObjectError):
            casmon.load_run("latest", store).load("f")


def test_saving_a_large_file_streams_it(store, tmp_path):
    data = _data(64 << 20, seed=8)
    (tmp_path / "f.bin").write_bytes(data)
    del data
    with casmon.record(store=store, capture_output=False) as run:
        run.save("warm", np.arange(10))  # the run's own start is not the save's
        tracemalloc.start()
        try:
            run.save_file(tmp_path / "f.bin")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert peak < 32 << 20, peak  # a 64 MiB file: never held whole (about 23 MiB for any size)


def test_shared_counts_what_another_run_holds_not_what_the_run_itself_repeats(store, tmp_path):
    shared = _data(1 << 20, seed=9)
    with casmon.record(store=store, capture_output=False, comment="a") as a:
        a.save("common", shared)
        a.save("mine", _data(1 << 20, seed=10))
        a.save("mine-again", _data(1 << 20, seed=10))  # equal to "mine": one copy, but this run's only
    with casmon.record(store=store, capture_output=False, comment="b") as b:
        b.save("common", shared)
    got = {x["name"]: x for x in casmon.load_run("1-a", store).artifacts()}
    assert got["common"]["shared"] == got["common"]["stored"] > 1 << 20
    assert got["mine"]["shared"] == 0 == got["mine-again"]["shared"]
    casmon.delete_run("2-b", store=store)
    got = {x["name"]: x for x in casmon.load_run("1-a", store).artifacts()}
    assert got["common"]["shared"] == 0


def test_deleting_a_run_frees_exactly_what_no_other_run_shares(store, tmp_path, min_grace):
    min_grace(0.2)
    data = _data(3 * PIECED_MIN, seed=11)
    f = tmp_path / "w.bin"
    f.write_bytes(data)
    with casmon.record(store=store, capture_output=False, comment="a") as a:
        a.save_file(f)
        a.save("own", _data(300_000, seed=12))
        a.save("common", np.arange(50_000))
        a.save("pinned", np.arange(70_000.0))
    store.set_ref("pin", store.put(np.arange(70_000.0)))  # a ref shares it
    f.write_bytes(data[:PIECED_MIN] + b"edit" + data[PIECED_MIN:])
    with casmon.record(store=store, capture_output=False, comment="b") as b:
        b.save_file(f)
        b.save("common", np.arange(50_000))
    ref = casmon.load_run("1-a", store).ref
    own = set().union(*(sharing.needed(store, x) for x in read_artifacts(store, ref).values()))
    elsewhere = sharing.held_elsewhere(store, ref)
    kept, freed = own & elsewhere, own - elsewhere
    assert kept and freed and store.get_ref("pin").target in kept
    casmon.delete_run("1-a", store=store)
    store.gc(grace=0.2)
    time.sleep(0.3)
    store.gc(grace=0.2)
    store.objects.clear_caches()
    assert {d for d in own if d in store} == kept
    assert casmon.load_run("2-b", store).load("w.bin") == f.read_bytes()
    rep = store.verify()
    assert rep.ok, (rep.damaged, rep.missing)


def test_a_value_saved_with_mmap_loads_back_mapped_and_equal(store):
    w = np.random.default_rng(13).standard_normal(300_000).astype(np.float32)
    with casmon.record(store=store, capture_output=False) as run:
        run.save("w", {"layer": w}, mmap=True)
    r = casmon.load_run("latest", store)
    got = r.load("w", mmap=True)["layer"]
    np.testing.assert_array_equal(got, w)
    assert not got.flags.writeable and not got.flags.owndata  # a map of the stored bytes, not a copy
    np.testing.assert_array_equal(r.load("w")["layer"], w)


def test_a_large_bytes_value_is_kept_in_pieces_that_its_next_version_shares(store, tmp_path):
    data = _data(3 * PIECED_MIN, seed=14)
    edited = data[:100] + b"inserted" + data[100:]
    with casmon.record(store=store, capture_output=False, comment="a") as run:
        a = run.save("blob", data)
        run.checkpoint(edited, step=1)
        run.save("small", data[:1000])
        run.save("array", bytearray(data))  # not bytes: stored as it is, comes back a bytearray
    assert a.pieced and len(a.refs) > 3
    r = casmon.load_run("latest", store)
    assert r.load("blob") == data and r.checkpoint() == edited and r.checkpoint(1) == edited
    assert r.load("small") == data[:1000] and r.load("array") == bytearray(data)
    assert type(r.load("array")) is bytearray
    assert r.load_file("blob", tmp_path / "blob.bin").read_bytes() == data
    blob, ckpt = (read_artifacts(store, r.ref)[n] for n in ("blob", "checkpoint/1"))
    shared = set(blob.refs) & set(ckpt.refs)
    assert len(shared) >= len(blob.refs) - 3  # all but the pieces around the insertion, and the piece lists


def test_a_read_error_midway_is_raised(store):
    import errno
    import io

    from casmon.runs.pieces import put_stream

    class Failing(io.RawIOBase):
        def __init__(self):
            self.left = 3

        def readable(self):
            return True

        def readinto(self, b):
            if self.left == 0:
                raise OSError(errno.EIO, "Input/output error")
            self.left -= 1
            b[:] = _data(len(b), seed=self.left)
            return len(b)

    with pytest.raises(OSError, match="Input/output error"):
        put_stream(store, io.BufferedReader(Failing(), buffer_size=PIECED_MIN))


def test_a_store_error_midway_is_raised_and_the_next_save_works(store, tmp_path, monkeypatch):
    from casmon.errors import StoreError

    f = tmp_path / "f.bin"
    f.write_bytes(_data(6 * PIECED_MIN, seed=15))
    real, n = store.put, [0]

    def failing_put(v, *a, **k):
        n[0] += 1
        if n[0] == 3:
            raise StoreError("disk full")
        return real(v, *a, **k)

    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
        monkeypatch.setattr(store, "put", failing_put)
        with pytest.raises(StoreError, match="disk full"):
            run.save_file(f)
        monkeypatch.setattr(store, "put", real)
        run.save_file(f)  # and the next save works
    assert casmon.load_run("latest", store).load("f.bin") == f.read_bytes()


@pytest.mark.parametrize("pieced", [False, True])
def test_a_file_whose_record_says_another_size_is_a_damage_error_and_writes_nothing(store, tmp_path, pieced):
    from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key

    src = tmp_path / "f.bin"
    src.write_bytes(_data(PIECED_MIN + 10) if pieced else b"abc" * 10)
    with casmon.record(store=store, capture_output=False) as run:
        a = run.save_file(src, name="f")
        ref = run.ref
    store.append(KIND_ARTIFACT, {"run": ref, "name": "f", "kind": "file", "digest": a.digest, "size": 7,
                                 "time": time.time() + 100, "seq": 0}, key=artifacts_key(ref), refs=list(a.refs))
    store.flush()
    r = casmon.load_run("latest", store)
    with pytest.raises(DamagedObjectError):
        r.load("f")
    with pytest.raises(DamagedObjectError):
        r.load_file("f", tmp_path / "out.bin")
    assert not (tmp_path / "out.bin").exists() and not list(tmp_path.glob("*.casmon-partial"))


SAVER = """
import sys, casmon
s = casmon.open(sys.argv[1])
with casmon.record(store=s, capture_output=False, comment="killed") as run:
    run.save("before", 1)
    run.save_file(sys.argv[2], name="big")
"""


@pytest.mark.parametrize("point", ["pieces.after_piece@3", "pieces.after_listing"])
def test_a_save_of_a_large_file_killed_midway_names_no_half_written_file(tmp_path, point, min_grace):
    import os
    import subprocess
    import sys

    from tests.support.processes import ROOT

    min_grace(0.3)
    path = tmp_path / "s"
    casmon.open(path, create=True).close()
    src = tmp_path / "big.bin"
    src.write_bytes(_data(PIECED_MIN * 3, seed=5))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CASMON_FAULTPOINTS": f"{point}=kill", "CASMON_MIN_GRACE": "0.3"}
    p = subprocess.run([sys.executable, "-c", SAVER, str(path), str(src)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    s = casmon.open(path)
    try:
        r = casmon.load_run("1-killed", s)
        assert set(read_artifacts(s, r.ref)) == {"before"} and r.load("before") == 1
        time.sleep(0.4)
        assert s.gc(grace=0.3).condemned >= 2  # what the killed save put: its pieces (and list)
        with casmon.record(store=s, capture_output=False) as run:  # the same pieces again, while condemned
            run.save_file(src, name="big")
        for _ in range(2):  # the condemned lists are swept: the pieces the new save needs stay
            time.sleep(0.4)
            s.gc(grace=0.3)
        assert r.load("before") == 1 and casmon.load_run("latest", s).load("big") == src.read_bytes()
        assert s.verify().ok
    finally:
        s.close()


def test_artifacts_walk_the_store_for_shares_only_when_asked(store, monkeypatch):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("w", np.arange(100))
    walks = []
    real = sharing.held_elsewhere
    monkeypatch.setattr(sharing, "held_elsewhere", lambda *a, **k: walks.append(1) or real(*a, **k))
    r = casmon.load_run("latest", store)
    (a,) = r.artifacts(shared=False)
    assert walks == [] and a["shared"] is None and a["stored"] > 0
    (a,) = r.artifacts()
    assert walks == [1] and a["shared"] == 0


def test_loading_a_large_file_back_streams_it(store, tmp_path):
    (tmp_path / "f.bin").write_bytes(_data(64 << 20, seed=4))
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(tmp_path / "f.bin")
    r = casmon.load_run("latest", store)
    tracemalloc.start()
    try:
        r.load_file("f.bin", tmp_path / "out.bin")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, peak
    assert (tmp_path / "out.bin").read_bytes() == (tmp_path / "f.bin").read_bytes()
