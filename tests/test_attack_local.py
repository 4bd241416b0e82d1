"""Attacks on the zarr-free local folder backend, kept bucket-file descriptors, format-2 block
lookups (``_Block``, ``decode_table_block``) and the bytes-for-Digest change.

Each test says what it attacks. Three of them failed on the first version of this code (a defect each,
fixed since); the others pin behaviour that held.
"""

import json
import os
import random
import signal
import struct
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.store.backend import KEEP_OPEN, Backend, LocalFolder, open_backend
from casmon.store.codec import KIND_TABLE, decode_frame, encode_frame, get_codec
from casmon.store.table import StoreDamageWarning, Table

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def _run(code: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT), **kw)


def _gen_table(loc, entries, prefix="r/", writer="w1") -> tuple[Backend, Table, str]:
    """A table whose entries are all in one format-2 generation."""
    b = open_backend(loc)
    t = Table(b, prefix, writer)
    for k, v in entries:
        t.add(k, v)
    t.write_l0(t.take_pending())
    gid = t.consolidate(min_l0=1, force=True)
    assert gid is not None and t._active_gens[0].v == 2
    return b, t, gid


def _read_gen(loc, prefix, gid):
    """(json head, lens, bloom, bucket file blobs) of a format-2 generation."""
    mpath = Path(loc) / f"{prefix}gens/{gid}"
    raw = bytes(decode_frame(mpath.read_bytes(), "m")[1])
    cut = raw.index(b"\0")
    head = json.loads(raw[:cut])
    blocks = head["blocks"]
    binary = raw[cut + 1 :]
    lens = list(struct.unpack_from(f"<{blocks}I", binary, 0))
    bloom = binary[4 * blocks :]
    files = [(Path(loc) / f"{prefix}buckets/{gid}/{i:04x}").read_bytes() for i in range(head["nbuckets"])]
    return head, lens, bloom, files


def _write_gen(loc, prefix, gid, head, lens, bloom, files) -> None:
    """Write a generation's manifest and bucket files back, every frame's digest matching (crafted, not damaged)."""
    for i, data in enumerate(files):
        p = Path(loc) / f"{prefix}buckets/{gid}/{i:04x}"
        p.unlink()
        p.write_bytes(data)
    payload = json.dumps(head).encode() + b"\0" + struct.pack(f"<{len(lens)}I", *lens) + bloom
    mpath = Path(loc) / f"{prefix}gens/{gid}"
    mpath.unlink()
    mpath.write_bytes(encode_frame(payload, KIND_TABLE, get_codec("zstd"))[1])


def _rewrite_block(loc, prefix, gid, b, mutate) -> None:
    """Replace block ``b`` of a generation by ``mutate(payload)``, framed as lz4 with a matching digest."""
    head, lens, bloom, files = _read_gen(loc, prefix, gid)
    per = head["blocks"] // head["nbuckets"]
    fi = b // per
    data = files[fi]
    start = sum(lens[fi * per : b])
    frame = data[start : start + lens[b]]
    payload = bytes(decode_frame(frame, "blk")[1])
    new = encode_frame(mutate(payload), KIND_TABLE, get_codec("lz4"))[1]
    files[fi] = data[:start] + new + data[start + lens[b] :]
    lens[b] = len(new)
    _write_gen(loc, prefix, gid, head, lens, bloom, files)


# -- crafted manifests and blocks -------------------------------------------------------------------


def test_crafted_block_length_is_not_allocated_before_reading(tmp_path):
    """A generation manifest whose digest matches but names a 4 GiB block (the u32 maximum) must give a
    StoreDamageWarning and a miss. ``Backend.read_kept`` passed the whole length to ``os.pread``, which
    allocates it before reading: with 2 GiB of address space to spare the lookup raised MemoryError into
    the user's code. A kept file's reads now stop at its size (found by a helper's attack)."""
    loc = tmp_path / "s"
    rng = random.Random(3)
    entries = [(rng.randbytes(16), str(i).encode()) for i in range(3000)]
    _b, t, gid = _gen_table(loc, entries)
    blk = t._active_gens[0].block_of(entries[5][0])
    head, lens, bloom, files = _read_gen(loc, "r/", gid)
    lens[blk] = 0xFFFFFFFF
    _write_gen(loc, "r/", gid, head, lens, bloom, files)
    code = f"""
        import resource, warnings
        from casmon.store.backend import open_backend
        from casmon.store.table import Table
        with open("/proc/self/statm") as f:
            vm = int(f.read().split()[0]) * 4096
        resource.setrlimit(resource.RLIMIT_AS, (vm + (2 << 30), resource.RLIM_INFINITY))
        r = Table(open_backend({str(loc)!r}), "r/", "w2")
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            try:
                print("RESULT", r.lookup({entries[5][0]!r}, refresh_on_miss=False))
            except BaseException as e:
                print("RAISED", type(e).__name__)
        print("WARNED", len(w))
    """
    p = _run(code)
    assert "RAISED" not in p.stdout, p.stdout + p.stderr
    assert "RESULT []" in p.stdout and "WARNED 0" not in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("how", ["count_huge", "count_short", "offset_past_end", "offsets_reversed", "bad_magic",
                                 "empty", "truncated_keys"])
def test_hostile_block_payload_gives_warning_and_miss(tmp_path, how):
    """A block whose frame digest matches but whose key count or offsets are hostile: a lookup of a key
    in it gives StoreDamageWarning and no values of that block, never an exception or a big allocation;
    keys of other blocks are still found."""
    loc = tmp_path / "s"
    rng = random.Random(11)
    entries = [(rng.randbytes(16), str(i).encode()) for i in range(3000)]
    _b, t, gid = _gen_table(loc, entries)
    g = t._active_gens[0]
    target = entries[7][0]
    blk = g.block_of(target)

    def mutate(p: bytes) -> bytes:
        magic, n = struct.unpack_from("<4sI", p, 0)
        offs_at = 8 + 16 * n
        if how == "count_huge":
            return p[:4] + struct.pack("<I", 0xFFFFFFFF) + p[8:]
        if how == "count_short":  # fewer keys claimed: offsets are then read from the keys area
            return p[:4] + struct.pack("<I", n // 2) + p[8:]
        if how == "offset_past_end":
            offs = list(struct.unpack_from(f"<{n + 1}Q", p, offs_at))
            offs = [o + (1 << 62) for o in offs]
            return p[:offs_at] + struct.pack(f"<{n + 1}Q", *offs) + p[offs_at + 8 * (n + 1) :]
        if how == "offsets_reversed":
            offs = list(struct.unpack_from(f"<{n + 1}Q", p, offs_at))[::-1]
            return p[:offs_at] + struct.pack(f"<{n + 1}Q", *offs) + p[offs_at + 8 * (n + 1) :]
        if how == "bad_magic":
            return b"XXXX" + p[4:]
        if how == "empty":
            return b""
        if how == "truncated_keys":
            return p[: 8 + 16 * (n // 2)]
        raise AssertionError(how)

    _rewrite_block(loc, "r/", gid, blk, mutate)
    r = Table(open_backend(loc), "r/", "w2")
    in_block = [(k, v) for k, v in entries if g.block_of(k) == blk]
    other = next((k, v) for k, v in entries if g.block_of(k) != blk)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [r.lookup(k, refresh_on_miss=False) for k, _ in in_block]
        got_other = r.lookup(other[0], refresh_on_miss=False)
    assert got_other == [other[1]]
    for (k, v), vals in zip(in_block, got):
        assert vals in ([], [v]), (k.hex(), vals)  # never another key's value
    if how != "count_short":  # a shorter count may still find some keys with sane offsets
        assert any(issubclass(x.category, StoreDamageWarning) for x in w), [str(x.message) for x in w]
        assert all(vals == [] for vals in got)


def test_block_key_count_cannot_make_huge_lists(tmp_path):
    """A block claiming 2**32-1 keys in a payload of a few KiB: ``_Block`` must reject it from the lengths
    alone (never allocate for the count)."""
    from casmon.store.table import _Block

    from casmon.errors import DamagedObjectError

    raw = b"CTB1" + struct.pack("<I", 0xFFFFFFFF) + bytes(4096)
    with pytest.raises(DamagedObjectError):
        _Block("k", raw)


# -- lookups against a reference, near-identical keys -----------------------------------------------

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _variants(k: bytes) -> list[bytes]:
    out = [k]
    for bit in (0, 7, 8 * 7 + 3, 8 * 15, 8 * 15 + 7, 8 * 8):
        b = bytearray(k)
        b[bit // 8] ^= 1 << (bit % 8)
        out.append(bytes(b))
    out.append(k[:15] + b"\0")
    out.append(k[:12] + bytes(4))
    out.append(k[:8] + bytes(8))
    out.append(k[:8] + bytes(7) + b"\1")
    out.append(k[:4] + bytes(12))  # same block, same bucket
    out.append(bytes(4) + k[4:])  # same bloom hashes, other block
    return out


@settings(max_examples=int(os.environ.get("ATK_EXAMPLES", 25)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 400), split=st.floats(0, 1), dup=st.floats(0, 0.3),
       extra=st.lists(st.binary(min_size=16, max_size=16), max_size=5))
def test_lookups_match_a_reference_with_near_identical_keys(tmp_path_factory, seed, n, split, dup, extra):
    """Every key -- in a format-2 generation (``_Block``'s own binary search, inline bloom probes), in a
    level-0 file (``TableFile.find``'s bisect) or pending (``_index_add``) -- finds exactly its values, with
    keys differing in one bit, ending in zero bytes, or sharing the first 4/8 bytes; other keys miss."""
    rng = random.Random(seed)
    base = [rng.randbytes(16) for _ in range(max(1, n // 8))] + extra
    pool = [v for k in base for v in _variants(k)]
    keys = [rng.choice(pool) for _ in range(n)]
    loc = tmp_path_factory.mktemp("ref") / "s"
    b = open_backend(loc)
    t = Table(b, "r/", "w1")
    ref: dict[bytes, list[bytes]] = {}
    cut1, cut2 = int(n * split), int(n * (1 + split) / 2)
    for i, k in enumerate(keys):
        v = str(i).encode() if rng.random() > dup or k not in ref else ref[k][0]
        t.add(k, v)
        if v not in ref.setdefault(k, []):
            ref[k].append(v)
        if i == cut1:
            t.write_l0(t.take_pending())
            t.consolidate(min_l0=1, force=True)
        elif i == cut2:
            t.write_l0(t.take_pending())
    # t: generation + level-0 + pending; r: a fresh reader of what is written; w: all written and merged
    for tab in (t,):
        for k in pool:
            assert sorted(tab.lookup(k, refresh_on_miss=False)) == sorted(ref.get(k, [])), k.hex()
    t.flush()
    r = Table(open_backend(loc), "r/", "w2")
    for k in pool:
        assert sorted(r.lookup(k, refresh_on_miss=False)) == sorted(ref.get(k, [])), k.hex()
    t.consolidate(min_l0=1, force=True)
    w = Table(open_backend(loc), "r/", "w3")
    assert all(g.v == 2 for g in w._active_gens) if w._active_gens else True
    for k in pool:
        assert sorted(w.lookup(k, refresh_on_miss=False)) == sorted(ref.get(k, [])), k.hex()
        assert sorted(w.lookup_cached(k) or []) in ([], sorted(ref.get(k, [])))


# -- kept descriptors: merges elsewhere, fork, many stores -----------------------------------------


def _merge_in_child(loc: str, n_new: int, seed: int) -> None:
    code = f"""
        import random
        from casmon.store.backend import open_backend
        from casmon.store.table import Table
        rng = random.Random({seed})
        t = Table(open_backend({loc!r}), "r/", "wc")
        for i in range({n_new}):
            t.add(rng.randbytes(16), b"new%d" % i)
        t.write_l0(t.take_pending())
        assert t.consolidate(min_l0=1, force=True)
        t.refresh()
        print(len(t._active_gens))
    """
    p = _run(code)
    assert p.returncode == 0, p.stderr


def test_reader_keeps_reading_right_bytes_after_another_process_merges(tmp_path):
    """A reader holds bucket files open; another process merges the generation away (deleting them) and
    writes a new one whose bucket files reuse the freed inode numbers and names' pattern. The reader's
    lookups (before and after it notices) return exactly the right values, with no damage warning; after
    a refresh it keeps no descriptor of the deleted files."""
    loc = tmp_path / "s"
    rng = random.Random(5)
    entries = [(rng.randbytes(16), str(i).encode()) for i in range(20_000)]
    _b, _t, gid = _gen_table(loc, entries)
    rb = open_backend(loc)
    r = Table(rb, "r/", "w2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k, v in entries[::97]:
            assert r.lookup(k, refresh_on_miss=False) == [v]
        assert any(gid in k for k in rb._kept)
        _merge_in_child(str(loc), 5000, 1)
        assert not (loc / "r" / "buckets" / gid / "0000").exists()
        for k, v in entries[1::89]:  # still the old view: the deleted files, through kept descriptors
            assert r.lookup(k, refresh_on_miss=False) == [v]
        r.refresh()
        assert not any(gid in k for k in rb._kept)
        for k, v in entries[2::83]:
            assert r.lookup(k, refresh_on_miss=False) == [v]
    fds = {os.readlink(f"/proc/self/fd/{x}") for x in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{x}")}
    assert not any(gid in f for f in fds), "a descriptor of a merged-away file is still open"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_forked_children_read_through_inherited_descriptors(tmp_path):
    """Lookups in forked children (inherited kept descriptors, shared file offsets are irrelevant to
    pread) while the parent goes on looking up: every child and the parent get the right values."""
    loc = tmp_path / "s"
    rng = random.Random(9)
    entries = [(rng.randbytes(16), str(i).encode()) for i in range(30_000)]
    _gen_table(loc, entries)
    r = Table(open_backend(loc), "r/", "w2")
    for k, v in entries[::50]:
        assert r.lookup(k, refresh_on_miss=False) == [v]
    pids = []
    for c in range(3):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            ok = 1
            try:
                for k, v in entries[c::7]:
                    if r.lookup(k, refresh_on_miss=False) != [v]:
                        ok = 0
                        break
                r.backend.forget("")  # a child closing its copies must not disturb the parent
            except BaseException:
                ok = 0
            os._exit(0 if ok else 3)
        pids.append(pid)
    for k, v in entries[3::11]:
        assert r.lookup(k, refresh_on_miss=False) == [v]
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    for k, v in entries[5::13]:
        assert r.lookup(k, refresh_on_miss=False) == [v]


def test_kept_descriptors_are_bounded_and_released(tmp_path):
    """More bucket files than ``KEEP_OPEN``: at most ``KEEP_OPEN`` stay open, and closing the store (or
    dropping it) releases every one."""
    import gc

    loc = tmp_path / "s"
    b = open_backend(loc)
    ts = []
    rng = random.Random(2)
    for j in range(KEEP_OPEN + 10):  # one table (one bucket file) per prefix
        t = Table(b, f"t{j}/", "w1")
        t.add(rng.randbytes(16), b"v")
        t.write_l0(t.take_pending())
        t.consolidate(min_l0=1, force=True)
        ts.append(t)
    base = len(os.listdir("/proc/self/fd"))
    rb = open_backend(loc)
    readers = [Table(rb, f"t{j}/", "w2") for j in range(KEEP_OPEN + 10)]
    for _ in range(2):
        for r in readers:
            r.lookup(rng.randbytes(16), refresh_on_miss=False)
            r.lookup(next(iter(r.items()))[0], refresh_on_miss=False)
    assert len(rb._kept) <= KEEP_OPEN
    assert len(os.listdir("/proc/self/fd")) - base <= KEEP_OPEN + 2
    rb.close()
    assert len(os.listdir("/proc/self/fd")) - base <= 2
    rb2 = open_backend(loc)
    r2 = Table(rb2, "t0/", "w2")
    r2.lookup(next(iter(r2.items()))[0])
    del r2, rb2
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) - base <= 2


# -- the write protocol --------------------------------------------------------------------------


def test_concurrent_create_if_absent_from_processes_has_one_intact_winner(tmp_path):
    """Four processes create the same 200 keys (each with its own content, of sizes from 0 bytes to
    300 KB, through ``create``, ``create_many`` and ``create_frame``) at once: every key holds exactly
    one writer's bytes, whole, and no ``*.partial`` file is left."""
    loc = tmp_path / "s"
    open_backend(loc)
    code = """
        import sys, random
        from casmon.store.backend import open_backend
        me = int(sys.argv[1]); b = open_backend(sys.argv[2])
        sys.stdin.readline()
        rng = random.Random(1)
        sizes = [rng.choice([0, 1, 4096, 300_000]) for _ in range(200)]
        def data(i):
            return bytes([me]) * sizes[i]
        for i in range(0, 200, 3):
            b.create(f"a/{i % 7}/k{i}", data(i))
        b.create_many([(f"a/{i % 7}/k{i}", data(i)) for i in range(1, 200, 3)])
        for i in range(2, 200, 3):
            d = data(i)
            b.create_frame(f"a/{i % 7}/k{i}", d[:10], d[10:])
        print("done")
    """
    procs = [subprocess.Popen([PY, "-c", textwrap.dedent(code), str(m), str(loc)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(ROOT))
             for m in range(1, 5)]
    time.sleep(0.5)
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and "done" in out, err
    rng = random.Random(1)
    sizes = [rng.choice([0, 1, 4096, 300_000]) for _ in range(200)]
    for i in range(200):
        data = (loc / f"a/{i % 7}/k{i}").read_bytes()
        assert len(data) == sizes[i]
        assert len(set(data)) <= 1 and (not data or data[0] in (1, 2, 3, 4))
    assert not list(loc.rglob("*.partial"))


def test_write_into_a_folder_removed_meanwhile(tmp_path):
    """The backend remembers folders it made; a folder removed by someone else (another process, a user)
    must be made again, for every write path (``set``, ``create``, ``create_many``, ``create_frame``)."""
    import shutil

    loc = tmp_path / "s"
    b = open_backend(loc)
    writes = [lambda k, d: b.set(k, d), lambda k, d: b.create(k, d), lambda k, d: b.create_many([(k, d)]),
              lambda k, d: b.create_frame(k, d[:2], d[2:])]
    for j, w in enumerate(writes):
        w(f"x/y/a{j}", b"first")
        shutil.rmtree(loc / "x")
        w(f"x/y/b{j}", b"second")
        assert (loc / f"x/y/b{j}").read_bytes() == b"second"
        shutil.rmtree(loc / "x")
        (loc / "x").mkdir()  # the parent exists again, the child does not
        w(f"x/y/c{j}", b"third")
        assert (loc / f"x/y/c{j}").read_bytes() == b"third"
    # the whole store folder removed under an open writer
    s = casmon.open(loc / "t")
    s.put(b"x" * 100)
    s.flush()
    shutil.rmtree(loc / "t")
    d = s.put(b"y" * 100)
    s.flush()
    assert casmon.open(loc / "t").get(d) == b"y" * 100


def test_full_disk_mid_write_leaves_nothing_visible(tmp_path, monkeypatch):
    """``os.write`` fails with ENOSPC half way through a large value: the error reaches the caller as an
    OSError/StoreError, no file appears under the final name, no ``*.partial`` is left, and a retry once
    space is back stores the value whole."""
    import errno

    loc = tmp_path / "s"
    b = open_backend(loc)
    real = os.write
    budget = {"n": 3 << 20}

    def write(fd, data):
        n = len(memoryview(data))
        if budget["n"] <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        n = min(n, budget["n"], 1 << 20)
        budget["n"] -= n
        return real(fd, memoryview(data)[:n])

    monkeypatch.setattr(os, "write", write)
    big = os.urandom(8 << 20)
    for how in ("set", "create", "frame"):
        budget["n"] = 3 << 20
        with pytest.raises(OSError):
            if how == "set":
                b.set("v/" + how, big)
            elif how == "create":
                b.create("v/" + how, big)
            else:
                b.create_frame("v/" + how, big[:40], big[40:])
        assert not (loc / "v" / how).exists()
        assert not list(loc.rglob("*.partial"))
    budget["n"] = 1 << 40
    b.create("v/create", big)
    assert (loc / "v/create").read_bytes() == big
    # through a store: the flush fails with a StoreError, and the next flush writes the value
    s = casmon.open(loc / "st")
    budget["n"] = 1 << 20
    with pytest.raises((casmon.StoreError, OSError)):
        d = s.put(np.random.default_rng(0).random(2_000_000))
        s.flush()
    assert not list(loc.rglob("*.partial"))
    budget["n"] = 1 << 40
    d = s.put(np.random.default_rng(0).random(2_000_000))
    s.flush()
    assert (casmon.open(loc / "st").get(d) == np.random.default_rng(0).random(2_000_000)).all()
    assert casmon.open(loc / "st").verify().ok


def test_local_folder_matches_zarr_local_store(tmp_path):
    """Differential: the same operations through casmon's ``LocalFolder`` and through zarr's ``LocalStore``
    (its own async methods) give the same results and leave the same files, keys with odd characters
    included (spaces, unicode, dots, '%', a name ending in '.partial'-like text, deep folders)."""
    import asyncio

    from zarr.core.buffer import default_buffer_prototype
    from zarr.core.buffer.cpu import Buffer
    from zarr.storage import LocalStore

    a_loc, z_loc = tmp_path / "a", tmp_path / "z"
    a = open_backend(a_loc)
    assert isinstance(a.zstore, LocalFolder)
    z_loc.mkdir()
    z = LocalStore(z_loc)
    proto = default_buffer_prototype()

    def zrun(c):
        return asyncio.run(c)

    keys = ["k", "a b/c d", "ü/ñ.json", "x/.hidden", "p%20q/r", "deep/" * 8 + "leaf", "dot.ted/name.ext",
            "x/y.partial.z", "0000", "a/b/c"]
    rng = random.Random(4)
    for step in range(400):
        k = rng.choice(keys)
        op = rng.choice(["set", "create", "delete", "get", "range", "exists", "getsize", "list_dir"])
        data = rng.randbytes(rng.choice([0, 1, 100, 5000]))
        if op == "set":
            a.set(k, data)
            zrun(z.set(k, Buffer.from_bytes(data)))
        elif op == "create":
            a.create(k, data)
            zrun(z.set_if_not_exists(k, Buffer.from_bytes(data)))
        elif op == "delete":
            ra = rz = None
            try:
                a.delete(k)
            except Exception as e:  # noqa: BLE001
                ra = type(e)
            try:
                zrun(z.delete(k))
            except Exception as e:  # noqa: BLE001
                rz = type(e)
            assert ra == rz, (k, ra, rz)
        elif op == "get":
            ga, gz = a.get(k), zrun(z.get(k, proto))
            assert (ga is None) == (gz is None) and (ga is None or ga.tobytes() == gz.to_bytes()), k
        elif op == "range":
            st_, en = sorted(rng.sample(range(0, 6000), 2))
            from zarr.abc.store import RangeByteRequest

            ga, gz = a.get_range(k, st_, en), zrun(z.get(k, proto, byte_range=RangeByteRequest(st_, en)))
            assert (ga is None) == (gz is None) and (ga is None or ga.tobytes() == gz.to_bytes()), (k, st_, en)
        elif op == "exists":
            assert a.exists(k) == zrun(z.exists(k)), k
        elif op == "getsize":
            ra = rz = None
            try:
                ra = a.getsize(k)
            except Exception as e:  # noqa: BLE001
                ra = type(e)
            try:
                rz = zrun(z.getsize(k))
            except Exception as e:  # noqa: BLE001
                rz = type(e)
            assert ra == rz, (k, ra, rz)
        else:
            d = k.rsplit("/", 1)[0] if "/" in k else ""

            async def ld():
                return sorted([x async for x in z.list_dir(d)])

            assert sorted(a.list_dir(d)) == zrun(ld()), d
    files_a = sorted(str(p.relative_to(a_loc)) for p in a_loc.rglob("*") if p.is_file())
    files_z = sorted(str(p.relative_to(z_loc)) for p in z_loc.rglob("*") if p.is_file())
    assert files_a == files_z
    for f in files_a:
        assert (a_loc / f).read_bytes() == (z_loc / f).read_bytes()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_kept_descriptor_numbers_are_not_trusted_after_a_daemonizing_fork(tmp_path):
    """A process looks values up (bucket files stay open), forks, and the child daemonizes the usual way
    (``os.closerange`` of every descriptor, then opens its own files, which get the freed numbers).
    The child's lookups must still find the values, without damage warnings, and casmon must never close
    the child's own file. Kept ``_OpenFile`` numbers were trusted blindly: the child read its own file as
    the bucket file (a false StoreDamageWarning, the block marked bad, misses), and ``forget``/eviction
    would close the user's descriptor; when the number was not reused, ``os.pread`` raised EBADF (an
    OSError in the user's code). Now a forked child neither trusts nor closes them."""
    loc = tmp_path / "s"
    rng = random.Random(8)
    entries = [(rng.randbytes(16), str(i).encode()) for i in range(20_000)]
    _gen_table(loc, entries)
    r = Table(open_backend(loc), "r/", "w2")
    assert r.lookup(entries[1][0], refresh_on_miss=False) == [entries[1][1]]
    assert r.backend._kept
    user = tmp_path / "userfile"
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.closerange(3, rfd)
            os.closerange(rfd + 1, wfd)
            os.closerange(wfd + 1, 4096)
            fd = os.open(user, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            os.write(fd, b"the user's own data " * 5000)
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                for k, v in entries[100:20_000:397]:
                    if r.lookup(k, refresh_on_miss=False) != [v]:
                        code |= 1
                        break
            if any(issubclass(x.category, StoreDamageWarning) for x in w):
                code |= 2
            r.backend.forget("")
            try:
                os.fstat(fd)
            except OSError:
                code |= 4
        except BaseException:
            import traceback

            (tmp_path / "child_error").write_text(traceback.format_exc())
            code |= 8
        os._exit(code)
    os.close(rfd)
    os.close(wfd)
    status = os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    what = [m for bit, m in [(1, "wrong lookup"), (2, "false StoreDamageWarning"),
                             (4, "the user's descriptor was closed by casmon"), (8, "exception")] if code & bit]
    err = (tmp_path / "child_error").read_text() if (tmp_path / "child_error").exists() else ""
    assert code == 0, (what, err)


# -- store level ----------------------------------------------------------------------------------


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


def test_cache_hits_through_gc_clear_and_fresh_processes(tmp_path):
    """The plain-bytes memory of a cache (``_mem``), the object store's ``_known``/``_pending`` and the
    record refs: hits after gc, after ``cache_clear`` (nothing remembered is served), after a fresh open,
    and every digest users see is a ``Digest`` (hex ``str``, ``.short``)."""
    loc = tmp_path / "s"
    s = casmon.open(loc)
    n = {"calls": 0}

    @casmon.cache(store=s)
    def f(i):
        return np.full(100 + i, i)

    for i in range(50):
        f(i)
    s.flush()
    s.gc(grace=0)
    for i in range(50):
        assert (f(i) == i).all() and f(i).shape == (100 + i,)
    r = f.ref(3)
    dg = getattr(r, "digest", None)
    if dg is not None:
        assert isinstance(dg, casmon.Digest) and str(dg) == dg.hex() and len(dg.short) == 12
    f.cache_clear()
    assert not f.is_cached(3)
    assert (f(3) == 3).all()
    assert f.is_cached(3)
    s.flush()
    s2 = casmon.open(loc)

    @casmon.cache(store=s2)
    def f(i):  # noqa: F811 - the same function, a fresh store object
        return np.full(100 + i, i)

    assert f.is_cached(3) and not f.is_cached(4)
    assert s2.verify().ok
    for d in list(s.objects._pending) + list(s.objects._known):
        assert type(d) is bytes and len(d) == 16
    del n


_WRITER = """
import sys, random
import numpy as np
import casmon
loc, seed = sys.argv[1], int(sys.argv[2])
rng = random.Random(seed)
s = casmon.open(loc)
@casmon.cache(store=s)
def f(i, n):
    return np.full(n, i % 251, dtype=np.uint8)
while True:
    f(rng.randrange(300), rng.choice([10, 1000, 70_000, 300_000, 2_000_000]))
    if rng.random() < 0.2:
        s.set_ref(f"r/{rng.randrange(5)}", s.put(rng.randbytes(rng.choice([10, 200_000]))))
    if rng.random() < 0.3:
        s.flush()
"""


@pytest.mark.parametrize("kills", [pytest.param(3, id="quick"), pytest.param(40, id="long", marks=pytest.mark.slow)])
def test_two_writers_sigkilled_at_random_moments(tmp_path, kills):
    """Two writers (packs, loose values through ``create_frame``, refs through ``set``, level-0 files,
    merges) SIGKILLed at random moments, again and again: the store verifies, every cached value read back
    is right, refs read, and no warning is given."""
    loc = str(tmp_path / "s")
    rng = random.Random(77 + kills)
    for k in range(kills):
        ps = [subprocess.Popen([PY, "-c", _WRITER, loc, str(rng.randrange(10**9))], cwd=str(ROOT),
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(2)]
        time.sleep(rng.uniform(0.8, 2.5))
        for p in ps:
            time.sleep(rng.uniform(0, 0.3))
            p.send_signal(signal.SIGKILL)
            p.wait()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            s = casmon.open(loc)
            rep = s.verify()
            assert rep.ok, (k, rep.as_dict())

            @casmon.cache(store=s)
            def f(i, n):
                return np.full(n, i % 251, dtype=np.uint8)

            for _ in range(20):
                i, n = rng.randrange(300), rng.choice([10, 1000, 70_000])
                v = f(i, n)
                assert v.shape == (n,) and (v == i % 251).all()
            for j in range(5):
                ref = s.get_ref(f"r/{j}")
                if ref is not None and ref.target is not None:
                    s.get(ref.target)
            s.close()


def test_decode_table_block_accepts_exactly_what_decode_frame_accepts():
    """Differential fuzz: mutated table frames (header bytes, lz4 size field, payload, length changes,
    other codecs and kinds): ``decode_table_block`` returns the same bytes as ``decode_frame`` when that
    accepts, and raises DamagedObjectError when that raises."""
    from casmon.store.codec import decode_table_block
    from casmon.errors import DamagedObjectError
    from casmon.store.table import encode_table_file

    rng = random.Random(12)
    frames = []
    for n in (1, 5, 64):
        payload = encode_table_file([(rng.randbytes(16), rng.randbytes(rng.choice([0, 3, 30]))) for _ in range(n)])
        for codec in ("lz4", "zstd", "none"):
            for kind in (KIND_TABLE, 0, 1):
                frames.append(encode_frame(payload, kind, get_codec(codec))[1])
    for _ in range(6000):
        data = bytearray(rng.choice(frames))
        how = rng.random()
        if how < 0.5:
            i = rng.randrange(min(len(data), 48)) if rng.random() < 0.7 else rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
            if rng.random() < 0.5:  # fix the check byte: only the field changed
                from casmon.store.codec import _xor_at

                data[7] ^= _xor_at(bytes(data), 0)
        elif how < 0.7:
            data = data[: rng.randrange(len(data) + 1)]
        elif how < 0.8:
            data += rng.randbytes(rng.randrange(1, 10))
        data = bytes(data)
        try:
            want = bytes(decode_frame(data, "k")[1])
        except DamagedObjectError:
            want = None
        try:
            got = decode_table_block(data, "k", 5)
        except DamagedObjectError:
            got = None
        assert got == want, data[:48].hex()


def test_lookups_beside_a_thread_that_writes_and_merges_never_miss(tmp_path):
    """Three threads look up keys already written while a fourth writes level-0 files and merges them,
    switches forced everywhere (a tiny switch interval, a gc callback that yields). Two defects showed
    as misses: a lookup read the generations, the level-0 files and the waiting entries at different
    moments (a merge moved entries from one to another in between), and a refresh that listed the
    folder before the writer's newest level-0 file dropped that file from memory until the next
    refresh. Each now holds: the view is taken in one step, and a refresh keeps this writer's level-0
    files written after its listing unless a listed generation holds them."""
    import gc

    b = open_backend(tmp_path / "t")
    t = Table(b, "r/", "w1")
    rng = random.Random(1)
    known: dict[bytes, bytes] = {}
    lock = threading.Lock()
    stop = time.monotonic() + 3.0
    errors: list[str] = []

    def writer():
        i = 0
        try:
            while time.monotonic() < stop:
                ks = [rng.randbytes(16) for _ in range(300)]
                for k in ks:
                    t.add(k, str(i).encode())
                    i += 1
                t.write_l0(t.take_pending())
                with lock:
                    for j, k in enumerate(ks):
                        known[k] = str(i - 300 + j).encode()
                if rng.random() < 0.5:
                    t.consolidate(min_l0=1, force=rng.random() < 0.3)
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    def reader(seed):
        r = random.Random(seed)
        try:
            while time.monotonic() < stop and not errors:
                with lock:
                    if not known:
                        continue
                    k = r.choice(list(known))
                    v = known[k]
                got = t.lookup(k)
                if got != [v]:
                    errors.append(f"lookup {k.hex()} -> {got}, want {v}")
                    return
                if r.random() < 0.05:
                    t.refresh()
        except BaseException as e:  # noqa: BLE001
            errors.append(repr(e))

    def switch(phase, info):
        time.sleep(0)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    gc.callbacks.append(switch)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            threads = [threading.Thread(target=writer)] + [threading.Thread(target=reader, args=(s,)) for s in range(3)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
    finally:
        gc.callbacks.remove(switch)
        sys.setswitchinterval(interval)
    assert not errors, errors[:3]
    assert len(known) > 1000
