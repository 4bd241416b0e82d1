"""`casmon tag RUN +x -y`, `casmon note RUN TEXT`, and tags in `casmon runs` (`--tag`) and `casmon show`."""

import json

import pytest

import casmon
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    for tags in (["baseline"], []):
        with casmon.record(store=s, tags=tags, capture_output=False) as run:
            run.log(loss=1.0)
    s.close()
    return str(path)


def test_tag_adds_and_removes_and_runs_filters_and_shows_them(store):
    assert cli("tag", "2", "+good", "-baseline", "v2", "--store", store).stdout.strip() == "run 2: good v2"
    assert cli("tag", "1", "--store", store).stdout.strip() == "run 1: baseline"
    table = cli("runs", "--store", store).stdout
    assert "tags" in table and "baseline" in table and "good v2" in table
    only = cli("runs", "--tag", "good", "--store", store).stdout
    assert "good v2" in only and "baseline" not in only
    assert "no runs tagged good and nope" in cli("runs", "--tag", "good", "--tag", "nope", "--store", store).stdout
    listed = json.loads(cli("runs", "--json", "--store", store).stdout)
    assert [(r["tags"], r["note"]) for r in listed] == [(["baseline"], ""), (["good", "v2"], "")]
    history = cli("tag", "2", "--history", "--store", store).stdout
    assert "+good +v2" in history


def test_note_is_set_shown_cleared_and_kept_in_the_history(store):
    assert "note set" in cli("note", "1", "lr", "too", "high", "--store", store).stdout
    assert cli("note", "1", "--store", store).stdout.splitlines()[0] == "run 1: lr too high"
    shown = cli("show", "1", "--store", store).stdout
    assert "tags: baseline" in shown and "run note: lr too high" in shown
    cli("note", "1", "--clear", "--store", store)
    out = cli("note", "1", "--store", store).stdout
    assert out.startswith("run 1: no note") and "note: 'lr too high'" in out
    assert json.loads(cli("show", "1", "--json", "--store", store).stdout)["note"] == ""


@pytest.mark.parametrize("args, says", [(["tag", "1", "+a b"], "holds whitespace"), (["tag", "1", "+"], "empty"),
                                        (["tag", "9", "+x"], "no run '9'"), (["runs", "--tag", "x,y"], "comma"),
                                        (["note", "1", "x", "--clear"], "not both")])
def test_bad_input_is_one_line(store, args, says):
    bad = cli(*args, "--store", store, check=False)
    assert bad.returncode == 1 and says in bad.stderr and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


def test_looking_at_tags_writes_nothing(store, tmp_path):
    from tests.support.cli import tree
    from pathlib import Path

    before = tree(Path(store))
    cli("tag", "1", "--store", store)
    cli("note", "1", "--store", store)
    cli("runs", "--tag", "baseline", "--store", store)
    assert tree(Path(store)) == before
