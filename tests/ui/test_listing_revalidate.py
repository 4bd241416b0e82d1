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
    monkeypatch.setattr(type(s.backend), "stamp_settled", lambda self, *a: asked.append(a) or real(self, *a))
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
