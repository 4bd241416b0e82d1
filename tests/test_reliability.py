"""Reliability by fault injection: killed writers, damaged bytes, full disks, fuzzed input, gc under load.

The default run is quick: the kill campaign and the gc soak run with `pytest --runslow` only,
in a quick and a long variant (50+ kills, a longer soak). Figures are printed at the end of the run ("reliability figures").
"""

import errno
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.store.codec import decode_frame
from casmon.errors import CasmonError, DamagedObjectError, MissingObjectError
from casmon.maintenance import remove_partials, repair
from casmon.store.objects import loose_key
from casmon.store.table import TableFile
from tests.support.damage import flip_at
from tests.conftest import ROOT, run_python

# ---------------------------------------------------------------------------
# Damage: every kind of object, flipped, truncated or deleted
# ---------------------------------------------------------------------------


def build_store(path: Path):
    s = casmon.open(path, autoflush=None)
    big = np.random.default_rng(0).random(100_000)  # loose chunks
    d_big = s.put(big)
    d_small = s.put({"small": [1, 2, 3]})

    @casmon.cache(store=s)
    def f(x):
        return np.full(50_000, x)

    for i in range(3):  # three flushes: three segments per table from one writer
        f(i)
        s.put(("round", i))
        s.append("note", {"n": i}, refs=[d_big, d_small])
        s.flush()
    s.set_ref("best", d_small)
    with casmon.record(comment="r", store=s, capture_output=False):
        pass
    s.close()
    return d_big, d_small, f


def objects_of_kind(root: Path, kind: str) -> list[Path]:
    pattern = {"chunk": "objects/*/*", "pack": "packs/*", "records": "records/*/l0/*", "index": "index/l0/*", "ref": "refs/**/*"}[kind]
    return sorted(p for p in root.glob(pattern) if p.is_file())


def damage(path: Path, how: str, rng: random.Random) -> int:
    data = bytearray(path.read_bytes())
    if how == "flip":
        out, _ = flip_at(bytes(data), rng.randrange(len(data)), 1 << rng.randrange(8))  # a flip that changes content
        path.write_bytes(out)
        return 1
    if how == "truncate":
        cut = rng.randrange(1, max(2, len(data)))
        path.write_bytes(bytes(data[: len(data) - cut]))
        return cut
    path.unlink()
    return len(data)


@pytest.mark.parametrize("kind", ["chunk", "pack", "records", "index", "ref"])
@pytest.mark.parametrize("how", ["flip", "truncate", "delete"])
def test_damage_is_detected_named_and_repaired(tmp_path, kind, how, figures):
    root = tmp_path / "s"
    d_big, d_small, _ = build_store(root)
    rng = random.Random(f"{kind}/{how}")  # the same victim in every run (str seeds do not depend on hash())
    candidates = objects_of_kind(root, kind)
    if how == "delete" and kind in ("records", "index"):
        candidates = candidates[:1]  # a writer's newest segment leaves no trace when deleted (docs/RELIABILITY.md)
    if how == "delete" and kind == "ref":
        candidates = [p for p in candidates if "runs" in p.parts]  # a ref no record stands behind is like a deleted branch
    victim = rng.choice(candidates)
    rel = victim.relative_to(root).as_posix()
    nbytes = damage(victim, how, rng)
    figures(f"damaged objects ({how})")
    figures("bytes corrupted or removed", nbytes)
    s = casmon.open(root)
    rep = s.verify()
    assert not rep.ok, f"{how} of {rel} went unnoticed"
    text = json.dumps(rep.as_dict())
    assert rel.rsplit("/", 1)[-1] in text or how == "delete", f"the report names {rel}: {text[:500]}"
    figures("damage detected by verify")
    # Reads never return wrong data: they raise, naming what is wrong, or return the right value.
    for d, expected in ((d_big, np.random.default_rng(0).random(100_000)), (d_small, {"small": [1, 2, 3]})):
        try:
            value = casmon.open(root).get(d)
        except (DamagedObjectError, MissingObjectError) as e:
            assert str(e)
            continue
        if isinstance(expected, np.ndarray):
            assert np.array_equal(value, expected)
        else:
            assert value == expected
    done = repair(casmon.open(root))
    assert done["ok"], done
    assert casmon.open(root).verify().ok
    figures("stores repaired to a clean verify")


def test_cache_recomputes_instead_of_returning_damage(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    calls = []

    @casmon.cache(store=s)
    def small(x):
        calls.append(x)
        return {"x": x, "list": list(range(200))}  # too large to travel inline in its cache entry

    small(1)
    s.flush()
    (pack,) = objects_of_kind(tmp_path / "s", "pack")
    data = bytearray(pack.read_bytes())
    data[-3] ^= 0xFF
    pack.write_bytes(bytes(data))
    s2 = casmon.open(tmp_path / "s", autoflush=None)
    again = casmon.cache(store=s2)(small.__wrapped__)
    with pytest.warns(casmon.CacheWarning, match="damaged"):
        assert again(1) == {"x": 1, "list": list(range(200))}
    assert calls == [1, 1]


# ---------------------------------------------------------------------------
# Killed writers
# ---------------------------------------------------------------------------

WORKLOAD = textwrap.dedent(
    """
    import sys, casmon, numpy as np
    store = casmon.open(sys.argv[1], autoflush=0.2)

    @casmon.cache(store=store)
    def prep(i):
        return np.full(2000 + (i % 7) * 1000, i, dtype=np.float64)

    @casmon.intercept(store=store)
    def step(i, a):
        return float(a[0])

    print("ready", flush=True)
    with casmon.record(comment="soak", store=store, capture_output=False) as run:
        print("recording", flush=True)
        i = 0
        while True:
            a = prep(i % 50)
            step(i, a)
            if i % 40 == 39:
                casmon.flush()
                print("flushed", i, flush=True)
            i += 1
    """
)


def _one_kill(loc: str, rng: random.Random) -> tuple[int, int]:
    """Start the workload, kill it at a random moment; returns (session, last flushed call number)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_MIN_GRACE="60")
    p = subprocess.Popen([sys.executable, "-c", WORKLOAD, loc], env=env, stdout=subprocess.PIPE, text=True,
                         cwd=Path(loc).parent)
    assert p.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + rng.uniform(0.05, 1.5)
    os.set_blocking(p.stdout.fileno(), False)
    text = ""
    while time.monotonic() < deadline:
        time.sleep(0.01)
        try:
            text += p.stdout.read() or ""
        except (BlockingIOError, TypeError):
            pass
    p.send_signal(signal.SIGKILL)
    p.wait()
    text += p.stdout.read() or ""
    # Only whole lines count: "flushed N" is printed after the flush returned.
    lines = text.split("\n")[:-1]
    flushed = [int(line.split()[1]) for line in lines if line.startswith("flushed ")]
    return p.pid, max(flushed, default=-1), "recording" in lines


@pytest.mark.parametrize("kills", [pytest.param(8, id="quick", marks=pytest.mark.slow),
                                   pytest.param(60, id="long", marks=pytest.mark.slow)])  # a kill campaign: --runslow
def test_sigkill_at_random_moments(tmp_path, kills, figures):
    loc = str(tmp_path / "s")
    rng = random.Random(1234 + kills)
    for k in range(kills):
        pid, last, started = _one_kill(loc, rng)
        figures("writers killed with SIGKILL")
        s = casmon.open(loc)
        rep = s.verify()
        assert rep.ok, f"after kill {k}: {rep.as_dict()}"
        log = casmon.load(s)
        calls = log.calls("step", process=pid) if "step" in [n.rsplit(".", 1)[-1] for n in log.functions] else []
        got = sorted(c.n for c in calls)
        # Every call flushed before the kill is there (numbers count from 1, i from 0).
        assert got[: last + 1] == list(range(1, last + 2)), f"kill {k}: flushed up to i={last}, log has {len(got)}"
        figures("flushed calls checked after kills", last + 1)
        for c in calls[-3:]:
            assert c.inputs()[0][0] == c.n - 1 and c.result() == float((c.n - 1) % 50)
        if started:
            assert any(r.manifest.get("pid") == pid for r in casmon.list_runs(s)), \
                "the run started before the kill is listed"
    # Temporary files of killed writers are never data, and gc removes them.
    s = casmon.open(loc)
    partials = list(Path(loc).rglob("*.partial"))
    assert s.verify().ok
    assert remove_partials(s, 0) == len(partials)
    assert not list(Path(loc).rglob("*.partial"))
    s.gc(grace=0)
    assert casmon.open(loc).verify().ok
    figures("records lost beyond the flush window", 0)


# ---------------------------------------------------------------------------
# Full disk, read-only stores
# ---------------------------------------------------------------------------


def test_full_disk(tmp_path, monkeypatch, figures):
    s = casmon.open(tmp_path / "s", autoflush=None)
    s.put("before")
    s.flush()

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    for name in ("create", "create_async", "create_frame", "create_many", "set"):
        monkeypatch.setattr(s.backend, name, enospc)

    @casmon.cache(store=s)
    def compute(x):
        return np.arange(x)

    @casmon.intercept(store=s)
    def logged(a):
        return len(a)

    with pytest.warns(casmon.CacheWarning, match="No space left"):
        assert len(compute(300_000)) == 300_000  # the computed result is returned
    with pytest.warns(casmon.CallLogWarning):
        assert logged(np.arange(300_000)) == 300_000
    with pytest.raises(casmon.StoreError, match="No space left"):
        s.flush()
    with pytest.raises(casmon.StoreError, match="No space left"):
        s.put(np.arange(400_000))
    assert casmon.open(tmp_path / "s").verify().ok, "nothing damaged is visible"
    monkeypatch.undo()
    s.flush()  # space again: what waited is written
    assert casmon.open(tmp_path / "s").verify().ok
    figures("bad inputs and failures tried", 5)


def test_read_only_store(tmp_path, figures):
    casmon.open(tmp_path / "s").close()
    ro = casmon.open(tmp_path / "s", read_only=True)

    @casmon.cache(store=ro)
    def f(x):
        return x * 2

    with pytest.warns(casmon.CacheWarning, match="read-only"):
        assert f(21) == 42
    with pytest.raises(casmon.StoreError, match="read-only"):
        ro.put(1)
    figures("bad inputs and failures tried", 2)


# ---------------------------------------------------------------------------
# Fuzz: random bytes never crash a reader or come back as data
# ---------------------------------------------------------------------------

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=400))
def test_random_bytes_are_rejected_as_frames_and_table_files(data):
    with pytest.raises(DamagedObjectError):
        decode_frame(data, "fuzz")
    try:
        tf = TableFile("fuzz", data)
    except DamagedObjectError:
        return
    list(tf.items())  # if it parses, it is a consistent table file


@FUZZ
@given(st.binary(min_size=1, max_size=300), st.integers(min_value=0, max_value=10_000))
def test_mutated_record_files_are_rejected_cleanly(tmp_path_factory, noise, where):
    root = tmp_path_factory.mktemp("fuzz")
    s = casmon.open(root / "s", autoflush=None)
    for i in range(20):
        s.append("call", {"i": i, "text": "x" * i})
    s.flush()
    (l0,) = objects_of_kind(root / "s", "records")
    data = bytearray(l0.read_bytes())
    pos = where % len(data)
    data[pos : pos + len(noise)] = noise
    l0.write_bytes(bytes(data))
    try:
        recs = [r for _, r in casmon.open(root / "s").records("call")]
    except DamagedObjectError:
        return
    assert sorted(r["i"] for r in recs) == list(range(20)), "if it reads, it reads right"


def test_fingerprints_are_stable_across_processes_property():
    rng = random.Random(7)
    values = [
        {"a": [rng.random() for _ in range(5)], "b": {"x", "y", str(rng.random())}, "c": (1, None, b"z")},
        np.random.default_rng(3).random((7, 3)),
        [frozenset({1, 2, 3}), {"nested": {"deep": [1, [2, [3]]]}}],
    ]
    code = "import pickle, sys, casmon\nvals = pickle.loads(bytes.fromhex(sys.argv[1]))\nprint(' '.join(str(casmon.fingerprint(v)) for v in vals))\n"
    import pickle

    blob = pickle.dumps(values).hex()
    outs = {run_python(code, blob, env={"PYTHONHASHSEED": str(seed)}).stdout.strip() for seed in (0, 1, 99)}
    assert outs == {" ".join(str(casmon.fingerprint(v)) for v in values)}


# ---------------------------------------------------------------------------
# Soak: writers and gc at the same time
# ---------------------------------------------------------------------------

SOAK_WRITER = textwrap.dedent(
    """
    import sys, time, casmon, numpy as np
    store = casmon.open(sys.argv[1], autoflush=None)
    until = time.time() + float(sys.argv[2])
    w = int(sys.argv[3])

    @casmon.cache(store=store)
    def shared(i):
        return np.full(40_000, i % 10, dtype=np.float64)   # the same results again and again: dedup

    @casmon.intercept(store=store)
    def use(i, a):
        return float(a.sum())

    i = 0
    while time.time() < until:
        use(i, shared(i % 25))
        if i % 10 == 9:
            store.flush()
        i += 1
    store.flush()
    print(i)
    """
)

SOAK_GC = textwrap.dedent(
    """
    import sys, time, casmon
    until = time.time() + float(sys.argv[2])
    n = 0
    while time.time() < until:
        casmon.open(sys.argv[1]).gc(grace=float(sys.argv[3]))
        n += 1
        time.sleep(0.2)
    print(n)
    """
)


@pytest.mark.parametrize("seconds", [pytest.param(8, id="quick", marks=pytest.mark.slow),
                                     pytest.param(60, id="long", marks=pytest.mark.slow)])  # a soak: --runslow
def test_gc_never_removes_what_writers_use(tmp_path, seconds, figures):
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_MIN_GRACE="2")  # the most aggressive grace: 2 s
    writers = [subprocess.Popen([sys.executable, "-c", SOAK_WRITER, loc, str(seconds), str(w)], env=env,
                                stdout=subprocess.PIPE, text=True) for w in range(3)]
    gcs = subprocess.Popen([sys.executable, "-c", SOAK_GC, loc, str(seconds), "2.0"], env=env, stdout=subprocess.PIPE, text=True)
    counts = [int(p.communicate(timeout=seconds + 120)[0].strip()) for p in writers]
    gc_runs = int(gcs.communicate(timeout=seconds + 120)[0].strip())
    assert all(p.returncode == 0 for p in writers + [gcs])
    s = casmon.open(loc)
    rep = s.verify()
    assert rep.ok, rep.as_dict()
    log = casmon.load(s)
    calls = log.calls("use")
    assert len(calls) == sum(counts)
    for c in calls[:: max(1, len(calls) // 50)]:
        i, a = c.inputs()[0]
        assert a[0] == (i % 25) % 10 and c.result() == float(a.sum())
    figures("soak: calls written while gc ran", sum(counts))
    figures("soak: gc runs", gc_runs)


def test_every_byte_of_a_pack_is_covered(tmp_path):
    """Flip each byte of a small pack in turn: verify notices every one."""
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put({"a": 1})
    s.set_ref("x", d)
    s.close()
    (pack,) = objects_of_kind(tmp_path / "s", "pack")
    original = pack.read_bytes()
    for i in range(len(original)):
        data = bytearray(original)
        data[i] ^= 0x01
        pack.write_bytes(bytes(data))
        assert not casmon.open(tmp_path / "s").verify().ok, f"a flip at byte {i} of {len(original)} went unnoticed"
    pack.write_bytes(original)
    assert casmon.open(tmp_path / "s").verify().ok
