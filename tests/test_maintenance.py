import json
import time
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.store.objects import loose_key

from tests._damage import flip_file


def build(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    big = np.random.default_rng(0).random(1_000_000)  # loose chunks
    keep = s.put({"big": big})
    small = s.put([1, 2, 3])
    orphan = s.put(np.random.default_rng(1).random(100_000))
    orphan_small = s.put("nobody points at me")
    s.append("call", {"n": 1}, refs=[keep, small])
    s.set_ref("named", small)
    s.flush()
    return s, keep, small, orphan, orphan_small, big


def test_stats(tmp_path):
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    st = s.stats()
    assert st["values"] == 4
    assert st["records"] == {"call": 1}
    assert st["refs"] == 1
    assert st["logical_bytes"] >= big.nbytes + 800_000
    assert st["files"] == sum(1 for p in (tmp_path / "s").rglob("*") if p.is_file())
    s.put(np.asarray(big))  # the same data again adds no chunk
    s.flush()
    assert s.stats()["chunk_bytes"] == st["chunk_bytes"] + 0 or s.stats()["chunks"] == st["chunks"]


def test_verify_clean(tmp_path):
    s, *_ = build(tmp_path)
    rep = s.verify()
    assert rep.ok, rep.as_dict()
    assert rep.checked["values"] == 4 and rep.checked["records"] == 1


def flip(path: Path, where: float = 0.5):
    flip_file(path, where, 0x40)  # a flip that changes what the file holds (some decode to the same content)


def test_verify_reports_damage_and_dependents(tmp_path):
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    chunk = next(s.manifest(keep).chunk_digests())
    flip(tmp_path / "s" / loose_key(chunk))
    rep = casmon.open(tmp_path / "s").verify()
    assert not rep.ok
    (key, reason), = rep.damaged
    assert chunk.hex() in key and "digest" in reason
    deps = rep.affected[key]
    assert f"value {keep.hex()}" in deps
    assert any(d.startswith("record call/") for d in deps)


def test_verify_reports_truncated_pack_and_deleted_chunk(tmp_path):
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    (pack,) = list((tmp_path / "s" / "packs").iterdir())
    pack.write_bytes(pack.read_bytes()[:-10])
    chunk = next(s.manifest(keep).chunk_digests())  # a chunk a record needs
    (tmp_path / "s" / loose_key(chunk)).unlink()
    rep = casmon.open(tmp_path / "s").verify()
    assert not rep.ok
    assert any("packs/" in k for k, _ in rep.damaged)
    assert any(chunk.hex() in what for what, _ in rep.missing)


def test_verify_counts_garbage_that_gc_is_collecting_piece_by_piece(tmp_path):
    """An unreachable value whose chunk gc already removed is garbage on its way out, not damage;
    the same loss under a value a record needs is reported."""
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    s.close()
    orphan_chunk = next(s.manifest(orphan).chunk_digests())
    (tmp_path / "s" / loose_key(orphan_chunk)).unlink()
    rep = casmon.open(tmp_path / "s").verify()
    assert rep.ok, rep.as_dict()
    assert rep.checked["unreachable values partly collected (gc removes the rest)"] == 1
    kept_chunk = next(s.manifest(keep).chunk_digests())
    (tmp_path / "s" / loose_key(kept_chunk)).unlink()
    rep = casmon.open(tmp_path / "s").verify()
    assert not rep.ok and any(kept_chunk.hex() in what for what, _ in rep.missing)
    assert any(keep.hex() in " ".join(deps) for deps in rep.affected.values())


def test_verify_reports_damaged_table_and_ref(tmp_path):
    s, *_ = build(tmp_path)
    (l0,) = list((tmp_path / "s" / "records" / "call" / "l0").iterdir())
    flip(l0, 0.9)
    flip(tmp_path / "s" / "refs" / "named", 0.9)
    rep = casmon.open(tmp_path / "s").verify()
    damaged = [k for k, _ in rep.damaged]
    assert any("records/call/l0" in k for k in damaged)
    assert any("refs/named" in k for k in damaged)


def test_gc_now_removes_only_unreachable(tmp_path):
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    rep = s.gc(grace=0)
    assert rep.deleted_objects >= 3  # orphan's manifest and chunk(s), orphan_small
    fresh = casmon.open(tmp_path / "s")
    assert orphan not in fresh and orphan_small not in fresh
    assert np.array_equal(fresh.get(keep)["big"], big)
    assert fresh.get(small) == [1, 2, 3]
    assert fresh.verify().ok


def test_gc_waits_for_the_grace_period(tmp_path, min_grace):
    min_grace(0.5)
    s, keep, small, orphan, orphan_small, big = build(tmp_path)
    s.close()  # the job that stored the orphans is over (a live one would keep what it put, see below)
    s = casmon.open(tmp_path / "s")
    first = s.gc(grace=0.5)
    assert first.deleted_objects == 0 and first.waiting >= 3
    assert orphan in casmon.open(tmp_path / "s")
    time.sleep(0.6)
    second = s.gc(grace=0.5)
    assert second.deleted_objects >= 3
    assert orphan not in casmon.open(tmp_path / "s")
    assert casmon.open(tmp_path / "s").verify().ok


def test_a_live_process_keeps_what_it_put_until_a_record_names_it(tmp_path, min_grace):
    """A value put and not yet named (a call still running) survives gc while its process lives."""
    min_grace(0.5)
    s = casmon.open(tmp_path / "s", autoflush=None)
    held = s.put(np.arange(100_000.0))
    s.flush()
    gc_store = casmon.open(tmp_path / "s")
    gc_store.gc(grace=0.5)  # condemns it
    time.sleep(0.6)
    s.flush()  # the holder sees the list and copies what it holds
    gc_store.gc(grace=0.5)  # sweeps the list: the old copy goes, the new one stays
    s.append("call", {"n": 1}, refs=[held])
    s.close()
    fresh = casmon.open(tmp_path / "s")
    assert fresh.verify().ok and fresh.get(held)[-1] == 99_999.0


def test_gc_dry_run_changes_nothing(tmp_path):
    s, *_ = build(tmp_path)
    before = sorted(str(p) for p in (tmp_path / "s").rglob("*"))
    rep = s.gc(grace=0, dry_run=True)
    assert rep.deleted_objects >= 3
    assert sorted(str(p) for p in (tmp_path / "s").rglob("*")) == before


def test_gc_repacks_and_keeps_live_values(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    live = [s.put(("live", i)) for i in range(10)]
    dead = [s.put(("dead", i, "x" * 200)) for i in range(90)]
    s.append("k", {}, refs=live)
    s.flush()
    rep = s.gc(grace=0)
    assert rep.repacked_packs == 1
    fresh = casmon.open(tmp_path / "s")
    assert [fresh.get(d) for d in live] == [("live", i) for i in range(10)]
    assert all(d not in fresh for d in dead)
    assert fresh.verify().ok


def test_gc_removes_old_partial_files(tmp_path):
    s, *_ = build(tmp_path)
    junk = tmp_path / "s" / "objects" / "ab" / "abc.1234.partial"
    junk.parent.mkdir(parents=True, exist_ok=True)
    junk.write_bytes(b"half")
    import os

    old = time.time() - 3600
    os.utime(junk, (old, old))
    assert s.gc(grace=0).partial_files == 1
    assert not junk.exists()
