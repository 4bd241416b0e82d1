"""The compare page's charts: what a chart is sent of a metric (buckets that keep every extreme, the first and last
points, NaN and infinities marked; the whole series when it is short; the points in view of a zoom), packed for
the script, and the charts' data for runs of different step ranges, a run still running and a damaged batch."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest

import casmon
from casmon.runs import Series
from casmon.ui.series import metric_json

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _series(k: int, seed: int, holes: bool = True, disorder: bool = False) -> Series:
    rng = np.random.default_rng(seed)
    steps = np.cumsum(rng.integers(1, 4, k)) - 5  # strictly increasing, negative ones too
    if disorder:  # a resumed run logging steps again, a user's own steps: not in order
        steps = rng.permutation(steps) // 2
    values = rng.normal(size=k) * 10
    if holes and k > 4:
        at = rng.choice(np.arange(1, k - 1), size=min(k - 2, 6), replace=False)
        for i, v in zip(at, [math.nan, math.inf, -math.inf, math.nan, math.inf, -math.inf]):
            values[i] = v
    return Series("loss", steps, values, 1.7e9 + np.arange(k) * 0.5)


def _buckets(got: dict, s: Series) -> list[np.ndarray]:
    """The points each bucket holds, found from what the chart was sent: the first and last points alone, the
    others by the ``every`` steps their step falls in (consecutive points ending at ``step[i]`` without it)."""
    k = len(s)
    if "every" not in got:
        ends = np.searchsorted(np.arange(k), [int(np.flatnonzero(s.steps == x)[-1]) for x in got["step"]], "right")
        return [np.arange(a, b) for a, b in zip(np.concatenate(([0], ends[:-1])), ends)]
    w = got["every"]
    assert w & (w - 1) == 0  # a power of two
    mid = np.arange(1, k - 1)
    return [np.array([0])] + [mid[s.steps[mid] // w * w == x] for x in got["step"][1:-1]] + [np.array([k - 1])]


SIZES = [(10, 3), (10, 4), (1000, 7), (5000, 400), (100_001, 1999), (3, 1), (5, 2)]


@pytest.mark.parametrize("k,n,seed,disorder", [(k, n, seed, False) for k, n in SIZES for seed in (0, 1)]
                         + [(k, n, 2, True) for k, n in SIZES if n >= 4])  # steps out of order: bucketed by step
def test_a_downsampled_chart_keeps_every_buckets_extremes_the_first_and_last_points_and_marks_the_non_finite(
        k, n, seed, disorder):
    s = _series(k, seed, disorder=disorder)
    got = metric_json("1", "loss", s, n)
    assert got["n"] == k and len(got["value"]) == len(got["min"]) == len(got["max"]) == len(got["time"]) <= n
    assert len(got["value"]) >= (n - 3) / 2 if n >= 4 else len(got["value"]) == n  # about a bucket a pixel
    buckets = _buckets(got, s)
    assert sum(len(b) for b in buckets) == k and all(len(b) for b in buckets)  # every point in one bucket
    for i, b in enumerate(buckets):
        v = s.values[b]
        fin = v[np.isfinite(v)]
        if len(fin):
            assert (got["min"][i], got["max"][i]) == (fin.min(), fin.max())  # the band's edges: its extremes
            assert fin.min() <= got["value"][i] <= fin.max()
        else:
            assert got["min"][i] is got["max"][i] is got["value"][i] is None  # a gap, marked below
        assert got["time"][i] == s.times[b[-1]]  # the bucket's last point's, in the order logged
        for kind, hit in (("NaN", np.isnan(v)), ("Infinity", v == math.inf), ("-Infinity", v == -math.inf)):
            assert (i in got.get("marks", {}).get(kind, [])) == bool(hit.any()), (i, kind)
    if n >= 3:  # the chart starts and ends where the run did
        assert got["step"][0] == s.steps[0] and got["value"][0] == s.values[0]
        assert got["step"][-1] == s.steps[-1] and got["value"][-1] == s.values[-1]
    json.dumps(got, allow_nan=False)  # JSON as it is: no NaN or infinity in it


def test_runs_of_different_lengths_and_step_ranges_share_their_chart_xs():
    """A chart of 100 runs joins every run's xs: buckets at steps of each run's own (their last points') made
    100 runs of 10,000 points 40,000 xs for each of 300 lines, seconds of the browser's time."""
    xs: set[int] = set()
    for i in range(100):
        k = 10_000 - 37 * i
        steps = np.arange(k) + (i % 3) * 50
        got = metric_json(str(i), "loss", Series("loss", steps, np.ones(k), np.zeros(k)), 400)
        assert got["step"][0] == steps[0] and got["step"][-1] == steps[-1] and len(got["step"]) <= 400
        xs.update(got["step"])
    assert len(xs) <= 2 * 400 + 200  # a grid or two, and each run's first and last steps


def test_steps_at_the_ends_of_int64_are_bucketed_without_overflow():
    steps = np.array([-(1 << 63), -(1 << 63) + 5, -5, 0, 7, (1 << 63) - 1], np.int64)
    got = metric_json("1", "loss", Series("loss", steps, np.arange(6.0), np.zeros(6)), 4)
    assert got["step"][0] == -(1 << 63) and got["step"][-1] == (1 << 63) - 1 and got["n"] == 6
    assert sorted(v for v in got["max"] if v is not None) == sorted(set(got["max"]))
    assert got["min"][0] == 0.0 and got["max"][-1] == 5.0


@pytest.mark.parametrize("k", [1, 2, 50, 400])
def test_a_short_series_is_sent_whole_each_non_finite_point_marked(k):
    s = _series(k, 3)
    got = metric_json("1", "loss", s, 400)
    assert got["step"] == s.steps.tolist() and got["time"] == s.times.tolist() and "min" not in got
    assert got["value"] == [v if math.isfinite(v) else None for v in s.values.tolist()]
    marked = sorted(i for idx in got.get("marks", {}).values() for i in idx)
    assert marked == [i for i, v in enumerate(s.values) if not math.isfinite(v)]


@pytest.mark.parametrize("k,n", [(30, 400), (100_000, 450)])
def test_packed_lists_decode_to_the_json_lists(k, n):
    s = _series(k, 4)
    plain, packed = metric_json("1", "loss", s, n), metric_json("1", "loss", s, n, packed=True)
    assert packed.pop("enc") == "f64"
    for col in ("step", "time", "value", "min", "max"):
        if col not in plain:
            assert col not in packed
            continue
        got = np.frombuffer(base64.b64decode(packed[col]), "<f8").tolist()
        assert [None if x != x else x for x in got] == plain[col], col
    assert packed["marks"] == plain["marks"] and packed["n"] == plain["n"]


def test_a_zoomed_chart_gets_the_points_in_view_at_full_resolution():
    s = _series(100_000, 5, holes=False)
    lo, hi = int(s.steps[40_000]), int(s.steps[40_299])
    got = metric_json("1", "loss", s, 450, steps=(lo, hi))
    assert got["n"] == 300 and got["step"] == s.steps[40_000:40_300].tolist()  # every point, not buckets
    assert got["value"] == s.values[40_000:40_300].tolist()
    wide = metric_json("1", "loss", s, 450, steps=(lo, int(s.steps[-1])))
    assert wide["n"] == 60_000 and 223 <= len(wide["value"]) <= 450 and wide["step"][0] == lo  # buckets of the view
    assert metric_json("1", "loss", s, 450, steps=(10**12, 10**12 + 5))["n"] == 0  # nothing in view: nothing


# -- the charts' data of a compare page, from the server --

def _served(path):
    from tests.ui.test_ui import Served

    return Served(path)


def _packed_values(series: dict) -> list:
    return [None if x != x else x for x in np.frombuffer(base64.b64decode(series["value"]), "<f8").tolist()]


def test_compare_charts_of_runs_with_different_step_ranges_keep_each_runs_own_steps(tmp_path):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    a = np.arange(0, 1000)
    b = np.arange(500, 50_500, 5)  # starts later, goes further, another stride, past a chart's buckets
    write_run(s, comment="a", start=1.7e9, end=1.7e9 + 9, metrics={"loss": (a, a * 0.5, 1.7e9 + a)})
    write_run(s, comment="b", start=1.7e9, end=1.7e9 + 9, metrics={"loss": (b, -b * 1.0, 1.7e9 + b)})
    s.close()
    srv = _served(tmp_path / "s")
    try:
        page = srv.get("/compare?run=1&run=2")
        assert 'id="charts"' in page
        for url in ("/api/metric?run=1&run=2&name=loss&n=300", "/api/run/1/metrics?name=loss&n=300",
                    "/api/run/2/metrics?name=loss&n=300"):
            got = json.loads(srv.get(url))
            series = got["series"] if isinstance(got["series"], list) else list(got["series"].values())
            for one in series:
                steps = a if one["run"] == "1" else b
                assert (one["step"][0], one["step"][-1]) == (steps[0], steps[-1]) and one["n"] == len(steps)
                assert one["value"][0] == steps[0] * (0.5 if one["run"] == "1" else -1.0)
        zoom = json.loads(srv.get("/api/run/2/metrics?name=loss&n=300&enc=f64&from=1000&to=1495"))["series"]["loss"]
        assert zoom["n"] == 100 and _packed_values(zoom) == (-np.arange(1000, 1496, 5.0)).tolist()
        for bad, words in (("&enc=json", "enc:"), ("&from=3", "from and to"), ("&from=9&to=3", "from and to"),
                           ("&from=x&to=3", "from and to")):
            status, _h, body = srv.request("/api/run/2/metrics?name=loss" + bad)
            assert status == 400 and words in body, (bad, body)
    finally:
        srv.close()


def test_a_run_still_running_shows_its_new_points_on_the_compare_charts(tmp_path):
    from casmon.ui import api, model

    s = casmon.open(tmp_path / "s")
    reader = casmon.open(tmp_path / "s", read_only=True, create=False, autoflush=None)
    index = model.RunIndex(reader)
    with casmon.record(comment="live", store=s, capture_output=False) as run:
        run.log(loss=1.0)
        s.flush()
        e = index.entries(fresh=True).__iter__().__next__()
        assert e.status == "running"
        first = api.run_metrics(index, e, ["loss"], 300, packed=True)["series"]["loss"]
        for i in range(2, 600):
            run.log(loss=1.0 / i)
        s.flush()
        e = next(iter(index.entries(fresh=True)))
        again = api.run_metrics(index, e, ["loss"], 300, packed=True)["series"]["loss"]
        points = api.metric_points(index, [e], "loss", 300)["series"][0]
    assert first["n"] == 1 and _packed_values(first) == [1.0]
    assert again["n"] == 599 and _packed_values(again)[-1] == 1.0 / 599  # the newest point, not a kept chart
    assert points["n"] == 599 and points["value"][-1] == 1.0 / 599
    reader.close()
    s.close()


def _damage_one_batch(path, run: str) -> None:
    """A metric batch of run ``run`` whose points are not base64: damage a reader meets in the run's records."""
    from casmon.runs.metrics import KIND_METRICS, metrics_key

    s = casmon.open(path)
    (r,) = [r for r in casmon.list_runs(s) if r.name.split("-")[0] == run]
    s.append(KIND_METRICS, {"run": r.ref, "seq": 99, "s": {"loss": {"n": 3, "b64": "@@ not base64 @@"}}},
             key=metrics_key(r.ref))
    s.close()


def test_a_damaged_metric_batch_is_said_for_its_run_and_the_others_chart(tmp_path):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    for i in range(3):
        steps = np.arange(3000)
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9,
                  metrics={"loss": (steps, steps * (i + 1.0), 1.7e9 + steps), "acc": (steps, steps * 0.0, 1.7e9 + steps)})
    s.close()
    _damage_one_batch(tmp_path / "s", "2")
    srv = _served(tmp_path / "s")
    try:
        page = srv.get("/compare?run=1&run=2&run=3")
        assert "r0" in page and "r2" in page and 'id="charts"' in page
        got = json.loads(srv.get("/api/metric?run=1&run=2&run=3&name=loss&enc=f64"))
        by = {x["run"]: x for x in got["series"]}
        assert "not base64" in by["2"]["error"] and by["2"]["n"] == 0 and got["missing"] == ["2"]
        assert by["1"]["n"] == by["3"]["n"] == 3000 and _packed_values(by["3"])[-1] == 2999 * 3.0
        two = json.loads(srv.get("/api/run/2/metrics?name=loss&name=acc&enc=f64"))["series"]
        assert "not base64" in two["loss"]["error"] and two["acc"]["n"] == 3000  # its other metric charts
    finally:
        srv.close()


def test_several_runs_metrics_in_one_request_each_run_with_the_names_it_logged(tmp_path):
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    steps = np.arange(5000)
    write_run(s, comment="a", start=1.7e9, end=1.7e9 + 9, metrics={"loss": (steps, steps * 1.0, 1.7e9 + steps)})
    write_run(s, comment="b", start=1.7e9, end=1.7e9 + 9, metrics={"acc": (steps, steps * 2.0, 1.7e9 + steps)})
    s.close()
    srv = _served(tmp_path / "s")
    try:
        for _ in range(2):  # again: from what the index keeps, the same
            got = json.loads(srv.get("/api/runs/metrics?run=1&run=2&name=loss&name=acc&n=400&enc=f64"))["runs"]
            assert [(r["run"], sorted(r["series"])) for r in got] == [("1", ["loss"]), ("2", ["acc"])]
            assert _packed_values(got[1]["series"]["acc"])[-1] == 4999 * 2.0 and got[0]["series"]["loss"]["n"] == 5000
        zoom = json.loads(srv.get("/api/runs/metrics?run=1&name=loss&from=10&to=19"))["runs"][0]["series"]["loss"]
        assert zoom["step"] == list(range(10, 20)) and zoom["value"] == [float(x) for x in range(10, 20)]
        many = "&".join(f"name=m{i}" for i in range(101))
        for url, status, words in (("/api/runs/metrics?run=1", 400, "/api/runs/metrics?run="),
                                   ("/api/runs/metrics?name=loss", 400, "/api/runs/metrics?run="),
                                   (f"/api/runs/metrics?run=1&{many}", 400, "at most"),
                                   ("/api/runs/metrics?run=1&name=loss&to=5", 400, "from and to"),
                                   ("/api/runs/metrics?run=1&name=loss&from=-99999999999999999999&to=5", 400, "from and to"),
                                   ("/api/runs/metrics?run=1&name=loss&n=0", 400, "n: 1 to")):
            st, _h, body = srv.request(url)
            assert st == status and words in json.loads(body)["error"], (url, body)
        # a run deleted since the page was made: said for that run, the others answered
        got = json.loads(srv.get("/api/runs/metrics?run=1&run=9&run=2&name=loss&name=acc"))["runs"]
        assert [r["run"] for r in got] == ["1", "9", "2"] and "no run '9'" in got[1]["error"]
        assert got[0]["series"]["loss"]["n"] == got[2]["series"]["acc"]["n"] == 5000
    finally:
        srv.close()


def test_a_run_whose_summary_lists_a_metric_whose_points_are_gone_fails_only_its_own_series(tmp_path):
    """Ten runs share a request: one run's missing points were a 404 for the ten, every panel an error."""
    from casmon.runs.imported import write_run
    from casmon.runs.metrics import KIND_METRICS, metrics_key

    s = casmon.open(tmp_path / "s")
    steps = np.arange(100)
    for i in range(3):
        write_run(s, comment=f"r{i}", start=1.7e9, end=1.7e9 + 9, metrics={"loss": (steps, steps * 1.0, 1.7e9 + steps)})
    (gone,) = [r for r in casmon.list_runs(s) if r.name.startswith("2-")]
    s.table(KIND_METRICS).consolidate(force=True, keep=lambda k, v: bytes(k) != bytes(metrics_key(gone.ref)))
    s.close()
    srv = _served(tmp_path / "s")
    try:
        got = json.loads(srv.get("/api/runs/metrics?run=1&run=2&run=3&name=loss&enc=f64"))["runs"]
        assert [r["series"]["loss"]["n"] for r in got] == [100, 0, 100]
        assert "has no metric 'loss'" in got[1]["series"]["loss"]["error"]
        assert srv.request("/api/run/2/metrics?name=loss")[0] == 404  # one run's dashboard: still a 404
    finally:
        srv.close()
