"""Resuming a run: ``casmon.record(resume=RUN)`` continues a killed, lost or failed run as the same run.

Real processes and SIGKILL: a training script logs a point and saves a checkpoint per step, then says so
in an event file; this process kills it once the event file says enough, and resumes it in another
process. Waits poll with deadlines far beyond what must happen.
"""

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import casmon
from tests.support import deadline
from casmon.runs import ResumeError, list_runs, load_run
from casmon.runs.resume import claim_refs
from tests.conftest import ROOT

pytestmark = [pytest.mark.filterwarnings("ignore::casmon.RunWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

TRAIN = r"""
import os, sys, time, casmon
store, events, which, stop, hold = sys.argv[1:6]
if hold != "-":  # a racer: wait for the start signal, then hold the run until released
    while not os.path.exists(hold + ".go"):
        time.sleep(0.01)
with casmon.record(store=store, comment="job", resume=None if which == "-" else which, keep_last=3,
                   params={"lr": 0.1}) as run:
    if hold != "-":
        open(hold + f".won{os.getpid()}", "w").close()
        while not os.path.exists(hold + ".release"):
            time.sleep(0.01)
    try:
        start = run.checkpoint_latest()["step"] + 1
    except LookupError:
        start = 0
    print(f"from {start}", flush=True)
    for step in range(start, int(stop)):
        run.log(x=2.0 * step, step=step)
        run.checkpoint({"step": step, "w": [step] * 8}, step=step)  # its flush writes the point too
        with open(events, "a") as f:
            f.write(f"{step}\n")
"""


def _until(cond, what, timeout=120.0):
    return deadline.until(cond, what, timeout)


def _spawn(tmp_path, which="-", stop=100, hold="-"):
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_HEARTBEAT_S="1")
    return subprocess.Popen([sys.executable, "-c", TRAIN, str(tmp_path / "s"), str(tmp_path / "events"), which,
                             str(stop), hold], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _flushed(tmp_path):
    try:
        return [int(x) for x in (tmp_path / "events").read_text().split()]
    except FileNotFoundError:
        return []


def _kill_after(tmp_path, p, n):
    """SIGKILL ``p`` once ``n`` steps in all are flushed (or it ended); reaped, so it is gone."""
    _until(lambda: len(_flushed(tmp_path)) >= n or p.poll() is not None, f"{n} steps")
    p.send_signal(signal.SIGKILL)
    p.communicate()


def _check_points(run, flushed, upto=None):
    x = run.metric("x")
    steps = list(x.steps)
    assert len(steps) == len(set(steps)), "a step is there twice"
    assert set(flushed) <= set(steps), "a flushed point is lost"
    top = max(steps) if upto is None else upto
    assert steps == list(range(top + 1)), "steps have a gap or are out of order"
    assert np.array_equal(x.values, 2.0 * np.arange(top + 1))


def test_a_sigkilled_run_resumed_in_another_process_is_one_run_with_every_flushed_point_once(tmp_path):
    p = _spawn(tmp_path)
    _kill_after(tmp_path, p, 5)
    before = _flushed(tmp_path)
    (info,) = list_runs(tmp_path / "s")
    assert info.status in ("running", "lost")
    q = _spawn(tmp_path, which=info.name, stop=12)
    out, err = q.communicate(timeout=300)
    assert q.returncode == 0, err
    resumed_at = int(out.split()[1])
    assert max(before) + 1 <= resumed_at <= max(before) + 2  # the latest checkpoint was at hand
    (run,) = list_runs(tmp_path / "s")
    assert (run.name, run.ref, run.status) == (info.name, info.ref, "ok")
    _check_points(run, _flushed(tmp_path), upto=11)
    (r,) = run.manifest["resumes"]
    assert r["status"] == "lost" and r["pid"] == q.pid and r["claim"] == 1
    assert run.checkpoint("latest")["step"] == 11 and run.checkpoint(10)["w"] == [10] * 8
    assert run.params()["lr"] == 0.1
    assert "resumed (1)" in run.output() and run.output().index("from 0") < run.output().index(f"from {resumed_at}")
    assert run.metric_summary()["x"]["n"] == 12


def test_two_processes_resuming_one_run_at_once_one_wins_the_other_is_told_who_holds_it(tmp_path):
    p = _spawn(tmp_path)
    _kill_after(tmp_path, p, 2)
    name = list_runs(tmp_path / "s")[0].name
    hold = str(tmp_path / "race")
    racers = [_spawn(tmp_path, which=name, stop=30, hold=hold) for _ in range(2)]
    open(hold + ".go", "w").close()
    _until(lambda: any(r.poll() is not None for r in racers), "one racer to give up")
    winners = [f for f in os.listdir(tmp_path) if f.startswith("race.won")]
    open(hold + ".release", "w").close()
    outs = [r.communicate(timeout=300) for r in racers]
    codes = sorted(r.returncode for r in racers)
    assert codes[0] == 0 and codes[1] != 0, outs
    loser = next(err for r, (_o, err) in zip(racers, outs) if r.returncode != 0)
    assert "ResumeError" in loser and f"cannot resume run {name}" in loser, loser
    assert len(winners) <= 1 and len([f for f in os.listdir(tmp_path) if f.startswith("race.won")]) == 1
    (run,) = list_runs(tmp_path / "s")
    assert run.status == "ok" and len(run.manifest["resumes"]) == 1
    _check_points(run, _flushed(tmp_path), upto=29)


def test_a_run_that_runs_in_a_live_process_cannot_be_resumed(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        with pytest.raises(ResumeError, match=f"cannot resume run {run.name}: it is running in process {os.getpid()}"):
            casmon.record(store=s, resume=run.name, capture_output=False).__enter__()
    assert load_run(run.name, s).status == "ok" and "resumes" not in load_run(run.name, s).manifest


def test_an_ok_run_is_resumed_only_with_resume_ok_and_new_params_win(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, params={"lr": 0.1, "bs": 8}) as run:
        run.log(loss=1.0)
        run.info["note"] = "first"
    with pytest.raises(ResumeError, match=f"run {run.name} ended ok; to continue it anyway pass resume_ok=True"):
        casmon.record(store=s, resume=run.name).__enter__()
    with casmon.record(store=s, resume="latest", resume_ok=True, params={"lr": 0.01}, capture_output=False) as again:
        assert (again.name, again.ref) == (run.name, run.ref) and again.resumed_from.name == run.name
        again.log(loss=0.5)
    (r,) = list_runs(s)
    assert r.params() == {"lr": 0.01, "bs": 8} and r.info()["note"] == "first"
    assert list(r.metric("loss").steps) == [0, 1] and r.manifest["resumes"][0]["status"] == "ok"


def test_a_replayed_step_is_skipped_once_flushed_and_the_counter_continues(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        for i in range(3):
            run.log(a=float(i))
        run.log(b=9.0, step=10)
    with casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False) as again:
        again.log(a=3.0)  # the counter: after the highest step flushed (10)
        with pytest.warns(UserWarning, match="metric 'a' at step 1 is skipped"):
            again.log(a=-1.0, step=1)
    r = load_run(run.name, s)
    assert list(r.metric("a").steps) == [0, 1, 2, 11] and list(r.metric("a").values) == [0, 1, 2, 3]
    assert r.metric_summary()["a"]["n"] == 4


def test_resuming_a_run_that_does_not_exist_says_which_runs_are_near(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, comment="train", capture_output=False):
        pass
    with pytest.raises(LookupError, match="did you mean '1-train'"):
        casmon.record(store=s, resume="1-trian").__enter__()
    for bad in ("", 1.5, True):
        with pytest.raises((TypeError, ValueError), match="resume="):
            casmon.record(store=s, resume=bad)


def test_a_resume_claimed_by_a_process_that_died_before_writing_is_passed_over(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        pass
    start = load_run(run.name, s).manifest["start"]
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    s.create_ref(f"resumes/{run.ref.split('/', 1)[1]}/1", None,
                 {"host": os.uname().nodename, "pid": int(dead.stdout), "time": time.time(), "start": start})
    import socket
    assert os.uname().nodename == socket.gethostname()
    with casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False):
        pass
    assert [e["claim"] for e in load_run(run.name, s).manifest["resumes"]] == [2]
    assert sorted(claim_refs(s, run.ref)) == [1, 2]


@pytest.mark.slow
def test_a_run_sigkilled_and_resumed_20_times_ends_as_one_run_with_every_flushed_point_once(tmp_path):
    rng = random.Random(int.from_bytes(os.urandom(4), "little"))
    p = _spawn(tmp_path)
    _kill_after(tmp_path, p, 2)
    name = list_runs(tmp_path / "s")[0].name
    t0 = time.monotonic()
    for _ in range(20):
        q = _spawn(tmp_path, which=name, stop=10**6)
        _kill_after(tmp_path, q, len(_flushed(tmp_path)) + rng.randint(0, 3))
        assert q.returncode == -signal.SIGKILL
    top = max(_flushed(tmp_path)) + 10
    q = _spawn(tmp_path, which=name, stop=top)
    out, err = q.communicate(timeout=300)
    assert q.returncode == 0, err
    (run,) = list_runs(tmp_path / "s")
    assert run.name == name and run.status == "ok"
    _check_points(run, _flushed(tmp_path), upto=top - 1)
    last = [top - 3, top - 2, top - 1]
    assert sorted(a["step"] for a in run.artifacts()) == last
    assert all(run.checkpoint(k) == {"step": k, "w": [k] * 8} for k in last)
    claims = claim_refs(run.store, run.ref)
    # A kill before the claim leaves none; one between the claim and the manifest, a claim not listed.
    assert 1 <= len(run.manifest["resumes"]) <= len(claims) <= 21
    assert run.manifest["resumes"][-1]["pid"] == q.pid
    from tests.conftest import FIGURES
    FIGURES["resume campaign: resumes written"] = len(run.manifest["resumes"])
    FIGURES["resume campaign: claims"] = len(claims)
    FIGURES["resume campaign: seconds"] = int(time.monotonic() - t0)
    FIGURES["resume campaign: points"] = len(run.metric("x"))


def test_deleting_a_resumed_run_drops_its_resume_claims(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        pass
    with casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False):
        pass
    assert list(claim_refs(s, run.ref)) == [1]
    casmon.delete_run(run.name, s)
    assert claim_refs(s, run.ref) == {} and s.refs("resumes") == []


@pytest.mark.parametrize("claim", [{"host": "x"}, {"pid": 2**70, "time": "now"}, {"time": float("nan")}],
                         ids=["no-pid", "huge-pid", "nan-time"])
def test_a_crafted_resume_claim_is_passed_over_not_raised(tmp_path, claim):
    import socket
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        pass
    start = load_run(run.name, s).manifest["start"]
    s.create_ref(f"resumes/{run.ref.split('/', 1)[1]}/1", None, {"host": socket.gethostname(), "start": start, **claim})
    with casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False):
        pass
    assert [e["claim"] for e in load_run(run.name, s).manifest["resumes"]] == [2]


def test_a_resumed_runs_metric_digest_is_that_of_a_run_with_the_same_points(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as whole:
        for i in range(6):
            whole.log(x=float(i))
    with pytest.raises(RuntimeError):
        with casmon.record(store=s, capture_output=False) as cut:
            for i in range(3):
                cut.log(x=float(i))
            raise RuntimeError("preempted")
    with casmon.record(store=s, capture_output=False, resume=cut.name):
        for i in range(3, 6):
            casmon.log(x=float(i))
    a, b = load_run(whole.name, s).manifest["metrics"]["x"], load_run(cut.name, s).manifest["metrics"]["x"]
    assert (a["digest"], a["n"], a["step"], a["min"], a["max"]) == (b["digest"], b["n"], b["step"], b["min"], b["max"])
    assert load_run(cut.name, s).resumes[0]["status"] == "failed"


def test_a_resume_that_failed_after_its_claim_can_be_tried_again_in_the_same_process(tmp_path, monkeypatch):
    from casmon.runs import resume

    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)

    def broken(*a, **k):
        raise resume.ResumeError("store went away")

    with monkeypatch.context() as m:
        m.setattr(resume, "_seed_metrics", broken)
        with pytest.raises(ResumeError, match="store went away"):
            casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False).__enter__()
    assert list(claim_refs(s, run.ref)) == [1]
    with casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False) as again:
        again.log(x=2.0)
    assert [e["claim"] for e in load_run(run.name, s).manifest["resumes"]] == [2]
    assert list(load_run(run.name, s).metric("x").values) == [1.0, 2.0]


STEP = r"""
import sys, casmon
with casmon.record(store=sys.argv[1], capture_output=False) as run:
    run.log(x=1.0, step=0)
    run.checkpoint({"step": 0}, step=0)
    run.log(x=2.0, step=1)
    run.checkpoint({"step": 1}, step=1)
"""


@pytest.mark.parametrize("nth", [1, 2, 3, 4, 5, 6])
def test_a_checkpoint_that_survives_a_kill_has_every_point_logged_before_it(tmp_path, nth):
    """A resumed loop continues after its latest checkpoint: a point logged before that checkpoint and lost with
    the kill would be a gap no one logs again. Killed after each record table a flush writes."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_FAULTPOINTS=f"flush.table_written@{nth}=kill")
    p = subprocess.run([sys.executable, "-c", STEP, str(tmp_path / "s")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    if not list_runs(tmp_path / "s"):
        return  # killed before the run's ref: nothing to resume
    (info,) = list_runs(tmp_path / "s")
    try:
        latest = info.checkpoint("latest")["step"]
    except LookupError:
        return
    steps = list(info.metric("x").steps) if "x" in info.metrics() else []
    assert set(range(latest + 1)) <= set(steps), (nth, latest, steps, p.returncode)
