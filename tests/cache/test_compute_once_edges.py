"""The edges of compute once, explain, expires_after and clears: reentry, forks, store errors, crafted claims and
records, takeover races, expiry against gc."""
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import pytest

import casmon
from casmon.caching import claims
from tests.cache.test_compute_once import _env, _spawn, _starts, _wait_for
from tests.conftest import run_python


def test_waiters_that_lose_the_break_race_wait_for_the_one_that_takes_over(s3_proxy, tmp_path):
    """The holder dies; of three waiters one breaks its claim and claims the key again. The others must wait for that
    one, not read the moment between the dead claim's delete and the new claim's create as "released without a
    result" and compute too. (A slow request on S3 widens that moment.)"""
    from tests.support.s3proxy import Rule

    proxy, bucket = s3_proxy
    url = f"s3://{bucket}/race"
    casmon.open(url).close()
    log = tmp_path / "computed.log"
    holder = _spawn(url, log, 600, [7], CASMON_HEARTBEAT_S="1")
    try:
        _wait_for(lambda: len(_starts(log)) == 1, holder)
        waiters = [_spawn(url, log, 1, [7], CASMON_HEARTBEAT_S="1") for _ in range(3)]

        def beat_after_three_lost_takes():
            """The claim's PUTs as the proxy saw them: 412 is a waiter's lost take, 200 the holder's beat."""
            puts = [s.status for s in proxy.log if s.method == "PUT" and "/refs/claims/" in s.path]
            lost = [i for i, status in enumerate(puts) if status == 412]
            return len(lost) >= 3 and 200 in puts[lost[2]:]

        # every waiter lost its take, so watches the live claim, and the holder beat once since (no fixed sleep)
        _wait_for(beat_after_three_lost_takes, holder)
        assert len(_starts(log)) == 1 and all(w.poll() is None for w in waiters)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        # S3 deletes are POSTs (DeleteObjects): the breaker's delete of the dead claim, then of its marker, each
        # take 1.5 s -- while the marker is there and the claim gone, the other waiters look
        rule = proxy.add(Rule("delay_before", method="POST", delay=1.5, times=2))
        for w in waiters:
            out, err = w.communicate(timeout=60)
            assert w.returncode == 0, err
            assert json.loads(out) == [{"k": 7, "square": 49}]
        after_kill = len(_starts(log)) - 1
        assert rule.applied == 2
        assert after_kill == 1, f"the key was computed {after_kill} times after its holder died (3 waiters)"
    finally:
        holder.kill()
        holder.wait()


def test_a_call_that_reenters_its_own_key_computes_instead_of_waiting_for_itself(tmp_path):
    """A cached function whose call reaches the same key again (a parameter in ignore= or a hasher that maps two
    values to one key) waited forever for its own in-flight mark; before claims it returned."""
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s, ignore=["depth"], version="1")
    def f(x, depth=0):
        if depth == 0:
            return f(x, depth=1) + 1
        time.sleep(0.2)
        return x

    out = []
    t = threading.Thread(target=lambda: out.append(f(3)), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the call waits forever for itself"
    assert out == [4]


def test_a_forked_child_never_releases_its_parents_claim(tmp_path):
    """A slow cached call forks; the child ends with sys.exit (SystemExit unwinds through the cached wrapper).
    The parent still computes: its claim must stay, or every waiter computes beside it."""
    code = textwrap.dedent("""
        import os, sys, time
        import casmon
        from casmon.caching import claims
        s = casmon.open(sys.argv[1])

        @casmon.cache(store=s, version="1")
        def slow(x):
            time.sleep(0.3)
            pid = os.fork()
            if pid == 0:
                sys.exit(0)
            os.waitpid(pid, 0)
            key = slow.__casmon_cache__.key((x,), {})
            print(s.get_ref(claims.claim_name(key)) is not None)
            return x

        slow(1)
        """)
    out = run_python(code, str(tmp_path / "s")).stdout.split()
    assert out[-1] == "True", "the child deleted the claim its parent holds"


def test_a_clear_in_another_process_is_seen_after_cache_info(tmp_path):
    """cache_info() (or entries(), ref(), a code-change warning) reads the clears and notes the newest as seen; the
    next hits must still forget what this process remembers, not serve the cleared result forever."""
    loc = str(tmp_path / "s")
    s = casmon.open(loc)
    calls = []

    @casmon.cache(store=s, version="1")
    def f(x):
        calls.append(x)
        return len(calls)

    assert f(1) == 1
    s.flush()
    run_python("import casmon\nfrom casmon.caching import clear_function\nclear_function(casmon.open(%r), 'f')\n" % loc)
    assert f.cache_info().entries == 0
    time.sleep(1.2)  # past CLEAR_CHECK_S
    assert f(1) == 2, "the cleared result is still returned from memory"


def test_a_cachefn_record_with_malformed_parts_never_fails_a_call(tmp_path):
    """One code-version record whose parts hold a 'text' that is not an object (a crafted or damaged record, or one
    another casmon wrote): the code-change warning and explain must not raise out of the user's call."""
    from casmon.caching.entries import KIND_FN, name_digest

    s = casmon.open(str(tmp_path / "s"))

    def g(x):
        return x + 1

    cg = casmon.cache(store=s)(g)
    fn = cg.__casmon_cache__.name
    s.append(KIND_FN, {"fn": fn, "version": "00" * 16, "time": time.time(),
                       "parts": {"code": {fn: "x"}, "text": ["not", "an", "object"]}}, key=name_digest(fn))
    s.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert cg(1) == 2
        assert not cg.explain(5).hit


def test_casmon_cache_name_with_malformed_parts_says_so_without_a_traceback(tmp_path):
    from casmon.caching.entries import KIND_FN, name_digest

    loc = str(tmp_path / "s")
    s = casmon.open(loc)
    fn = "mod.g"
    for v, parts in (("aa", {"code": {fn: "x"}, "text": {fn: "def g(): pass"}}), ("bb", {"code": {fn: "y"}, "text": ["no"]})):
        s.append(KIND_FN, {"fn": fn, "version": v * 16, "time": time.time(), "parts": parts}, key=name_digest(fn))
    s.close()
    p = subprocess.run([sys.executable, "-m", "casmon", "cache", "g", "--store", loc], capture_output=True, text=True,
                       env=_env())
    assert "Traceback" not in p.stderr, p.stderr[-800:]


def _claim_data(**over):
    from casmon.store.lock import machine

    d = {"fn": "x", "token": "abc123", **machine(), "pid": 1, "start": "", "since": time.time(), "time": time.time(),
         "beat": 0, "every": 0.5, "lag": 0.0}
    d.update(over)
    return d


@pytest.mark.parametrize("case", ["lag", "marker"])
def test_a_crafted_claim_that_looks_well_formed_never_hangs_a_call(tmp_path, case):
    """RELIABILITY promise 10: a crafted claim makes the call compute, and a dead computer never blocks a key.
    ``lag``: a claim from another machine whose heartbeat never moves but whose 'lag' is 1e11 s (waiters allow twice
    the lag). ``marker``: a dead holder's claim whose token is not alphanumeric, with the `.break-crafted` marker a
    killed waiter left: the waiters clean up `.break-<token>`, never the marker that blocks them."""
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s, version="1")
    def f(x):
        return x * 2

    name = claims.claim_name(f.__casmon_cache__.key((4,), {}))
    if case == "lag":
        assert s.create_ref(name, None, _claim_data(host="elsewhere", boot="b", pidns="p", lag=1e11))
    else:
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        assert s.create_ref(name, None, _claim_data(token="not-hex", pid=dead.pid, start="1"))
        assert s.create_ref(name + ".break-crafted", None, {"pid": dead.pid, "time": time.time()})
    out = []
    t = threading.Thread(target=lambda: out.append(f(4)), daemon=True)
    t.start()
    t.join(15)  # 30 heartbeats of the claim
    assert not t.is_alive(), "the call still waits"
    assert out == [8]


def test_is_cached_is_false_once_the_entry_expired(tmp_path):
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s, version="1", expires_after=0.5)
    def f(x):
        return x

    f(1)
    time.sleep(0.7)
    with pytest.raises(KeyError):
        f.lookup(1)
    assert not f.is_cached(1), "is_cached says True; f(1) computes again"


def test_explain_says_an_expired_entry_expired_instead_of_an_unrecorded_key_difference(tmp_path):
    """The call's own entry is stored but expired (by the function's current expires_after, shorter than when it was
    stored): explain should say so, not 'the key differs in something the entry does not record'."""
    s = casmon.open(str(tmp_path / "s"))

    def h(x):
        return x

    casmon.cache(store=s, version="3", expires_after=3600)(h)(5)
    short = casmon.cache(store=s, version="3", expires_after=0.5)(h)
    time.sleep(0.7)
    ex = short.explain(5)
    assert not ex.hit
    assert "expire" in str(ex), str(ex)
    assert all(d.what != "key" for d in ex.differences), str(ex)


def test_casmon_cache_name_after_the_store_option(tmp_path):
    """`casmon cache --store S NAME` (options first, as every other command takes them) says 'no such command'."""
    loc = str(tmp_path / "s")
    s = casmon.open(loc)

    @casmon.cache(store=s, version="1")
    def prep(x):
        return x

    prep(1)
    s.close()
    p = subprocess.run([sys.executable, "-m", "casmon", "cache", "--store", loc, "prep"], capture_output=True, text=True,
                       env=_env())
    assert p.returncode == 0, p.stderr


def test_explain_names_a_varargs_position_past_the_hundredth(tmp_path):
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s, version="1")
    def f(*xs):
        return len(xs)

    f(*range(150))
    ex = f.explain(*range(120), 999, *range(121, 150))
    assert [d.what for d in ex.differences] == ["parameter"], str(ex)


def test_a_store_error_as_a_waiter_reads_the_result_never_leaves_its_key_in_flight(tmp_path):
    """The store finds the entry another process stored, but reading it raises a store error (S3 away past casmon's
    retries: a FaultProxy can do it): the call computes uncached, with a warning. Its
    in-process in-flight mark must go with it: it stayed, and the next miss of that key in the process (after a clear,
    an expiry) waited forever for a thread that does not exist."""
    from casmon.errors import StoreError

    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s, version="leak")
    def slow(k):
        time.sleep(0.2)
        return os.urandom(1000)

    slow(7)  # the entry "another process" stored; and the function is slow here
    state = slow.__casmon_cache__
    real = state._lookup
    looks = []

    def flaky(key):
        looks.append(key)
        if len(looks) == 1:
            return False, None, None  # the miss, before the entry was visible here
        if len(looks) == 2:
            raise StoreError("injected: the store is away as the waiter reads the result")
        return real(key)

    state._lookup = flaky
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slow(7)
    del state._lookup
    assert len(looks) == 2
    slow.cache_clear()
    out = []
    t = threading.Thread(target=lambda: out.append(slow(7)), daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "the miss waits forever for an in-flight mark nobody will clear"


# The holder computes until the test writes the "go" file; every computation is logged.
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    import casmon
    store, folder = sys.argv[1], sys.argv[2]

    @casmon.cache(store=store)
    def slow(k):
        with open(os.path.join(os.environ["EVENTS"], "computed"), "a") as f:
            f.write(f"{os.getpid()}\\n")
        open(os.path.join(os.environ["EVENTS"], f"started-{os.getpid()}"), "w").close()
        while not os.path.exists(os.path.join(os.environ["EVENTS"], "go")):
            time.sleep(0.01)
        return k * 2

    print(slow(int(sys.argv[3])), flush=True)
    """
)


def test_a_waiting_process_says_once_what_it_waits_on(tmp_path):
    import socket

    events = tmp_path / "events"
    events.mkdir()
    store = str(tmp_path / "s")
    casmon.open(store).close()
    (tmp_path / "holder.py").write_text(HOLDER)
    env = _env(EVENTS=str(events))
    cmd = [sys.executable, str(tmp_path / "holder.py"), store, str(events), "21"]
    procs = []
    try:
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(first)
        _until(lambda: (events / f"started-{first.pid}").exists(), "the holder starts computing")
        err_file = open(tmp_path / "waiter.err", "w+")
        waiter = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err_file, text=True)
        procs.append(waiter)
        _until(lambda: "waits for" in (tmp_path / "waiter.err").read_text(), "the waiter says what it waits on")
        (events / "go").touch()
        outs = [p.communicate(timeout=120)[0] for p in procs]
    finally:
        (events / "go").touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert outs == ["42\n", "42\n"] and (events / "computed").read_text().split() == [str(first.pid)]
    said = (tmp_path / "waiter.err").read_text()
    assert said.count("waits for") == 1, said
    assert "CacheWarning" in said and "slow waits for" in said, said
    assert f"process {first.pid} on {socket.gethostname()}" in said, said


@pytest.mark.slow
def test_a_waiter_whose_holder_is_killed_after_its_notice_computes_and_says_nothing_more(tmp_path):
    """kill -9 of the holder after the waiter said what it waits on: the waiter neither hangs nor warns again
    (not about the dead holder, not about itself), and computes the call."""
    events = tmp_path / "events"
    events.mkdir()
    store = str(tmp_path / "s")
    casmon.open(store).close()
    (tmp_path / "holder.py").write_text(HOLDER)
    env = _env(EVENTS=str(events), CASMON_HEARTBEAT_S="1")
    cmd = [sys.executable, str(tmp_path / "holder.py"), store, str(events), "21"]
    procs = []
    try:
        first = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        procs.append(first)
        _until(lambda: (events / f"started-{first.pid}").exists(), "the holder starts computing")
        err_file = open(tmp_path / "waiter.err", "w+")
        waiter = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err_file, text=True)
        procs.append(waiter)
        _until(lambda: "waits for" in (tmp_path / "waiter.err").read_text(), "the waiter says what it waits on")
        first.send_signal(signal.SIGKILL)
        first.wait(60)
        _until(lambda: (events / f"started-{waiter.pid}").exists(), "the waiter computes the call itself")
        (events / "go").touch()
        out = waiter.communicate(timeout=120)[0]
    finally:
        (events / "go").touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert out == "42\n" and waiter.returncode == 0
    said = (tmp_path / "waiter.err").read_text()
    assert said.count("waits for") == 1 and f"process {first.pid} on" in said, said
    assert "Traceback" not in said, said


def _until(cond, what, deadline_s=120.0):
    deadline = time.monotonic() + deadline_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_a_thread_waiting_on_another_thread_says_so_once(tmp_path):
    store = casmon.open(str(tmp_path / "s"))
    started, go = threading.Event(), threading.Event()

    @casmon.cache(store=store)
    def slow(k):
        started.set()
        assert go.wait(120)
        return k

    holder = threading.Thread(target=slow, args=(1,))
    holder.start()
    assert started.wait(120)
    seen = []

    def on_warning(message, category, *rest):
        seen.append(str(message))
        go.set()  # the waiter said it: let the holder finish

    old = warnings.showwarning
    warnings.showwarning = on_warning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.showwarning = on_warning
            assert slow(1) == 1
    finally:
        warnings.showwarning = old
        go.set()
        holder.join(120)
    assert len([m for m in seen if "waits for another thread" in m]) == 1, seen


@pytest.mark.parametrize("data", [{}, {"host": ["x"], "pid": "1", "since": "soon"}, {"host": "h" * 10_000, "pid": 2**80, "since": 1e300},
                                  {"host": None, "pid": None, "since": float("nan")}])
def test_the_waiting_notice_of_a_crafted_claim_is_short_and_never_raises(data):
    said = claims.waiting_message("mod.f", data)
    assert said.startswith("casmon: mod.f waits for process") and len(said) < 400
    notice = claims._Notice(0.0, lambda d: 1 / 0)
    notice.check(1.0, data)  # a failing notice never ends the wait
    assert notice.say is None


@pytest.mark.parametrize("field", ["time", "seconds", "size", "expires"])
def test_a_cache_record_with_a_number_field_of_another_type_stops_no_call_and_no_verb(tmp_path, field):
    """A crafted (or foreign) entry, clear or use record whose time, seconds, size or expires is a string made the
    user's next cached call, `casmon cache`, `casmon cache NAME` and `gc --max-size` raise a raw TypeError."""
    from casmon.caching import KIND, KIND_CLEAR, KIND_USE
    from tests.support.cli import cli

    s = casmon.open(tmp_path / "s")
    ns: dict = {"__name__": "mod"}
    exec("def f(x):\n    return x + 1\n", ns)
    f = casmon.cache(store=s)(ns["f"])
    assert f(1) == 2
    s.flush()
    _k, good = next(iter(s.records(KIND)))
    s.append(KIND, dict(good, **{field: "x"}), key=os.urandom(16))
    s.append(KIND_CLEAR, {"fn": "mod.f", field: "x"}, key=os.urandom(16))
    s.append(KIND_USE, {"hits": {}, field: "x"})
    s.append(KIND_USE, {"hits": {bytes(_k).hex(): "x", "zz": ["mod.f", 1, 1.0], "0" * 32: ["mod.f", "1", 1.0]}})
    s.append(KIND_USE, {"hits": ["x"]})
    s.close()
    g = casmon.cache(store=str(tmp_path / "s"))(ns["f"])
    assert g(1) == 2 and g(5) == 6 and g.cache_info().entries >= 1
    g.explain(7)
    for args in (["cache"], ["cache", "mod.f"], ["gc", "--dry-run", "--max-size", "1K"]):
        r = cli(*args, "--store", str(tmp_path / "s"), check=False)
        assert "Traceback" not in r.stderr and r.returncode == 0, (args, r.stderr)
