"""The runs page's listing, brought up to date at each request, checks an ended run's stamp for settledness
once: a stamp found settled stays so, so a request at 100k runs costs one stamped listing of the refs."""

import time

import pytest

import casmon
from benchmarks.runs_store import build
from casmon.ui import model

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def test_a_settled_stamp_is_not_checked_again_and_a_rewritten_ref_still_is(tmp_path, monkeypatch):
    import casmon.store.backend.local as local

    monkeypatch.setattr(model, "FULL_LOOK_SECONDS", 0.0)  # every ref's stamp looked at each time
    path = tmp_path / "s"
    build(str(path), 20, metrics=1, points=3)
    old = time.time_ns() - 3600 * 10**9
    monkeypatch.setattr(local, "_stamp_of", lambda st: f"{st.st_ino:x}.{old:x}.{old:x}.{st.st_size:x}")
    casmon.list_runs(casmon.open(path))
    s = casmon.open(path, read_only=True)
    idx = model.RunIndex(s)
    assert len(idx.entries()) == 20
    asked = []
    real = type(s.backend).stamp_settled

    def settled(self, stamp, at):
        if stamp != self.folder_stamp("refs/runs"):  # a ref's, not the folder's
            asked.append(stamp)
        return real(self, stamp, at)

    monkeypatch.setattr(type(s.backend), "stamp_settled", settled)
    idx.entries(fresh=True)
    idx.entries(fresh=True)
    assert asked == []  # each found settled by the first listing
    monkeypatch.setattr(local, "_stamp_of", lambda st: f"{st.st_ino:x}.{old + 1:x}.{old + 1:x}.{st.st_size:x}")
    got = idx.entries(fresh=True)  # every stamp changed: every ref read again, each stamp checked anew
    assert len(got) == 20 and all(not e.settled for e in got)
    idx.entries(fresh=True)
    assert len(asked) == 20
    idx.entries(fresh=True)
    assert len(asked) == 20


def _settled_folder(s):
    deadline = time.monotonic() + 60
    while not s.backend.stamp_settled(s.backend.folder_stamp("refs/runs"), time.time()):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_an_unchanged_settled_refs_folder_lists_no_ref_and_a_ref_added_or_removed_is_seen(tmp_path, monkeypatch):
    path = tmp_path / "s"
    build(str(path), 20, metrics=1, points=3)
    casmon.list_runs(casmon.open(path))
    s = casmon.open(path, read_only=True)
    idx = model.RunIndex(s)
    assert len(idx.entries()) == 20
    _settled_folder(s)
    idx.entries(fresh=True)  # a full look, the folder's stamp settled
    listed = []
    real = type(s.backend).list_stamped
    monkeypatch.setattr(type(s.backend), "list_stamped", lambda self, *a: listed.append(a) or real(self, *a))
    first = idx.entries(fresh=True)
    assert listed == [] and idx.entries(fresh=True) is first
    with casmon.record(store=casmon.open(path), capture_output=False, system_metrics=False):
        pass
    assert len(idx.entries(fresh=True)) == 21 and listed
    _settled_folder(s)
    idx.entries(fresh=True)
    (path / "refs" / "runs" / "3").unlink()
    assert len(idx.entries(fresh=True)) == 20
