"""``artifacts.release``: a run drops an artifact (a file its trainer deleted), and gc frees what only it held."""

import pytest

import casmon
from casmon.runs.artifacts import release

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def test_a_released_artifact_is_gone_from_the_run_and_the_others_stay(store, tmp_path):
    f = tmp_path / "epoch=0.ckpt"
    f.write_bytes(b"weights-0")
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(f, "checkpoints/epoch=0.ckpt")
        run.save("keep", 1)
        release(run, "checkpoints/epoch=0.ckpt")
    r = casmon.load_run("latest", store)
    assert [a["name"] for a in r.artifacts()] == ["keep"]
    with pytest.raises(LookupError, match="no artifact"):
        r.load("checkpoints/epoch=0.ckpt")


def test_a_released_checkpoint_no_longer_counts_for_retention(store):
    with casmon.record(store=store, capture_output=False, keep_last=2) as run:
        run.checkpoint("a", step=1)
        run.checkpoint("b", step=2)
        release(run, "checkpoint/2")
        run.checkpoint("c", step=3)  # keeps 1 and 3: the released 2 is not one of the last two
    r = casmon.load_run("latest", store)
    assert sorted(a["name"] for a in r.artifacts()) == ["checkpoint/1", "checkpoint/3"]


def test_releasing_a_bad_name_is_a_one_line_error(store):
    with casmon.record(store=store, capture_output=False) as run:
        with pytest.raises(ValueError, match="contains '..'"):
            release(run, "../x")
