"""What a live run's ref says about its metrics is what a reader can read: the ref is rewritten by its own
heartbeat thread, while another thread's flush may be writing the points' record."""

import threading
import time

import pytest

import casmon
from tests.support import deadline
from casmon import faultpoints

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _until(cond, what, timeout=60.0):
    return deadline.until(cond, what, timeout)


def _reader(loc):
    runs = casmon.list_runs(casmon.open(loc, create=False, read_only=True))
    return runs[-1] if runs else None


def test_a_heartbeat_during_a_flush_names_no_metric_whose_points_are_not_written(tmp_path, monkeypatch):
    monkeypatch.setenv("CASMON_HEARTBEAT_S", "0.2")
    pause = tmp_path / "pause"
    pause.mkdir()
    loc = tmp_path / "s"
    store = casmon.open(loc, autoflush=None)  # only this test's flush writes the points
    try:
        with casmon.record(store=store, capture_output=False) as run:
            run.log(loss=0.5, epoch=0)
            faultpoints.configure(f"flush.sealed=pause:{pause}")
            flusher = threading.Thread(target=store.flush)
            try:
                flusher.start()
                _until((pause / "flush.sealed.reached").exists, "the flush to set the points' record aside")
                sealed = time.time()
                r = _until(lambda: (r := _reader(loc)) is not None and (r.heartbeat or 0) > sealed and r,
                           "a heartbeat while the record is unwritten")
                for name in r.metric_summary():
                    assert len(r.metric(name)) == r.metric_summary()[name]["n"], name
            finally:
                (pause / "flush.sealed.go").touch()
                faultpoints.configure(None)
                flusher.join(60)
            r = _until(lambda: (r := _reader(loc)) is not None and "loss" in r.metric_summary() and r,
                       "the written points in the ref")
            assert r.metric("loss").values.tolist() == [0.5] and r.metric_summary()["loss"]["n"] == 1
    finally:
        store.close()
