"""One damaged run ref (``refs/runs/*``: truncated, not a frame, a crafted body) is listed as an unreadable run
naming it: it hides no other run from list_runs, load_run, casmon runs or a new record()."""

import warnings

import pytest
from click.testing import CliRunner

import casmon
from casmon.cli.app import main as cli


@pytest.mark.parametrize("name,data", [("zzz", b"junk"), ("3", b""), ("4", b"\x00" * 64)], ids=["junk", "empty", "zeros"])
def test_a_damaged_run_ref_hides_no_other_run(tmp_path, name, data):
    root = tmp_path / "s"
    s = casmon.open(root, autoflush=None)
    with casmon.record(store=s, capture_output=False):
        casmon.log(loss=1.0)
    s.flush()
    s.close()
    (root / "refs" / "runs" / name).write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = casmon.list_runs(root)
        assert sorted(r.name for r in runs) == sorted(["1", name])
        bad = next(r for r in runs if r.name == name)
        assert bad.status == "unreadable" and f"refs/runs/{name}" in bad.manifest["error"]
        assert casmon.load_run(1, root).metric("loss").values.tolist() == [1.0]
        repr(runs)
        with pytest.raises(casmon.DamagedObjectError, match=f"refs/runs/{name}"):
            casmon.load_run(name, root).metrics()
        with casmon.record(store=casmon.open(root), capture_output=False) as run:
            casmon.log(loss=2.0)
        assert casmon.load_run(run.name, root).metric("loss").values.tolist() == [2.0]
    r = CliRunner().invoke(cli, ["runs", "--store", str(root)])
    assert r.exit_code == 0 and "unreadable" in r.output, (r.output, r.exception)


@pytest.mark.parametrize("name", ["²", "1\n", "x y", "é"])
def test_a_stray_file_under_refs_that_no_ref_is_named_like_is_no_ref(tmp_path, name):
    """A file ``refs/runs/²`` raised ValueError into record() (``"²".isdigit()``) and list_runs (not a ref name)."""
    root = tmp_path / "s"
    s = casmon.open(root)
    with casmon.record(store=s, capture_output=False):
        casmon.log(loss=1.0)
    s.flush()
    for folder in ("runs", "calllog/sessions"):
        (root / "refs" / folder).mkdir(parents=True, exist_ok=True)
        (root / "refs" / folder / name).write_bytes(b"x")
    s = casmon.open(root)
    assert [r.name for r in casmon.list_runs(s)] == ["1"]
    with casmon.record(store=s, capture_output=False) as run:
        casmon.log(loss=2.0)
    assert run.name == "2"
    assert casmon.intercept(lambda x: x + 1, store=s)(1) == 2
    s.flush()
    assert casmon.open(root).verify().ok
