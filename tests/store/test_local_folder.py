"""The zarr-free local folder backend (``casmon.store.backend.LocalFolder``): writes that are atomic
and create-if-absent across processes, folders removed meanwhile, full disks, killed writers, and
the bucket-file descriptors it keeps open (bounded, re-checked after a fork or a daemonizing fork).
A differential test holds it to zarr's ``LocalStore``."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import numpy as np
import pytest

import casmon
from casmon.store.backend import KEEP_OPEN, LocalFolder, open_backend
from casmon.errors import StoreDamageWarning
from casmon.store.table import Table
from tests.support.processes import PY, ROOT, run_code, wait_for_file
from tests.support.tables import gen_table


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
    p = run_code(code)
    assert p.returncode == 0, p.stderr


def test_reader_keeps_reading_right_bytes_after_another_process_merges(tmp_path):
    """A reader holds bucket files open; another process merges the generation away (deleting them) and
    writes a new one whose bucket files reuse the freed inode numbers and names' pattern. The reader's
    lookups (before and after it notices) return exactly the right values, with no damage warning; after
    a refresh it keeps no descriptor of the deleted files."""
    loc = tmp_path / "s"
    rng = random.Random(5)
    entries = [(rng.randbytes(16), str(i).encode()) for i in range(20_000)]
    _b, _t, gid = gen_table(loc, entries)
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
    gen_table(loc, entries)
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
    gen_table(loc, entries)
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


def test_a_write_whose_partial_file_vanished_before_its_link_is_written_again(tmp_path):
    """gc deletes ``*.partial`` files a killed writer left (``casmon gc``, once they are old). A live
    writer stalled between writing its ``*.partial`` file and linking it into place (a stopped
    process, a swapping machine) found it gone and lost that write: for a logged call's session ref
    the call was not logged (``CallLogWarning``). The writer still has the bytes: it writes them again.
    Held at the fault point ``local.partial_written`` while the test deletes the file, as gc would."""
    from casmon import faultpoints

    loc, points = tmp_path / "s", tmp_path / "points"
    points.mkdir()
    s = casmon.open(loc)
    d = s.put("v")
    s.flush()
    faultpoints.configure(f"local.partial_written@1=pause:{points}")
    errors = []

    def write():
        try:
            s.create_ref("made", d)
            s.set_ref("set", d)
        except Exception as e:  # noqa: BLE001 - the test reports it
            errors.append(e)

    import threading

    t = threading.Thread(target=write)
    t.start()
    try:
        wait_for_file(points / "local.partial_written.reached")
        partials = list((loc / "refs").glob("*.partial"))
        assert len(partials) == 1
        partials[0].unlink()  # what gc does to an old *.partial file
    finally:
        (points / "local.partial_written.go").touch()
        t.join(30)
        faultpoints.configure(None)
    assert errors == []
    assert s.get_ref("made").target == d and s.get_ref("set").target == d
    s.close()
    assert not list(loc.rglob("*.partial"))


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


@pytest.mark.parametrize("written_ns, taken_after, settled", [
    (1_796_000_000_123_456_789, 0.01, False),  # a fine clock: within 50 ms, a rewrite may share the stamp
    (1_796_000_000_123_456_789, 0.2, True),
    (1_796_000_000_000_000_000, 2.0, False),  # whole seconds (FAT, ext3, NFS): three seconds' margin
    (1_796_000_000_000_000_000, 3.5, True),
    (1_796_000_000_120_000_000, 0.02, False),  # exFAT's 10 ms
    (1_796_000_000_120_000_000, 0.1, True),
])
def test_a_stamp_is_settled_only_ticks_of_its_file_clock_after_the_write(tmp_path, written_ns, taken_after, settled):
    b = casmon.open(tmp_path / "s", create=True).backend
    stamp = f"1f.{written_ns:x}.{written_ns:x}.40"
    assert b.stamp_settled(stamp, written_ns / 1e9 + taken_after) is settled
    assert b.stamp_settled("not a stamp", 2e9) is False and b.stamp_settled("1.zz.1.1", 2e9) is False


def test_a_fresh_files_stamp_is_not_settled_and_an_old_ones_is(tmp_path):
    b = casmon.open(tmp_path / "s", create=True).backend
    b.set("k", b"x")
    stamp = b.list_stamped("")["k"]
    assert b.stamp("k") == stamp and not b.stamp_settled(stamp, time.time())
    assert b.stamp_settled(stamp, time.time() + 10)


@pytest.mark.parametrize("prefix", ["", "records/", "records", "records/cache/gens/", "records//cache", "./records",
                                    "records/../records/cache", "absent/", "a_file", "linked/"])
def test_a_listing_is_os_walks_files_keyed_from_the_root_whatever_the_prefix(tmp_path, prefix):
    """The folder's listing (walked with scandir for casmon's plain prefixes) holds exactly the keys, in the order,
    that os.walk gives: nested folders, a link to a folder (never entered), a link to a file, a broken link,
    an empty folder, a prefix naming a file or nothing, and prefixes written oddly."""
    root = tmp_path / "s"
    for rel in ["casmon.json", "a_file", "records/cache/l0/x1", "records/cache/gens/g1", "records/cache/gens/g2",
                "records/cachefn/l0/y", "records/z", "other/deep/er/f"]:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"1")
    (root / "records" / "empty").mkdir()
    (root / "records" / "cache" / "dirlink").symlink_to(root / "other", target_is_directory=True)
    (root / "records" / "filelink").symlink_to(root / "a_file")
    (root / "records" / "broken").symlink_to(root / "nowhere")
    (root / "linked").symlink_to(root / "records" / "cache", target_is_directory=True)
    b = open_backend(root)

    def walked(p: str) -> list[str]:  # what the listing was: os.walk, each folder relative to the root
        out: list[str] = []
        for folder, _dirs, files in os.walk(os.path.join(str(root.resolve()), p.rstrip("/"))):
            rel = os.path.relpath(folder, str(root.resolve())).replace(os.sep, "/")
            out.extend(f"{rel}/{f}" if rel != "." else f for f in files)
        return out

    assert b.list(prefix) == walked(prefix)
