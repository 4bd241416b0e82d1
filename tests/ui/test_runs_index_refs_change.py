"""The UI's runs listing follows a run whose ref is written again after it ended: a resumed run shows as
running, then with its new manifest; a deleted run whose number a new run took shows the new run."""

import pytest

import casmon
from casmon.ui.model import RunIndex

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _record(s, lr):
    with casmon.record(store=s, capture_output=False) as run:
        run.params = {"lr": lr}
    return run


def _seen(idx):
    return {e.tail: (e.status, idx.run(e).params().get("lr"), e.digest) for e in idx.entries(fresh=True)}


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    _record(s, 0.1)
    _record(s, 0.2)
    return s


def test_a_run_resumed_after_the_ui_listed_it_shows_running_then_its_new_manifest(store):
    idx = RunIndex(store)
    try:
        assert _seen(idx)["1"][:2] == ("ok", 0.1)
        with casmon.record(store=store, capture_output=False, resume="1", resume_ok=True) as run:
            run.params = {"lr": 0.5}
            assert _seen(idx)["1"][0] == "running"
        seen = _seen(idx)["1"]
        assert seen[0] == "ok" and seen[2] == store.get_ref("runs/1").target.hex()
        assert idx.run(idx.find("1")).resumes
    finally:
        idx.stop()


def test_a_deleted_runs_number_taken_by_a_new_run_shows_the_new_run(store):
    idx = RunIndex(store)
    try:
        assert _seen(idx)["2"][:2] == ("ok", 0.2)
        casmon.delete_run("2", store)
        run = _record(store, 0.9)
        assert run.ref == "runs/2"
        assert _seen(idx)["2"][:2] == ("ok", 0.9)
    finally:
        idx.stop()
