"""delete_run against a resume of the same run: a run being resumed is never half deleted."""

import os
import socket
import subprocess
import sys
import time

import pytest

import casmon
from casmon.errors import CasmonError
from casmon.runs.resume import RESUME_REFS
from tests.support.processes import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _failed_run(s):
    with pytest.raises(RuntimeError), casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
        run.save("w", b"weights")
        raise RuntimeError("boom")
    return run


def test_a_run_whose_resume_another_live_process_has_claimed_is_not_deleted(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    run = _failed_run(s)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        m = casmon.load_run(run.name, s).manifest
        s.create_ref(f"{RESUME_REFS}/{run.ref.split('/', 1)[-1]}/1", None,
                     {"host": socket.gethostname(), "pid": holder.pid, "time": time.time(), "start": m["start"],
                      "status": "failed"})
        with pytest.raises(CasmonError, match=f"being resumed by process {holder.pid}"):
            casmon.delete_run(run.name, s)
        r = casmon.load_run(run.name, s)
        assert r.load("w") == b"weights" and len(r.metric("x")) == 1
    finally:
        holder.kill()
        holder.wait()
    casmon.delete_run(run.name, s)  # its holder gone, the claim is stale
    assert [r.name for r in casmon.list_runs(s)] == []


def test_a_run_written_between_its_read_and_its_deletion_is_not_deleted(tmp_path, monkeypatch):
    from casmon.runs import deletion

    s = casmon.open(tmp_path / "s", create=True)
    run = _failed_run(s)
    real = deletion.read_artifacts

    def resumed_meanwhile(store, ref):  # runs after the run was read, before the lock is taken
        with casmon.record(store=casmon.open(tmp_path / "s"), resume=run.name, capture_output=False) as again:
            again.log(x=2.0)
        return real(store, ref)

    monkeypatch.setattr(deletion, "read_artifacts", resumed_meanwhile)
    with pytest.raises(CasmonError, match="written while it was being deleted"):
        casmon.delete_run(run.name, s)
    r = casmon.load_run(run.name, s)
    assert r.load("w") == b"weights" and list(r.metric("x").values) == [1.0, 2.0]


def test_a_run_whose_process_lives_on_this_host_is_not_deleted_even_forced_and_never_comes_back(tmp_path):
    path = tmp_path / "s"
    casmon.open(path, create=True).close()
    started = tmp_path / "started"
    code = (f"import casmon, time, pathlib\n"
            f"with casmon.record(store=casmon.open({str(path)!r}), capture_output=False) as run:\n"
            f"    run.log(x=1.0)\n"
            f"    pathlib.Path({str(started)!r}).write_text('1')\n"
            f"    time.sleep(600)\n")
    writer = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and writer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        s = casmon.open(path)
        with pytest.raises(CasmonError, match=f"process {writer.pid} .*still alive"):
            casmon.delete_run("latest", s, force=True)
        assert [r.status for r in casmon.list_runs(s)] == ["running"]
    finally:
        writer.kill()
        writer.wait()
    casmon.delete_run("latest", s, force=True)  # its process gone: a forced delete goes through, and stays done
    assert casmon.list_runs(s) == []


def test_a_run_deleted_while_a_resume_carries_it_over_is_not_brought_back(tmp_path, monkeypatch):
    from casmon.runs import resume
    from casmon.runs.resume import ResumeError

    import casmon.runs.deletion  # noqa: F401 - imported before the patch: it binds the real reader by name

    s = casmon.open(tmp_path / "s", create=True)
    run = _failed_run(s)
    real = resume.artifacts.read_artifacts
    deleting = []

    def deleted_meanwhile(store, ref):  # the resume has claimed and read the run: another process deletes it now
        if not deleting:  # once: the deletion reads the run's artifacts too
            deleting.append(ref)
            casmon.delete_run(run.name, casmon.open(tmp_path / "s"))
        return real(store, ref)

    monkeypatch.setattr(resume.artifacts, "read_artifacts", deleted_meanwhile)
    with pytest.raises(ResumeError, match="deleted"):
        with casmon.record(store=s, resume=run.name, capture_output=False) as again:
            again.log(x=2.0)
    monkeypatch.undo()
    assert casmon.list_runs(s) == [] and s.refs("resumes") == []
