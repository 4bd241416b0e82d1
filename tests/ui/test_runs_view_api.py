"""``/api/runs/view``: the parts of the runs page a sort, a filter or a page changes, as the whole page holds them,
for the page's script to swap in; a bad parameter is a one-line 400, a hostile string stays text."""

from __future__ import annotations

import html
import json
import re
from html.parser import HTMLParser
from urllib.parse import quote

import pytest

from tests.ui.test_ui import HOSTILE, HOSTILE_KEY, Served, built, rows_of, served  # noqa: F401 - fixtures


#: Every element the runs table's parts are made of: none from a store string.
SAFE_TAGS = {"p", "span", "a", "table", "thead", "tbody", "tr", "th", "td", "input", "code", "nav", "details", "summary",
             "div", "noscript", "script"}


def _elements(markup: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """Each element of ``markup`` as a browser's parser reads it: its tag and attributes."""
    out: list[tuple[str, list[tuple[str, str | None]]]] = []

    class Reader(HTMLParser):
        def handle_starttag(self, tag, attrs):
            out.append((tag, attrs))

    Reader().feed(markup)
    return out


def _view(served, query: str) -> tuple[int, dict]:
    status, headers, body = served.request("/api/runs/view?" + query)
    assert headers["content-type"].startswith("application/json"), body[:200]
    assert "<" not in body and ">" not in body  # markup travels as JSON escapes: never sniffed as a page
    return status, json.loads(body)


def _table(body: str) -> str:
    return re.search(r'<table class="runs" id="runs".*?</table>', body, re.S).group(0)


@pytest.mark.parametrize("query", ["", "sort=info.loss", "sort=param.lr&order=asc", "q=lr%3E0.05",
                                   "sort=run&order=asc&per=2&page=2", "q=base"])
def test_the_view_holds_what_the_page_holds(served, query):
    status, got = _view(served, query)
    assert status == 200 and "error" not in got
    page = served.get("/?" + query)
    parts = got["parts"]
    assert parts["runs"] == _table(page)
    assert rows_of(parts["runs"]) == rows_of(page)
    assert f'id="runs-count" data-n="{got["all"]}">{parts["runs-count"]}</span>' in page
    assert f'<div id="runs-after">{parts["runs-after"]}</div>' in page
    assert f'<div id="runs-notice">{parts["runs-notice"]}</div>' in page
    # its URL is the page's: loaded, it shows the same rows
    assert rows_of(served.get(got["url"])) == rows_of(page)


def test_a_filter_that_cannot_be_applied_is_a_400_with_its_one_line_error_and_every_run(served):
    status, got = _view(served, "q=" + quote("lr<"))
    assert status == 400
    assert "needs a value after '<'" in got["error"] and "\n" not in got["error"]
    assert rows_of(got["parts"]["runs"]) == ["4", "3", "2", "1"]
    assert html.escape(got["error"]) in got["parts"]["runs-error"] and got["q"] == "lr<" and "q=lr%3C" in got["url"]


@pytest.mark.parametrize("query, words", [
    ("sort=__proto__", "sort: no column '__proto__'"),
    ("sort=" + quote(HOSTILE), "sort: no column"),
    ("order=sideways", "order: asc or desc"),
    ("per=0", "per: 1 to 1000"),
    ("per=1001", "per: 1 to 1000"),
    ("page=x", "parameter 'page' must be a whole number"),
    ("page=-1", "parameter 'page' must be a whole number"),
    ("sort=run&sort=start", "parameter 'sort' is given twice"),
    ("since=3", "unknown parameter 'since'"),
    ("q=" + "x" * 2001, "parameter 'q' is too long"),
])
def test_a_bad_parameter_is_a_one_line_400(served, query, words):
    status, got = _view(served, query)
    assert status == 400 and set(got) == {"error"}
    assert words in got["error"] and "\n" not in got["error"] and "Traceback" not in got["error"]


@pytest.mark.parametrize("query", ["sort=param." + quote(HOSTILE), "sort=param.__proto__", "sort=metric.constructor",
                                   "q=" + quote(HOSTILE_KEY), "q=__proto__", "q=" + quote(f"tag:{HOSTILE}"),
                                   "q=" + quote(f"{HOSTILE} or __proto__<1")])
def test_hostile_sort_keys_and_filters_stay_text(served, query):
    status, got = _view(served, query)
    assert status in (200, 400)
    for part in got["parts"].values():
        assert HOSTILE not in part and HOSTILE_KEY not in part
        for tag in re.findall(r"<script\b[^>]*>", part):  # the parallel coordinates' data block only
            assert tag == '<script type="application/json" id="casmon-parcoords-data">', tag
        assert not [(tag, a) for tag, attrs in _elements(part) for a, _v in attrs if a.startswith("on")]
        assert {tag for tag, _a in _elements(part)} <= SAFE_TAGS
    assert set(got["parts"]) == {"runs-count", "runs-error", "runs-notice", "runs", "runs-after"}


def test_a_store_without_runs_has_a_view_too(tmp_path):
    import casmon

    casmon.open(tmp_path / "s", create=True).close()
    srv = Served(tmp_path / "s")
    try:
        status, got = _view(srv, "sort=param.lr&q=lr%3E1")
        assert status == 400 and "no run has a column 'lr'" in got["error"]  # no column in no run
        status, got = _view(srv, "sort=param.lr")
        assert status == 200 and rows_of(got["parts"]["runs"]) == [] and got["parts"]["runs-count"] == "0 runs"
        assert got["parts"]["runs-after"] == ""  # no pager, no parallel coordinates
    finally:
        srv.close()
