"""``casmon runs`` and ``casmon show RUN`` show metrics (latest value, length) and params, in text and JSON."""

import json

import pytest

import casmon
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    for i, lr in enumerate((0.1, 0.01)):
        with casmon.record(store=s, capture_output=False, params={"cfg": {"lr": lr}}) as run:
            for step in range(10):
                run.log(loss=1.0 / (step + 1 + i), acc=step / 10)
            run.info["note"] = f"run {i}"
    s.close()
    return str(path)


def test_runs_shows_the_latest_value_of_each_metric(store):
    out = cli("runs", "--store", store).stdout
    header = next(line for line in out.splitlines() if "status" in line)
    assert "acc" in header and "loss" in header
    assert "0.1" in out and "0.09091" in out  # the last loss of run 2: 1/11


def test_runs_columns_chooses_params_info_and_metrics_and_names_an_unknown_one(store):
    out = cli("runs", "--store", store, "--columns", "cfg.lr,loss,note").stdout
    header = next(line for line in out.splitlines() if "status" in line)
    assert "cfg.lr" in header and "note" in header and "acc" not in header
    assert "0.01" in out and "run 1" in out
    bad = cli("runs", "--store", store, "--columns", "nosuch", check=False)
    assert bad.returncode == 1 and "no run has 'nosuch'" in bad.stderr and "cfg.lr" in bad.stderr


def test_a_name_that_is_both_a_param_and_a_metric_must_be_named_with_its_group(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, params={"loss": "l2"}) as run:
        run.log(loss=0.5)
    s.close()
    store = str(tmp_path / "s")
    bad = cli("runs", "--store", store, "--columns", "loss", check=False)
    assert bad.returncode == 1 and "'loss' is metric.loss and param.loss" in bad.stderr
    out = cli("runs", "--store", store, "--columns", "metric.loss,param.loss").stdout
    assert "metric.loss" in out and "param.loss" in out and "0.5" in out and "l2" in out


def test_diff_names_the_params_and_metrics_that_differ(store):
    d = casmon.diff("1", "2", store)
    assert d["params"] == {"cfg.lr": {"a": 0.1, "b": 0.01}}
    assert set(d["metrics"]) == {"loss"}  # acc logged the same points in both runs
    out = cli("diff", "1", "2", "--store", store).stdout
    assert "param cfg.lr: 0.1 -> 0.01" in out and "metric loss: last 0.1 -> 0.09091 (10 -> 10 points)" in out


def test_to_pandas_has_params_and_metrics_columns(store):
    df = casmon.list_runs(store).to_pandas()
    assert df["params.cfg.lr"].tolist() == [0.1, 0.01]
    assert df["metrics.loss"].tolist() == pytest.approx([0.1, 1 / 11]) and "metrics.acc" in df.columns


def test_runs_json_carries_params_metrics_and_elapsed(store):
    rows = json.loads(cli("runs", "--store", store, "--json").stdout)
    assert [r["params"] for r in rows] == [{"cfg.lr": 0.1}, {"cfg.lr": 0.01}]
    assert rows[1]["metrics"]["loss"]["n"] == 10 and rows[1]["metrics"]["loss"]["last"] == pytest.approx(1 / 11)
    assert rows[0]["status"] == "ok" and rows[0]["elapsed"] >= 0


def test_show_lists_params_and_metrics_with_last_value_and_length(store):
    out = cli("show", "2", "--store", store).stdout
    assert "param cfg.lr = 0.01" in out
    assert "loss: last 0.09091 at step 9, 10 points, min 0.09091, max 0.5" in out
    doc = json.loads(cli("show", "2", "--store", store, "--json").stdout)
    assert doc["metrics"]["acc"]["n"] == 10 and doc["params"] == {"cfg.lr": 0.01} and doc["status"] == "ok"


def test_diff_says_a_value_one_run_lacks_is_absent_and_shows_metadata_as_a_to_b(tmp_path, monkeypatch):
    """A run killed before setting an info key, or without a param or metric, showed ``-> None`` (as if it had
    stored None), and metadata (status, comment, argv) as a raw ``{'a': ..., 'b': ...}`` dict."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, comment="first", params={"lr": 0.1}) as run:
        run.log(loss=0.5, acc=0.1)
        run.info["final_w"] = 0.2
        run.info["none"] = None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    with casmon.record(store=s, capture_output=False, comment="second", params={"lr": 0.1, "extra": 3, "opt": None}) as run:
        run.log(loss=0.25)
    s.close()
    assert casmon.diff("1", "2", str(tmp_path / "s"))["params"]["opt"] == {"a": None, "b": None}
    out = cli("diff", "1", "2", "--store", str(tmp_path / "s")).stdout
    assert "{'a'" not in out and "'b':" not in out
    assert "comment: 'first' -> 'second'" in out
    assert "info final_w: 0.2 -> (not set)" in out and "info none: None -> (not set)" in out
    assert "param extra: (not set) -> 3" in out and "param opt: (not set) -> None" in out
    assert "metric acc: last 0.1 -> (not logged)" in out
    assert "env OMP_NUM_THREADS: (not set) -> '3'" in out


def test_show_and_diff_say_a_nan_or_infinite_param_as_metrics_do(tmp_path):
    """A param NaN showed as Python's `nan` beside metrics' `NaN`."""
    s = casmon.open(tmp_path / "s", create=True)
    for lr in (float("nan"), float("-inf")):
        with casmon.record(store=s, capture_output=False, params={"cfg": {"lr": lr}}) as run:
            run.log(loss=lr)
    s.close()
    store = str(tmp_path / "s")
    assert "param cfg.lr = NaN" in cli("show", "1", "--store", store).stdout
    assert "param cfg.lr: NaN -> -inf" in cli("diff", "1", "2", "--store", store).stdout


def test_diff_of_a_crafted_env_that_is_no_dict_says_what_it_can():
    """The env of a run's manifest is data from the store: a list there must not raise in `casmon diff`."""
    from casmon.cli.run_verbs import _pairs

    assert _pairs("env", {"a": ["OMP_NUM_THREADS=1"], "b": {"OMP_NUM_THREADS": "2"}}) == {
        "OMP_NUM_THREADS": {"a": None, "b": "2"}}


def test_the_default_columns_show_the_users_metrics_before_system_metrics(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, system_metrics=False) as run:
        run.log({f"train/m{i}": float(i) for i in range(6)})
        run.log({"sys/cpu_percent": 50.0, "sys/rss_bytes": 1e9})  # as the sampler logs them
    s.close()
    header = next(line for line in cli("runs", "--store", str(tmp_path / "s")).stdout.splitlines() if "status" in line)
    assert "train/m5" in header and "sys/" not in header
