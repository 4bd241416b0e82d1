"""Runs attacked: crafted metric batches, values no float holds, odd run.info, kills at every fault point while
several threads log. Each view of a run must tell its stored points, never a batch's claim about them."""

import base64
import fractions
import json
import math
import sys

import numpy as np
import pytest

import casmon
from tests.support.cli import cli

pytestmark = [pytest.mark.filterwarnings("ignore::casmon.RunWarning")]


def _points(steps, values, times):
    return (np.asarray(steps, "<i8").tobytes() + np.asarray(values, "<f8").tobytes()
            + np.asarray(times, "<f8").tobytes())


def _running_copy(s):
    """The latest run, made to read as running again (so its summary is read from its batches)."""
    r = casmon.load_run("latest", s)
    m = dict(r.manifest, status="running")
    m.pop("metrics")
    s.set_ref(r.ref, s.put(m), {})
    return r


def test_a_well_formed_batch_summary_that_disagrees_with_its_points_loses_to_them(tmp_path):
    from casmon.runs import metrics as mm

    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
    r = _running_copy(s)
    lie = {"last": 5.0, "step": 9, "time": 1.0, "min": -3.0, "max": 7.0}
    small = _points([0, 1], [0.5, 0.25], [1.0, 2.0])
    big_n = mm.INLINE_POINTS + 1
    big = _points(np.arange(big_n), np.full(big_n, 2.0), np.full(big_n, 3.0))
    s.append(mm.KIND_METRICS, {"run": r.ref, "seq": 7, "s": {
        "inline": {"n": 2, "b64": base64.b64encode(small).decode(), "sum": lie},
        "stored": {"n": big_n, "$": s.put(big).hex(), "sum": lie},
        "huge_step": {"n": 2, "b64": base64.b64encode(small).decode(), "sum": dict(lie, step=2**70)}}},
        key=mm.metrics_key(r.ref))
    s.flush()
    got = casmon.load_run("latest", s).metric_summary()
    for k in ("inline", "huge_step"):
        assert (got[k]["n"], got[k]["last"], got[k]["step"], got[k]["min"], got[k]["max"]) == (2, 0.25, 1, 0.25, 0.5)
    assert (got["stored"]["n"], got["stored"]["last"], got["stored"]["step"], got["stored"]["min"]) == (
        big_n, 2.0, big_n - 1, 2.0)
    shown = json.loads(cli("show", "latest", "--json", "--store", str(s.url)).stdout)["metrics"]
    assert shown["inline"]["last"] == 0.25 and shown["stored"]["step"] == big_n - 1
    s.close()


@pytest.mark.parametrize("value", [10**400, -(10**400), fractions.Fraction(10**400)])
def test_a_metric_value_no_float_holds_is_a_clear_error_naming_the_metric(tmp_path, value):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        with pytest.raises(ValueError, match="metric 'big'.*float"):
            run.log(big=value, fine=1.0)
        run.log(fine=2.0)
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and list(r.metric("fine").values) == [2.0] and "big" not in r.metric_summary()
    s.close()


def test_points_another_thread_logs_as_the_run_ends_are_in_its_summary_or_nowhere(tmp_path, monkeypatch):
    """SIGTERM, Ctrl-C or the end of the block while threads still log: no point lands after the summary."""
    from casmon.runs import metrics as mm

    s = casmon.open(tmp_path / "s", autoflush=None)
    summarise = mm.MetricLog.full_summary
    late = []

    def then_log(self):
        got = summarise(self)
        late.append(run)
        run.log(x=99.0)  # another thread's call, just after the summary was taken
        return got

    monkeypatch.setattr(mm.MetricLog, "full_summary", then_log)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
    run.log(x=100.0)  # after the end
    s.flush()
    assert late
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and r.metric_summary()["x"]["n"] == len(r.metric("x")) == 1
    s.close()


class _NoText:
    def __str__(self):
        raise RuntimeError("no str")

    def __repr__(self):
        raise RuntimeError("no repr")

    def __hash__(self):
        return 1


class _StrKey(str):
    def __str__(self):
        raise RuntimeError("no str")


class _NoItems(dict):
    def items(self):
        raise RuntimeError("no items")

    def __iter__(self):
        raise RuntimeError("no iter")

    def keys(self):
        raise RuntimeError("no keys")


@pytest.mark.parametrize("make, want", [
    (lambda: {1: "int", "1": "str", 1.0: "float?"}, {"1": "str", "1 (int)": "float?"}),
    (lambda: {"a": 1, (1, 2): 3, None: 4}, {"a": 1, "(1, 2)": 3, "None": 4}),
    (lambda: {_NoText(): 1, "b": 2}, None),
    (lambda: {_StrKey("k"): 1}, {"k": 1}),
    (lambda: _NoItems(a=1), {"a": 1}),
], ids=["keys-that-read-alike", "non-str-keys", "key-without-text", "str-subclass-key", "dict-subclass-without-items"])
def test_any_info_or_params_keys_end_the_run_ok_and_keep_every_value(tmp_path, make, want):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.info = make()
        run.params = make()
    r = casmon.load_run("latest", s)
    assert r.status == "ok"
    for got in (r.info(), r.params()):
        assert len(got) == len(make())  # no value lost to a key that reads like another
        if want is not None:
            assert got == want
    s.close()


def test_info_another_thread_changes_while_the_run_ends_leaves_the_run_ended(tmp_path, monkeypatch):
    from casmon.runs import cells

    s = casmon.open(tmp_path / "s")
    store_one = cells.json_or_value

    def and_change(store, v, refs):  # another thread adds a key while the end is being stored
        run.info[f"later{len(run.info)}"] = 1
        return store_one(store, v, refs)

    with casmon.record(store=s, capture_output=False) as run:
        run.info = {"a": 1, "b": 2}
        monkeypatch.setattr(cells, "json_or_value", and_change)
    monkeypatch.undo()
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and {"a", "b"} <= set(r.info())
    s.close()


def test_an_imported_runs_keys_that_read_alike_are_both_kept(tmp_path):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    write_run(s, start=1.0, end=2.0, info={1: "int", "1": "str"}, params={"1": "str", 1: "int"},
              metrics={"x": ([0, 1], [float("nan"), float("inf")], [1.0, 2.0])})
    r = casmon.load_run("latest", s)
    assert r.info() == r.params() == {"1": "str", "1 (int)": "int"}
    assert str(r.metric_summary()["x"]["last"]) == "inf" and r.metric_summary()["x"]["n"] == 2
    s.close()


THREADS = r"""
import os, sys, threading, time, casmon
store, how = sys.argv[1], sys.argv[2]
with casmon.record(store=store) as run:
    def work(name):
        for i in range(10**6):
            run.log({name: float("nan") if i % 13 == 5 else (float("inf") if i % 17 == 3 else float(i))}, step=i)
            if i % 50 == 0:
                time.sleep(0.001)
            if i == 300 and name == "a":
                open(os.path.join(os.path.dirname(store), "ready"), "w").close()
                if how == "exit":
                    os._exit(3)
                if how == "thread":
                    raise RuntimeError("a logging thread fails")
    for n in "abc":
        threading.Thread(target=work, args=(n,), daemon=True).start()
    for i in range(10**6):
        run.log(main=float(i))
        time.sleep(0.0005)
        if i % 97 == 0:
            run.store.flush()
"""


def _ends(tmp_path, how):
    """Run THREADS in a child and end it ``how``: a signal once it logged a while, os._exit, a failing thread
    (then SIGKILL), or a fault point's action (``fp:POINT@N=ACTION``)."""
    import os
    import random
    import signal
    import subprocess
    import time

    from tests.conftest import ROOT

    store = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_HEARTBEAT_S="1")
    if how.startswith("fp:"):
        env["CASMON_FAULTPOINTS"] = how[3:]
    p = subprocess.Popen([sys.executable, "-c", THREADS, store, how], env=env, cwd=tmp_path,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "ready").exists() and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(random.random() * 0.3)
        sig = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "int": signal.SIGINT}.get(how)
        if how.startswith("fp:"):
            try:
                p.wait(20)  # the fault point ends it, or, if it was never reached, SIGKILL below
            except subprocess.TimeoutExpired:
                sig = signal.SIGKILL
        if how == "thread":
            time.sleep(0.3)
            sig = signal.SIGKILL
        if sig is not None and p.poll() is None:
            p.send_signal(sig)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    return store, err


def _told(v):
    """A summary's numbers, however a view writes them ("NaN", nan, "Infinity", inf), as one text."""
    from casmon.runs.metrics import number_of

    return tuple(str(number_of(v[k])) if k in ("last", "min", "max") else v[k] for k in ("n", "step", "last", "min", "max"))


def _every_view(store, name):
    """{view: (status, {metric: (n, last step, last, min, max)})} as each view tells it, and the points' truth."""
    from casmon.ui import api, model

    s = casmon.open(store, read_only=True)
    r = casmon.load_run(name, s)
    truth = {}
    for k, ser in r.metrics().items():
        v = ser.values
        real = v[~np.isnan(v)]
        lo, hi = (float(real.min()), float(real.max())) if len(real) else (math.nan, math.nan)
        truth[k] = (len(ser), int(ser.steps[-1]), str(float(v[-1])), str(lo), str(hi))
    got = {"load_run": (r.status, {k: _told(v) for k, v in r.metric_summary().items()})}
    got["list_runs"] = (next(x.status for x in casmon.list_runs(s) if x.name == name), None)
    row = next(x for x in _json(cli("runs", "--json", "--store", store).stdout) if x["name"] == name)
    got["casmon runs"] = (row["status"], {k: _told(v) for k, v in row["metrics"].items()})
    shown = _json(cli("show", name, "--json", "--store", store).stdout)
    got["casmon show"] = (shown["status"], {k: _told(v) for k, v in shown["metrics"].items()})
    index = model.RunIndex(s)
    state = api.run_state(index, index.find(name))
    got["ui /api/run"] = (state["status"], {k: _told(v) for k, v in state["metrics"].items()})
    row = next(x for x in api.runs_since(index, 0)["runs"] if x["name"] == name)
    got["ui /api/runs"] = (row["status"], {k: _told(v) for k, v in row["metrics"].items()})
    s.close()
    return truth, got


def _json(text):
    def refuse(c):
        raise AssertionError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


_WRITER_POINTS = ["flush.sealed", "flush.after_pack", "flush.after_index", "flush.after_records", "put.after_chunks",
                  "local.partial_written", "merge.after_buckets", "merge.after_manifest"]


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("how", ["kill", "term", "int", "exit", "thread"]
                         + [f"fp:{p}@{n}={a}" for p in _WRITER_POINTS for a in ("kill", "interrupt")
                            for n in ((20, 60) if p.startswith("local.") else (2, 7))])  # each file passes local.*
def test_a_run_several_threads_log_into_reads_the_same_in_every_view_however_it_ends(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    store, err = _ends(tmp_path, how)
    runs = casmon.list_runs(casmon.open(store, read_only=True))
    assert runs, err
    truth, got = _every_view(store, runs[0].name)  # no points at all when a kill fell before the first batch
    assert len({status for status, _ in got.values()}) == 1, got
    assert {view: m for view, (_, m) in got.items() if m is not None and m != truth} == {}, (truth, err)


def test_an_exported_runs_information_json_holds_no_bare_nan_or_infinity(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.info = {"a": float("nan"), "b": [float("inf"), -float("inf")], "c": np.float64("nan"), "d": {"e": 1.5}}
        run.params = {"lr": float("nan")}
        run.log(x=float("nan"))
    root = casmon.export(casmon.load_run("latest", s), tmp_path / "exported")
    got = _json((root / "information.json").read_text(encoding="utf-8"))
    text = json.dumps(got)
    assert '"NaN"' in text and '"Infinity"' in text and '"-Infinity"' in text and "1.5" in text
    s.close()


class _OddScalar:
    def __init__(self, error):
        self.error = error

    def item(self):
        raise self.error


@pytest.mark.parametrize("error", [KeyError("k"), IndexError("i"), AttributeError("a"), ZeroDivisionError()])
def test_a_metric_value_whose_conversion_fails_any_way_is_a_type_error_naming_the_metric(tmp_path, error):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        with pytest.raises(TypeError, match="metric 'odd' must be a number"):
            run.log(odd=_OddScalar(error), fine=1.0)
        run.log(fine=2.0)
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and list(r.metric("fine").values) == [2.0]
    s.close()
