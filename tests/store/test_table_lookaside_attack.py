"""Attacks on a generation's lookaside copy (``buckets/{id}/lookup``): a copy that is not a plain file, one that
cannot be read or written, a reader killed while it writes one, one written for a generation merged meanwhile or
left behind by one, readers, a merging writer and gc at once, older casmon on the same store, media that keep
none. Every stored key is found with its value, no absent key is, nothing raises or blocks, nothing is left."""

from __future__ import annotations

import glob
import logging
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

import casmon
from casmon.store.backend import open_backend
from casmon.store.backend.local import LocalBackend
from casmon.store.table import Table
from casmon.store.table.format import LOOKASIDE
from tests.conftest import run_python
from tests.support.tables import gen_table, random_keys

N = 30_000  # a manifest of ~38 KB: above LOOKASIDE_MIN
ROOT = Path(__file__).resolve().parent.parent.parent
#: The last commit before lookaside copies: "older casmon" sharing the store.
PRE_LOOKASIDE = "771aec0"


def _store(loc, n=N, prefix="r/", seed=1):
    keys = random_keys(n, seed=seed)
    b, _t, gid = gen_table(loc, [(k, k[:5]) for k in keys], prefix=prefix)
    return b, keys, gid


def _copy_path(loc, gid, prefix="r/"):
    return os.path.join(str(loc), prefix, "buckets", gid, LOOKASIDE)


def _answers_right(b, keys, prefix="r/"):
    """A fresh reader finds a sample of stored keys with their values and no absent key; returns it."""
    r = Table(b, prefix, "reader")
    for k in keys[:: max(1, len(keys) // 300)]:
        assert r.lookup(k, refresh_on_miss=False) == [k[:5]], "a stored key was missed"
    for k in random_keys(300, seed=4242):
        assert r.lookup(k, refresh_on_miss=False) == [], "an absent key was found"
    return r


def _within(seconds, fn):
    """``fn()`` in a thread: its result, or a failure if it raised or had not returned after ``seconds``."""
    out: list = []

    def run():
        try:
            out.append(("ok", fn()))
        except BaseException as e:  # noqa: BLE001 - reported below
            out.append(("raised", e))

    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"still running after {seconds} s: it blocks"
    how, value = out[0]
    if how == "raised":
        raise value
    return value


def _kinds(base: Path, path: str, good: bytes, manifest: str) -> dict:
    def sparse_huge():
        with open(path, "wb") as f:
            f.write(good)
            f.truncate(1 << 36)  # sparse: 64 GiB that a reader must not read

    def elsewhere():
        (base / "elsewhere").write_bytes(b"not a copy" * 1000)
        os.symlink(base / "elsewhere", path)

    return {
        "a directory": lambda: os.mkdir(path),
        "a directory holding files": lambda: (os.mkdir(path), open(os.path.join(path, "x"), "wb").close()),
        "a named pipe": lambda: os.mkfifo(path),
        "a symlink to a file elsewhere": elsewhere,
        "a dangling symlink": lambda: os.symlink(base / "nothing-here", path),
        "a symlink to itself": lambda: os.symlink(path, path),
        "a symlink to its manifest": lambda: os.symlink(manifest, path),
        "a symlink to /dev/zero": lambda: os.symlink("/dev/zero", path),
        "an empty file": lambda: open(path, "wb").close(),
        "a sound copy with 64 GiB of zeros after it": sparse_huge,
    }


KINDS = list(_kinds(Path("."), "", b"", "").keys())


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_that_is_not_a_plain_sound_file_answers_right_blocks_nothing_and_harms_nothing_it_points_at(
        tmp_path, kind):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    path = _copy_path(loc, gid)
    good = open(path, "rb").read()
    manifest = os.path.join(str(loc), "r", "gens", gid)
    manifest_bytes = open(manifest, "rb").read()
    os.remove(path)
    _kinds(tmp_path, path, good, manifest)[kind]()
    b.forget("r/buckets/")

    def read_and_flush():
        r = _answers_right(b, keys)
        assert sorted(r.items()) == sorted((k, k[:5]) for k in keys)
        r.flush()
        return r

    r = _within(120, read_and_flush)
    assert not r.damaged, f"{kind} was reported as damage: {r.damaged}"
    assert open(manifest, "rb").read() == manifest_bytes, "the manifest was changed"
    if kind == "a symlink to a file elsewhere":
        assert (tmp_path / "elsewhere").read_bytes() == b"not a copy" * 1000, "a file outside the store was written"
    st = os.lstat(path)
    if kind.startswith("a directory"):
        assert stat.S_ISDIR(st.st_mode)  # not the reader's to delete: the next reader reads the manifest whole
    elif kind.startswith("a sound copy"):
        with open(path, "rb") as f:
            assert f.read(len(good)) == good
    else:
        assert stat.S_ISREG(st.st_mode) and open(path, "rb").read() == good, f"{kind} was not replaced by a copy"
    assert not glob.glob(os.path.join(os.path.dirname(path), "*.partial")), "a temporary file was left"
    _within(120, lambda: _answers_right(b, keys))


def test_a_copy_cut_at_any_boundary_of_its_layout_answers_right_and_is_replaced(tmp_path):
    from casmon.store.table.format import LA_HEAD

    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    path = _copy_path(loc, gid)
    good = open(path, "rb").read()
    _m, _v, _z, _d, size, chunk, head = LA_HEAD.unpack_from(good, 0)
    n = -(-size // chunk)
    at = LA_HEAD.size + 8 + 8 * n
    edges = {1, 4, 6, 8, LA_HEAD.size, LA_HEAD.size + 8, at, at + head, at + head + 1, 4096, len(good) - 1}
    edges |= {at + c * chunk for c in range(1, n)}
    cuts = sorted({e + d for e in edges for d in (-1, 0, 1) if 0 <= e + d < len(good)})
    for cut in cuts:
        with open(path, "wb") as f:
            f.write(good[:cut])
        b.forget("r/buckets/")
        r = _answers_right(b, keys)
        assert r._gen_entries(r._active_gens[0], tolerant=False) and not r.damaged, f"cut to {cut} bytes"
        r.flush()
        assert open(path, "rb").read() == good, f"a copy cut to {cut} bytes was not replaced"


def test_a_bit_flipped_in_any_byte_before_the_payload_or_in_any_chunk_of_it_answers_right(tmp_path):
    from casmon.store.table.format import LA_HEAD

    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    path = _copy_path(loc, gid)
    good = open(path, "rb").read()
    _m, _v, _z, _d, size, chunk, _head = LA_HEAD.unpack_from(good, 0)
    n = -(-size // chunk)
    at = LA_HEAD.size + 8 + 8 * n
    spots = list(range(at)) + [at + c * chunk + (c * 997) % min(chunk, size - c * chunk) for c in range(n)]
    for i, spot in enumerate(spots):
        with open(path, "wb") as f:
            f.write(good[:spot] + bytes([good[spot] ^ (1 << (i % 8))]) + good[spot + 1 :])
        b.forget("r/buckets/")
        r = Table(b, "r/", "reader")
        for k in keys[i % 50 :: 500]:
            assert r.lookup(k, refresh_on_miss=False) == [k[:5]], f"a bit flipped at {spot}: a stored key missed"
        for k in random_keys(40, seed=10_000 + i):
            assert r.lookup(k, refresh_on_miss=False) == [], f"a bit flipped at {spot}: an absent key found"
        if spot >= at:  # a flipped chunk is found where a lookup or the whole read reads it
            assert len(r._gen_entries(r._active_gens[0], tolerant=False)) == len(keys)
        assert not r.damaged


def test_an_unreadable_copy_reads_the_manifest_whole_and_is_replaced(tmp_path):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    path = _copy_path(loc, gid)
    good = open(path, "rb").read()
    os.chmod(path, 0)
    b.forget("r/buckets/")
    if os.geteuid() == 0:  # root reads it anyway: the medium says what a user's process would be told
        read_kept = b.read_kept

        def refused(key, start, end):
            if key.endswith("/" + LOOKASIDE):
                raise PermissionError(13, "Permission denied", key)
            return read_kept(key, start, end)

        b.read_kept = refused
    r = _answers_right(b, keys)
    assert not r.damaged
    r.flush()
    assert open(path, "rb").read() == good, "the unreadable copy was not replaced"


def test_a_reader_that_cannot_write_the_copy_answers_quietly_and_tries_once_a_generation(tmp_path, monkeypatch,
                                                                                          caplog):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    os.remove(_copy_path(loc, gid))
    b.forget("r/buckets/")
    tries = []
    write_file = LocalBackend._write_file

    def refused(path, folder, parts, exclusive):
        if os.path.basename(path) == LOOKASIDE:
            tries.append(path)
            raise PermissionError(13, "Permission denied", path)  # a folder the user may not write
        return write_file(path, folder, parts, exclusive)

    monkeypatch.setattr(LocalBackend, "_write_file", staticmethod(refused))
    caplog.set_level(logging.DEBUG)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r = _answers_right(b, keys)
        r.flush()
        for _ in range(3):
            r.refresh()
            for k in keys[:50]:
                assert r.lookup(k) == [k[:5]]
            r.flush()
    assert len(tries) == 1, f"the copy's write was tried {len(tries)} times"
    assert not [rec for rec in caplog.records if rec.levelno >= logging.WARNING], caplog.text
    assert not os.path.exists(_copy_path(loc, gid))
    assert not glob.glob(os.path.join(str(loc), "**", "*.partial"), recursive=True)


def _records_store(loc, n=N):
    """A store whose ``attack`` records (key: the number, big-endian) are one generation with its copy."""
    s = casmon.open(loc, autoflush=None)
    for i in range(n):
        s.append("attack", {"i": i}, key=i.to_bytes(16, "big"))
    s.flush()
    s.table("attack").consolidate(min_l0=1, force=True)  # None where the flush merged them already
    s.close()
    (gid,) = os.listdir(os.path.join(str(loc), "records", "attack", "gens"))
    assert os.path.isfile(_copy_path(loc, gid, "records/attack/"))
    return gid


def _listing(loc):
    out = {}
    for folder, _dirs, files in os.walk(loc):
        for f in files:
            p = os.path.join(folder, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_store_opened_read_only_writes_no_copy_and_answers_right(tmp_path):
    loc = tmp_path / "s"
    gid = _records_store(loc)
    os.remove(_copy_path(loc, gid, "records/attack/"))
    before = _listing(loc)
    s = casmon.open(loc, read_only=True)
    for i in range(0, N, 97):
        (rec,) = s.lookup("attack", i.to_bytes(16, "big"))
        assert rec["i"] == i
    assert s.lookup("attack", (N + 1).to_bytes(16, "big")) == []
    s.flush()
    s.close()
    assert _listing(loc) == before, "a read-only store was written"


READ_THEN_FLUSH = """
import sys, casmon
s = casmon.open(sys.argv[1], autoflush=None)
for i in range(0, int(sys.argv[2]), 97):
    (rec,) = s.lookup("attack", i.to_bytes(16, "big"))
    assert rec["i"] == i, rec
s.flush()
s.close()
"""


def test_a_reader_killed_while_it_writes_its_copy_leaves_nothing_read_as_a_copy_and_gc_removes_what_it_left(
        tmp_path):
    loc = tmp_path / "s"
    gid = _records_store(loc)
    path = _copy_path(loc, gid, "records/attack/")
    good = open(path, "rb").read()
    os.remove(path)
    p = run_python(READ_THEN_FLUSH, str(loc), str(N), env={"CASMON_FAULTPOINTS": "local.partial_written=kill"},
                   check=False)
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not os.path.exists(path), "a copy was in place before its write ended"
    (left,) = glob.glob(path + ".*.partial")
    run_python(READ_THEN_FLUSH, str(loc), str(N))  # reads the manifest whole, writes a sound copy
    assert open(path, "rb").read() == good
    os.utime(left, (1, 1))  # as a killed writer's file is after a while
    s = casmon.open(loc, autoflush=None)
    s.gc(grace=0)
    assert not os.path.exists(left), "gc left a killed reader's partial copy"
    assert s.verify().ok
    s.close()
    run_python(READ_THEN_FLUSH, str(loc), str(N))


def test_a_reader_killed_at_every_fault_point_it_passes_leaves_a_store_that_answers_and_a_sound_copy_next(tmp_path):
    from casmon.faultpoints import POINTS

    loc = tmp_path / "s"
    gid = _records_store(loc)
    path = _copy_path(loc, gid, "records/attack/")
    good = open(path, "rb").read()
    os.remove(path)
    pristine = tmp_path / "pristine"
    shutil.copytree(loc, pristine)
    count = tmp_path / "count"
    count.mkdir()
    run_python(READ_THEN_FLUSH, str(loc), str(N),
               env={"CASMON_FAULTPOINTS": ",".join(f"{p}=count:{count}" for p in POINTS)})
    passed = [(f.name[: -len(".count")], n) for f in sorted(count.iterdir())
              for n in range(1, len(f.read_text().splitlines()) + 1)]
    assert ("local.partial_written", 1) in passed, "the reader wrote no copy"
    for point, n in passed:
        shutil.rmtree(loc)
        shutil.copytree(pristine, loc)
        p = run_python(READ_THEN_FLUSH, str(loc), str(N), env={"CASMON_FAULTPOINTS": f"{point}@{n}=kill"},
                       check=False)
        assert p.returncode == -signal.SIGKILL, (point, n, p.stderr)
        left = os.listdir(os.path.dirname(path))
        assert all(f in ("0000", LOOKASIDE) or f.startswith(LOOKASIDE + ".") and f.endswith(".partial")
                   for f in left), (point, n, left)
        if LOOKASIDE in left:
            assert open(path, "rb").read() == good, f"killed at {point}@{n}: a copy in place that is not sound"
        run_python(READ_THEN_FLUSH, str(loc), str(N))
        assert open(path, "rb").read() == good, f"killed at {point}@{n}: the next reader wrote no sound copy"


def test_a_copy_a_reader_writes_for_a_generation_merged_meanwhile_is_not_left(tmp_path):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    os.remove(_copy_path(loc, gid))
    b.forget("r/buckets/")
    r = _answers_right(b, keys)  # read the manifest whole: wants to write the copy at its flush
    assert gid in r._derive
    m = Table(open_backend(loc), "r/", "merger")
    more = random_keys(2000, seed=9)
    for k in more:
        m.add(k, k[:5])
    m.flush()
    new = m.consolidate(force=True)
    assert new is not None and new != gid and not os.path.exists(os.path.join(str(loc), "r", "gens", gid))
    r.flush()
    assert not os.path.exists(_copy_path(loc, gid)), "a copy of a generation merged away was left"
    assert not glob.glob(os.path.join(str(loc), "r", "buckets", gid, "*"))
    _answers_right(b, keys + more)


def test_a_rewrite_deletes_a_copy_left_of_a_generation_that_is_gone(tmp_path):
    """A reader killed between writing a copy and seeing its generation merged away leaves the copy alone in its
    folder: the rewrite that deletes leftover buckets deletes it too."""
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    gone = "0000000000000001-0123456789ab-000001"  # a generation id of long ago, no manifest
    os.makedirs(os.path.dirname(_copy_path(loc, gone)))
    shutil.copy(_copy_path(loc, gid), _copy_path(loc, gone))
    t = Table(b, "r/", "repair")
    sv = t.survey(keep=True)
    assert sv.ok
    t.rewrite(sv, sv.entries())
    assert not os.path.exists(_copy_path(loc, gone)), "a copy of no generation was left by the rewrite"
    _answers_right(b, keys)


RACE_WRITER = """
import sys, casmon
loc, start, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = casmon.open(loc, autoflush=None)
for i in range(start, start + n):
    s.append("attack", {"i": i}, key=i.to_bytes(16, "big"))
s.flush()
s.table("attack").consolidate(min_l0=1, force=True)
s.close()
"""

RACE_READER = """
import sys, random, casmon
loc, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(seed)
s = casmon.open(loc, autoflush=None)
for i in r.sample(range(n), 200):
    got = s.lookup("attack", i.to_bytes(16, "big"))
    assert len(got) == 1 and got[0]["i"] == i, (i, got)
for i in r.sample(range(10**9, 2 * 10**9), 100):
    assert s.lookup("attack", i.to_bytes(16, "big")) == [], i
s.flush()
s.close()
"""

RACE_GC = """
import sys, casmon
s = casmon.open(sys.argv[1], autoflush=None)
s.gc(grace=0)
s.close()
"""


def _spawn(code, *args):
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _damage_copies(loc, rnd):
    """Delete or damage every copy there is now (derived data): the readers write them again."""
    for i, f in enumerate(glob.glob(os.path.join(str(loc), "records", "attack", "buckets", "*", LOOKASIDE))):
        try:
            if (i + rnd) % 2:
                os.unlink(f)
            else:
                with open(f, "r+b") as fh:
                    fh.seek(os.path.getsize(f) // 2)
                    fh.write(b"\xff\x00")
        except OSError:
            pass  # merged away meanwhile


def test_readers_writing_copies_beside_a_merging_writer_and_gc_answer_right_and_leave_nothing(tmp_path):
    loc = tmp_path / "s"
    _records_store(loc)
    n = committed = N
    for rnd in range(4):
        procs = [_spawn(RACE_WRITER, loc, n, 1500)]
        n += 1500
        procs += [_spawn(RACE_READER, loc, committed, rnd * 10 + j) for j in range(3)]
        if rnd % 2:
            procs.append(_spawn(RACE_GC, loc))
        while any(p.poll() is None for p in procs):
            _damage_copies(loc, rnd)
            try:
                procs[0].wait(timeout=0.02)  # a poll: the damage goes on until every process ended
            except subprocess.TimeoutExpired:
                pass
        outs = [(p.returncode, p.communicate(timeout=300)[0]) for p in procs]
        assert all(rc == 0 and not out.strip() for rc, out in outs), outs
        committed = n
    s = casmon.open(loc, autoflush=None)
    assert s.verify().ok
    assert sorted(rec["i"] for _k, rec in s.records("attack")) == list(range(n)), "records were lost"
    s.close()
    gens = set(os.listdir(os.path.join(str(loc), "records", "attack", "gens")))
    for folder in glob.glob(os.path.join(str(loc), "records", "attack", "buckets", "*")):
        if os.path.basename(folder) not in gens:
            assert os.listdir(folder) == [], f"files left of a generation merged away: {os.listdir(folder)}"
    assert not glob.glob(os.path.join(str(loc), "**", "*.partial"), recursive=True)


@pytest.fixture(scope="module")
def pre_lookaside_casmon(tmp_path_factory):
    """casmon as of :data:`PRE_LOOKASIDE`, from this repository's history (skipped without it)."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", PRE_LOOKASIDE, "casmon"],
                          capture_output=True, timeout=120)
    if arch.returncode != 0:
        pytest.skip(f"commit {PRE_LOOKASIDE} is not in this clone")
    dest = tmp_path_factory.mktemp("prelookaside")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch.stdout, check=True, timeout=120)
    return dest


OLD_STEPS = """
import sys, casmon
import casmon.maintenance
loc, what, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
s = casmon.open(loc, autoflush=None)
if what == "merge":  # n more records, merged with the others into one generation
    for i in range(n, n + 3000):
        s.append("attack", {"i": i}, key=i.to_bytes(16, "big"))
    s.flush()
    s.table("attack").consolidate(min_l0=1, force=True)
    n += 3000
elif what == "gc":
    s.gc(grace=0)
elif what == "repair":
    from casmon.maintenance.salvage import repair
    assert repair(s)["ok"]
rep = s.verify()
assert rep.ok, rep
for i in range(0, n, 89):
    (rec,) = s.lookup("attack", i.to_bytes(16, "big"))
    assert rec["i"] == i, rec
assert s.lookup("attack", (n + 3).to_bytes(16, "big")) == []
assert sorted(r["i"] for _k, r in s.records("attack")) == list(range(n))
s.flush()
s.close()
print(n)
"""


def test_older_casmon_and_this_one_take_turns_on_a_store_with_copies(tmp_path, pre_lookaside_casmon):
    loc = tmp_path / "s"
    gid = _records_store(loc)
    n = N
    for tree, what in [("old", "read"), ("old", "merge"), ("new", "read"), ("old", "gc"), ("old", "repair"),
                       ("new", "merge"), ("old", "read"), ("old", "merge"), ("new", "gc"), ("new", "repair"),
                       ("new", "read"), ("old", "read")]:
        path = str(pre_lookaside_casmon) if tree == "old" else str(ROOT)
        env = dict(os.environ, PYTHONPATH=path)
        p = subprocess.run([sys.executable, "-c", OLD_STEPS, str(loc), what, str(n)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert p.returncode == 0 and not p.stderr.strip(), f"{tree} casmon's {what}: {p.stderr[-3000:]}"
        n = int(p.stdout.split()[-1])
        gens = os.listdir(os.path.join(str(loc), "records", "attack", "gens"))
        for folder in glob.glob(os.path.join(str(loc), "records", "attack", "buckets", "*")):
            if os.path.basename(folder) not in gens:
                assert os.listdir(folder) == [], f"after {tree} casmon's {what}: left {os.listdir(folder)}"
    assert gid not in os.listdir(os.path.join(str(loc), "records", "attack", "gens"))
    (live,) = os.listdir(os.path.join(str(loc), "records", "attack", "gens"))
    assert os.path.isfile(_copy_path(loc, live, "records/attack/")), "this casmon's reads wrote no copy"


def test_media_without_cheap_ranged_reads_keep_no_copy_and_read_none(any_store):
    s = any_store
    for i in range(N):
        s.append("attack", {"i": i}, key=i.to_bytes(16, "big"))
    s.flush()
    s.table("attack").consolidate(min_l0=1, force=True)  # None where the flush merged them already
    gids = [k.rsplit("/", 1)[1] for k in s.backend.list("records/attack/gens/")]  # none in a zip: no merges
    has = [k for k in s.backend.list("records/attack/buckets/") if k.endswith("/" + LOOKASIDE)]
    if s.kind == "local":
        assert has, "a local folder keeps a copy"
        return
    assert not has, f"a copy was written on {s.kind}"
    for gid in gids:
        s.backend.set(f"records/attack/buckets/{gid}/{LOOKASIDE}", b"CTL1" + b"\xff" * 5000)  # never read
    r = Table(s.backend, "records/attack/", "reader")
    assert not r.lookasides
    r.refresh()
    assert all(g.lookaside is None for g in r._active_gens)
    for i in range(0, N, 211):
        (rec,) = s.lookup("attack", i.to_bytes(16, "big"))
        assert rec["i"] == i
