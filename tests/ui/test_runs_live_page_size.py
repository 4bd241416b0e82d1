"""A run that starts while a page of the runs table is open keeps that page at its size: on top of the newest
first page, the row it pushes down leaves (the next page starts with it, as the server now pages), and a full
oldest-first last page counts the run in the notice, not as a row past the page's size."""

from __future__ import annotations

import casmon
from casmon.runs.imported import write_run
from tests.support.browser import needs_chromium
from tests.ui.test_runs_inplace_browser import Opened
from tests.ui.test_ui import Served, rows_of

pytestmark = needs_chromium


def _store(tmp_path, n):
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    for i in range(n):
        write_run(s, start=1.7e9 + i, end=1.7e9 + i + 1, params={"lr": 0.1})
    s.close()
    return path


def _new_run(path, at):
    w = casmon.open(path)
    write_run(w, start=1.7e9 + at, end=1.7e9 + at + 1, params={"lr": 0.2})
    w.close()


def test_a_new_run_on_top_of_a_full_first_page_pushes_its_last_row_to_the_next_page(tmp_path, browser):
    path = _store(tmp_path, 6)
    srv = Served(path)
    o = Opened(browser, srv, "/?per=3")
    try:
        assert o.rows() == ["6", "5", "4"]
        _new_run(path, 10)
        o.wait_rows(["7", "6", "5"])  # within a poll (5 s)
        assert o.page.locator("#runs-count").inner_text() == "7 runs"
        # the next page starts where the first now ends: no run on both, none on neither
        o.page.locator("nav.pager a", has_text="next").click()
        o.wait_rows(rows_of(srv.request("/?per=3&page=2")[2]))
        assert o.rows() == ["4", "3", "2"] and o.same_document()
    finally:
        o.close()
        srv.close()


def test_a_new_run_after_a_full_oldest_first_last_page_is_counted_in_the_notice(tmp_path, browser):
    path = _store(tmp_path, 6)
    srv = Served(path)
    o = Opened(browser, srv, "/?per=3&order=asc&page=2")
    try:
        assert o.rows() == ["4", "5", "6"]
        _new_run(path, 10)
        o.page.wait_for_selector("#new-runs:not([hidden])", timeout=30_000)
        assert "1 new run" in o.page.locator("#new-runs").inner_text()
        assert o.rows() == ["4", "5", "6"]
        # the notice's link keeps the page size
        assert "per=3" in o.page.locator("#new-runs a").get_attribute("href")
    finally:
        o.close()
        srv.close()


def test_a_new_run_after_an_oldest_first_last_page_with_room_is_added_to_it(tmp_path, browser):
    path = _store(tmp_path, 5)
    srv = Served(path)
    o = Opened(browser, srv, "/?per=3&order=asc&page=2")
    try:
        assert o.rows() == ["4", "5"]
        _new_run(path, 10)
        o.wait_rows(["4", "5", "6"])
    finally:
        o.close()
        srv.close()
