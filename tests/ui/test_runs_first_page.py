"""What the runs page's first answer does around the listing: the cycle collector paused while it is made and
left as it was found (a failed listing too), a big listing frozen out of it; the background loader waits for a
quiet moment."""

from __future__ import annotations

import gc
import time

import pytest

import casmon
from casmon.errors import CasmonError
from casmon.runs.imported import write_run
from casmon.ui import server as ui_server
from casmon.ui.server import App


@pytest.fixture()
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    for i in range(3):
        write_run(s, start=1.7e9 + i, end=1.7e9 + i + 1, params={"lr": 0.1 * (i + 1)})
    yield s
    s.close()


@pytest.fixture()
def collector():
    """The cycle collector as the test found it, again after it (on, nothing frozen)."""
    was = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was else gc.disable)()


def test_the_first_page_leaves_the_collector_on_and_freezes_a_big_listing(store, collector, monkeypatch):
    gc.enable()
    app = App(store)
    app.index_in_background = False
    app.own_process = True  # as `casmon ui` runs it
    seen = []
    entries = app.runs.entries
    monkeypatch.setattr(app.runs, "entries", lambda *a, **k: (seen.append(gc.isenabled()), entries(*a, **k))[1])
    monkeypatch.setattr(ui_server, "FREEZE_FROM", 3)
    frozen = gc.get_freeze_count()
    status, body, _ = app.handle("/")
    assert status == 200 and b'data-run="3"' in body
    assert seen[0] is False and gc.isenabled()  # paused for the listing only
    assert gc.get_freeze_count() > frozen
    gc.unfreeze()
    app.handle("/api/runs/view?sort=param.lr")  # listed once: nothing paused or frozen again
    assert gc.isenabled() and gc.get_freeze_count() == 0 and seen[1:] and all(seen[1:])


def test_a_small_listing_is_not_frozen(store, collector):
    gc.enable()
    app = App(store)
    app.index_in_background = False
    app.own_process = True  # as `casmon ui` runs it
    app.handle("/")
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_listing_that_fails_leaves_the_collector_on_and_is_tried_again(store, collector, monkeypatch):
    gc.enable()
    app = App(store)
    app.index_in_background = False
    app.own_process = True  # as `casmon ui` runs it
    entries = app.runs.entries
    monkeypatch.setattr(app.runs, "entries", lambda *a, **k: (_ for _ in ()).throw(CasmonError("the refs are gone")))
    with pytest.raises(CasmonError):
        app.handle("/")
    assert gc.isenabled()
    monkeypatch.setattr(app.runs, "entries", entries)
    status, body, _ = app.handle("/")
    assert status == 200 and b'data-run="1"' in body


def test_a_collector_turned_off_stays_off(store, collector, monkeypatch):
    gc.disable()
    monkeypatch.setattr(ui_server, "FREEZE_FROM", 0)
    app = App(store)
    app.index_in_background = False
    app.own_process = True  # as `casmon ui` runs it
    app.handle("/")
    assert not gc.isenabled() and gc.get_freeze_count() == 0


def test_the_background_loader_waits_for_a_quiet_moment(store, monkeypatch):
    monkeypatch.setattr(ui_server, "LOADER_QUIET", 0.5)
    app = App(store)
    app.enter()
    assert not app.runs.idle()  # a request is being answered
    app.index_in_background = False
    app.leave()
    assert not app.runs.idle()  # just answered: the next may follow at once
    deadline = time.monotonic() + 30
    while not app.runs.idle():
        assert time.monotonic() < deadline
        time.sleep(0.05)
