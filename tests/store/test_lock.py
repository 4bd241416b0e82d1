"""The store lock (``gc/lock``, casmon/store/lock.py): a dead holder's lock is taken over at once by
exactly one taker (``gc/lock-broken/<hash>``), a lock that is not a lock at all (empty or garbage
after a crash) counts as a dead holder's, and a taker killed while breaking one never locks the
store for good."""

import json
import socket
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

import casmon
from tests.support.processes import ENV, PY, start_python, wait_for_file


def test_two_takers_of_a_dead_holders_lock_never_both_hold(tmp_path):
    """The store lock (``gc/lock``) of a holder that died on this host is taken over at once. A taker
    reads the dead holder's lock, judges it dead, and deletes ``gc/lock`` -- whatever it holds by then. If
    another taker broke the same dead lock and took it meanwhile, the slow one deletes the live lock and
    takes it too: two processes hold the store lock at once (two gc's, or a gc and a merge: the rewrites
    the lock keeps apart, I4b of RELIABILITY.md). A crashed gc or merge leaves such a lock (the kill
    campaign kills gc processes); every writer's routine merge tries to take it. Seen without any help:
    12 processes taking a dead holder's lock at once, 40 times, under load: two held it at once once.
    Here the slow taker is held between judging and deleting by a pause the test wraps around
    ``lock._dead``."""
    loc, points = tmp_path / "s", tmp_path / "points"
    points.mkdir()
    casmon.open(loc).close()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (loc / "gc").mkdir(exist_ok=True)
    (loc / "gc" / "lock").write_text(json.dumps({"what": "gc", "host": socket.gethostname(), "pid": dead.pid,
                                                   "time": time.time(), "nonce": "00"}))
    taker = """
        import os, sys, time, casmon
        from casmon.store import lock
        loc, points, me, slow = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "slow"
        if slow:
            dead = lock._dead

            def held_dead(info, *rest):
                r = dead(info, *rest)
                open(os.path.join(points, me + ".judged"), "w").close()
                while not os.path.exists(os.path.join(points, me + ".go")):
                    time.sleep(0.005)
                return r

            lock._dead = held_dead
        s = casmon.open(loc, create=False)
        try:
            with lock.held(s.backend, "gc"):
                open(os.path.join(points, me + ".holds"), "w").close()
                while not os.path.exists(os.path.join(points, me + ".release")):
                    time.sleep(0.005)
        except casmon.StoreError as e:
            print("busy:", e)
    """
    a = start_python(taker, loc, points, "a", "slow")
    b = None
    try:
        wait_for_file(points / "a.judged", a)
        b = start_python(taker, loc, points, "b", "fast")
        wait_for_file(points / "b.holds", b)
        (points / "a.go").touch()
        deadline = time.monotonic() + 30
        while not (points / "a.holds").exists() and a.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        both = (points / "a.holds").exists() and (points / "b.holds").exists()
        (points / "a.release").touch()
        (points / "b.release").touch()
        a_out = a.communicate(timeout=30)[0]
        b.communicate(timeout=30)
    finally:
        a.kill()
        if b is not None:
            b.kill()
    assert not both, f"two processes held the store lock at once ({a_out.strip()!r})"


def _gc(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "casmon", "gc", "--store", str(root)], env=ENV, capture_output=True, text=True, timeout=60)


def test_a_garbage_lock_found_again_within_a_day_is_still_broken(tmp_path):
    """A ``gc/lock`` that is not a lock at all (empty after a crash, garbage) is a dead holder's: taken over
    at once. Its break record is named by the hash of its bytes, so the same bytes found again within a day
    (a second crash leaving an empty file) are never broken: each taker sees the old record, takes it for
    another taker breaking it now, and gives up -- gc and repair fail, writers' merges skip, until someone
    runs ``--break-lock`` (gc, which would forget the record, cannot take the lock)."""
    root = tmp_path / "s"
    s = casmon.open(root)
    s.set_ref("x", s.put(1))
    s.close()
    for round_ in range(2):
        (root / "gc" / "lock").parent.mkdir(exist_ok=True)
        (root / "gc" / "lock").write_bytes(b"")
        r = _gc(root)
        assert r.returncode == 0, (round_, r.stderr[-400:])


BREAKER = textwrap.dedent("""
    import os, signal, sys, casmon
    from casmon.store import lock
    from casmon.store.backend import Backend

    real = Backend.delete
    def delete(self, key, *a, **k):
        if key == lock.LOCK_KEY:  # the break record is written; the dead lock is not deleted yet
            os.kill(os.getpid(), signal.SIGKILL)
        return real(self, key, *a, **k)
    Backend.delete = delete
    casmon.open(sys.argv[1]).gc()
""")


def test_a_taker_killed_while_breaking_a_dead_lock_does_not_lock_the_store_for_good(tmp_path):
    """A taker (a gc, or a writer's merge: writers are killed all the time) that created
    ``gc/lock-broken/<hash>`` and was killed before it deleted the dead lock leaves both: every later taker
    finds the record, takes it for a live breaker, and gives up. The lock's holder and its breaker are both
    dead, yet gc fails ("another gc ... is rewriting the store") every time, for good (gc alone forgets
    break records, and it cannot take the lock). Before the fix the next gc took the dead lock over."""
    root = tmp_path / "s"
    s = casmon.open(root)
    s.set_ref("x", s.put(1))
    s.close()
    dead = subprocess.Popen([PY, "-c", "pass"])
    dead.wait()
    (root / "gc").mkdir(exist_ok=True)
    (root / "gc" / "lock").write_text(json.dumps({"what": "gc", "host": socket.gethostname(), "pid": dead.pid,
                                                  "time": __import__("time").time(), "nonce": "00"}))
    b = subprocess.run([PY, "-c", BREAKER, str(root)], env=ENV, capture_output=True, text=True, timeout=60)
    assert b.returncode == -9, b.stderr[-400:]
    assert list((root / "gc" / "lock-broken").iterdir()) and (root / "gc" / "lock").exists()
    r = _gc(root)
    assert r.returncode == 0, r.stderr[-400:]


HOLDER = textwrap.dedent("""
    import os, sys, time, casmon
    from casmon.store import lock
    s = casmon.open(sys.argv[1], create=False)
    with lock.held(s.backend, "gc"):
        open(sys.argv[2], "w").close()
        time.sleep(float(sys.argv[3]))
""")


def _try_take(root, lease: float) -> tuple[bool, dict]:
    """Try to take the store lock here, with a lease of ``lease`` seconds, and let it go at once: (got, holder).

    In this process, not a fresh one: a taker judges a holder by what the holder wrote (its lease, host, PID
    namespace), so where the taker runs changes nothing, and each fresh interpreter cost half a second."""
    from casmon.store import lock

    old = lock.LEASE, lock.RENEW_EVERY
    lock.LEASE, lock.RENEW_EVERY = lease, lease / 6
    s = casmon.open(root, create=False)
    try:
        lk = lock.StoreLock(s.backend, "gc")
        got = lk.acquire()
        if got:
            lk.release()
        return got, lk.holder
    finally:
        s.close()
        lock.LEASE, lock.RENEW_EVERY = old


def test_a_live_holder_in_another_pid_namespace_keeps_its_lock_until_its_lease_ends(tmp_path):
    """Containers share the host's name: a PID from another PID namespace means nothing here. The holder's
    lock is left alone while its lease is renewed, and taken over once the holder is gone and the lease ran out."""
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot make a PID namespace here")
    root = tmp_path / "s"
    casmon.open(root).close()
    holds = tmp_path / "holds"
    env = dict(ENV, CASMON_LOCK_LEASE="2")
    holder = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", PY, "-c", HOLDER, str(root), str(holds), "60"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_file(holds, holder)
        info = json.loads((root / "gc" / "lock").read_text())
        assert info["host"] == socket.gethostname() and info["pid"] < 10, "its PID is its namespace's"
        tries = 0
        while tries < 3 or time.time() - info["time"] < 2.5:  # past its first lease (2 s): it renews
            got, held_by = _try_take(root, 2)
            assert not got and held_by["nonce"] == info["nonce"]
            tries += 1
            time.sleep(0.5)
    finally:
        holder.kill()
        holder.wait()
    assert (root / "gc" / "lock").exists(), "killed: its lock stays until the lease ends"
    time.sleep(2.5)
    got, _ = _try_take(root, 2)
    assert got, "the lease ran out: taken over"


def test_a_lock_whose_pid_now_names_another_process_is_a_dead_holders(tmp_path):
    from casmon.store import lock

    root = tmp_path / "s"
    casmon.open(root).close()
    other = subprocess.Popen([PY, "-c", "import time; time.sleep(60)"])
    try:
        (root / "gc").mkdir(exist_ok=True)
        info = {"what": "gc", **lock.machine(), "pid": other.pid, "start": "1", "time": time.time(), "lease": 120.0,
                "nonce": "ab"}
        (root / "gc" / "lock").write_text(json.dumps(info))
        got, _ = _try_take(root, 120)
        assert got, "same machine, that PID started at another moment: its holder is gone"
        info["start"] = lock.process_start(other.pid)
        (root / "gc" / "lock").write_text(json.dumps(info))
        got, _ = _try_take(root, 120)
        assert not got, "the holder itself is alive"
    finally:
        other.kill()
        other.wait()


def test_a_holder_stopped_past_its_lease_finds_it_lost_and_deletes_nothing(tmp_path, min_grace):
    from casmon.store import lock

    root = tmp_path / "s"
    s = casmon.open(root)
    lk = lock.StoreLock(s.backend, "gc")
    assert lk.acquire()
    lk._stop.set()  # as if stopped: no renewal
    (root / "gc" / "lock").unlink()  # another process took the lock over meanwhile
    (root / "gc" / "lock").write_text(json.dumps({"what": "gc", "nonce": "other", "time": time.time(), "lease": 120}))
    with pytest.raises(casmon.StoreError, match="lost the store lock"):
        lk.confirm()
    lk.release()
    assert json.loads((root / "gc" / "lock").read_text())["nonce"] == "other", "the other holder's lock stays"


def test_a_killed_holder_its_parent_has_not_reaped_yet_is_gone():
    """A process killed but not yet reaped (a zombie: its PID still answers signals) holds nothing."""
    import sys

    from casmon.store import lock

    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        info = {**lock.machine(), "pid": p.pid, "start": lock.process_start(p.pid)}
        assert not lock.process_gone(info)
        p.kill()
        deadline = time.monotonic() + 10
        while not lock.process_gone(info):
            assert time.monotonic() < deadline, "a zombie counted as alive"
            time.sleep(0.02)
    finally:
        p.kill()
        p.wait()
