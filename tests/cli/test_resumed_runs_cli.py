"""`casmon runs` and `casmon show` say a run was resumed, and how often."""

import json

import pytest

import casmon
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def test_runs_and_show_say_how_often_a_run_was_resumed(tmp_path):
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    with casmon.record(store=s, capture_output=False, comment="job"):
        pass
    for _ in range(2):
        with casmon.record(store=s, capture_output=False, resume="latest", resume_ok=True):
            pass
    s.close()
    assert "resumed 2x" in cli("runs", "--store", str(path)).stdout
    assert json.loads(cli("runs", "--store", str(path), "--json").stdout)[0]["resumes"] == 2
    out = cli("show", "1-job", "--store", str(path)).stdout
    assert "resumed 2 times:" in out and out.count(", after it was ok\n") == 2 and out.count("resumed (") == 2


def test_a_crafted_resumes_list_is_shown_without_its_bad_entries(tmp_path):
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    with casmon.record(store=s, capture_output=False, comment="job") as run:
        pass
    r = casmon.load_run(run.name, s)
    m = dict(r.manifest, resumes=[1, {"time": "x"}, {"time": 1e300}, {"time": 5.0, "host": "h", "pid": 7, "status": "lost"}])
    s.set_ref(r.ref, s.put(m), {"status": "ok"})
    s.close()
    assert "resumed 1x" in cli("runs", "--store", str(path)).stdout
    assert "by pid 7, after it was lost" in cli("show", "1-job", "--store", str(path)).stdout
