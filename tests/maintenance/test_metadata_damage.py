"""Damaged store metadata (gc's fence, lock, leases, claims; condemned lists; refs; casmon.json) loses no
acknowledged entry and raises nothing but casmon's errors (casmon/store/metafile.py, docs/RELIABILITY.md)."""

import json
import time
import warnings
from pathlib import Path

import pytest

import casmon
from casmon.errors import StoreDamageWarning
from casmon.maintenance import repair
from casmon.store import lock, metafile
from casmon.store.table import fence

N = 40


def square(i):
    return [i] * 50


def _build(root: Path) -> None:
    s = casmon.open(root, autoflush=None)
    sq = casmon.cache(store=s)(square)
    for i in range(N):
        sq(i)
        if i % 10 == 9:
            s.flush()
    s.put(list(range(3000)))  # garbage: gc sweeps it, and publishes its fence first
    s.flush()
    s.gc(grace=0)
    s.close()
    assert list((root / "gc" / "fence").iterdir()), "gc published a fence"


def _found(root: Path) -> int:
    """How many of the N entries a fresh store holds (looked up, never computed)."""
    s = casmon.open(root, read_only=True)
    sq = casmon.cache(store=s)(square)
    n = 0
    for i in range(N):
        try:
            assert sq.lookup(i) == [i] * 50
            n += 1
        except KeyError:
            pass
    return n


@pytest.fixture
def built(tmp_path):
    root = tmp_path / "s"
    _build(root)
    return root


def test_a_flipped_digit_in_the_fence_time_hides_no_entry_and_stops_gc(built):
    """One bit of ``"time"``'s first digit moved the fence 250 years ahead: every newer record file read as late,
    40 entries -> 10, verify said sound, and the next gc condemned their values."""
    (f,) = (built / "gc" / "fence").iterdir()
    data = bytearray(f.read_bytes())
    i = data.index(b'"time":') + len(b'"time":')
    assert data[i : i + 1] == b"1"
    data[i] ^= 0x08  # "1" -> "9"
    f.write_bytes(bytes(data))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreDamageWarning)
        assert _found(built) == N
        rep = casmon.open(built).verify()
        assert not rep.ok
        assert any(k == f"gc/fence/{f.name}" for k, _ in rep.damaged), rep.damaged
        with pytest.raises(casmon.StoreError, match=f"gc/fence/{f.name}"):
            casmon.open(built).gc(grace=0)
        assert _found(built) == N
        done = repair(casmon.open(built))
        assert done["ok"], done
        for _ in range(2):
            casmon.open(built).gc(grace=0)
        assert _found(built) == N
        assert casmon.open(built).verify().ok


@pytest.mark.parametrize("where", ["gc/fence", "gc/lock", "gc/lock-lease/abcd", "gc/lock-broken/ab-0"])
def test_deep_json_in_gc_metadata_is_damage_never_a_recursion_error(built, where):
    """Deep-nested JSON in a fence raised RecursionError into a plain cached call; in gc/lock it broke gc."""
    target = next((built / "gc" / "fence").iterdir()) if where == "gc/fence" else built / where
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"[" * 200_000 + b"]" * 200_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreDamageWarning)
        assert _found(built) == N
        rep = casmon.open(built).verify()
        assert not rep.ok and any(k.startswith(where) for k, _ in rep.damaged), rep.damaged
        assert repair(casmon.open(built))["ok"]
        for _ in range(2):
            casmon.open(built).gc(grace=0)
        assert _found(built) == N


def test_the_reader_bounds_size_depth_and_numbers():
    for bad in [b"[" * 100_000, b'{"time": NaN}', b'{"time": 1e999}', b'{"time": 1' + b"0" * 400 + b"}",
                b"\xff\xfe", b"", b'{"a": [1, 2', b"x" * (metafile.MAX_BYTES + 1)]:
        with pytest.raises(casmon.DamagedObjectError, match="gc/x"):
            metafile.load(bad, "gc/x")
    with pytest.raises(casmon.DamagedObjectError, match="not a JSON object"):
        metafile.load_object(b"[1]", "gc/x")
    assert metafile.load(b'{"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\"[[[["}', "k") == {"a": "[" * 40 + '"[[[['}


def test_a_fence_without_a_checksum_fences_nothing():
    """Fences written before checksums are read as fencing nothing (a flipped bit in one could hide records)."""
    body = {"time": 4e9, "seen": {}}
    assert not fence.parse("gc/fence/00000000000000a0-x", json.dumps(body).encode()).late("records/call/", "00000000000000a0-aa-1")
    sealed = metafile.seal({"time": 1.0e9, "seen": {}})
    assert fence.parse(f"gc/fence/{int(1.0e9 * 1e9):016x}-x", sealed).late("records/call/", "00000000000000a0-aa-1")
    with pytest.raises(casmon.DamagedObjectError, match="ahead of this host's clock"):
        fence.parse(f"gc/fence/{int(1.0e9 * 1e9):016x}-x", metafile.seal({"time": 4e9, "seen": {}}))


@pytest.mark.parametrize("body", [b"", b"garbage", b"[]", b'{"time": "x", "lease": 120}',
                                  b'{"time": 1e300, "lease": 120}', b'{"time": 0, "lease": 1e300, "nonce": "zz"}',
                                  b'{"what": "gc", "time": 9999999999, "lease": 1e18}'])
def test_a_damaged_or_crafted_lock_is_a_dead_holders_never_held_for_good(built, body):
    (built / "gc" / "lock").write_bytes(body)
    s = casmon.open(built)
    s.gc(grace=0)  # takes it over
    assert not (built / "gc" / "lock").exists()
    assert _found(built) == N


def test_a_holder_description_from_a_crafted_lock_is_one_line():
    lk = lock.StoreLock.__new__(lock.StoreLock)
    lk.holder = {"time": "soon", "what": "x" * 1000, "pid": [1], "host": None}
    assert "since ?" in lk.describe() and len(lk.describe()) < 200


def test_repair_of_an_older_damaged_fence_keeps_the_newest_fencing(tmp_path):
    """Only the newest fence decides: a damaged older one is deleted, the newest (sound) one stays as it is."""
    s = casmon.open(tmp_path / "s")
    b = s.backend
    fence.publish(b, time.time() - 100, {"records/call/": []})
    fence.publish(b, time.time(), {"records/call/": []})
    old, new = sorted(b.list(fence.FENCE_PREFIX))
    b.set(old, b"[" * 50_000)
    assert fence.read_all(b) == [(old, "nested deeper than 16 levels")]
    assert repair(s)["ok"]
    assert sorted(b.list(fence.FENCE_PREFIX)) == [new]
    assert fence.read(b).late("records/call/", "00000000000000a0-aa-1")


def test_a_cached_call_whose_claim_is_damaged_computes_and_stores(tmp_path):
    """A compute claim (refs/claims/<key>) that is deep JSON in a sound frame: the call neither raises nor waits
    for good; verify names the claim and repair removes it."""
    from casmon.caching.claims import claim_name
    from casmon.store.codec import KIND_REF, encode_frame, get_codec

    s = casmon.open(tmp_path / "s")
    calls = []

    @casmon.cache(store=s)
    def slow(x):
        calls.append(x)
        time.sleep(0.15)
        return x + 1

    key = slow.__casmon_cache__.key((1,), {})
    ref = "refs/" + claim_name(key)
    s.backend.set(ref, encode_frame(b"[" * 100_000 + b"]" * 100_000, KIND_REF, get_codec("none"))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreDamageWarning)
        assert slow(1) == 2 and calls == [1]
        s.flush()
        rep = s.verify()
        assert any(k == ref for k, _ in rep.damaged), rep.damaged
        assert repair(s)["ok"]
    assert slow(1) == 2 and calls == [1]
