"""Runs ticked on the runs page stay selected while a sort, a filter or another page is swapped in: ticked
again where they show, sent to Compare where they do not, counted on the button, and cleared on request."""

from __future__ import annotations

import re

from tests.support.browser import needs_chromium
from tests.ui.test_runs_inplace_browser import Opened, _server_rows, server  # noqa: F401 - the fixture

pytestmark = needs_chromium


def test_runs_ticked_across_a_filter_and_a_page_are_compared_together(server, browser):  # noqa: F811
    o = Opened(browser, server)
    try:
        page = o.page
        page.locator("#runs tr[data-run='129'] input[type=checkbox]").check()  # lr 1e-5: not on lr's first page
        page.locator("#runs thead th[data-col='param.lr'] a").click()
        want = _server_rows(server, "sort=param.lr&order=desc")
        o.wait_rows(want)
        assert page.locator("#compare-button").inner_text() == "Show the selected run"
        assert "1 not on this page" in page.locator("#selection-kept").inner_text()
        page.locator(f"#runs tr[data-run='{want[0]}'] input[type=checkbox]").check()
        assert page.locator("#compare-button").inner_text() == "Compare 2 runs"
        # the next page, and back: the ticked row is ticked again
        page.locator("nav.pager a", has_text="next").click()
        o.wait_rows(_server_rows(server, "sort=param.lr&order=desc&page=2"))
        assert page.locator("#compare-button").inner_text() == "Compare 2 runs"
        page.go_back()
        o.wait_rows(want)
        assert page.locator(f"#runs tr[data-run='{want[0]}'] input[type=checkbox]").is_checked()
        assert page.locator(f"#runs tr[data-run='{want[0]}']").get_attribute("class") == "selected"
        # unticking a shown run drops it; the one not shown is still sent
        page.locator(f"#runs tr[data-run='{want[1]}'] input[type=checkbox]").check()
        page.locator(f"#runs tr[data-run='{want[1]}'] input[type=checkbox]").uncheck()
        assert o.same_document()
        page.locator("#compare-button").click()
        page.wait_for_url(re.compile(r"/compare\?"))
        assert sorted(re.findall(r"run=(\d+)", page.url)) == sorted([want[0], "129"])
    finally:
        o.close()


def test_clear_drops_the_selection_not_shown(server, browser):  # noqa: F811
    o = Opened(browser, server)
    try:
        page = o.page
        page.locator("#runs tr[data-run='129'] input[type=checkbox]").check()
        page.locator("nav.pager a", has_text="next").click()
        o.wait_rows(_server_rows(server, "page=2"))
        page.locator("#selection-kept button").click()
        assert page.locator("#compare-button").is_disabled()
        assert page.locator("#selection-kept").is_hidden()
        page.go_back()
        o.wait_rows(_server_rows(server, ""))
        assert page.locator("#runs input[name=run]:checked").count() == 0
    finally:
        o.close()
