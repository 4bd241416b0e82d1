"""A resume or a run deletion SIGKILLed at each of its fault points: the run is resumable after (no point lost,
none twice), and a deletion cut short is finished by deleting again, nothing of it coming back."""

import os
import subprocess
import sys
import textwrap

import pytest

import casmon
from tests.support.processes import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

RESUME = textwrap.dedent("""
    import sys, casmon
    s = casmon.open(sys.argv[1])
    try:
        with casmon.record(store=s, resume="latest", capture_output=False) as run:
            run.log(x=float(sys.argv[2]))
            run.checkpoint({"at": sys.argv[2]}, step=int(sys.argv[2]))
            raise RuntimeError("preempted")
    except RuntimeError:
        pass
""")


def _child(tmp_path, args, point=None):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if point:
        env["CASMON_FAULTPOINTS"] = f"{point}=kill"
    return subprocess.run([sys.executable, "-c", RESUME, str(tmp_path / "s"), *args], env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("point", ["resume.after_claim", "resume.after_attach"])
def test_a_resume_killed_at_each_point_leaves_the_run_resumable_with_every_point_once(tmp_path, point):
    s = casmon.open(tmp_path / "s", create=True)
    with pytest.raises(RuntimeError), casmon.record(store=s, capture_output=False) as run:
        run.log(x=0.0)
        run.checkpoint({"at": "0"}, step=0)
        raise RuntimeError("preempted")
    killed = _child(tmp_path, ["1"], point)
    assert killed.returncode == -9, killed.stderr[-2000:]
    done = _child(tmp_path, ["2"])
    assert done.returncode == 0, done.stderr[-2000:]
    r = casmon.load_run(run.name, s)
    assert list(r.metric("x").values) == [0.0, 2.0] and r.checkpoint() == {"at": "2"} and r.checkpoint(0)
    assert [e["claim"] for e in r.manifest["resumes"]] == [2]


DELETE = textwrap.dedent("""
    import sys, casmon
    casmon.delete_run(sys.argv[2], casmon.open(sys.argv[1]))
""")


def test_a_deletion_killed_after_its_records_went_is_finished_by_deleting_again(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
        run.save("w", b"weights")
    with casmon.record(store=s, resume=run.name, resume_ok=True, capture_output=False):
        pass
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CASMON_FAULTPOINTS": "delete.after_records=kill"}
    p = subprocess.run([sys.executable, "-c", DELETE, str(tmp_path / "s"), run.name], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == -9, p.stderr[-2000:]
    s2 = casmon.open(tmp_path / "s")
    assert [r.name for r in casmon.list_runs(s2)] == [run.name]  # cut short: still listed
    casmon.delete_run(run.name, s2)
    assert casmon.list_runs(s2) == [] and s2.refs("resumes") == []
    with casmon.record(store=s2, capture_output=False) as fresh:  # takes the freed number, inherits nothing
        pass
    r = casmon.load_run(fresh.name, s2)
    assert r.artifacts() == [] and r.metrics() == {}
