"""How a chunk read through a zarr view reaches zarr (casmon/store/arrayview.py, casmon/store/bufferpool.py): read
into a pooled private buffer and checked there, so a file changed or cut after its check never reaches zarr's
output, and a buffer zarr still holds is never read into again."""

import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
import zarr
from zarr.buffer import default_buffer_prototype

import casmon
from casmon.errors import DamagedObjectError
from casmon.store import arrayview, bufferpool
from casmon.store.codec import FRAME_HEADER
from casmon.store.objects import loose_key
from casmon.store.zarrview import node_name


def _big(s, seed=6, shape=(1024, 512)):
    @casmon.cache(store=s)
    def big():
        return np.random.default_rng(seed).random(shape)  # 4 MiB: four raw chunks of 1 MiB

    a = big()
    s.flush()
    ref = big.ref()
    path = f"cache/{node_name(big.__casmon_cache__.name)}/{ref.key.hex()}"
    return a, ref, path


def test_a_chunk_file_rewritten_in_place_after_its_read_never_reaches_zarrs_output(tmp_path, monkeypatch):
    s = casmon.open(tmp_path / "s", chunk_size=1 << 20)
    a, ref, path = _big(s)
    chunks = list(s.manifest(ref.digest).chunk_digests())
    real = arrayview.ChunkView._read_chunk

    def read_then_rewrite(self, i):
        got = real(self, i)  # what zarr copies into its output next
        with open(tmp_path / "s" / loose_key(chunks[i]), "r+b") as f:  # same file, same size, other bytes
            f.seek(FRAME_HEADER)
            f.write(bytes(b ^ 0xFF for b in f.read(4096)))
        return got

    monkeypatch.setattr(arrayview.ChunkView, "_read_chunk", read_then_rewrite)
    z = zarr.open_group(s.zarr(), mode="r")[path]
    assert np.array_equal(z[:], a)  # the checked bytes, not the file's later ones
    s.objects.clear_caches()
    with pytest.raises(DamagedObjectError):  # read again, the rewritten chunks are damage
        zarr.open_group(s.zarr(), mode="r")[path][:]


_CUT_AFTER_READ = textwrap.dedent("""
    import sys, numpy as np, zarr, casmon
    from casmon.errors import DamagedObjectError
    from casmon.store import arrayview
    from casmon.store.objects import loose_key
    from casmon.store.zarrview import node_name
    root = sys.argv[1]
    s = casmon.open(root, chunk_size=1 << 20)
    @casmon.cache(store=s)
    def big():
        return np.random.default_rng(6).random((1024, 512))
    a = big()
    s.flush()
    ref = big.ref()
    chunks = list(s.manifest(ref.digest).chunk_digests())
    real = arrayview.ChunkView._read_chunk
    def read_then_cut(self, i):
        got = real(self, i)
        with open(root + "/" + loose_key(chunks[i]), "r+b") as f:
            f.truncate(100)
        return got
    arrayview.ChunkView._read_chunk = read_then_cut
    z = zarr.open_group(s.zarr(), mode="r")[f"cache/{node_name(big.__casmon_cache__.name)}/{ref.key.hex()}"]
    try:
        print("equal" if np.array_equal(z[:], a) else "WRONG")
    except DamagedObjectError:
        print("damage")
""")


def test_a_chunk_file_cut_after_its_read_neither_kills_the_reader_nor_reads_wrong(tmp_path):
    # In a child: a chunk handed to zarr as a map of its file kills the process (SIGBUS) when the file is cut.
    done = subprocess.run([sys.executable, "-c", _CUT_AFTER_READ, str(tmp_path / "s")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() in ("equal", "damage"), done.stdout


def test_a_chunk_file_cut_while_it_is_read_raises_damage(tmp_path, monkeypatch):
    from casmon.store import chunkio

    s = casmon.open(tmp_path / "s", chunk_size=1 << 20)
    a, ref, path = _big(s)
    victim = tmp_path / "s" / loose_key(list(s.manifest(ref.digest).chunk_digests())[1])
    real = chunkio._readinto_hashed

    def cut_first(f, mv):
        if f.name == str(victim):
            with open(victim, "r+b") as g:  # after its size was checked, before its bytes are read
                g.truncate(FRAME_HEADER + 1000)
        return real(f, mv)

    monkeypatch.setattr(chunkio, "_readinto_hashed", cut_first)
    z = zarr.open_group(s.zarr(), mode="r")[path]
    assert np.array_equal(z[:256], a[:256])
    with pytest.raises(DamagedObjectError, match="truncated"):
        z[256:512]


_DERIVED = {
    "view-reshape": lambda x: x.view("f8").reshape(-1, 3),
    "slice": lambda x: x[8:],
    "strided": lambda x: x[::2],
    "asarray": np.asarray,
    "memoryview": lambda x: np.frombuffer(memoryview(x), np.uint8),
    "zarr-buffer": lambda x: default_buffer_prototype().buffer.from_array_like(x).as_array_like().view("f8"),
}


@pytest.mark.parametrize("derive", list(_DERIVED))
def test_a_leased_buffer_is_never_leased_again_while_anything_made_from_it_lives(derive):
    n = 3 * 4096 + 24  # a size no other test leases: its free list is this test's alone
    first = bufferpool.lease(n)
    first[:] = 1
    addr = first.__array_interface__["data"][0]
    kept = _DERIVED[derive](first)
    del first  # only what was made from it holds it now
    others = [bufferpool.lease(n) for _ in range(4)]
    for o in others:
        assert not np.shares_memory(kept, o)
        o[:] = 2
    assert (kept.view(np.uint8) == 1).all()
    del kept, others, o
    again = [bufferpool.lease(n) for _ in range(6)]  # all let go: the pool hands that memory out again
    assert addr in {x.__array_interface__["data"][0] for x in again}


def test_the_pool_keeps_at_most_its_bytes_and_leases_fresh_buffers_past_them(monkeypatch):
    monkeypatch.setattr(bufferpool, "POOL_BYTES", bufferpool.pooled_bytes() + 3 * 10_016)
    held = [bufferpool.lease(10_016) for _ in range(8)]
    assert bufferpool.pooled_bytes() <= bufferpool.POOL_BYTES
    assert len({x.__array_interface__["data"][0] for x in held}) == 8  # none shared


def test_threads_reading_one_view_at_once_with_a_small_pool_each_get_the_true_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(bufferpool, "POOL_BYTES", bufferpool.pooled_bytes() + (6 << 16))  # most leases reuse
    s = casmon.open(tmp_path / "s", chunk_size=1 << 16)
    a, _ref, path = _big(s, seed=9, shape=(512, 512))  # 32 chunks of 64 KiB, each its own bytes
    z = zarr.open_group(s.zarr(), mode="r")[path]
    wrong: list[str] = []

    def reader(k):
        for j in range(6):
            lo = (k * 37 + j * 61) % 480
            if not np.array_equal(z[lo : lo + 32 + j], a[lo : lo + 32 + j]) or not np.array_equal(z[:], a):
                wrong.append(f"reader {k}, round {j}")

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads) and not wrong


_FORK_WHILE_READING = textwrap.dedent("""
    import os, signal, sys, threading, numpy as np, zarr, casmon
    from casmon.store import bufferpool
    from casmon.store.zarrview import node_name
    s = casmon.open(sys.argv[1], chunk_size=1 << 16)
    @casmon.cache(store=s)
    def big():
        return np.random.default_rng(3).random((256, 512))
    a = big()
    s.flush()
    z = zarr.open_group(s.zarr(), mode="r")[f"cache/{node_name(big.__casmon_cache__.name)}/{big.ref().key.hex()}"]
    z[:1]
    held, release = threading.Barrier(bufferpool.READERS + 2), threading.Event()
    def hold_slot():
        with bufferpool.reading(True):
            held.wait()
            release.wait()
    def hold_lock():
        with bufferpool._lock:  # as a thread leasing a buffer holds it
            held.wait()
            release.wait()
    threads = [threading.Thread(target=hold_slot) for _ in range(bufferpool.READERS)]
    threads.append(threading.Thread(target=hold_lock))
    for t in threads:
        t.start()
    held.wait()  # the fork copies every reader slot and the pool's lock held, by threads the child does not have
    pid = os.fork()
    if pid == 0:
        signal.alarm(120)  # a child that waits on a slot or lock nobody gives back dies instead of hanging
        os._exit(0 if np.array_equal(z[:], a) else 1)
    release.set()
    for t in threads:
        t.join()
    print(os.waitpid(pid, 0)[1])
""")


def test_a_child_forked_while_chunks_are_read_and_leased_reads_through_the_view(tmp_path):
    done = subprocess.run([sys.executable, "-W", "ignore", "-c", _FORK_WHILE_READING, str(tmp_path / "s")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0", done.stdout  # the child's exit status: it read the array, equal
