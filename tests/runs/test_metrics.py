"""Step-wise metrics: ``run.log`` points come back as they were logged, and bad input is refused whole."""

import math
import warnings

import numpy as np
import pytest

import casmon
from casmon.runs import metrics as metrics_mod
from casmon.runs.metrics import downsample

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def test_points_come_back_with_their_steps_values_and_times_in_the_order_logged(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(loss=1.0)  # step 0
        run.log({"loss": 0.5, "acc": 0.25})  # step 1, both
        run.log(loss=0.25, step=10)
        casmon.log(acc=np.float32(0.75), lr=np.float64(1e-3))  # a helper's call lands on the step just given
        run.log(loss=0.125)  # then the counter goes on
    r = casmon.load_run("latest", store)
    loss = r.metric("loss")
    assert loss.steps.tolist() == [0, 1, 10, 11] and loss.values.tolist() == [1.0, 0.5, 0.25, 0.125]
    assert loss.steps.dtype == np.int64 and loss.values.dtype == np.float64
    assert np.all(np.diff(loss.times) >= 0) and loss.times[0] >= r.manifest["start"]
    acc = r.metric("acc")
    assert acc.steps.tolist() == [1, 10] and acc.values.tolist() == [0.25, 0.75]
    assert sorted(r.metrics()) == ["acc", "loss", "lr"]
    summary = r.metric_summary()
    digest = summary["loss"].pop("digest")
    assert summary["loss"] == {"n": 4, "last": 0.125, "step": 11, "time": loss.times[-1], "min": 0.125, "max": 1.0}
    assert len(digest) == 32
    df = loss.to_pandas()
    assert list(df.columns) == ["step", "value", "time"] and df["value"].tolist() == loss.values.tolist()


def test_points_cross_many_flushes_in_order(store):
    n = 300_000
    with casmon.record(store=store, capture_output=False) as run:
        for i in range(n):
            run.log(x=i * 0.5, step=i)
            if i % 100_000 == 0:
                store.flush()  # batches of every size: inline ones and stored ones
    s = casmon.load_run("latest", store).metric("x")
    assert len(s) == n and np.array_equal(s.steps, np.arange(n)) and np.array_equal(s.values, np.arange(n) * 0.5)


def test_equal_points_give_equal_digests_however_flushes_cut_them(store):
    from casmon.runs.imported import write_run

    def run_of(values, flush_every):
        with casmon.record(store=store, capture_output=False) as run:
            for i, v in enumerate(values):
                run.log(x=v)
                if flush_every and i % flush_every == 0:
                    store.flush()
        return casmon.load_run("latest", store).metric_summary()["x"]["digest"]

    values = [float(i % 7) for i in range(5000)]
    a = run_of(values, 0)
    assert run_of(values, 333) == a  # other batches, same points
    assert run_of(values[:-1] + [99.0], 0) != a  # one value differs
    with casmon.record(store=store, capture_output=False) as run:
        for i, v in enumerate(values):
            run.log(x=v, step=i + 1)
    assert casmon.load_run("latest", store).metric_summary()["x"]["digest"] != a  # the same values at other steps
    n = len(values)
    name = write_run(store, start=0.0, metrics={"x": (np.arange(n), np.array(values), np.zeros(n))})
    assert casmon.load_run(name, store).metric_summary()["x"]["digest"] == a  # an imported copy too


def test_nan_and_infinity_are_kept_and_the_summary_stays_json(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(loss=float("nan"))
        run.log(loss=float("inf"))
        run.log(loss=2.0)
        run.log(loss=float("nan"))
    r = casmon.load_run("latest", store)
    v = r.metric("loss").values
    assert math.isnan(v[0]) and v[1] == math.inf and v[2] == 2.0 and math.isnan(v[3])
    s = r.metric_summary()["loss"]
    assert math.isnan(s["last"]) and s["max"] == math.inf and s["min"] == 2.0 and s["n"] == 4
    stored = store.get(store.get_ref(r.ref).target)["metrics"]["loss"]  # JSON has no NaN: strings, documented
    assert stored["last"] == "NaN" and stored["max"] == "Infinity"


def test_a_diverged_runs_summary_says_nan_and_infinity_in_every_reading(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(a=float("nan"), b=float("-inf"))
        run.log(a=float("nan"), b=1.0)
    ended = casmon.load_run("latest", store).metric_summary()
    manifest = dict(casmon.load_run("latest", store).manifest, status="running")
    manifest.pop("metrics")
    r = casmon.load_run("latest", store)
    store.set_ref(r.ref, store.put(manifest), {})  # as a run killed before its end: summarised from its records
    live = casmon.load_run("latest", store).metric_summary()
    for s in (ended, live):
        assert s["a"]["n"] == 2 and math.isnan(s["a"]["last"]) and math.isnan(s["a"]["min"]) and math.isnan(s["a"]["max"])
        assert s["b"]["last"] == 1.0 and s["b"]["min"] == -math.inf and s["b"]["max"] == 1.0


@pytest.mark.parametrize("bad, match", [
    ({"loss": "0.3"}, "metric 'loss' must be a number, got str"),
    ({"loss": None}, "metric 'loss' must be a number, got NoneType"),
    ({"loss": np.arange(3)}, "metric 'loss' must be a number, got ndarray"),
    ({"": 1.0}, "metric name '' must be"),
])
def test_a_call_with_a_bad_value_or_name_raises_naming_it_and_logs_nothing(store, bad, match):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(ok=1.0)
        with pytest.raises((TypeError, ValueError), match=match):
            run.log({"ok": 2.0, **bad})
        run.log(ok=3.0)
    s = casmon.load_run("latest", store).metric("ok")
    assert s.values.tolist() == [1.0, 3.0] and s.steps.tolist() == [0, 1]


def test_bad_steps_and_arguments_are_refused(store):
    with casmon.record(store=store, capture_output=False) as run:
        with pytest.raises(TypeError, match="step must be an integer, got float"):
            run.log(a=1.0, step=1.5)
        with pytest.raises(ValueError, match="does not fit in 64 bits"):
            run.log(a=1.0, step=1 << 64)
        with pytest.raises(TypeError, match="metrics must be a dict"):
            run.log([("a", 1.0)])
        run.log(a=1.0, step=np.int64(7))
    assert casmon.load_run("latest", store).metric("a").steps.tolist() == [7]


def test_casmon_log_goes_to_the_innermost_run_and_refuses_outside_any(store):
    with pytest.raises(casmon.NoActiveRunError, match="no run is being recorded"):
        casmon.log(loss=1.0)
    with casmon.record(store=store, capture_output=False, comment="outer"):
        casmon.log(a=1.0)
        with casmon.record(store=store, capture_output=False, comment="inner"):
            casmon.log(b=2.0)
        casmon.log(a=3.0)
    runs = {r.name: r for r in casmon.list_runs(store)}
    assert sorted(runs["1-outer"].metrics()) == ["a"] and runs["1-outer"].metric("a").values.tolist() == [1.0, 3.0]
    assert sorted(runs["2-inner"].metrics()) == ["b"]


def test_an_unknown_metric_names_the_ones_there_are(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(loss=1.0, acc=0.5)
    with pytest.raises(LookupError, match=r"has no metric 'los' \(did you mean 'loss'\?\); it has: acc, loss"):
        casmon.load_run("latest", store).metric("los")


def test_params_stay_nested_and_flatten_to_dotted_names(store):
    with casmon.record(store=store, capture_output=False, params={"cfg": {"lr": 0.1, "opt": {"name": "adam"}}}) as run:
        run.params["seed"] = 3
    r = casmon.load_run("latest", store)
    assert r.params() == {"cfg": {"lr": 0.1, "opt": {"name": "adam"}}, "seed": 3}
    assert r.flat_params() == {"cfg.lr": 0.1, "cfg.opt.name": "adam", "seed": 3}
    with pytest.raises(TypeError, match="params must be a dict"):
        casmon.record(params=[1, 2])



class Kind(__import__("enum").Enum):
    MLP = "mlp"


def test_a_nested_param_that_is_not_json_keeps_its_siblings_flat_and_readable(store):
    """``params={"cfg": dataclasses.asdict(cfg)}`` with one Enum (or array) inside was stored as one pickled dict:
    ``cfg.lr`` and the rest vanished from tables, filters, diffs and charts. Only that leaf is a stored value."""
    cfg = {"lr": 0.1, "kind": Kind.MLP, "opt": {"name": "adam", "betas": np.array([0.9, 0.99])}}
    with casmon.record(store=store, capture_output=False, params={"cfg": cfg}):
        pass
    r = casmon.load_run("latest", store)
    flat = r.flat_params()
    assert set(flat) == {"cfg.lr", "cfg.kind", "cfg.opt.name", "cfg.opt.betas"}
    assert flat["cfg.lr"] == 0.1 and flat["cfg.opt.name"] == "adam"
    assert "Kind" in str(flat["cfg.kind"])  # described, as every stored param is: never unpickled
    assert np.asarray(flat["cfg.opt.betas"]).tolist() == [0.9, 0.99] or "float64" in str(flat["cfg.opt.betas"])

def test_downsampling_keeps_every_spike_in_its_envelope():
    n = 1_000_003
    v = np.zeros(n)
    v[123_457] = 99.0
    v[777_777] = -5.0
    s = casmon.Series("x", np.arange(n, dtype=np.int64), v, np.zeros(n))
    d = downsample(s, 1000)
    assert len(d["value"]) == 1000 and d["max"].max() == 99.0 and d["min"].min() == -5.0
    assert d["step"][-1] == n - 1 and np.all(np.diff(d["step"]) > 0)
    small = downsample(casmon.Series("y", np.arange(5), np.arange(5.0), np.zeros(5)), 1000)
    assert small["value"].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_gc_keeps_the_stored_batches_of_a_run(store):
    with casmon.record(store=store, capture_output=False) as run:
        for i in range(metrics_mod.INLINE_POINTS * 3):
            run.log(x=float(i))
    store.gc(grace=0)
    s = casmon.load_run("latest", store).metric("x")
    assert len(s) == metrics_mod.INLINE_POINTS * 3 and s.values[-1] == len(s) - 1
    assert store.verify().ok


def test_a_damaged_metric_record_names_the_run(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(x=1.0)
    r = casmon.load_run("latest", store)
    store.append(metrics_mod.KIND_METRICS, {"run": r.ref, "seq": 9, "s": {"x": {"n": 5, "b64": "AAAA"}}},
                 key=metrics_mod.metrics_key(r.ref))
    store.flush()
    with pytest.raises(casmon.DamagedObjectError, match=f"run {r.name}: metric 'x'.*batch of 5 points holds 3 bytes"):
        r.metric("x")


def test_a_read_only_reader_sees_the_points_flushed_so_far(store):
    reader = casmon.open(store.url, read_only=True)
    with casmon.record(store=store, capture_output=False) as run:
        run.log(x=1.0)
        store.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r = casmon.load_run("latest", reader)
        assert r.status == "running" and r.metric("x").values.tolist() == [1.0]
        run.log(x=2.0)
        store.flush()
        assert r.metric("x").values.tolist() == [1.0, 2.0]


def test_export_writes_the_metrics_as_csv_and_the_params_into_information_json(store, tmp_path):
    import csv
    import json

    with casmon.record(store=store, capture_output=False, params={"cfg": {"lr": 0.5}}) as run:
        run.log(loss=0.25)
        run.log(loss=float("nan"), acc=1.0)
    root = casmon.export(casmon.load_run("latest", store), tmp_path / "out")
    rows = list(csv.reader(open(root / "metrics.csv")))
    assert rows[0] == ["metric", "step", "value", "time"]
    assert [(m, s, v) for m, s, v, _t in rows[1:]] == [("acc", "1", "1.0"), ("loss", "0", "0.25"), ("loss", "1", "nan")]
    assert json.loads((root / "information.json").read_text())["params"] == {"cfg.lr": 0.5}


class _Pickled:
    pass


def test_a_crafted_ref_and_batches_give_clear_errors_or_are_left_out(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log(x=1.0)
    r = casmon.load_run("latest", store)
    ref = store.get_ref(r.ref)
    manifest = dict(r.manifest)
    manifest["status"] = "running"
    manifest.pop("metrics")
    d = store.put(manifest)
    store.set_ref(r.ref, d, {"heartbeat": "soon", "heartbeat_s": [1], "metrics": {"x": {"last": "a"}, "y": 3, "z": []}})
    assert ref is not None
    got = casmon.load_run("latest", store)
    assert got.status == "running" and got.heartbeat is None  # no claim from a crafted heartbeat
    assert got.metric_summary()["x"]["n"] == 1  # from the records, whatever the ref says
    pickled = store.put(_Pickled())  # a batch naming a pickle is never unpickled
    store.append(metrics_mod.KIND_METRICS, {"run": r.ref, "seq": 5, "s": {"x": {"n": 1, "$": pickled.hex()}}},
                 key=metrics_mod.metrics_key(r.ref))
    store.flush()
    got = casmon.load_run("latest", store)  # records it cannot read: the ref's cells, the odd ones left out
    assert got.metric_summary() == {"x": {"n": None, "last": None, "step": None, "time": None, "min": None, "max": None,
                                          "digest": None}}
    for trust in (False, True):  # a batch is data casmon wrote: whatever the trust, nothing is unpickled
        with pytest.raises(casmon.UntrustedStoreError, match="_Pickled"):
            casmon.load_run("latest", casmon.open(store.url, trust=trust, read_only=True)).metric("x")
    from tests.support.cli import cli

    out = cli("runs", "--store", str(store.url)).stdout
    assert "running" in out
    store.set_ref(r.ref, d, {"heartbeat": -1e300, "heartbeat_s": 1.0, "metrics": {"x": {"n": float("inf")}}})
    shown = cli("show", r.name, "--store", str(store.url)).stdout
    assert f"run {r.name}" in shown and "running" in shown


def test_a_signal_a_flush_defers_arrives_after_it_whichever_thread_the_kernel_hands_it_to():
    import os
    import signal
    import threading
    import time

    from casmon.store import lifecycle

    class Arrived(Exception):
        pass

    def raiser(signum, frame):
        raise Arrived()

    old = signal.signal(signal.SIGHUP, raiser)
    steps = []
    try:
        with pytest.raises(Arrived):
            with lifecycle.signals_deferred():
                threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGHUP)).start()  # not the main thread
                for i in range(20):
                    time.sleep(0.01)
                    steps.append(i)
        assert steps == list(range(20))  # the step was not cut
    finally:
        signal.signal(signal.SIGHUP, old)


def test_a_name_and_its_value_log_as_the_dict_would_in_run_log_and_casmon_log(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.log("score", 0.5)  # MLflow's log_metric(name, value) shape: step 0
        run.log("score", np.float32(0.25), step=5)
        casmon.log("lr", 1e-3)  # lands on step 5, as casmon.log(lr=...) would
        run.log("score", 0.125, acc=0.75)  # the name form and keywords mix
        run.log({"score": 1.0})  # the dict and keyword forms are as they were
        run.log(score=2.0)
        run.log(np.str_("score"), 4.0)  # a numpy string names it too
    r = casmon.load_run("latest", store)
    assert r.metric("score").steps.tolist() == [0, 5, 6, 7, 8, 9]
    assert r.metric("score").values.tolist() == [0.5, 0.25, 0.125, 1.0, 2.0, 4.0]
    assert r.metric("lr").steps.tolist() == [5] and r.metric("acc").steps.tolist() == [6]


@pytest.mark.parametrize("args, kwargs, match", [
    (("score",), {}, r"^casmon: run\.log: metric 'score' has no value: run\.log\('score', 0\.5\) or run\.log\(score=0\.5\)$"),
    (({"a": 1.0}, 0.5), {}, r"^casmon: run\.log: a dict of metrics takes no second value \(got float 0\.5\); .*step=N"),
    ((None, 0.5), {}, r"^casmon: run\.log: a value \(float 0\.5\) with no metric name"),
    (("score", 0.5, 3), {}, r"^casmon: run\.log: 3 positional arguments; it takes a metric name and its value, "
                            r"or a dict, and the step as step=N$"),
    (("score", 0.5), {"score": 0.25}, r"^casmon: run\.log: metric 'score' is given twice"),
    (({"score": 0.5},), {"score": 0.25}, r"^casmon: run\.log: metric 'score' is given twice"),
    ((3, 0.5), {}, r"^casmon: run\.log: metrics must be a dict of name -> number or a name and its value, got int$"),
])
def test_a_wrong_mix_of_name_value_and_dict_raises_one_casmon_line_and_logs_nothing(store, args, kwargs, match):
    with casmon.record(store=store, capture_output=False) as run:
        for log in (run.log, casmon.log):
            with pytest.raises(TypeError, match=match.replace("run\\.log", "(run|casmon)\\.log")) as e:
                log(*args, **kwargs)
            assert "\n" not in str(e.value)
        run.log(ok=1.0)
    r = casmon.load_run("latest", store)
    assert sorted(r.metrics()) == ["ok"] and r.metric("ok").steps.tolist() == [0]
