"""A run seen from outside while it goes on and after it ends: live points and output, killed, lost.

Real processes and real signals: a training script runs in a child with
heartbeats every second (``CASMON_HEARTBEAT_S=1``); this process reads the
store the way ``casmon runs`` or the UI would. Waits poll for what must
happen, with deadlines far beyond it, so a loaded machine only makes them slower.
"""

import os
import signal
import subprocess
import sys
import time

import pytest

import casmon
from tests.support import deadline
from casmon.runs import live
from tests.conftest import ROOT

pytestmark = [pytest.mark.filterwarnings("ignore::casmon.RunWarning"),
              pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

TRAIN = r"""
import os, sys, time, casmon
store, mode = sys.argv[1], sys.argv[2]
if mode == "own-handler":
    import signal
    def mine(signum, frame):
        print("own handler", flush=True)
        sys.exit(3)
    signal.signal(signal.SIGTERM, mine)
with casmon.record(store=store, params={"lr": 0.1, "cfg": {"depth": 3}}) as run:
    try:
        for epoch in range(100000):
            print(f"epoch {epoch}", flush=True)
            run.log(loss=1.0 / (epoch + 1), epoch=epoch)
            if epoch == 5:
                open(os.path.join(os.path.dirname(store), "ready"), "w").close()
            time.sleep(0.05)
    finally:
        print("finally ran", flush=True)
"""


def _start(tmp_path, mode="plain", **env):
    store = str(tmp_path / "s")
    e = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_HEARTBEAT_S="1", **env)
    p = subprocess.Popen([sys.executable, "-c", TRAIN, store, mode], env=e, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _until(lambda: (tmp_path / "ready").exists() or p.poll() is not None, "the script to start")
    assert p.poll() is None, p.communicate()
    return p, store


def _until(cond, what, timeout=60.0):
    return deadline.until(cond, what, timeout)


def _run(store):
    runs = casmon.list_runs(casmon.open(store, create=False, read_only=True))
    return runs[-1] if runs else None


def test_another_process_sees_a_live_runs_points_output_and_params(tmp_path):
    p, store = _start(tmp_path)
    try:
        r = _until(lambda: (r := _run(store)) is not None and r.metric_summary().get("loss", {}).get("n", 0) >= 5 and r,
                   "the first points")
        assert r.status == "running" and r.flat_params() == {"lr": 0.1, "cfg.depth": 3}
        assert r.elapsed is not None and r.elapsed > 0
        n = len(_run(store).metric("loss"))
        _until(lambda: len(_run(store).metric("loss")) > n, "more points while it runs")
        _until(lambda: "epoch 5\n" in _run(store).output(), "the output so far")
    finally:
        p.kill()
        p.communicate()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_terminated_run_is_saved_as_killed_with_its_output_and_points_then_ends_by_the_signal(tmp_path, sig):
    p, store = _start(tmp_path)
    time.sleep(0.3)
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert p.returncode == -sig, err  # ended by the signal, as it would have without casmon
    assert "finally ran" in out  # the user's cleanup ran
    r = _run(store)
    assert r.status == "killed" and r.manifest["signal"] == signal.Signals(sig).name
    last_epoch = max(int(line.split()[1]) for line in out.splitlines() if line.startswith("epoch"))
    loss = r.metric("loss")
    assert loss.steps[-1] == last_epoch and len(loss) == last_epoch + 1  # every point logged before the signal
    assert f"epoch {last_epoch}\n" in r.output() and "finally ran" in r.output()
    assert r.elapsed is not None and r.metric_summary()["loss"]["n"] == last_epoch + 1


def test_ctrl_c_saves_the_run_as_killed_by_sigint(tmp_path):
    p, store = _start(tmp_path)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert p.returncode != 0 and "KeyboardInterrupt" in err
    r = _run(store)
    assert r.status == "killed" and r.manifest["signal"] == "SIGINT" and len(r.metric("loss")) >= 6


def test_the_users_own_sigterm_handler_decides_and_the_run_is_killed(tmp_path):
    p, store = _start(tmp_path, "own-handler")
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 3 and "own handler" in out and "finally ran" in out
    r = _run(store)
    assert r.status == "killed" and r.manifest["signal"] == "SIGTERM"


def test_a_run_killed_without_warning_is_lost_once_its_heartbeats_stop(tmp_path):
    p, store = _start(tmp_path)
    # Points and output are two records of one flush: a reader can see the first before the second lands.
    _until(lambda: (r := _run(store)) is not None and r.metric_summary().get("loss", {}).get("n", 0) >= 6
           and "epoch 5\n" in r.output(), "six points and their output flushed")
    p.kill()
    p.communicate()
    r = _until(lambda: (r := _run(store)).status == "lost" and r, "the run to be lost")
    assert r.manifest["status"] == "running"  # nothing wrote its end: lost is what a reader concludes
    assert r.elapsed == pytest.approx(r.heartbeat - r.manifest["start"])
    assert len(r.metric("loss")) >= 6 and "epoch 5\n" in r.output()


def test_lost_is_read_from_the_heartbeat_alone():
    now = 1000.0
    assert not live.is_lost(now - 2.9, 1.0, now) and live.is_lost(now - 3.1, 1.0, now)
    assert not live.is_lost(None, 1.0, now) and not live.is_lost(now - 99, None, now)  # older runs: no claim
    assert not live.is_lost("x", 1.0, now) and not live.is_lost(now - 99, 0, now)


EXIT_BLIP = r"""
import os, sys, time, casmon
s = casmon.open(sys.argv[1], create=True)
with casmon.record(store=s, capture_output=False) as run:
    run.log(loss=0.5)
    run.info["done"] = True
    open(sys.argv[2], "w").close()
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.02)
print("block ended", flush=True)
"""


def test_a_run_whose_end_meets_an_outage_as_the_process_exits_is_ok_once_the_store_is_back(tmp_path, s3_proxy,
                                                                                          moto_server):
    proxy, bucket = s3_proxy
    url = f"s3://{bucket}/s"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_RETRY_SECONDS="0.3", CASMON_HEARTBEAT_S="1")
    ending, go = tmp_path / "ending", tmp_path / "go"
    p = subprocess.Popen([sys.executable, "-c", EXIT_BLIP, url, str(ending), str(go)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _until(lambda: ending.exists() or p.poll() is not None, "the run's last step")
    proxy.outage(2.0, "503")  # longer than the retries of one request: the end fails, the process exits
    go.touch()
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0 and "block ended" in out, err
    direct = casmon.open(url, storage_options={"endpoint": moto_server}, create=False)
    r = casmon.list_runs(direct)[-1]
    assert r.status == "ok" and r.info() == {"done": True} and r.metric("loss").values.tolist() == [0.5]


POOL = r"""
import multiprocessing as mp, sys, time, casmon

def work(x):
    time.sleep(30)  # the pool is terminated meanwhile

def log_in_child(_):
    try:
        RUN.log(loss=1.0)
    except casmon.CasmonError as e:
        return str(e)
    return "logged"

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    with casmon.record(store=sys.argv[1], capture_output=False) as RUN:
        RUN.log(loss=0.5)
        with ctx.Pool(1) as pool:
            print(pool.map(log_in_child, [0])[0], flush=True)
        pool = ctx.Pool(2)
        pool.map_async(work, [1, 2])
        time.sleep(0.5)
        t = time.monotonic()
        pool.terminate()  # SIGTERM to the workers: they end as they would without casmon
        pool.join()
        print("terminated in", round(time.monotonic() - t, 1), flush=True)
"""


def test_a_forked_worker_neither_logs_into_its_parents_run_nor_meets_sigterm_as_a_run(tmp_path):
    store = str(tmp_path / "s")
    p = subprocess.run([sys.executable, "-c", POOL, store], env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=tmp_path,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "a run's metrics are logged by the process that records it" in p.stdout
    assert "terminated in" in p.stdout and "RunSignal" not in p.stderr
    r = _run(store)
    assert r.status == "ok" and r.metric("loss").values.tolist() == [0.5]  # the parent's point, once


def test_output_batches_join_into_what_the_terminal_shows_wherever_they_are_cut():
    from hypothesis import given, settings, strategies as st

    from casmon.runs.capture import collapse_carriage_returns, compact_carriage_returns

    @settings(max_examples=500, deadline=None)
    @given(st.lists(st.sampled_from(["a", "bb", "\r", "\n", "ccc", "\r\n"]), max_size=40),
           st.lists(st.integers(0, 40), max_size=4))
    def check(pieces, cuts):
        text = "".join(pieces)
        at = sorted({min(c, len(text)) for c in cuts})
        parts = [text[i:j] for i, j in zip([0, *at], [*at, len(text)])]
        assert collapse_carriage_returns("".join(compact_carriage_returns(p) for p in parts)) == \
            collapse_carriage_returns(text)

    check()


THREADS = r"""
import sys, threading, time, casmon
store = sys.argv[1]

def worker():
    with casmon.record(store=store, capture_output=False, comment="thread") as run:
        for i in range(100000):
            run.log(x=i)
            time.sleep(0.01)

t = threading.Thread(target=worker, daemon=True)
with casmon.record(store=store, capture_output=False, comment="main") as run:
    t.start()
    time.sleep(0.5)
    print("ready", flush=True)
    try:
        t.join()
    finally:
        print("main finally", flush=True)
"""


def test_sigterm_saves_a_worker_threads_run_too_and_ends_the_process(tmp_path):
    store = str(tmp_path / "s")
    p = subprocess.Popen([sys.executable, "-c", THREADS, store], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                         cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == -signal.SIGTERM, err
    runs = {r.manifest["comment"]: r for r in casmon.list_runs(casmon.open(store, create=False, read_only=True))}
    assert {k: (r.status, r.manifest.get("signal")) for k, r in runs.items()} == {
        "main": ("killed", "SIGTERM"), "thread": ("killed", "SIGTERM")}
    assert len(runs["thread"].metric("x")) > 0


FORK_LEAVES = r"""
import os, sys, casmon
with casmon.record(store=sys.argv[1], capture_output=False) as run:
    run.log(x=1.0)
    pid = os.fork()
    if pid == 0:
        sys.exit(0)  # the child leaves its parent's block
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status), flush=True)
    run.log(x=2.0)
"""


def test_a_forked_child_leaving_its_parents_block_ends_no_run_and_exits(tmp_path):
    store = str(tmp_path / "s")
    p = subprocess.run([sys.executable, "-c", FORK_LEAVES, store], env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "child 0" in p.stdout, p.stderr
    r = _run(store)
    assert r.status == "ok" and r.metric("x").values.tolist() == [1.0, 2.0]


def test_a_slow_heartbeat_write_is_allowed_for():
    now = 1000.0
    assert live.is_lost(now - 3.5, 1.0, now, 0.0) and not live.is_lost(now - 3.5, 1.0, now, 1.5)
    assert live.is_lost(now - 6.5, 1.0, now, 1.5) and live.is_lost(now - 3.5, 1.0, now, float("inf"))
