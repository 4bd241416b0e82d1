"""Runs that no block ends: ``casmon.start_run``, ``run.end``, ``casmon.end_run``, and the process's end.

The exit paths run real processes: a script that leaves its run open, one that raises, one ended by SIGTERM,
one killed outright; this process reads the store as ``casmon runs`` would.
"""

import os
import signal
import subprocess
import sys
import threading

import pytest

import casmon
from casmon.errors import CasmonError
from tests.conftest import ROOT
from tests.support import deadline

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s")
    yield s
    casmon.end_run()  # a failed test leaves no run open for the next
    s.close()


def test_a_run_started_in_one_call_and_ended_in_another_keeps_every_point(store):
    run = casmon.start_run(store=store, comment="nb", params={"lr": 0.1}, capture_output=False)
    assert casmon.active_run() is run
    for i in range(10):
        casmon.log(loss=1.0 / (i + 1))
    run.log(acc=0.5)
    assert casmon.load_run("latest", store).status == "running"
    run.end()
    assert casmon.active_run() is None
    r = casmon.load_run("latest", store)
    assert (r.status, r.name, r.flat_params()) == ("ok", "1-nb", {"lr": 0.1})
    assert list(r.metric("loss").values) == [1.0 / (i + 1) for i in range(10)]
    assert list(r.metric("acc").steps) == [10]


def test_end_is_idempotent_and_logging_after_it_is_a_clear_error(store):
    run = casmon.start_run(store=store, capture_output=False)
    run.end("failed")
    digest = casmon.load_run("latest", store).digest
    run.end("ok")  # a no-op: the run stays as it ended
    casmon.end_run()  # none active: nothing to do
    r = casmon.load_run("latest", store)
    assert (r.status, r.digest) == ("failed", digest)
    assert "run.end" in r.manifest["error"]
    with pytest.raises(CasmonError, match="has ended"):
        run.log(x=1.0)
    with pytest.raises(casmon.NoActiveRunError):
        casmon.log(x=1.0)


@pytest.mark.parametrize("status", ["ok", "failed", "killed"])
def test_end_run_ends_the_innermost_started_run_with_its_status(store, status):
    casmon.start_run(store=store, capture_output=False)
    casmon.end_run(status=status)
    assert casmon.load_run("latest", store).status == status


def test_a_bad_status_is_refused_and_the_run_goes_on(store):
    run = casmon.start_run(store=store, capture_output=False)
    with pytest.raises(ValueError, match="status must be"):
        run.end("done")
    with pytest.raises(ValueError, match="status must be"):
        casmon.end_run("FINISHED")
    run.log(x=1.0)
    run.end()
    assert casmon.load_run("latest", store).status == "ok"


def test_failed_inside_an_except_block_keeps_the_traceback(store):
    run = casmon.start_run(store=store, capture_output=False)
    try:
        raise RuntimeError("diverged")
    except RuntimeError:
        run.end("failed")
    r = casmon.load_run("latest", store)
    assert r.status == "failed" and "RuntimeError: diverged" in r.manifest["traceback"]


def test_a_second_start_run_raises_unless_nested(store):
    outer = casmon.start_run(store=store, capture_output=False)
    with pytest.raises(CasmonError, match="nested=True"):
        casmon.start_run(store=store)
    inner = casmon.start_run(store=store, nested=True, capture_output=False)
    casmon.log(x=1.0)
    assert casmon.active_run() is inner
    casmon.end_run()
    assert casmon.active_run() is outer
    casmon.end_run()
    runs = {r.name: r for r in casmon.list_runs(store)}
    assert runs[inner.name].manifest["parent"] == outer.ref and "x" in runs[inner.name].metric_summary()
    assert runs[outer.name].metric_summary() == {} and all(r.status == "ok" for r in runs.values())


def test_start_run_inside_a_record_block_needs_nested(store):
    with casmon.record(store=store, capture_output=False):
        with pytest.raises(CasmonError, match="nested=True"):
            casmon.start_run(store=store)


def test_as_a_context_manager_an_exception_fails_it(store):
    with pytest.raises(ZeroDivisionError):
        with casmon.start_run(store=store, capture_output=False) as run:
            run.log(x=1.0)
            1 / 0
    r = casmon.load_run("latest", store)
    assert r.status == "failed" and "ZeroDivisionError" in r.manifest["error"]


def test_two_threads_ending_at_once_save_one_end(store):
    run = casmon.start_run(store=store, capture_output=False)
    run.log(x=1.0)
    go = threading.Barrier(4)
    errors = []

    def end():
        go.wait()
        try:
            run.end()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=end) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    r = casmon.load_run("latest", store)
    assert r.status == "ok" and len(r.metric("x")) == 1


SCRIPT = r"""
import os, sys, time, casmon
store, mode = sys.argv[1], sys.argv[2]
run = casmon.start_run(store=store, params={"mode": mode})
for i in range(3):
    casmon.log(x=float(i))
print("logged", flush=True)
if mode == "raise":
    raise RuntimeError("the script failed")
if mode == "interrupt":
    raise KeyboardInterrupt
if mode == "wait":
    open(os.path.join(os.path.dirname(store), "ready"), "w").close()
    time.sleep(600)
if mode == "block":
    with casmon.record(store=store, comment="block") as inner:
        inner.log(y=1.0)
        open(os.path.join(os.path.dirname(store), "ready"), "w").close()
        try:
            time.sleep(600)
        finally:
            print("finally ran", flush=True)
"""


def _script(tmp_path, mode, **env):
    store = str(tmp_path / "s")
    e = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_HEARTBEAT_S="0.5", **env)
    return subprocess.Popen([sys.executable, "-c", SCRIPT, store, mode], env=e, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), store


@pytest.mark.parametrize("mode, status", [("open", "ok"), ("raise", "failed"), ("interrupt", "killed")])
def test_a_run_left_open_is_saved_when_the_script_ends(tmp_path, mode, status):
    p, store = _script(tmp_path, mode)
    out, err = p.communicate(timeout=300)
    assert "logged" in out, err
    r = casmon.load_run("latest", store)
    assert r.status == status, (r.manifest, err)
    assert list(r.metric("x").values) == [0.0, 1.0, 2.0]
    if mode == "raise":
        assert "the script failed" in r.manifest["traceback"]
    if mode == "interrupt":
        assert r.manifest["signal"] == "SIGINT"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_saves_an_open_run_as_killed_and_ends_the_process_by_the_signal(tmp_path):
    p, store = _script(tmp_path, "wait")
    deadline.until(lambda: (tmp_path / "ready").exists() or p.poll() is not None, "the script to start", 120)
    p.send_signal(signal.SIGTERM)
    p.communicate(timeout=300)
    assert p.returncode == -signal.SIGTERM
    r = casmon.load_run("latest", store)
    assert (r.status, r.manifest["signal"]) == ("killed", "SIGTERM")
    assert list(r.metric("x").values) == [0.0, 1.0, 2.0]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigkill_leaves_an_open_run_lost_once_its_heartbeats_stop(tmp_path):
    p, store = _script(tmp_path, "wait")
    deadline.until(lambda: (tmp_path / "ready").exists() or p.poll() is not None, "the script to start", 120)
    p.kill()
    p.communicate(timeout=300)
    deadline.until(lambda: casmon.load_run("latest", store).status == "lost", "the run to read as lost", 120)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_sigterm_inside_a_block_saves_the_block_run_and_the_open_run_as_killed(tmp_path):
    p, store = _script(tmp_path, "block")
    deadline.until(lambda: (tmp_path / "ready").exists() or p.poll() is not None, "the script to start", 120)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=300)
    assert p.returncode == -signal.SIGTERM and "finally ran" in out, err
    runs = {r.manifest["comment"]: r for r in casmon.list_runs(store)}
    assert {c: (r.status, r.manifest.get("signal")) for c, r in runs.items()} == {
        "": ("killed", "SIGTERM"), "block": ("killed", "SIGTERM")}
    assert len(runs[""].metric("x")) == 3 and len(runs["block"].metric("y")) == 1


def test_two_threads_starting_at_once_start_one_run_and_the_other_raises(store):
    """The docs make a start_run run process-wide: the check and the start are one step, so a race never
    starts two runs that each think they are the only one."""
    go = threading.Barrier(2)
    started, refused = [], []

    def start():
        go.wait()
        try:
            started.append(casmon.start_run(store=store, capture_output=False))
        except CasmonError as e:
            refused.append(e)

    ts = [threading.Thread(target=start) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert (len(started), len(refused)) == (1, 1), (started, refused)
    assert "is active" in str(refused[0])
    started[0].end()
    assert [r.status for r in casmon.list_runs(store)] == ["ok"]


def test_a_per_thread_run_is_neither_blocked_by_nor_ended_from_another_thread(store):
    main = casmon.start_run(store=store, capture_output=False)
    got = {}

    def other():
        run = casmon.start_run(store=store, capture_output=False, per_thread=True)
        casmon.log(x=1.0)
        got["run"] = run

    t = threading.Thread(target=other)
    t.start()
    t.join()
    run = got["run"]
    assert "parent" not in run.manifest, "another thread's run is no parent of a per-thread run"
    casmon.end_run()  # this thread's run, never the other thread's
    assert (main.manifest["status"], run.manifest["status"]) == ("ok", "running")
    casmon.end_run()  # no run of this thread is left, and the other thread's is its own
    assert run.manifest["status"] == "running"
    run.end()
    assert list(casmon.load_run(run.name, store).metric("x").values) == [1.0]


def test_a_resumed_nested_run_keeps_its_parent(store):
    parent = casmon.start_run(store=store, capture_output=False)
    child = casmon.start_run(store=store, capture_output=False, nested=True)
    child.end("killed")
    parent.end()
    again = casmon.start_run(store=store, resume=child.name, capture_output=False)
    again.log(x=1.0)
    again.end()
    assert casmon.load_run(child.name, store).manifest.get("parent") == parent.ref
    with casmon.record(store=store, resume=child.name, resume_ok=True, capture_output=False):
        pass
    assert casmon.load_run(child.name, store).manifest.get("parent") == parent.ref


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_child_forked_while_another_thread_starts_a_run_can_start_its_own(tmp_path):
    import multiprocessing

    from casmon.runs import session

    def child(path):
        run = casmon.start_run(store=path, capture_output=False)
        run.end()

    with session._start_lock:  # as if another thread were starting a run at the fork
        p = multiprocessing.get_context("fork").Process(target=child, args=(str(tmp_path / "s"),))
        p.start()
        p.join(120)
    if p.is_alive():
        p.kill()
    assert p.exitcode == 0
    assert [r.status for r in casmon.list_runs(str(tmp_path / "s"))] == ["ok"]
