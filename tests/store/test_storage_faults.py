"""Storage faults on S3 never reach user code, never block gc, never leave a record naming a removed value.

The S3 tests put a fault-injecting proxy (tests/support/s3proxy.py) between casmon and a real moto
server; moto, read directly, is the ground truth. The rest stop a writer at a fault point or craft
what a late write leaves.
"""

import json
import os
import subprocess
import sys
import threading
import time
import warnings

import pytest

import casmon
from casmon.store import condemned, lock
from tests.conftest import ROOT, run_python
from tests.support.s3proxy import Rule
from tests.support.stores import assert_no_record_names_a_removed_value

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::casmon.CacheWarning",
                                        "ignore::casmon.RunWarning")


def _open(proxy_bucket, name="s", **kw):
    _proxy, bucket = proxy_bucket
    return casmon.open(f"s3://{bucket}/{name}", **kw)


def _direct(moto_server, bucket, name="s"):
    """The same store read straight from moto: what is really there."""
    return casmon.open(f"s3://{bucket}/{name}", storage_options={"endpoint": moto_server}, create=False)


def _workload(s, calls):
    """Cache hits and misses, a logged call and a recorded run; returns the results, raising nothing of casmon's."""

    @casmon.cache(store=s)
    def square(x):
        calls.append(x)
        return x * x

    @casmon.intercept(store=s)
    def logged(x):
        return x + 1

    out = []
    with casmon.record(store=s, capture_output=False) as run:
        for x in range(6):
            out.append(square(x))
            out.append(logged(x))
        run.info["done"] = True
    return out


@pytest.mark.parametrize("outages", [pytest.param(((1.0, "503"), (3.0, "reset")), id="three-seconds"),
                                     pytest.param(((1.0, "503"), (10.0, "reset")), id="ten-seconds",
                                                  marks=pytest.mark.slow)])
def test_a_one_second_503_burst_and_a_ten_second_outage_reach_no_user_code(s3_proxy, moto_server, outages):
    proxy, bucket = s3_proxy
    s = _open(s3_proxy)
    calls: list[int] = []
    expected = [v for x in range(6) for v in (x * x, x + 1)]
    assert _workload(s, calls) == expected  # warm: misses, then written
    s.flush()
    for seconds, mode in outages:
        seen = proxy.counts()
        proxy.outage(seconds, mode, from_first_request=True)
        assert _workload(s, calls) == expected  # hits and the run's writes meet the outage
        s.flush()
        assert proxy.counts() > seen
    assert proxy.counts(action="status") > 0 and proxy.counts(action="reset") > 0
    direct = _direct(moto_server, bucket)
    assert direct.verify().ok
    runs = casmon.list_runs(direct)
    assert [r.status for r in runs] == ["ok", "ok", "ok"] and all(r.info()["done"] for r in runs)


def test_a_store_away_longer_than_the_retries_costs_each_call_one_attempt(s3_proxy, moto_server):
    """A cache hit that cannot read computes; a miss returns its result; one warning; what could not be
    written waits for the next flush."""
    np = pytest.importorskip("numpy")
    proxy, bucket = s3_proxy
    s = _open(s3_proxy)
    s.backend.retrier.seconds = 1.0
    calls: list[int] = []

    def f(x):
        calls.append(x)
        return np.arange(x, x + 200_000)

    cached = casmon.cache(store=s)(f)
    for x in range(4):
        assert cached(x)[0] == x
    s.flush()
    s.objects.clear_caches()
    fresh = casmon.cache(store=s)(f)  # no memory of these hits: it reads the store
    calls.clear()
    proxy.outage(60.0, "reset")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        results = [fresh(0)]
        retried = s.backend.retrier.retries
        assert retried > 0 and s.backend.retrier.down_since is not None
        results += [fresh(x) for x in (1, 2, 3, 4, 5)]
    assert [r[0] for r in results] == [0, 1, 2, 3, 4, 5] and calls == [0, 1, 2, 3, 4, 5]
    assert [str(m.message) for m in w if "cannot be read" in str(m.message)], [str(m.message) for m in w]
    assert s.backend.retrier.retries == retried, "once down, each request is tried once, not retried for a budget"
    proxy.clear()
    s.flush()  # the store is back: what waited is written
    direct = _direct(moto_server, bucket)
    assert direct.verify().ok
    assert {int(r["size"]) for _, r in direct.records("cache")} == {200_000 * 8}


def test_a_lost_reply_to_the_gc_lock_put_blocks_no_later_gc(s3_proxy, moto_server, min_grace):
    proxy, bucket = s3_proxy
    min_grace(1.0)
    s = _open(s3_proxy)
    s.put({"orphan": 1})
    s.flush()
    rule = proxy.add(Rule("drop_after", method="PUT", path="gc/lock", times=1))
    s.gc(grace=1.0)  # the lock landed, its reply was lost: the retry finds it is this gc's own
    assert rule.applied == 1
    assert _direct(moto_server, bucket).backend.get(lock.LOCK_KEY) is None, "released"
    s.gc(grace=1.0)  # the next gc in this process runs
    code = f"""
import casmon
s = casmon.open("s3://{bucket}/s", create=False)
print(s.gc(grace=1.0).as_dict())
"""
    env = {"AWS_ENDPOINT_URL": moto_server, "CASMON_MIN_GRACE": "1"}
    assert "live_values" in run_python(code, env=env).stdout  # and another process's gc runs


def test_a_taker_whose_lock_create_failed_leaves_no_lock_behind(s3_proxy, moto_server):
    """The create's reply was lost and every retry failed too: the taker deletes the lock if it holds its token."""
    proxy, bucket = s3_proxy
    s = _open(s3_proxy)
    s.backend.retrier.seconds = 0.5
    proxy.add(Rule("drop_after", method="PUT", path="gc/lock", times=1))
    proxy.add(Rule("reset", method="PUT", path="gc/lock", duration=2.0))
    with pytest.raises(casmon.StoreError):
        lock.StoreLock(s.backend, "gc").acquire()
    proxy.clear()
    assert _direct(moto_server, bucket).backend.get(lock.LOCK_KEY) is None


def test_a_blip_as_a_run_ends_leaves_it_ok_with_its_info_once_the_store_is_back(s3_proxy, moto_server):
    proxy, bucket = s3_proxy
    s = _open(s3_proxy)
    s.backend.retrier.seconds = 0.5
    with casmon.record(store=s, capture_output=False) as run:
        print("hello")
        run.info["loss"] = 0.25
        proxy.outage(3.0, "503")
    # The end could not be written; the run goes on being written by every later flush.
    with pytest.raises(casmon.StoreError):
        s.flush()
    time.sleep(3.0)
    s.flush()
    r = casmon.list_runs(_direct(moto_server, bucket))
    assert [x.status for x in r] == ["ok"] and r[0].info()["loss"] == 0.25


def test_a_run_started_while_the_store_is_away_is_written_when_it_is_back(s3_proxy, moto_server):
    proxy, bucket = s3_proxy
    s = _open(s3_proxy)
    s.backend.retrier.seconds = 0.5
    proxy.outage(2.0, "reset", from_first_request=True)
    with pytest.warns(casmon.RunWarning, match="later flush"):
        with casmon.record(store=s, capture_output=False, comment="away") as run:
            run.info["k"] = 1
            time.sleep(2.5)
    s.flush()
    r = casmon.list_runs(_direct(moto_server, bucket))
    assert [(x.name, x.status, x.info()["k"]) for x in r] == [("1-away", "ok", 1)]


GC_LOOP = """
import os, sys, time, casmon
from casmon.store import condemned
condemned.configure(float(sys.argv[2]))
s = casmon.open(sys.argv[1], create=False)
end = time.time() + float(sys.argv[3])
runs = deleted = 0
stop = sys.argv[4] if len(sys.argv) > 4 else ""
while time.time() < end and not (stop and os.path.exists(stop)):
    try:
        deleted += s.gc(grace=float(sys.argv[2])).deleted_objects
        runs += 1
    except casmon.StoreError:
        pass
    time.sleep(0.2)
print(runs, deleted)
"""


class _GcLoop:
    """gc in a loop in a process of its own, at ``grace``, for at most ``seconds`` or until :meth:`stop`."""

    def __init__(self, url, grace, seconds, endpoint):
        import tempfile

        self._stop = os.path.join(tempfile.mkdtemp(), "stop")
        env = dict(os.environ, PYTHONPATH=str(ROOT), AWS_ENDPOINT_URL=endpoint, CASMON_MIN_GRACE=str(grace))
        self.proc = subprocess.Popen([sys.executable, "-c", GC_LOOP, url, str(grace), str(seconds), self._stop],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def communicate(self, timeout=60):
        """Stop the loop; ``(stdout, stderr)``: stdout is "runs deleted"."""
        open(self._stop, "w").close()
        return self.proc.communicate(timeout=timeout)


def _gc_loop(url, grace, seconds, endpoint):
    return _GcLoop(url, grace, seconds, endpoint)


@pytest.mark.slow  # 9 s: a soak of the held-request cases the default run keeps
def test_record_puts_held_6s_with_gc_at_grace_1s_never_name_a_removed_value(s3_proxy, moto_server, min_grace):
    proxy, bucket = s3_proxy
    min_grace(1.0)
    s = _open(s3_proxy, autoflush=None)
    calls: list[int] = []

    @casmon.cache(store=s)
    def f(x):
        calls.append(x)
        return list(range(x, x + 50))

    gc = _gc_loop(f"s3://{bucket}/s", 1.0, 14.0, moto_server)
    try:
        time.sleep(1.0)
        rule = proxy.add(Rule("hold", method="PUT", path="records/cache/l0/", delay=6.0, times=1))
        for x in range(5):
            assert f(x) == list(range(x, x + 50))
        s.flush()  # held 6 s: slow, so sealed anew, checked again, written again
        assert rule.applied == 1 and s.late_writes >= 1
    finally:
        out, err = gc.communicate(timeout=60)
    assert int((out.split() or ["0"])[0]) >= 3, err
    direct = _direct(moto_server, bucket)
    assert_no_record_names_a_removed_value(direct)
    calls.clear()
    assert [f(x) for x in range(5)] == [list(range(x, x + 50)) for x in range(5)]


WRITER_DIES = """
import os, sys, casmon
s = casmon.open(sys.argv[1], autoflush=None, storage_options={"client_options": {"timeout": "2s"}})
s.backend.retrier.seconds = 1.0

@casmon.cache(store=s)
def f(x):
    return list(range(x, x + 50))

for x in range(5):
    f(x)
try:
    s.flush()
except casmon.StoreError as e:
    print("flush failed:", e)
os._exit(0)  # dies after its failed flush; the held PUT lands later
"""


@pytest.mark.slow  # 13 s: the default run keeps the held-request cases below
def test_a_record_put_landing_after_its_dead_writers_flush_failed_is_not_a_record(s3_proxy, moto_server, min_grace):
    """Scaled from the issue's 75 s at the default grace: the held PUT lands long after gc swept its values."""
    proxy, bucket = s3_proxy
    min_grace(2.0)
    url = f"s3://{bucket}/s"
    casmon.open(url).close()
    proxy.add(Rule("hold", method="PUT", path="records/cache/l0/", delay=9.0))
    env = {"AWS_ENDPOINT_URL": proxy.url, "CASMON_MIN_GRACE": "2"}
    gc = _gc_loop(url, 2.0, 14.0, moto_server)
    try:
        assert "flush failed" in run_python(WRITER_DIES, url, env=env).stdout
        assert proxy.wait_idle(timeout=30)
    finally:
        gc.communicate(timeout=60)
    direct = _direct(moto_server, bucket)
    landed = direct.backend.list("records/cache/l0/")
    assert landed, "the held PUT did land"
    assert_no_record_names_a_removed_value(direct)
    assert list(direct.records("cache")) == []
    direct.table("cache").consolidate(force=True)
    assert direct.backend.list("records/cache/l0/") == [], "a merge deletes the late file"


def test_values_of_a_record_waiting_for_a_late_flush_stay_held(tmp_path, min_grace):
    """autoflush=None: the record of a call waits for the flush; gc at its most aggressive must not take
    the call's argument meanwhile, and the warning counts what was cut truly."""
    np = pytest.importorskip("numpy")
    min_grace(0.6)
    loc = tmp_path / "s"
    s = casmon.open(loc, autoflush=None)
    value = np.arange(400_000)  # its chunks are written at once, its manifest waits for the flush
    d = s.put(value)
    s.append("call", {"n": 1}, refs=[d])  # pending: nothing in the store reaches d's chunks yet
    other = casmon.open(loc)
    swept = 0
    for _ in range(8):
        swept += other.gc(grace=0.6).deleted_objects
        time.sleep(0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        s.flush()
    fresh = casmon.open(loc)
    assert [r["n"] for _, r in fresh.records("call")] == [1] and (fresh.get(d) == value).all()
    assert fresh.verify().ok
    assert swept > 0, "gc did sweep: the copies it condemned were the held value's old ones"


def test_a_gc_whose_clock_runs_30s_ahead_does_not_sweep_early_on_s3(s3_env, min_grace, monkeypatch):
    """On S3 a list's age is judged by the storage's clock too (its landing time against the gc lock's)."""
    min_grace(3.0)
    _env, bucket = s3_env
    url = f"s3://{bucket}/s"
    s = casmon.open(url, autoflush=None)
    s.put(list(range(5000)))  # an orphan: nothing will ever name it
    s.close()
    assert casmon.open(url).gc(grace=3.0).condemned >= 1  # published now, by a gc with a right clock
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 30.0)
    early = casmon.open(url).gc(grace=3.0)
    monkeypatch.setattr(time, "time", real)
    assert early.deleted_objects == 0 and early.waiting >= 1, early.as_dict()
    time.sleep(3.5)
    assert casmon.open(url).gc(grace=3.0).deleted_objects >= 1, "once the grace has passed by every clock"


def test_a_writer_frozen_inside_its_record_write_past_the_grace_writes_no_record_naming_a_removed_value(
        tmp_path, min_grace):
    """Stopped between writing its record file and linking it into place, for longer than gc's grace: the
    file lands after gc marked without it, so readers list past it, and the writer, when it goes on, notices and
    checks its values again before it writes the records anew."""
    from casmon import faultpoints

    min_grace(1.0)
    loc = tmp_path / "s"
    s = casmon.open(loc, autoflush=None)
    d = s.put(list(range(3000)))
    s.append("cache", {"fn": "f", "result": d.hex(), "time": time.time()}, refs=[d])
    pauses = tmp_path / "pause"
    pauses.mkdir()
    faultpoints.configure(f"local.partial_written@3=pause:{pauses}")  # the pack, the index, then the records
    try:
        t = threading.Thread(target=s.flush)
        t.start()
        deadline = time.monotonic() + 30
        while not (pauses / "local.partial_written.reached").exists():
            assert time.monotonic() < deadline and t.is_alive()
            time.sleep(0.01)
        assert list((loc / "records" / "cache" / "l0").glob("*.partial")), "stopped inside the record write"
        gc = casmon.open(loc)
        swept = 0
        for _ in range(12):
            swept += gc.gc(grace=1.0).deleted_objects
            time.sleep(0.25)
        assert swept >= 1, "gc swept the value while the writer was stopped"
        (pauses / "local.partial_written.go").touch()
        t.join(timeout=60)
    finally:
        faultpoints.configure("")
    assert s.late_writes >= 1
    fresh = casmon.open(loc)
    assert_no_record_names_a_removed_value(fresh)
    assert list(fresh.records("cache")) == [], "its value was gone: the record was dropped, with a warning"


def test_a_copied_store_keeps_every_record(tmp_path, min_grace):
    """The fence judges by names and gc's published fence only: copying a store (which gives every file
    new times) hides nothing."""
    import shutil

    min_grace(0.5)
    loc = tmp_path / "s"
    s = casmon.open(loc, autoflush=None)
    s.put(list(range(2000)))  # garbage, so that gc sweeps and publishes its fence
    s.flush()
    for i in range(5):
        s.append("call", {"n": i}, refs=[s.put({"i": i})])
        s.flush()  # one level-0 file each
    for _ in range(3):
        casmon.open(loc).gc(grace=0.5)
        time.sleep(0.6)
    assert (loc / "gc" / "fence").exists()
    time.sleep(0.6)
    shutil.copytree(loc, tmp_path / "copy")
    for where in (loc, tmp_path / "copy"):
        fresh = casmon.open(where)
        assert sorted(r["n"] for _, r in fresh.records("call")) == list(range(5)), where
        assert fresh.verify().ok


def test_two_files_of_one_writer_and_number_count_once(tmp_path):
    """A batch written again after a slow write keeps its number: readers take the newest file only."""
    from casmon.store.table import fence

    loc = tmp_path / "s"
    s = casmon.open(loc, autoflush=None)
    s.append("call", {"n": 1}, refs=[s.put({"i": 1})])
    s.flush()
    l0 = loc / "records" / "call" / "l0"
    (first,) = [p.name for p in l0.iterdir()]
    again = fence.renamed(first, time.time_ns())
    (l0 / again).write_bytes((l0 / first).read_bytes())
    fresh = casmon.open(loc)
    assert [r["n"] for _, r in fresh.records("call")] == [1]
    assert fresh.verify().ok
    assert fresh.table("call").l0_listed() == [again]


@pytest.mark.parametrize("prefix", ["records/call/l0/",
                                    # the rest with --runslow (the default run's time budget)
                                    *(pytest.param(p, marks=pytest.mark.slow)
                                      for p in ("packs/", "refs/", "index/l0/", "gc/condemned/", "gc/fence/"))])
def test_any_request_held_past_the_grace_leaves_no_record_naming_a_removed_value(s3_proxy, moto_server, min_grace,
                                                                                  prefix):
    """Each step's PUT held 3 s (a writer's pack, index, records and refs; gc's list and fence) while gc
    loops at grace 1 s and a writer logs calls whose arguments a dead job left condemned."""
    proxy, bucket = s3_proxy
    min_grace(1.0)
    url = f"s3://{bucket}/s"
    dead = casmon.open(url, autoflush=None)
    args = [list(range(i, i + 300)) for i in range(4)]
    for a in args:
        dead.put(a)  # a dead job's values: unreachable, soon condemned
    dead.close()
    gc = _gc_loop(url, 1.0, 20.0, proxy.url)
    try:
        time.sleep(2.0)  # condemned by now
        proxy.add(Rule("hold", method="PUT", path=prefix, delay=3.0, times=1))
        s = _open(s3_proxy, autoflush=None)

        @casmon.intercept(store=s)
        def logged(a):
            return len(a)

        for a in args:
            assert logged(a) == 300
        s.set_ref("keep", s.put(args[0]))
        try:
            s.flush()
        except casmon.StoreError:
            s.flush()
        s.close()
        time.sleep(1.5)  # and gc sweeps on after the writer
    finally:
        gc.communicate(timeout=60)
    direct = _direct(moto_server, bucket)
    assert_no_record_names_a_removed_value(direct)
    calls = casmon.load(direct).calls()
    assert sorted(c.inputs()[0][0][0] for c in calls) == [0, 1, 2, 3]
    assert direct.get(direct.get_ref("keep").target) == args[0]


def test_a_fence_that_lands_after_a_newer_one_changes_nothing(tmp_path):
    """Each gc's fence is a file of its own, named by its mark time: readers take the newest."""
    from casmon.store.table import fence

    s = casmon.open(tmp_path / "s")
    b = s.backend
    old_name = "00000000000000a0-aaaa-000001"
    fence.publish(b, time.time(), {"records/call/": []})  # a newer gc: fences everything sealed long ago
    assert fence.read(b).late("records/call/", old_name)
    b.create(fence.FENCE_PREFIX + "0000000000000001-late", b'{"time": 1.0, "seen": {}}')  # an old gc's, landing now
    assert fence.read(b).late("records/call/", old_name)


def test_a_value_relied_on_stays_while_the_flush_that_names_it_is_held(s3_proxy, moto_server, min_grace):
    """The writer deduplicated against a value a dead job left; gc condemns and sweeps it while the flush's
    pack PUT is held for longer than the grace. The flush copies it meanwhile (into memory) and writes the
    copy before its record: the record is written, and its flush returned honestly."""
    proxy, bucket = s3_proxy
    min_grace(1.0)
    url = f"s3://{bucket}/s"
    orphan = list(range(5000))
    dead = casmon.open(url, storage_options={"endpoint": moto_server}, autoflush=None)
    d = dead.put(orphan)
    dead.close()
    s = _open(s3_proxy)
    g = casmon.open(url, storage_options={"endpoint": moto_server})
    assert s.put(orphan) == d  # deduplicated: relies on the dead job's copy
    s.append("job", {"n": 1}, refs=[d, s.put({"new": 1})])
    rule = proxy.add(Rule("hold", method="PUT", path="/packs/", delay=120.0, times=1))  # until released
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t = threading.Thread(target=s.flush)
        t.start()
        try:
            deadline = time.monotonic() + 60
            while rule.applied == 0 and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)  # the pack's PUT is held from here on
            g.gc(grace=1.0)  # condemns it while the pack is in flight
            time.sleep(1.1)
            swept = g.gc(grace=1.0).deleted_objects  # and sweeps it
        finally:
            rule.release()
        t.join(timeout=60)
    assert rule.applied == 1 and swept >= 1
    assert not [str(w.message) for w in caught if "were removed" in str(w.message)]
    direct = _direct(moto_server, bucket)
    assert_no_record_names_a_removed_value(direct)
    assert [r["n"] for _, r in direct.records("job")] == [1] and direct.get(d) == orphan