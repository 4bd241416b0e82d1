"""Compute once across workers: a slow miss of a key another live process or thread computes waits for its result;
a dead holder is taken over; quick calls and wait=False never claim."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import casmon
from casmon.caching import claims
from tests.conftest import ROOT, run_parallel

# A worker: calls the slow function on keys in the order given, logs each computation to a file, prints its results.
WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    import casmon
    store, keys = sys.argv[1], [int(k) for k in sys.argv[4].split(",")]
    os.environ["LOG"], os.environ["SECONDS"] = sys.argv[2], sys.argv[3]

    @casmon.cache(store=store)
    def slow(k):  # the log and the time from the environment: the function's version is the same in every worker
        with open(os.environ["LOG"], "a") as f:
            f.write(f"{os.getpid()} {k} start {time.time()}\\n")
        time.sleep(float(os.environ["SECONDS"]))
        if k < 0:
            raise ValueError("negative")
        return {"k": k, "square": k * k}

    out = []
    for k in keys:
        try:
            out.append(slow(k))
        except ValueError as e:
            out.append(str(e))
    print(json.dumps(out))
    """
)


def _env(**extra):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.update(extra)
    return e


def _starts(log):
    if not os.path.exists(log):
        return []
    with open(log) as f:
        return [line.split() for line in f if line.strip()]


def _spawn(loc, log, seconds, keys, **env):
    return subprocess.Popen([sys.executable, "-c", WORKER, loc, str(log), str(seconds), ",".join(map(str, keys))],
                            env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_six_processes_missing_the_same_four_keys_compute_each_once(tmp_path):
    """The sweep of the issue: 6 processes x the same 4 keys, each call 1 s, each process starting at another key.
    Every key is computed once, and every process gets every right value."""
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    log = tmp_path / "computed.log"
    orders = [[(i + j) % 4 for j in range(4)] for i in range(6)]
    outs = run_parallel([["-c", WORKER, loc, str(log), "1", ",".join(map(str, o))] for o in orders])
    for order, out in zip(orders, outs):
        assert json.loads(out) == [{"k": k, "square": k * k} for k in order]
    computed = sorted(int(k) for _pid, k, *_ in _starts(log))
    assert computed == [0, 1, 2, 3], f"each key computed once: {computed}"
    assert not casmon.open(loc).refs("claims"), "no claim is left behind"


def test_a_killed_holder_is_taken_over(tmp_path):
    """The holder is SIGKILLed mid-call: a waiting process computes the key itself (the holder's process is gone),
    long before the holder's call would have ended."""
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    log = tmp_path / "computed.log"
    holder = _spawn(loc, log, 120, [7], CASMON_HEARTBEAT_S="1")
    try:
        _wait_for(lambda: len(_starts(log)) == 1, holder)
        waiter = _spawn(loc, log, 0.2, [7], CASMON_HEARTBEAT_S="1")
        time.sleep(1.0)
        assert waiter.poll() is None and len(_starts(log)) == 1, "the waiter waits while the holder lives"
        holder.send_signal(signal.SIGKILL)
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert json.loads(out) == [{"k": 7, "square": 49}]
        assert [k for _pid, k, *_ in _starts(log)] == ["7", "7"]
    finally:
        holder.kill()
        holder.wait()


def test_a_stopped_holder_whose_heartbeats_stand_still_is_taken_over_within_three_heartbeats(tmp_path):
    """A holder that is alive but beats no more (SIGSTOP: a hung node) is taken over once its heartbeat counter has
    stood still for the stale time; when it resumes it finishes too and both entries hold equal results."""
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    log = tmp_path / "computed.log"
    holder = _spawn(loc, log, 4.5, [3], CASMON_HEARTBEAT_S="0.5")
    try:
        _wait_for(lambda: len(_starts(log)) == 1, holder)
        time.sleep(1.2)  # a few beats
        waiter = _spawn(loc, log, 0.1, [3], CASMON_HEARTBEAT_S="0.5")
        time.sleep(1.0)  # the waiter has seen the claim beating
        assert len(_starts(log)) == 1
        holder.send_signal(signal.SIGSTOP)
        stopped = time.time()
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, err
        assert json.loads(out) == [{"k": 3, "square": 9}]
        starts = _starts(log)
        assert len(starts) == 2
        took_over = float(starts[1][3]) - stopped
        # 3 heartbeats (1.5 s) plus the waiter's polls on a loaded machine: well short of the 4.5 s call
        assert took_over < 5.0, f"taken over {took_over:.2f} s after the holder stopped"
    finally:
        holder.send_signal(signal.SIGCONT)
    out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert json.loads(out) == [{"k": 3, "square": 9}]


def test_waiters_compute_themselves_when_the_holder_fails(tmp_path):
    """The holder's call raises: its claim goes, and the waiters compute (and raise) themselves at once, not one
    after another."""
    loc = str(tmp_path / "s")
    casmon.open(loc).close()
    log = tmp_path / "computed.log"
    holder = _spawn(loc, log, 1.5, [-1])
    _wait_for(lambda: len(_starts(log)) == 1, holder)
    # Each waiter's compute: one after the other, the second would start this long after the first; long enough
    # that two side by side on a loaded machine never read as one after the other.
    computes = 10.0
    waiters = [_spawn(loc, log, computes, [-1]) for _ in range(2)]
    for p in [holder, *waiters]:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert json.loads(out) == ["negative"]
    starts = sorted(float(s[3]) for s in _starts(log))
    assert len(starts) == 3
    assert starts[2] - starts[1] < computes, "the two waiters computed side by side after the holder failed"


def test_threads_of_one_process_wait_for_the_one_computing(tmp_path):
    s = casmon.open(str(tmp_path / "s"))
    calls = []

    @casmon.cache(store=s)
    def slow(x):
        calls.append(x)
        time.sleep(0.3)
        return [x] * 3

    results = []
    threads = [threading.Thread(target=lambda: results.append(slow(5))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [5] and results == [[5, 5, 5]] * 4
    info = slow.cache_info()
    assert (info.misses, info.hits) == (1, 3)


def _live_claim(s, key, pid):
    """A claim of ``key`` held by live process ``pid`` on this machine."""
    from casmon.store.lock import machine, process_start

    data = {"fn": "x", "token": "abc123", **machine(), "pid": pid, "start": process_start(pid), "since": time.time(),
            "time": time.time(), "beat": 0, "every": 60.0, "lag": 0.0}
    assert s.create_ref(claims.claim_name(key), None, data)


def test_wait_false_and_quick_functions_never_wait_and_a_number_bounds_the_wait(tmp_path):
    s = casmon.open(str(tmp_path / "s"))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        calls = []

        def body(x):
            calls.append(x)
            return x + 1

        never = casmon.cache(store=s, wait=False)(body)
        _live_claim(s, never.__casmon_cache__.key((1,), {}), sleeper.pid)
        t0 = time.monotonic()
        assert never(1) == 2 and time.monotonic() - t0 < 5, "wait=False computes beside a live holder"

        def body2(x):  # another function: body is known to be quick by now
            calls.append(x)
            return x + 1

        bounded = casmon.cache(store=s, wait=0.6, version="b")(body2)
        _live_claim(s, bounded.__casmon_cache__.key((2,), {}), sleeper.pid)
        t0 = time.monotonic()
        with pytest.warns(casmon.CacheWarning, match="waited 0.6 s"):  # giving up says so
            assert bounded(2) == 3
        assert 0.6 <= time.monotonic() - t0, "wait=0.6 waits for the live holder first"

        def body3(x):
            calls.append(x)
            return x + 1

        quick = casmon.cache(store=s, version="q")(body3)
        assert quick(10) == 11  # a first call that takes microseconds: the function is quick from now on
        _live_claim(s, quick.__casmon_cache__.key((3,), {}), sleeper.pid)
        t0 = time.monotonic()
        assert quick(3) == 4 and time.monotonic() - t0 < 5, "a quick function neither claims nor waits"
        assert calls == [1, 2, 10, 3]
        # Only the claims this test made: the quick call made none of its own.
        assert len(s.refs("claims")) == 3
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("data", [{"token": 5, "beat": "x", "every": -1, "time": 1e300}, {}, {"every": float("nan")}])
def test_a_crafted_claim_never_hangs_a_call(tmp_path, data):
    """A claim whose data is garbage names no live process and no heartbeat: the call takes it over and computes."""
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s)
    def f(x):
        return x * 2

    assert s.create_ref(claims.claim_name(f.__casmon_cache__.key((4,), {})), None, data)
    t0 = time.monotonic()
    assert f(4) == 8
    assert time.monotonic() - t0 < 30


def test_claims_on_s3_compute_each_key_once(s3_env):
    env, bucket = s3_env
    url = f"s3://{bucket}/sweep"
    casmon.open(url).close()
    import tempfile

    log = os.path.join(tempfile.mkdtemp(), "computed.log")
    orders = [[0, 1], [1, 0], [0, 1]]
    outs = run_parallel([["-c", WORKER, url, log, "1.5", ",".join(map(str, o))] for o in orders], env=env)
    for order, out in zip(orders, outs):
        assert json.loads(out) == [{"k": k, "square": k * k} for k in order]
    assert sorted(int(k) for _pid, k, *_ in _starts(log)) == [0, 1]


def _wait_for(cond, proc, timeout=60):
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.communicate()}")
        if time.monotonic() > end:
            raise AssertionError("timed out")
        time.sleep(0.05)


def test_coroutines_missing_one_key_together_never_block_the_event_loop(tmp_path):
    import asyncio

    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s)
    async def fetch(x):
        await asyncio.sleep(0.3)
        return x * 2

    async def both():
        return await asyncio.gather(fetch(1), fetch(1))

    out = []
    t = threading.Thread(target=lambda: out.append(asyncio.run(both())), daemon=True)  # a blocked loop never ends
    t.start()
    t.join(30)
    assert not t.is_alive(), "the event loop is blocked"
    assert out == [[2, 2]]


def test_a_forked_child_never_waits_for_a_thread_of_its_parent(tmp_path):
    """A thread of the parent computes key 1 when another thread forks: the child, calling key 1, waits for the
    parent's claim in the store and gets the result, instead of waiting forever for a thread it does not have."""
    import multiprocessing

    s = casmon.open(str(tmp_path / "s"))
    started = threading.Event()

    @casmon.cache(store=s, version="fork")
    def slow(x):
        started.set()
        time.sleep(1.5)
        return x

    t = threading.Thread(target=slow, args=(1,))
    t.start()
    started.wait(10)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=lambda: q.put(slow(1)))
    p.start()
    p.join(30)
    alive = p.is_alive()
    p.kill()
    assert not alive, "the child waits forever"
    assert p.exitcode == 0 and q.get(timeout=5) == 1
    t.join()


def test_a_claim_left_failed_by_a_process_that_exited_is_claimed_anew(tmp_path):
    """A holder whose call raised marks its claim failed and exits before its heartbeat deletes it: a later miss
    claims the key afresh (so its own waiters are protected again) instead of computing beside a claim forever."""
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s, version="failed")
    def f(x):
        return x * 3

    name = claims.claim_name(f.__casmon_cache__.key((2,), {}))
    from casmon.store.lock import machine

    assert s.create_ref(name, None, {"fn": "x", "token": "dead0", **machine(), "pid": 424242, "start": "", "since": 0,
                                     "time": time.time(), "beat": 3, "every": 60.0, "lag": 0.0, "failed": True})
    seen = []
    real = claims.ClaimBook.take

    def take(self, key, fn):
        c = real(self, key, fn)
        seen.append(c is not None)
        return c

    claims.ClaimBook.take = take
    try:
        assert f(2) == 6
    finally:
        claims.ClaimBook.take = real
    assert seen == [False, True], "the failed claim was broken and the key claimed anew"
    assert s.get_ref(name) is None
