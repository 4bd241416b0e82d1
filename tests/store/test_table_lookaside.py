"""A generation's lookaside copy (``buckets/{id}/lookup``): a fresh reader's lookups read a few checked chunks of it
where they read the manifest whole; missing, stale or damaged, the manifest is read whole, never a wrong hit or a
wrong miss; merges drop the copies of what they merge; a kill while one is written leaves a store that answers."""

from __future__ import annotations

import os
import shutil
import signal
import struct

import pytest

from casmon.store.backend import open_backend
from casmon.store.table import Table
from casmon.store.table.format import LA_HEAD, LOOKASIDE
from tests.support.tables import gen_table, random_keys

N = 30_000  # a manifest of ~38 KB: above LOOKASIDE_MIN


def _store(loc, n=N, prefix="r/", seed=1):
    keys = random_keys(n, seed=seed)
    b, t, gid = gen_table(loc, [(k, k[:5]) for k in keys], prefix=prefix)
    return b, keys, gid


def _copy_path(loc, gid, prefix="r/"):
    return os.path.join(str(loc), prefix, "buckets", gid, LOOKASIDE)


def _answers_right(b, keys, prefix="r/", lookasides=True):
    """A fresh reader finds every key of a sample with its value and none of a sample of absent keys; returns it."""
    r = Table(b, prefix, "reader")
    r.read_copies = lookasides
    for k in keys[:: max(1, len(keys) // 400)]:
        assert r.lookup(k, refresh_on_miss=False) == [k[:5]], "a stored key was missed"
    for k in random_keys(400, seed=12345):
        assert r.lookup(k, refresh_on_miss=False) == [], "an absent key was found"
    return r


def test_a_fresh_readers_lookups_read_a_few_chunks_of_the_copy_never_the_manifest_whole(tmp_path):
    b, keys, gid = _store(tmp_path / "s")
    assert os.path.isfile(_copy_path(tmp_path / "s", gid)), "the merge wrote no lookaside copy"
    whole = []
    get, get_many = b.get, b.get_many
    b.get = lambda k: (whole.append(k), get(k))[1]
    b.get_many = lambda ks: (whole.extend(ks), get_many(ks))[1]
    r = Table(b, "r/", "reader")
    r.refresh()
    (g,) = r._active_gens
    assert g.lookaside is not None
    assert r.lookup(keys[0], refresh_on_miss=False) == [keys[0][:5]]
    assert len(g.lookaside.chunks) <= g.k + 2  # a chunk a probe of the filter, one or two of the directory
    for k in keys[1:20]:
        assert r.lookup(k, refresh_on_miss=False) == [k[:5]]
    assert r.lookup(random_keys(1, seed=777)[0], refresh_on_miss=False) == []
    assert not [k for k in whole if "/gens/" in k], "a manifest was read whole"
    assert r.lookup_cached(keys[0]) is None  # its filter is read on use: unsure without I/O, never a wrong answer
    _answers_right(b, keys)


def test_the_whole_table_read_through_a_copy_is_the_table(tmp_path):
    b, keys, _gid = _store(tmp_path / "s")
    r = Table(b, "r/", "reader")
    assert sorted(r.items()) == sorted((k, k[:5]) for k in keys)
    assert r.count() == len(keys)


def _regions(data: bytes) -> dict[str, int]:
    """An offset in every byte region of a copy: each header field, its sum, the chunk sums, the JSON part, the
    zero byte, the block directory, the bloom filter (start, middle, end)."""
    _magic, _v, _z, _d, size, chunk, head = LA_HEAD.unpack_from(data, 0)
    n = -(-size // chunk)
    at = LA_HEAD.size + 8 + 8 * n
    binary = at + head + 1
    return {"magic": 1, "version": 4, "zero": 6, "digest": 10, "size": 25, "chunk": 33, "head": 37, "sum": 42,
            "first chunk sum": LA_HEAD.size + 8, "last chunk sum": at - 1, "json": at + head // 2,
            "zero byte": at + head, "directory": binary + 3, "bloom start": binary + (size - head - 1) // 3,
            "bloom middle": at + size // 2 + 7, "bloom end": at + size - 1}


def test_a_copy_damaged_in_any_byte_region_or_cut_short_reads_the_manifest_whole_and_answers_right(tmp_path):
    b, keys, gid = _store(tmp_path / "s")
    path = _copy_path(tmp_path / "s", gid)
    good = open(path, "rb").read()
    regions = _regions(good)
    variants = {f"bit flipped in {name}": good[:at] + bytes([good[at] ^ 0x10]) + good[at + 1 :]
                for name, at in regions.items()}
    variants.update({f"cut to {n} bytes": good[:n] for n in (0, 10, LA_HEAD.size, regions["json"],
                                                                  regions["bloom middle"], len(good) - 1)})
    variants["with bytes after it"] = good + b"\0" * 100
    for what, data in variants.items():
        with open(path, "wb") as f:
            f.write(data)
        b.forget(f"r/buckets/{gid}/")
        try:
            r = _answers_right(b, keys)
            assert sorted(r.items()) == sorted((k, k[:5]) for k in keys)
        except AssertionError as e:
            raise AssertionError(f"a copy with {what}: {e}") from None
        assert not r.damaged, f"a copy with {what} was reported as damage: {r.damaged}"
        r.flush()  # a reader that found the copy unsound writes a sound one
        assert open(path, "rb").read() == good or data == good + b"\0" * 100, f"a copy with {what} was not rewritten"
    os.remove(path)
    b.forget(f"r/buckets/{gid}/")
    _answers_right(b, keys).flush()
    assert open(path, "rb").read() == good, "a reader did not write the missing copy"


def test_a_stale_copy_made_from_another_manifest_is_not_read(tmp_path):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc, prefix="r/")
    _b2, keys2, gid2 = _store(loc, prefix="q/", seed=2)
    os.makedirs(os.path.dirname(_copy_path(loc, gid2, "q/")), exist_ok=True)
    shutil.copy(_copy_path(loc, gid, "r/"), _copy_path(loc, gid2, "q/"))  # r's copy where q's belongs
    b.forget("q/")
    r = _answers_right(b, keys2, prefix="q/")
    assert r._active_gens[0].lookaside is None, "a copy of another manifest was used"


def test_a_manifest_damaged_on_disk_beside_a_sound_copy_is_never_answered_wrong(tmp_path):
    """The copy was made from the manifest when it was sound; the lookups it answers are the manifest's."""
    b, keys, gid = _store(tmp_path / "s")
    mpath = os.path.join(str(tmp_path / "s"), "r", "gens", gid)
    data = bytearray(open(mpath, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(mpath, "wb").write(bytes(data))
    _answers_right(b, keys)


def test_a_merge_drops_the_copies_of_the_generations_it_merges_and_writes_its_own(tmp_path):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    t = Table(b, "r/", "w2")
    more = random_keys(N, seed=3)
    for k in more:
        t.add(k, k[:5])
    t.flush()
    new = t.consolidate(force=True)
    assert new is not None and new != gid
    assert not os.path.exists(_copy_path(loc, gid)), "a merged generation's copy was left behind"
    assert os.path.isfile(_copy_path(loc, new))
    _answers_right(b, keys + more)


def test_a_gc_like_merge_that_drops_entries_keeps_the_copy_true(tmp_path):
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    t = Table(b, "r/", "gc")
    dropped = set(keys[::20])
    new = t.consolidate(force=True, keep=lambda k, v: k not in dropped)
    assert new is not None and os.path.isfile(_copy_path(loc, new))
    r = Table(b, "r/", "reader")
    for k in keys[:400]:
        assert r.lookup(k, refresh_on_miss=False) == ([] if k in dropped else [k[:5]])


BUILD = """
import os, sys
sys.path.insert(0, os.getcwd())
from casmon.store.backend import open_backend
from casmon.store.table import Table
from tests.support.tables import random_keys
b = open_backend(sys.argv[1])
t = Table(b, "r/", "w")
for k in random_keys(%d, seed=1):
    t.add(k, k[:5])
t.flush()
if sys.argv[2:] == ["merge"]:
    t.consolidate(force=True)
"""


READ = """
import os, sys
sys.path.insert(0, os.getcwd())
from casmon.store.backend import open_backend
from casmon.store.table import Table
from tests.support.tables import random_keys
t = Table(open_backend(sys.argv[1]), "r/", "reader")
for k in random_keys(50, seed=1):
    assert t.lookup(k) == [k[:5]]
t.flush()  # writes the missing copy
"""


def _run(code, *args, env=None):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})), cwd=os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__)))))


@pytest.mark.parametrize("point", ["merge.after_manifest", "the copy's write"])
def test_a_merge_killed_before_or_while_it_writes_the_copy_leaves_a_store_that_answers(tmp_path, point):
    loc = tmp_path / "s"
    assert _run(BUILD % N, str(loc)).returncode == 0
    if point == "the copy's write":  # the last file a merge writes: count the writes on a twin store, kill at the last
        twin = tmp_path / "twin"
        shutil.copytree(loc, twin)
        count = tmp_path / "count"
        count.mkdir()
        code = BUILD.replace("t.flush()\n", "") % 0
        assert _run(code, str(twin), "merge", env={"CASMON_FAULTPOINTS": f"local.partial_written=count:{count}"}
                    ).returncode == 0
        n = len((count / "local.partial_written.count").read_text().splitlines())
        spec = f"local.partial_written@{n}=kill"
    else:
        spec = "merge.after_manifest=kill"
    p = _run(BUILD.replace("t.flush()\n", "") % 0, str(loc), "merge", env={"CASMON_FAULTPOINTS": spec})
    assert p.returncode == -signal.SIGKILL, p.stderr
    b = open_backend(loc)
    (gid,) = [k.rsplit("/", 1)[1] for k in b.list("r/gens/")]
    assert not os.path.exists(_copy_path(loc, gid)), "the kill came after the copy was in place"
    keys = random_keys(N, seed=1)
    _answers_right(b, keys).flush()
    assert os.path.isfile(_copy_path(loc, gid)), "the reader did not write the missing copy"
    _answers_right(b, keys)


def test_a_reader_killed_while_it_writes_a_missing_copy_leaves_a_store_that_answers(tmp_path):
    loc = tmp_path / "s"
    assert _run(BUILD % N, str(loc), "merge").returncode == 0
    b = open_backend(loc)
    (gid,) = [k.rsplit("/", 1)[1] for k in b.list("r/gens/")]
    os.remove(_copy_path(loc, gid))
    p = _run(READ, str(loc), env={"CASMON_FAULTPOINTS": "local.partial_written@1=kill"})
    assert p.returncode == -signal.SIGKILL, p.stderr
    assert not os.path.exists(_copy_path(loc, gid))
    keys = random_keys(N, seed=1)
    _answers_right(b, keys).flush()
    assert os.path.isfile(_copy_path(loc, gid))
    assert _answers_right(b, keys)._active_gens[0].lookaside is not None  # the copy written is read


def test_a_reader_on_a_medium_without_cheap_ranged_reads_reads_manifests_whole(tmp_path):
    b, keys, _gid = _store(tmp_path / "s")
    r = Table(b, "r/", "reader")
    r.lookasides = r.read_copies = False
    r.refresh()
    assert r._active_gens[0].lookaside is None
    _answers_right(b, keys, lookasides=False)


def test_the_copy_names_the_digest_of_the_manifest_it_copies(tmp_path):
    from casmon.store.codec import read_header

    b, _keys, gid = _store(tmp_path / "s")
    copy = open(_copy_path(tmp_path / "s", gid), "rb").read()
    manifest = b.get(f"r/gens/{gid}")
    assert struct.unpack_from("<16s", copy, 8)[0] == bytes(read_header(manifest, "m").digest)


def test_merges_counts_and_whole_reads_decide_from_manifests_never_from_copies(tmp_path):
    """A copy whose sums were recomputed over a changed manifest (crafted) can misstate a lookup's view of its
    generation, never what a merge deletes, what gc reaches, or a count: those read the manifests whole."""
    from casmon.store.codec import decode_frame
    from casmon.store.table import lookaside

    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    frame, payload = decode_frame(b.get(f"r/gens/{gid}"), "m")
    fake = bytes(payload).replace(b'"count": %d' % N, b'"count": %d' % (N + 7), 1)
    assert fake != bytes(payload)
    with open(_copy_path(loc, gid), "wb") as f:
        f.write(lookaside.encode(frame.digest, fake))
    b.forget("r/")
    r = Table(b, "r/", "reader")
    r.refresh()
    assert r._active_gens[0].count == N + 7  # the lookup's view: read through the copy
    assert r.count() == N
    assert r._active_gens[0].lookaside is None and r._active_gens[0].count == N
    assert sorted(r.items()) == sorted((k, k[:5]) for k in keys)
    w = Table(b, "r/", "w2")
    w.refresh()
    assert w._active_gens[0].count == N + 7
    w.add(keys[0][:8] + b"\1" * 8, b"new")
    w.flush()
    new = w.consolidate(force=True)
    assert new is not None
    m = Table(b, "r/", "m")
    m.read_copies = False
    assert m.count() == N + 1 and m._active_gens[0].count == N + 1


@pytest.mark.parametrize("damaged", [False, True])
def test_a_reader_that_reads_many_chunks_reads_the_rest_at_once_and_answers_right(tmp_path, monkeypatch, damaged):
    from casmon.store.table import format as fmt

    monkeypatch.setattr(fmt, "LA_SETTLE", 2)
    loc = tmp_path / "s"
    b, keys, gid = _store(loc)
    if damaged:  # a chunk no first lookup reads: the rest, read at once, fails its check
        path = _copy_path(loc, gid)
        data = bytearray(open(path, "rb").read())
        data[-3] ^= 0x01
        open(path, "wb").write(bytes(data))
    r = Table(b, "r/", "reader")
    r.refresh()
    (g,) = r._active_gens
    assert g.lookaside is not None
    for k in keys[:300]:
        assert r.lookup(k, refresh_on_miss=False) == [k[:5]]
    for k in random_keys(300, seed=4321):
        assert r.lookup(k, refresh_on_miss=False) == []
    assert g.lookaside is None and isinstance(g.bloom, memoryview)  # in memory now, as after a whole read
    assert bool(r._derive) == damaged  # a copy that failed is written again at the next flush
