"""A run reads the same in every view: after a SIGKILL at any step its summary agrees with its points, its status
is one function's answer, a lost run's output is shown, a bad ``run.info`` is refused where it is set, and NaN
and infinities are said as such.

Kills are real: a training script in a child process is SIGKILLed at casmon's named fault points (between the
steps of a flush) or once it says it got somewhere; this process then reads the store through every view.
"""

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest

import casmon
from tests.support import deadline
from tests.conftest import ROOT
from tests.support.cli import cli

pytestmark = [pytest.mark.filterwarnings("ignore::casmon.RunWarning"),
              pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")]

TRAIN = r"""
import os, sys, time, casmon
store = sys.argv[1]
with casmon.record(store=store) as run:
    for step in range(100000):
        print(f"step {step}", flush=True)
        run.log(loss=1.0 / (step + 1))
        if step % 7 == 6:
            run.store.flush()  # a batch at a time (points and output), as the live thread writes them, more often
        if step == 40:
            open(os.path.join(os.path.dirname(store), "ready"), "w").close()
        time.sleep(0.002)
"""


def _until(cond, what, timeout=120.0):
    return deadline.until(cond, what, timeout)


def _killed_run(tmp_path, faultpoint=None):
    """A run whose process died by SIGKILL: at ``faultpoint``, or once it logged 40 steps."""
    store = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_HEARTBEAT_S="1")
    if faultpoint:
        env["CASMON_FAULTPOINTS"] = f"{faultpoint}=kill"
    p = subprocess.Popen([sys.executable, "-c", TRAIN, store], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        if faultpoint is None:
            _until(lambda: (tmp_path / "ready").exists() or p.poll() is not None, "40 steps")
            p.send_signal(signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == -signal.SIGKILL, err
    return store


def _views(store: str, name: str, tmp_path) -> dict[str, tuple[int, int]]:
    """(points, last step) of the metric ``loss`` as each view tells them."""
    from casmon.ui import api, model

    s = casmon.open(store, read_only=True)
    r = casmon.load_run(name, s)
    got: dict[str, tuple[int, int]] = {}
    series = r.metric("loss")
    got["load_run.metric"] = (len(series), int(series.steps[-1]))
    summary = r.metric_summary()["loss"]
    got["load_run.metric_summary"] = (summary["n"], summary["step"])
    listed = {x["name"]: x for x in json.loads(cli("runs", "--json", "--store", store).stdout)}
    got["casmon runs --json"] = (listed[name]["metrics"]["loss"]["n"], listed[name]["metrics"]["loss"]["step"])
    shown = json.loads(cli("show", name, "--json", "--store", store).stdout)["metrics"]["loss"]
    got["casmon show --json"] = (shown["n"], shown["step"])
    text = cli("show", name, "--store", store).stdout
    line = next(x for x in text.splitlines() if x.strip().startswith("loss:"))
    got["casmon show"] = (int(line.split(" point")[0].rsplit(" ", 1)[1].replace(",", "")),
                          int(line.split("at step ")[1].split(",")[0]))
    d = json.loads(cli("diff", name, "2-other", "--json", "--store", store).stdout)
    got["casmon diff --json"] = (d["metrics"]["loss"]["n"][0], got["load_run.metric"][1])
    index = model.RunIndex(s)
    entry = index.find(name)
    state = api.run_state(index, entry)["metrics"]["loss"]
    got["ui /api/run"] = (state["n"], state["step"])
    row = next(x for x in api.runs_since(index, 0)["runs"] if x["name"] == name)["metrics"]["loss"]
    got["ui /api/runs"] = (row["n"], row["step"])
    from casmon.ui.compare import compare

    cell = next(row for row in compare([r, casmon.load_run("2-other", s)]).metrics if row.key == "loss").cells[0]
    got["ui compare page"] = (cell["n"], cell["step"])
    root = casmon.export(r, tmp_path / "exported")
    rows = [x for x in csv.DictReader(open(root / "metrics.csv")) if x["metric"] == "loss"]
    got["metrics.csv"] = (len(rows), int(rows[-1]["step"]))
    s.close()
    return got


@pytest.mark.parametrize("faultpoint", [None, "flush.after_records@4", "flush.after_records@9", "flush.sealed@6",
                                        "flush.sealed@11"])
def test_a_sigkilled_runs_summary_agrees_with_its_points_in_every_view(tmp_path, monkeypatch, faultpoint):
    monkeypatch.chdir(tmp_path)  # this process's runs are outside this repository
    store = _killed_run(tmp_path, faultpoint)
    with casmon.record(comment="other", store=store, capture_output=False) as other:
        other.log(loss=5.0)
    name = casmon.list_runs(casmon.open(store, read_only=True))[0].name
    got = _views(store, name, tmp_path)
    truth = got["load_run.metric"]
    assert truth[0] >= 1
    assert {k: v for k, v in got.items() if v != truth} == {}, got


def test_a_lost_run_reads_lost_everywhere_and_its_output_is_on_its_page_and_report(tmp_path, monkeypatch):
    from casmon.ui import model, runpage
    from casmon.ui.compare import compare
    from casmon.ui.pages import Ctx
    from casmon.ui.report import report_html
    from casmon.view import display

    monkeypatch.chdir(tmp_path)
    store = _killed_run(tmp_path)
    with casmon.record(comment="other", store=store, capture_output=False):
        pass
    name = _until(lambda: (r := casmon.list_runs(casmon.open(store, read_only=True))[0]).status == "lost" and r.name,
                  "the killed run to be lost")
    s = casmon.open(store, read_only=True)
    r = casmon.load_run(name, s)
    assert "status: 'ok' -> 'lost'" in cli("diff", "2-other", name, "--store", store).stdout
    assert json.loads(cli("diff", "2-other", name, "--json", "--store", store).stdout)["meta"]["status"] == {
        "a": "ok", "b": "lost"}
    other = casmon.load_run("2-other", s)
    cmp = compare([other, r], ["2", "1"])
    assert cmp.diffs[0][1]["meta"]["status"] == {"a": "ok", "b": "lost"}
    assert f"casmon run {name} lost" in display.run_text(r) and "lost" in repr(casmon.list_runs(s))
    assert casmon.list_runs(s).to_pandas().loc[name, "status"] == "lost"
    both = report_html(s, [name, "2-other"])[0].decode()
    assert ">running<" not in both
    index = model.RunIndex(s)
    page = runpage.run_page(Ctx(s.url, False), index.find(name), r).decode()
    report = report_html(s, [name])[0].decode()
    for html in (page, report):  # step 30's line was flushed by step 34; step 40's may have died unflushed
        assert "step 30\n" in html and "Output (what the run wrote before it stopped)" in html
    s.close()


def test_a_non_dict_run_info_is_refused_where_it_is_set_and_the_run_ends_with_its_info(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.info["kept"] = 1
        for bad in (None, [("a", 1)], "x"):
            with pytest.raises(TypeError, match=f"run.info must be a dict .*got {type(bad).__name__}"):
                run.info = bad
        with pytest.raises(TypeError, match="run.params must be a dict .*got NoneType"):
            run.params = None
        run.info = {"new": 2, **run.info}
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and r.info() == {"new": 2, "kept": 1}
    with pytest.raises(TypeError):
        with casmon.record(store=s, capture_output=False) as run:
            run.info["a"] = 1
            run.info = None
    r = casmon.load_run("latest", s)
    assert r.status == "failed" and r.info() == {"a": 1} and "run.info must be a dict" in r.manifest["error"]


def test_a_value_that_cannot_be_stored_in_info_or_params_leaves_the_run_ended_and_blames_no_store(tmp_path):
    import threading

    s = casmon.open(tmp_path / "s")
    with pytest.warns(casmon.RunWarning, match=r"run.info\['lock'\] cannot be stored .*description is kept"):
        with casmon.record(store=s, capture_output=False, params={"lock": threading.Lock(), "lr": 0.1}) as run:
            run.info["lock"] = threading.Lock()
            run.info["acc"] = 0.9
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and r.info()["acc"] == 0.9 and "cannot be pickled" in r.info()["lock"]
    assert r.params()["lr"] == 0.1 and "cannot be pickled" in r.params()["lock"]
    deep: list = []
    x = deep
    for _ in range(100_000):
        x.append([])
        x = x[0]
    with pytest.warns(casmon.RunWarning, match=r"run.info\['deep'\] cannot be stored \((RecursionError|TypeError: .*nested too deeply)"):
        with casmon.record(store=s, capture_output=False) as run:
            run.info["deep"] = deep
            run.info["acc"] = 0.5
            with pytest.raises(TypeError, match="got _BadRepr <_BadRepr: repr failed: ValueError>"):
                run.info = _BadRepr()
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and r.info()["acc"] == 0.5 and "RecursionError" in r.info()["deep"]


class _BadRepr:
    def __repr__(self):
        raise ValueError("no repr")


def test_a_run_exiting_right_after_a_bad_info_value_is_not_stalled(tmp_path):
    script = ("import threading, casmon, sys\n"
              "with casmon.record(store=sys.argv[1], capture_output=False) as run:\n"
              "    run.info['lock'] = threading.Lock()\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_EXIT_RETRY_S="600")  # a stall would be 600 s
    p = subprocess.run([sys.executable, "-c", script, str(tmp_path / "s")], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0 and "could not save run" not in p.stderr, p.stderr
    assert casmon.load_run("latest", casmon.open(tmp_path / "s", read_only=True)).status == "ok"


def _diverged(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(comment="diverged", store=s, capture_output=False) as run:
        run.log(loss=1.0, gap=float("nan"), up=1.0)
        run.log(loss=float("inf"), gap=float("nan"), up=-float("inf"))
        run.log(loss=float("nan"), gap=float("nan"), up=2.0)
    s.close()
    return str(tmp_path / "s")


def _strict_json(text):
    def refuse(c):
        raise AssertionError(f"not JSON: {c}")

    return json.loads(text, parse_constant=refuse)


def test_nan_and_infinities_are_said_as_such_in_the_cli(tmp_path):
    store = _diverged(tmp_path)
    table = cli("runs", "--store", store, "--columns", "loss,gap,up").stdout
    row = next(x for x in table.splitlines() if "diverged" in x)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells[-3:] == ["NaN", "NaN", "2"]
    shown = cli("show", "latest", "--store", store).stdout
    assert "loss: last NaN at step 2, 3 points, min 1, max inf" in shown
    assert "gap: last NaN at step 2, 3 points, min NaN, max NaN" in shown
    assert "up: last 2 at step 2, 3 points, min -inf, max 2" in shown
    for args in (("runs", "--json"), ("show", "latest", "--json")):
        got = _strict_json(cli(*args, "--store", store).stdout)
        m = (got[0] if isinstance(got, list) else got)["metrics"]
        assert m["loss"]["last"] == "NaN" and m["loss"]["max"] == "Infinity" and m["up"]["min"] == "-Infinity"
    with casmon.record(comment="fine", store=store, capture_output=False) as run:
        run.log(loss=1.0)
    d = cli("diff", "1", "2", "--store", store).stdout
    assert "metric loss: last NaN -> 1" in d
    assert _strict_json(cli("diff", "1", "2", "--json", "--store", store).stdout)["metrics"]["loss"]["a"] == "NaN"


def test_crafted_batch_summaries_and_huge_numbers_fall_back_to_the_points_never_raise(tmp_path):
    from casmon.runs import metrics as mm

    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
    r = casmon.load_run("latest", s)
    m = dict(r.manifest, status="running")
    m.pop("metrics")
    s.set_ref(r.ref, s.put(m), {"metrics": {"x": {"n": 1, "last": 10**400, "time": 10**400}}})
    zeros = "A" * 32  # one point: step 0, value 0.0, time 0.0
    s.append(mm.KIND_METRICS, {"run": r.ref, "seq": 7, "s": {
        "y": {"n": 1, "b64": zeros, "sum": {"last": 10**400, "step": 1, "time": 1.0, "min": 1, "max": 1}},
        "z": {"n": 1, "b64": zeros, "sum": {"last": "nan?", "step": True, "time": "Infinity"}}}},
        key=mm.metrics_key(r.ref))
    s.flush()
    got = casmon.load_run("latest", s).metric_summary()
    assert got["x"]["n"] == 1 and got["x"]["last"] == 1.0
    for k in ("y", "z"):  # the cell's own summary is not what casmon writes: its points are read instead
        assert (got[k]["n"], got[k]["last"], got[k]["step"]) == (1, 0.0, 0)
    assert "y: last 0 at step 0, 1 point" in cli("show", "latest", "--store", str(s.url)).stdout
    s.close()


def test_an_ended_runs_summary_counts_a_batch_another_thread_was_appending_as_it_ended(tmp_path, monkeypatch):
    import threading

    from casmon.runs import metrics as mm
    from casmon.runs import recorder

    s = casmon.open(tmp_path / "s", autoflush=None)
    original, waiting = recorder._append_batch, threading.Event()
    release = threading.Event()

    def slow(store, run, batch):  # the other thread's batch is taken, not yet appended, as the run ends
        if batch is not None and threading.current_thread().name == "other":
            waiting.set()
            release.wait(60)
        return original(store, run, batch)

    settle = mm.MetricLog.wait_settled

    def settling(self, timeout):
        release.set()  # the run's end waits: the other thread goes on
        return settle(self, timeout)

    monkeypatch.setattr(recorder, "_append_batch", slow)
    monkeypatch.setattr(mm.MetricLog, "wait_settled", settling)
    with casmon.record(store=s, capture_output=False) as run:
        for i in range(50):
            run.log(x=float(i))
        other = threading.Thread(target=s.flush, name="other")
        other.start()
        assert waiting.wait(60)
    threading.Timer(5.0, release.set).start()  # without the wait, the run has ended by now: let the thread go
    other.join(60)
    s.flush()
    r = casmon.load_run("latest", s)
    assert r.status == "ok" and r.metric_summary()["x"]["n"] == len(r.metric("x")) == 50
    s.close()


def test_a_live_runs_summary_read_twice_from_one_runinfo_follows_its_points(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(x=1.0)
        s.flush()
        r = casmon.load_run("latest", s)
        assert r.status == "running" and r.metric_summary()["x"]["n"] == len(r.metric("x")) == 1
        run.log(x=float("nan"))
        s.flush()
        assert r.metric_summary()["x"]["n"] == len(r.metric("x")) == 2 and math.isnan(r.metric_summary()["x"]["last"])
    s.close()
