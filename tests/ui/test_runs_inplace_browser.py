"""The runs table sorts, filters and pages in place in Chromium: the page's script fetches ``/api/runs/view`` and
swaps the table, its count, pager and parallel coordinates in, with no navigation; the address bar carries the
view (back, forward and reload give it again); without JavaScript the same links and form navigate."""

from __future__ import annotations

import html
import re
from urllib.parse import quote

import pytest

import casmon
from benchmarks.runs_store import build
from tests.support.browser import needs_chromium, watch
from tests.ui.test_ui import Served, rows_of

pytestmark = needs_chromium

N = 130  # runs: three pages of 50
ROWS = "() => [...document.querySelectorAll('#runs tbody tr[data-run]')].map(r => r.dataset.run)"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    path = tmp_path_factory.mktemp("inplace") / "s"
    build(str(path), N, metrics=3, points=10)
    casmon.list_runs(casmon.open(path))  # the runs index, as the first `casmon runs` leaves it
    s = Served(path)
    yield s
    s.close()


class Opened:
    """A page of the runs table, watched: requests elsewhere, dialogs and errors, and every document the main
    frame loads (a navigation), which an in-place update never does."""

    def __init__(self, browser, server, path: str = "/", js: bool = True) -> None:
        self.base = f"http://127.0.0.1:{server.port}"
        self.context = browser.new_context(java_script_enabled=js, viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.watched = watch(self.page, lambda url: url.startswith(self.base + "/"))
        self.documents: list[str] = []
        self.page.on("request", lambda r: self.documents.append(r.url)
                     if r.is_navigation_request() and r.frame == self.page.main_frame else None)
        self.page.goto(self.base + path, wait_until="load")
        if js:
            self.page.wait_for_selector("#column-chooser:not([hidden])")  # the script has run
        self.page.evaluate("window.casmonKept = 'this document'")  # gone if the page is loaded again
        self.documents.clear()

    def rows(self) -> list[str]:
        return self.page.evaluate(ROWS)

    def wait_rows(self, want: list[str]) -> None:
        self.page.wait_for_function(f"want => JSON.stringify(({ROWS})()) === JSON.stringify(want)", arg=want,
                                    timeout=30_000)

    def same_document(self) -> bool:
        return self.page.evaluate("window.casmonKept") == "this document" and self.documents == []

    def close(self) -> None:
        w = self.watched
        self.context.close()
        w.console_errors[:] = [e for e in w.console_errors if "status of 400" not in e]  # a bad filter's answer
        assert w.foreign == [] and w.dialogs == [] and w.page_errors == [] and w.console_errors == []


def _server_rows(server, query: str) -> list[str]:
    status, _h, body = server.request("/?" + query)
    assert status in (200, 400)
    return rows_of(body)


def _count(page) -> str:
    return page.locator("#runs-count").inner_text()


def test_a_click_on_a_column_head_reorders_the_rows_in_place_and_the_url_carries_the_sort(server, browser):
    o = Opened(browser, server)
    try:
        newest = [str(n) for n in range(N, N - 50, -1)]
        assert o.rows() == newest
        want = _server_rows(server, "sort=param.lr&order=desc")
        assert want != newest
        o.page.locator("#runs thead th[data-col='param.lr'] a").click()
        o.wait_rows(want)
        assert re.search(r"[?&]sort=param\.lr(&|$)", o.page.url)
        assert o.same_document()
        assert o.page.locator("#runs thead th[data-col='param.lr'] a").inner_text().endswith("▼")
        # the new head has the focus: Enter sorts the other way, from the keyboard
        assert o.page.evaluate("document.activeElement.closest('th').dataset.col") == "param.lr"
        # the head's link now asks for the other order
        o.page.locator("#runs thead th[data-col='param.lr'] a").click()
        o.wait_rows(_server_rows(server, "sort=param.lr&order=asc"))
        assert "order=asc" in o.page.url and o.same_document()
        # back: the previous order, then the first; forward again; each without loading the page
        o.page.go_back()
        o.wait_rows(want)
        o.page.go_back()
        o.wait_rows(newest)
        assert o.page.url == o.base + "/"
        o.page.go_forward()
        o.wait_rows(want)
        assert o.same_document()
        # a reload (and so a shared link) shows the same view, made by the server
        o.page.reload(wait_until="load")
        assert o.rows() == want
    finally:
        o.close()


def test_the_pager_swaps_in_the_next_page_and_keeps_the_sort(server, browser):
    o = Opened(browser, server, "/?sort=param.lr&order=asc")
    try:
        o.page.locator("nav.pager a", has_text="next").click()
        o.wait_rows(_server_rows(server, "sort=param.lr&order=asc&page=2"))
        assert "page=2" in o.page.url and "sort=param.lr" in o.page.url and o.same_document()
        assert "page 2 of 3" in o.page.locator("nav.pager .current").inner_text()
    finally:
        o.close()


def test_a_filter_typed_shows_the_filtered_rows_and_count_and_a_bad_one_its_error(server, browser):
    o = Opened(browser, server)
    try:
        q = "status:ok and (lr>0.01 or tag:baseline)"
        box = o.page.locator("#runs-filter input[name=q]")
        box.fill(q)
        box.press("Enter")
        want = _server_rows(server, f"q={quote(q)}")
        o.wait_rows(want)
        page_count = html.unescape(re.search(r'id="runs-count"[^>]*>([^<]*)<', server.request(f"/?q={quote(q)}")[2])
                                   .group(1))
        assert _count(o.page) == page_count and page_count.endswith(f"of {N} runs")
        assert o.page.evaluate("new URL(location.href).searchParams.get('q')") == q
        assert o.page.locator("#filter-error").count() == 0 and o.same_document()

        # a filter that cannot be applied: its one-line error in place, every run shown, as the page says it
        bad = "lr<"
        box.fill(bad)
        box.press("Enter")
        o.page.wait_for_selector("#filter-error")
        status, _h, body = server.request(f"/?q={quote(bad)}")
        assert status == 400
        said = html.unescape(re.search(r'id="filter-error" role="alert">(.*?)</p>', body).group(1))
        assert o.page.locator("#filter-error").inner_text() == said and "\n" not in said
        assert "needs a value after '<'" in said
        o.wait_rows([str(n) for n in range(N, N - 50, -1)])
        assert _count(o.page) == f"{N} runs" and o.same_document()
        assert box.input_value() == bad and "q=lr%3C" in o.page.url
        # a good one after it: the error goes
        box.fill("tag:best")
        box.press("Enter")
        o.wait_rows(_server_rows(server, "q=tag%3Abest"))
        assert o.page.locator("#filter-error").count() == 0
    finally:
        o.close()


def test_after_a_swap_the_selection_columns_and_parallel_coordinates_follow_the_new_rows(server, browser):
    o = Opened(browser, server)
    try:
        page = o.page
        page.locator("#runs tr[data-run='130'] input[type=checkbox]").check()
        assert page.locator("#compare-button").inner_text() == "Show the selected run"
        page.locator("#column-chooser summary").click()
        page.locator("#column-chooser input[value='comment']").uncheck()
        page.locator("#runs thead th[data-col='param.lr'] a").click()
        want = _server_rows(server, "sort=param.lr&order=desc")
        o.wait_rows(want)
        # the new rows: the run ticked before is ticked where it shows (test_runs_selection_kept.py);
        # untick it, and selecting two compares them
        assert page.locator("#runs input[name=run]:checked").evaluate_all("bs => bs.map(b => b.value)") == ["130"]
        page.locator("#runs tr[data-run='130'] input[type=checkbox]").uncheck()
        assert page.locator("#compare-button").is_disabled()
        page.locator(f"#runs tr[data-run='{want[0]}'] input[type=checkbox]").check()
        page.locator(f"#runs tr[data-run='{want[1]}'] input[type=checkbox]").check()
        assert page.locator("#compare-button").inner_text() == "Compare 2 runs"
        assert page.locator("#runs tr.selected").count() == 2
        # the hidden column stays hidden in the new table, and the chooser lists the new table's columns
        assert page.locator("#runs td[data-col='comment']").first.is_hidden()
        boxes = page.locator("#column-chooser input").evaluate_all("bs => bs.map(b => b.value)")
        heads = page.locator("#runs thead th[data-col]").evaluate_all("hs => hs.map(h => h.dataset.col)")
        assert boxes == [c for c in heads if c != "run"]
        # the parallel coordinates are the new rows'
        page.wait_for_function("want => { const b = document.querySelector('#parcoords[data-ready]');"
                               " if (!b) return false; const got = [...b.querySelectorAll('a.pc-run')]"
                               ".map(a => a.dataset.run).sort(); return JSON.stringify(got) === JSON.stringify(want); }",
                               arg=sorted(want), timeout=30_000)
        assert o.same_document()
        # the compare form sends the runs selected among the new rows
        page.locator("#compare-button").click()
        page.wait_for_url(re.compile(r"/compare\?"))
        assert re.findall(r"run=(\d+)", page.url) == want[:2]
    finally:
        o.close()


def test_hostile_filters_and_sort_keys_stay_text(server, browser):
    o = Opened(browser, server, "/?sort=param.__proto__")
    try:
        page = o.page
        assert page.locator("#runs tbody tr[data-run]").count() == 50  # a column no run has: its cells empty
        box = page.locator("#runs-filter input[name=q]")
        for q in ("<script>alert(1)</script>", "__proto__", "constructor", "<img src=x onerror=alert(1)>"):
            box.fill(q)
            box.press("Enter")
            page.wait_for_function("q => new URL(location.href).searchParams.get('q') === q", arg=q, timeout=30_000)
            page.wait_for_function("() => !document.querySelector('#runs[aria-busy]')", timeout=30_000)
            assert box.input_value() == q
            status, _h, body = server.request(f"/?sort=param.__proto__&q={quote(q)}")
            said = re.search(r'id="filter-error" role="alert">(.*?)</p>', body)
            if status == 400:  # a comparison with no column before '<': said, as text
                assert o.page.locator("#filter-error").inner_text() == html.unescape(said.group(1))
                assert page.locator("#filter-error *").count() == 0
            else:
                assert said is None and page.locator("#filter-error").count() == 0
            assert page.locator("#runs-count").inner_text() == (f"0 of {N} runs" if status == 200 else f"{N} runs")
            assert page.locator("#runs-count *").count() == 0
        q = "__proto__<1"  # a column no run has: the error, with the name as text
        box.fill(q)
        box.press("Enter")
        page.wait_for_function("() => (document.querySelector('#filter-error') || {}).textContent"
                               ".includes(\"no run has a column '__proto__'\")", timeout=30_000)
        assert page.locator("#filter-error *").count() == 0 and o.same_document()
        # back to the first view: every run, the first page
        for _ in range(5):
            page.go_back()
        o.wait_rows(_server_rows(server, "sort=param.__proto__"))
    finally:
        o.close()


def test_without_javascript_the_same_sort_link_and_filter_navigate(server, browser):
    o = Opened(browser, server, js=False)
    try:
        page = o.page
        with page.expect_navigation():
            page.locator("#runs thead th[data-col='param.lr'] a").click()
        assert rows_of(page.content()) == _server_rows(server, "sort=param.lr&order=desc")
        assert "sort=param.lr" in page.url and o.documents
        with page.expect_navigation():
            page.locator("#runs-filter input[name=q]").fill("tag:best")
            page.locator("#runs-filter input[name=q]").press("Enter")
        assert rows_of(page.content()) == _server_rows(server, "sort=param.lr&order=desc&q=tag%3Abest")
    finally:
        o.close()


def test_a_failed_fetch_falls_back_to_the_link(server, browser):
    """The view's endpoint unreachable (a proxy, a server of another version): the click navigates as it would
    without the script."""
    o = Opened(browser, server)
    try:
        o.page.route("**/api/runs/view*", lambda r: r.abort())
        with o.page.expect_navigation():
            o.page.locator("#runs thead th[data-col='param.lr'] a").click()
        assert o.rows() == _server_rows(server, "sort=param.lr&order=desc")
        assert o.documents  # it loaded the page
        o.watched.console_errors.clear()  # the aborted fetch's own line
    finally:
        o.close()


def test_a_slow_answer_to_an_earlier_click_never_replaces_a_later_one(server, browser, monkeypatch):
    import threading

    app = server.server.app
    parts = app.runs_parts
    release, answered = threading.Event(), threading.Event()

    def slow(p):
        if p.one("sort") != "param.lr":
            return parts(p)
        release.wait(30)  # answered after the later click's view is on screen
        try:
            return parts(p)
        finally:
            answered.set()

    monkeypatch.setattr(app, "runs_parts", slow)
    o = Opened(browser, server)
    try:
        o.page.locator("#runs thead th[data-col='param.lr'] a").click()
        o.page.locator("#runs thead th[data-col='metric.loss'] a").click()
        want = _server_rows(server, "sort=metric.loss&order=desc")
        o.wait_rows(want)
        release.set()
        assert answered.wait(30)
        o.page.wait_for_timeout(300)  # a stale answer, were it taken, would be swapped in by now (never a false failure)
        assert o.rows() == want and "sort=metric.loss" in o.page.url and o.same_document()
        o.watched.console_errors.clear()  # the aborted fetch
    finally:
        release.set()
        o.close()


def test_a_filter_and_a_sort_keep_the_rows_per_page(server, browser):
    o = Opened(browser, server, "/?per=10")
    try:
        page = o.page
        box = page.locator("#runs-filter input[name=q]")
        box.fill("status:ok")
        box.press("Enter")
        o.wait_rows(_server_rows(server, "q=status%3Aok&per=10"))
        assert len(o.rows()) == 10 and "per=10" in page.url
        page.locator("#runs thead th[data-col='param.lr'] a").click()
        o.wait_rows(_server_rows(server, "q=status%3Aok&per=10&sort=param.lr&order=desc"))
        assert "per=10" in page.url and o.same_document()
        # a view of 50 a page again: the filter box no longer carries per
        page.goto(o.base + "/?q=status%3Aok", wait_until="load")
        assert page.locator("#runs-filter input[name=per]").count() == 0
    finally:
        o.close()


def test_a_run_that_starts_after_a_swap_goes_where_the_swapped_in_view_puts_it(tmp_path, browser):
    """Oldest first, one page: a new run would go at the bottom. Sorted newest first in place, it goes on top:
    the live updates follow the table swapped in (its serial, where it puts new runs), not the first one."""
    from casmon.runs.imported import write_run

    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    for i in range(3):
        write_run(s, start=1.7e9 + i, end=1.7e9 + i + 1, params={"lr": 0.1})
    s.close()
    srv = Served(path)
    o = Opened(browser, srv, "/?order=asc")
    try:
        assert o.rows() == ["1", "2", "3"]
        o.page.locator("#runs thead th[data-col='start'] a").click()
        o.wait_rows(["3", "2", "1"])
        w = casmon.open(path)
        write_run(w, start=1.7e9 + 10, end=1.7e9 + 11, params={"lr": 0.2})
        w.close()
        o.wait_rows(["4", "3", "2", "1"])  # within a poll (5 s)
        assert o.page.locator("#runs-count").inner_text() == "4 runs" and o.same_document()
    finally:
        o.close()
        srv.close()
