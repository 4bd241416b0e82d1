"""Parameters and info nested hundreds deep (a user's tree, or a crafted manifest) record, list, diff and show
without a RecursionError: record() raised one at its start (the plain-JSON check recursed), diff another."""

import math
import warnings

import pytest
from click.testing import CliRunner

import casmon
from casmon.cli.app import main as cli
from casmon.runs.comparison import _same_json


def _deep(n: int, leaf=1):
    v = leaf
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize("depth", [200, 400])
def test_parameters_nested_hundreds_deep_record_and_diff(tmp_path, depth):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False, params={"lr": 0.1, "tree": _deep(depth)}) as run:
        run.info["tree"] = _deep(depth, 2)
    with casmon.record(store=s, capture_output=False, params={"lr": 0.1, "tree": _deep(depth)}) as run:
        run.info["tree"] = _deep(depth, 3)
    s.flush()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        d = casmon.diff(1, 2, store=s)
        assert "tree" not in d["params"] and "tree" in d["info"], d
        repr(d), repr(casmon.list_runs(s))
    for verb in (["diff", "1", "2"], ["show", "1"], ["runs"]):
        r = CliRunner().invoke(cli, [verb[0], "--store", str(tmp_path / "s"), *verb[1:]])
        assert r.exit_code == 0, (verb, r.output[-500:], r.exception)


def test_deep_json_compares_by_content():
    assert _same_json(_deep(5000), _deep(5000)) and not _same_json(_deep(5000), _deep(5000, 2))
    assert _same_json({"a": [math.nan]}, {"a": [math.nan]}) and not _same_json([math.nan], [1.0])
    assert not _same_json([1], [1.0]) and not _same_json({"a": 1}, {"b": 1}) and not _same_json([1], [1, 2])


def test_parameters_too_deep_to_store_are_kept_as_their_description_and_the_run_ends(tmp_path):
    s = casmon.open(tmp_path / "s")
    with pytest.warns(casmon.RunWarning, match=r"run.params\['tree'\] cannot be stored \(TypeError: .*nested too deeply"):
        with casmon.record(store=s, capture_output=False, params={"tree": _deep(100_000), "lr": 0.1}):
            pass
    r = casmon.load_run("latest", store=s)
    assert r.status == "ok" and r.params()["lr"] == 0.1 and "nested too deeply" in r.params()["tree"]
