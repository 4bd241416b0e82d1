"""The runs table at scale: the server pages, sorts (any column, ``started`` too) and filters (``and``, ``or``,
parentheses, ``tag:``) on its side, from the runs index; one browser test pages and filters in Chromium."""

import re

import pytest

import casmon
from benchmarks.runs_store import TAGS, build
from casmon.ui import table
from tests.support.browser import ARGS, CHROMIUM, watch
from tests.ui.test_ui import Served, rows_of

N = 130  # runs: three pages of 50


@pytest.fixture(scope="module")
def scale_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("table") / "s"
    build(str(path), N, metrics=3, points=10)
    casmon.list_runs(casmon.open(path))  # the runs index, as the first `casmon runs` leaves it
    return path


@pytest.fixture(scope="module")
def server(scale_store):
    s = Served(scale_store)
    yield s
    s.close()


def _params(n):
    """What benchmarks.runs_store gives run n."""
    return {"lr": float(10.0 ** -(1 + n % 5)), "tags": {TAGS[n % len(TAGS)]} | ({"best"} if n % 97 == 0 else set()),
            "status": ("ok",) * 8 + ("failed", "killed")}


def _status(n):
    return (("ok",) * 8 + ("failed", "killed"))[n % 10]


def _tags(n):
    return {TAGS[n % len(TAGS)]} | ({"best"} if n % 97 == 0 else set())


def _lr(n):
    return float(10.0 ** -(1 + n % 5))


def _all_rows(server, query):
    out, page = [], 1
    while True:
        body = server.get(f"/?{query}&page={page}")
        got = rows_of(body)
        out += got
        pages = re.findall(r"page=(\d+)", body)
        if not got or page >= max([int(p) for p in pages] + [1]):
            return out, body
        page += 1


def test_the_server_pages_the_runs_newest_first(server):
    first = rows_of(server.get("/"))
    assert first == [str(n) for n in range(N, N - 50, -1)]
    rows, _ = _all_rows(server, "sort=start&order=desc")
    assert rows == [str(n) for n in range(N, 0, -1)]


@pytest.mark.parametrize("col", ["start", "started", "param.lr", "metric.loss", "status", "run"])
def test_the_server_sorts_every_page_by_any_column(server, col):
    asc, _ = _all_rows(server, f"sort={col}&order=asc")
    desc, _ = _all_rows(server, f"sort={col}&order=desc")
    assert sorted(asc, key=int) == [str(n) for n in range(1, N + 1)]
    if col in ("start", "started", "run"):
        assert asc == [str(n) for n in range(1, N + 1)] and desc == asc[::-1]
    if col == "param.lr":
        lrs = [_lr(int(n)) for n in asc]
        assert lrs == sorted(lrs)


@pytest.mark.parametrize("q, want", [
    ("status:ok and (lr>0.01 or tag:baseline)",
     lambda n: _status(n) == "ok" and (_lr(n) > 0.01 or "baseline" in _tags(n))),
    ("tag:best", lambda n: "best" in _tags(n)),
    ("tag:sweep or tag:debug", lambda n: _tags(n) & {"sweep", "debug"}),
    ("(status=failed or status=killed) lr<0.001", lambda n: _status(n) != "ok" and _lr(n) < 0.001),
    ("status=ok lr>=0.01", lambda n: _status(n) == "ok" and _lr(n) >= 0.01),  # today's syntax: and
    ("not-a-word-anywhere or tag:ablation", lambda n: "ablation" in _tags(n)),
])
def test_the_server_filters_with_and_or_parentheses_and_tags(server, q, want):
    from urllib.parse import quote

    rows, body = _all_rows(server, f"q={quote(q)}&sort=start&order=asc")
    assert rows == [str(n) for n in range(1, N + 1) if want(n)], q


@pytest.mark.parametrize("bad", ["lr>0.01 or", "and tag:x", "(tag:x or)", "tag:", "lr>0.1 or nosuch<3"])
def test_a_malformed_filter_says_what_is_wrong(bad):
    rows = [{"run": "1", "param.lr": 0.1, "status": "ok"}]
    with pytest.raises(table.FilterError):
        table.compile_query(table.parse_query(bad), rows)


def test_parentheses_that_do_not_pair_are_part_of_a_value():
    e = table.parse_query("comment=f(x")
    assert [t.value for t in table.leaves(e)] == ["f(x"]
    e = table.parse_query("(a or b) c")
    assert [t.word for t in table.leaves(e)] == ["a", "b", "c"]


def test_the_runs_page_pages_and_filters_in_chromium(server):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    if CHROMIUM is None:
        pytest.skip("Debian's chromium is not installed")
    base = f"http://127.0.0.1:{server.port}"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = b.new_page()
            w = watch(page, lambda url: url.startswith(base))
            page.goto(base + "/")
            page.wait_for_selector("#runs tbody tr[data-run]")
            shown = page.eval_on_selector_all("#runs tbody tr[data-run]", "rs => rs.map(r => r.dataset.run)")
            assert shown[0] == str(N) and len(shown) == 50
            page.goto(base + "/?q=" + "tag%3Abest%20or%20(status%3Akilled%20and%20lr%3C0.001)")
            page.wait_for_selector("#runs tbody tr[data-run]")
            shown = page.eval_on_selector_all("#runs tbody tr[data-run]", "rs => rs.map(r => r.dataset.run)")
            want = [str(n) for n in range(N, 0, -1) if "best" in _tags(n) or (_status(n) == "killed" and _lr(n) < 0.001)]
            assert shown == want
            assert not w.foreign and not w.dialogs and not w.page_errors
        finally:
            b.close()


def test_a_hundred_runs_compare_and_chart_on_one_page(server):
    import json

    which = "&".join(f"run={i}" for i in range(1, 101))
    assert "loss" in server.get(f"/compare?{which}")
    got = json.loads(server.get(f"/api/metric?{which}&name=loss&n=2000"))
    assert [s["run"] for s in got["series"]] == [str(i) for i in range(1, 101)] and not got["missing"]


def test_a_chart_of_many_runs_carries_a_bounded_number_of_points_and_keeps_each_spike(tmp_path):
    import numpy as np

    from casmon.ui import api, model

    s = casmon.open(tmp_path / "s", create=True)
    for k in range(50):
        with casmon.record(store=s, capture_output=False) as run:
            v = np.zeros(5000)
            v[1234 + k] = 1e6  # one spike a run
            for i, x in enumerate(v):
                run.log(loss=float(x), step=i)
    index = model.RunIndex(s)
    got = api.metric_points(index, list(index.entries()), "loss", 2000)
    assert len(got["series"]) == 50
    for one in got["series"]:
        assert len(one["value"]) <= api.CHART_POINTS // 50
        assert max(one.get("max") or one["value"]) == 1e6
