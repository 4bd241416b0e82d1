"""`casmon artifacts`, `casmon get` and `casmon rm`."""

import json

import numpy as np
import pytest

import casmon
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    with casmon.record(store=s, capture_output=False) as run:
        run.save("weights", np.arange(100))
        run.save("notes", b"some bytes")
        run.checkpoint({"w": 1}, step=3)
    s.close()
    return str(path)


def test_artifacts_lists_names_kinds_and_sizes_and_as_json(store):
    out = cli("artifacts", "1", "--store", store).stdout
    assert "weights" in out and "checkpoint/3" in out and "800 B" in out
    arts = json.loads(cli("artifacts", "1", "--store", store, "--json").stdout)
    assert {a["name"]: a["kind"] for a in arts} == {"weights": "value", "notes": "value", "checkpoint/3": "checkpoint"}


def test_get_writes_an_artifact_and_names_an_unknown_one(store, tmp_path):
    cli("get", "1", "notes", "-o", str(tmp_path / "n.bin"), "--store", store)
    assert (tmp_path / "n.bin").read_bytes() == b"some bytes"
    bad = cli("get", "1", "note", "-o", str(tmp_path / "x"), "--store", store, check=False)
    assert bad.returncode == 1 and "no artifact 'note'" in bad.stderr and "notes" in bad.stderr
    bad = cli("get", "1", "weights", "-o", str(tmp_path / "x"), "--store", store, check=False)
    assert bad.returncode == 1 and "not a file" in bad.stderr


def test_rm_dry_run_changes_nothing_and_rm_deletes_the_run(store):
    out = cli("rm", "1", "--dry-run", "--store", store).stdout
    assert "would delete run 1" in out and "3 artifacts" in out
    assert "1" in cli("runs", "--store", store).stdout
    cli("rm", "1", "--store", store)
    assert not casmon.list_runs(casmon.open(store))
    bad = cli("rm", "1", "--store", store, check=False)
    assert bad.returncode == 1 and "no runs" in bad.stderr


def test_gc_says_how_many_values_put_lately_nothing_names_and_how_to_keep_them(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    s.put(np.arange(1234))
    s.close()
    out = cli("gc", "--dry-run", "--store", str(tmp_path / "s")).stdout
    assert "1 unreachable value was put within the last day" in out
    assert "run.save(name, value)" in out and "store.set_ref(name, digest)" in out


@pytest.mark.parametrize("bad", [{"size": 10**400}, {"size": -5}, {"kind": "folder", "files": 10**400}])
def test_artifacts_of_crafted_records_with_absurd_sizes_list_without_a_traceback(store, bad):
    from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key

    s = casmon.open(store)
    rec = {"run": "runs/1", "name": "odd", "kind": "value", "digest": "0" * 32, "size": 1, "time": 9e9, **bad}
    s.append(KIND_ARTIFACT, rec, key=artifacts_key("runs/1"))
    s.close()
    r = cli("artifacts", "1", "--store", store, check=False)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "weights" in r.stdout, r.stderr
    arts = json.loads(cli("artifacts", "1", "--store", store, "--json").stdout)
    assert all(a["size"] >= 0 and a["size"] < 2**63 for a in arts)


def test_artifacts_says_the_share_another_run_holds(store):
    s = casmon.open(store)
    with casmon.record(store=s, capture_output=False) as run:
        run.save("same-weights", np.arange(100))
    s.close()
    arts = {a["name"]: a for a in json.loads(cli("artifacts", "1", "--shared", "--store", store, "--json").stdout)}
    assert arts["weights"]["shared"] == arts["weights"]["stored"] > 0 and arts["notes"]["shared"] == 0
    out = cli("artifacts", "1", "--shared", "--store", store).stdout
    assert "shared" in out and "100%" in out


def test_artifacts_counts_the_share_only_when_asked(store):
    """Counting the share walks every record and ref of the store: seconds on a large one, so only on --shared."""
    arts = json.loads(cli("artifacts", "1", "--store", store, "--json").stdout)
    assert arts and all(a["shared"] is None and a["stored"] > 0 for a in arts)
    out = " ".join(cli("artifacts", "1", "--store", store).stdout.split())
    assert "%)" not in out and "--shared" in out


def test_show_lists_a_runs_artifacts_and_checkpoint_steps(store):
    s = casmon.open(store)
    with casmon.record(store=s, capture_output=False) as run:
        for i in range(12):
            run.save(f"plot{i:02d}", b"x" * i)
            run.checkpoint(i, step=i * 10)
    s.close()
    out = cli("show", "1", "--store", store).stdout
    assert "artifacts (2, " in out and "weights: value, 800 B" in out and "checkpoints (1): steps 3" in out
    out = cli("show", "2", "--store", store).stdout
    assert "plot09" in out and "plot10" not in out and "and 2 more: `casmon artifacts 2`" in out
    assert "checkpoints (12): steps ..., 20, 30" in out and "steps ..., 20, 30, 40, 50, 60, 70, 80, 90, 100, 110" in out
    shown = json.loads(cli("show", "1", "--store", store, "--json").stdout)
    assert {a["name"] for a in shown["artifacts"]} == {"weights", "notes", "checkpoint/3"}


@pytest.mark.parametrize("args", [("artifacts", "1"), ("get", "1", "notes", "-o", "out.bin"), ("rm", "1", "--dry-run")])
def test_the_artifact_verbs_use_the_default_store_when_no_store_is_given(tmp_path, args):
    s = casmon.open(tmp_path / ".casmon", create=True)
    with casmon.record(store=s, capture_output=False, system_metrics=False) as run:
        run.save("notes", b"some bytes")
    s.close()
    r = cli(*args, cwd=tmp_path)  # ./.casmon, as the README's `casmon artifacts RUN` reads it
    assert r.returncode == 0 and "1" in r.stdout
