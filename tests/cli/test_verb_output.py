"""What the verbs print: ``show NAME`` without a call number, the README's RUN forms, ``diff`` of stored
values (how arrays differ, pickles told apart by digest), and counts that agree with their nouns."""

import json
import re

import numpy as np
import pytest

import casmon
from tests.conftest import ROOT
from tests.support.cli import cli


# runs recorded in tmp folders outside git say so; that is not what these tests look at
pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


def test_show_a_function_name_without_a_call_number(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.intercept(store=s)
    def step(x):
        return x

    step(1)
    step(2)
    s.close()
    r = cli("show", "step", "--store", str(tmp_path / "s"), check=False)
    assert r.returncode == 1
    msg = " ".join(r.stderr.split())
    assert "'step' is a logged function" in msg and "casmon show step N" in msg and "calls 1-2" in msg
    assert "step call 2" in cli("show", "step", "2", "--store", str(tmp_path / "s")).stdout
    r = cli("show", "nothing", "--store", str(tmp_path / "s"), check=False)
    assert r.returncode == 1 and "no runs recorded" in r.stderr


def test_run_names_as_the_readme_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    st = tmp_path / "s"
    with casmon.record(comment="base", store=str(st), capture_output=False):
        pass
    with casmon.record(comment="lr", store=str(st), capture_output=False, prefix="exp"):
        pass
    for which, name in (("1", "1-base"), ("1-base", "1-base"), ("exp1", "exp1-lr"), ("exp1-lr", "exp1-lr"),
                        ("latest", "exp1-lr")):
        assert f"run {name}" in cli("show", which, "--store", str(st)).stdout, which
    assert "`exp3` with `prefix=\"exp\"`" in (ROOT / "README.md").read_text()


def test_diff_says_how_arrays_differ_and_tells_pickles_apart_by_digest(tmp_path, monkeypatch):
    import collections

    monkeypatch.chdir(tmp_path)
    st = str(tmp_path / "s")
    w = np.linspace(0, 1, 8)
    w2 = w.copy()
    w2[[1, 5, 6]] += [0.5, -0.25, 0.125]
    for weights, shape, od in ((w, np.zeros((2, 3)), collections.OrderedDict(a=1)),
                               (w2, np.zeros((3, 3), dtype=np.float32), collections.OrderedDict(a=2))):
        with casmon.record(store=st, capture_output=False) as run:
            run.info["weights"] = weights
            run.info["grid"] = shape
            run.info["od"] = od
            run.info["same"] = np.arange(10)
    out = " ".join(cli("diff", "1", "2", "--store", st).stdout.split())
    assert "info weights:" in out and "3 of 8 elements differ, max abs difference 0.5" in out
    assert "shape (2, 3) -> (3, 3), dtype float64 -> float32" in out
    assert "info same" not in out
    od = out.split("info od:", 1)[1]
    assert "needs collections.OrderedDict" in od and "(digest " in od, "a pickle is described and told apart by digest"
    d = json.loads(cli("diff", "1", "2", "--store", st, "--json").stdout)
    assert d["info"]["weights"]["how"].startswith("3 of 8 elements differ")


def test_counts_agree_with_their_nouns(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.intercept(store=s)
    def only(x):
        return x

    only(1)
    s.set_ref("r", s.put(1))
    s.close()
    out = cli("calls", "--store", str(tmp_path / "s")).stdout
    assert "1 function, 1 session" in out and "sessions" not in out.splitlines()[0]
    assert "1 call" in cli("calls", "only", "--store", str(tmp_path / "s")).stdout
    one_plural = re.compile(r"(?<![\d,.])1 (\w+ )?(packs|values|refs|records|objects|files|functions|sessions|calls)\b")
    v = cli("verify", "--store", str(tmp_path / "s")).stdout
    assert "1 pack," in v and not one_plural.search(v), v
    g = cli("gc", "--store", str(tmp_path / "s")).stdout
    assert "live value" in g and not one_plural.search(g), g


def test_show_run_lists_the_cache_entries_and_call_sessions_it_links(tmp_path, monkeypatch):
    """A run records the cache entries it hit or filled and its call-log session; the UI showed them, `casmon show
    RUN` did not."""
    monkeypatch.chdir(tmp_path)
    s = casmon.open(tmp_path / "s")
    ns: dict = {"__name__": "prep"}
    exec("def scale(x):\n    return x * 2\ndef step(x):\n    return x + 1\n", ns)
    scale, step = casmon.cache(store=s)(ns["scale"]), casmon.intercept(store=s)(ns["step"])
    with casmon.record(store=s, capture_output=False):
        scale(1), scale(1), scale(2), step(3)
    s.close()
    out = cli("show", "latest", "--store", str(tmp_path / "s")).stdout
    assert "cache prep.scale: 2 stored, 1 hit (`casmon cache prep.scale`)" in out
    assert re.search(r"calls: session \d+ \(`casmon calls --session \d+`\)", out)
