"""A sort by a column no run has (a link from another store, a parameter renamed since) says so above the
table, in the page and in the view swapped in, instead of showing rows in no stated order under no sorted head."""

from __future__ import annotations

import html
import json
import re

import pytest

import casmon
from casmon.runs.imported import write_run
from tests.ui.test_ui import Served


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    path = tmp_path_factory.mktemp("sortmissing") / "s"
    s = casmon.open(path, create=True)
    for i in range(4):
        write_run(s, start=1.7e9 + i, end=1.7e9 + i + 1, params={"lr": 0.1 * (i + 1)} if i % 2 else {"seed": i})
    s.close()
    served = Served(path)
    yield served
    served.close()


def _note(markup: str) -> str | None:
    m = re.search(r'id="sort-note"[^>]*>(.*?)</p>', markup)
    return html.unescape(m.group(1)) if m else None


def test_a_sort_by_a_column_no_run_has_says_so_in_the_page_and_the_swapped_view(srv):
    said = _note(srv.get("/?sort=param.gone"))
    assert said is not None and "param.gone" in said and "no run" in said and "\n" not in said
    status, _h, body = srv.request("/api/runs/view?sort=param.gone&order=asc")
    assert status == 200 and _note(json.loads(body)["parts"]["runs-error"]) == said


def test_a_sort_by_a_column_some_runs_have_or_a_fixed_one_says_nothing(srv):
    for q in ("sort=param.lr", "sort=param.seed&order=asc", "sort=comment", "sort=commit", "", "sort=metric.x&q=zzz"):
        assert _note(srv.get(f"/?{q}")) is None, q


def test_a_filter_whose_runs_lack_the_sorted_column_says_no_run_that_matches_has_it(srv):
    said = _note(srv.get("/?sort=param.lr&q=seed%3E%3D0"))
    assert said is not None and "no run that matches" in said and "param.lr" in said


def test_a_later_page_says_it_only_where_no_run_on_any_page_has_the_column(srv):
    assert _note(srv.get("/?sort=param.gone&per=1&page=3")) is not None
    assert _note(srv.get("/?sort=param.lr&per=1&page=3")) is None  # its runs without lr come after those with it
