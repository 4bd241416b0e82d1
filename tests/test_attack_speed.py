"""Attacks from outside on the storage core's speed changes (format-2 tables, raw chunks written
with create_frame, reads into place, inline results, flush per pool call, the call-log encoder).

Each test is an attack that either found a defect (the test failed before its fix) or is kept as a
regression guard for a protocol the changes touched."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import xxhash

import casmon
from casmon.store import codec
from casmon.errors import DamagedObjectError

ROOT = Path(__file__).resolve().parent.parent
#: The last commit whose tables were format 1 (as tests/test_table_scale.py).


def _crafted_frame(codec_id: int, body: bytes, raw_len: int, digest: bytes) -> bytes:
    h = codec._HEADER.pack(codec.MAGIC, codec.FRAME_VERSION, codec_id, codec.KIND_CHUNK, 0, raw_len, len(body), digest)
    return h[:7] + bytes([codec._xor(h)]) + h[8:] + body


# -- hostile stores: lengths are checked before anything is allocated -----------------------------------------


def test_a_zstd_payload_cannot_make_a_reader_allocate_what_its_header_claims():
    """A 16 KiB zstd payload whose frame header claims 1 GiB: before the fix decode_body allocated
    the whole gigabyte (bytearray of raw_len, zero-filled) and only then let zstd fail; 256 KiB of
    payload could claim 16 GiB. zstd frames state their content size; it must agree first."""
    import numcodecs

    raw = bytes(16 << 10)
    body = bytes(numcodecs.Zstd(level=1).encode(raw))
    body += bytes(16 << 10)  # padding: the MAX_RATIO bound alone lets 32 KiB claim 2 GiB
    frame = _crafted_frame(2, body, 1 << 30, xxhash.xxh3_128_digest(raw))
    tracemalloc.start()
    try:
        with pytest.raises(DamagedObjectError, match="payload says 16384 bytes"):
            codec.decode_frame(frame, "crafted")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"{peak >> 20} MiB allocated for a crafted 32 KiB frame"
    # A zstd payload that states no content size (casmon never writes one) is damage, not a bound to trust.
    no_size = bytearray(body)
    no_size[4] = 0x00  # frame header descriptor: no content size, no single segment
    with pytest.raises(DamagedObjectError):
        codec.decode_frame(_crafted_frame(2, bytes(no_size), 1 << 30, xxhash.xxh3_128_digest(raw)), "crafted")


@pytest.mark.parametrize("n", [64, 255, 256, 257, 65_535, 65_791, 65_792, 1 << 20, (5 << 20) + 3])
def test_every_zstd_frame_casmon_writes_states_its_size_and_reads_back(n):
    """The content-size check must never refuse a frame casmon wrote (every size class of the field)."""
    rng = np.random.default_rng(n)
    data = (rng.integers(0, 4, n, dtype=np.uint8)).tobytes()
    _, frame = codec.encode_frame(data, codec.KIND_TABLE, codec.get_codec("zstd"))
    assert frame[5] == 2  # compressed with zstd, not stored raw
    assert bytes(codec.decode_frame(frame, "x")[1]) == data


# -- concurrent puts: a put returns only after its own chunks are written -------------------------------------


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


# -- a format-1 store upgraded while a writer running the casmon before format 2 keeps writing -----------------


OLD_APPENDER = r"""
import sys, os, time, hashlib, casmon
root, n = sys.argv[1], int(sys.argv[2])
store = casmon.open(root, autoflush=None)
print("open", flush=True)
while not os.path.exists(root + ".go"):
    time.sleep(0.01)
for i in range(n):
    store.append("x", {"who": "old", "i": i}, key=hashlib.blake2b(b"old%d" % i, digest_size=16).digest())
    if i % 20 == 19:
        store.flush()  # level-0 files, and format-1 merges as they accumulate
store.flush()
store.close()
"""


def test_an_old_writer_already_open_while_a_new_one_upgrades_the_store_loses_nothing(tmp_path, old_casmon):
    """The old casmon opened the store before it was marked format 2, so it keeps writing: it takes
    the new format-2 generations for damage (warnings in its stderr) while both merge. Held: every
    record of both is read exactly once afterwards and verify is clean."""
    root = tmp_path / "store"
    n = 1500
    env = dict(os.environ, PYTHONPATH=str(old_casmon))
    p = subprocess.Popen([sys.executable, "-c", OLD_APPENDER, str(root), str(n)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=str(old_casmon))
    try:
        assert p.stdout.readline().strip() == "open", p.stderr.read()
        assert json.loads((root / "casmon.json").read_text())["format"] == 1
        s = casmon.open(root, autoflush=None)
        Path(str(root) + ".go").touch()
        for i in range(n):
            s.append("x", {"who": "new", "i": i}, key=hashlib.blake2b(b"new%d" % i, digest_size=16).digest())
            if i % 20 == 19:
                s.flush()
        s.flush()
        _, err = p.communicate(timeout=600)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert json.loads((root / "casmon.json").read_text())["format"] == 2
    s.close()
    r = casmon.open(root, read_only=True)
    recs = [(k, v["who"], v["i"]) for k, v in r.records("x")]
    assert max(Counter(recs).values()) == 1
    assert Counter(who for _, who, _ in recs) == {"old": n, "new": n}
    assert r.verify().ok


# -- a value another process just flushed is found, not called damaged ------------------------------------------


def _big(i):
    return np.random.default_rng(i).random(40_000)  # too large to travel inline in its cache entry


_big.__module__ = "__main__"


def test_a_cache_hit_on_an_entry_another_process_just_flushed_is_a_hit_not_damage(tmp_path):
    """Found by a kill campaign (pool-style writers flushing every call beside gc): a process found
    another's fresh cache entry, but its pack index, read less than a second before, did not list the
    result yet and a miss re-reads it at most once a second -- so it warned 'damaged or missing',
    recomputed and wrote the result again. Small results travel inline in the entry and escaped it."""
    import warnings

    root = tmp_path / "s"
    s1 = casmon.open(root, autoflush=None)
    s1.put(1)
    s1.flush()
    s2 = casmon.open(root, autoflush=None)  # the other process
    c1 = casmon.cache(store=s1)(_big)
    c2 = casmon.cache(store=s2)(_big)
    c2(0)
    s2.flush()
    s2.table("cache").last_refresh -= 10  # its cache table was read over a second ago (no sleep)
    s2.objects.index.refresh()  # and its pack index just now, as any read or put does
    c1(1)
    s1.flush()  # the first process's entry for key 1, and its value, are stored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c2(1).tobytes() == _big(1).tobytes()
    assert c2.cache_info().hits == 1 and c2.cache_info().misses == 1


# -- the compression probe fooled both ways ----------------------------------------------------------------------


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


# -- a writer killed inside create_frame -------------------------------------------------------------------------

KILLED_IN_CREATE_FRAME = r"""
import os, signal, sys, numpy as np, casmon
s = casmon.open(sys.argv[1], autoflush=None)
keep = s.put(np.random.default_rng(1).random(1 << 17))
s.set_ref("keep", keep)
s.flush()
print(keep.hex(), flush=True)
real_link = os.link
def link(src, dst, *a, **k):
    if str(src).endswith(".partial") and "objects" in str(src):
        os.kill(os.getpid(), signal.SIGKILL)  # the partial file is written whole, the link never happens
    return real_link(src, dst, *a, **k)
os.link = link
s.put(np.random.default_rng(2).random(1 << 17))
print("not killed", flush=True)
"""


def test_a_writer_killed_inside_create_frame_leaves_only_a_partial_that_nothing_reads(tmp_path):
    """SIGKILL between writing a raw chunk's ``*.partial`` file and linking it into place: the debris
    is never read as data (verify clean, the chunk is absent, not half there), the next put of the
    same chunk writes it whole, and gc removes the debris once older than its grace. Held."""
    root = tmp_path / "s"
    p = subprocess.run([sys.executable, "-c", KILLED_IN_CREATE_FRAME, str(root)], capture_output=True, text=True,
                       timeout=300, cwd=str(ROOT))
    assert p.returncode == -signal.SIGKILL, p.stderr
    keep = p.stdout.split()[0]
    partials = list(root.rglob("*.partial"))
    assert len(partials) == 1 and partials[0].stat().st_size > (1 << 20)
    s = casmon.open(root, autoflush=None)
    assert s.verify().ok
    assert s.get(keep).tobytes() == np.random.default_rng(1).random(1 << 17).tobytes()
    again = np.random.default_rng(2).random(1 << 17)
    d = s.put(again)  # the same chunk again: written whole beside the debris
    s.set_ref("again", d)
    s.flush()
    assert casmon.open(root).get(d).tobytes() == again.tobytes()
    old = time.time() - 7200
    os.utime(partials[0], (old, old))
    rep = s.gc(grace=3600)
    assert rep.partial_files == 1 and not list(root.rglob("*.partial"))
    assert casmon.open(root).verify().ok


# -- a forked child does not inherit its parent's unflushed record values ----------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_does_not_check_its_parents_waiting_values(tmp_path):
    """Found by forking while a thread logged calls: the child inherited the set of values named by
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
