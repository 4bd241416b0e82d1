"""The runs index on S3, where a listing gives no stamps: an index file there (written by a local store the
bucket was copied from, or crafted) is used only for the manifest a run's ref names, never in its place."""

import shutil

import pytest

import casmon
from casmon.runs import tag_run
from casmon.runs.listing import IndexedManifest

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _view(runs):
    return [(r.ref, r.name, r.status, r.params(), r.metric_summary(), r.tags) for r in runs]


def _record(store, lr):
    with casmon.record(store=store, capture_output=False) as run:
        run.params = {"lr": lr}
        run.log(loss=lr * 2)


def test_runs_on_s3_list_true_through_a_copied_index_after_deletes_reuse_and_tags(s3_env, tmp_path):
    url = f"s3://{s3_env[1]}/runs"
    s3 = casmon.open(url, create=True)
    local = casmon.open(tmp_path / "l", create=True)
    for lr in (0.1, 0.2, 0.3):
        _record(s3, lr)
        _record(local, lr + 10)  # the same run names, other contents
    casmon.list_runs(local)
    casmon.list_runs(local)
    assert s3.backend.list_stamped("refs/runs/") is None
    for k in local.backend.list("runs-index/"):  # a bucket filled from another store's folder: its index too
        s3.backend.set(k, local.backend.get(k))
    want = _view(casmon.list_runs(casmon.open(url, read_only=True)))
    assert [v[3] for v in want] == [{"lr": 0.1}, {"lr": 0.2}, {"lr": 0.3}]
    casmon.delete_run("2", s3)
    _record(s3, 0.5)
    tag_run("1", add=["best"], store=s3)
    got = casmon.list_runs(casmon.open(url))
    assert [v[3] for v in _view(got)] == [{"lr": 0.1}, {"lr": 0.3}, {"lr": 0.5}]
    assert got[0].tags == ("best",)
    assert [r.ref for r in got if r.tags == ("best",)] == ["runs/1"]
    assert not any(isinstance(r.manifest, IndexedManifest) and r.manifest.get("params", {}).get("lr", 0) > 5
                   for r in got)
    shutil.rmtree(tmp_path / "l")
