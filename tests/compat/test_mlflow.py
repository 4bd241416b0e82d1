"""MLflow's own documented tracking examples, run through ``casmon.compat.mlflow`` with only the import changed.

Each example's text is MLflow's (examples/quickstart/mlflow_tracking.py, and the snippets of the tracking
API guide); helpers the snippets leave to the reader (``train_model``, ``evaluate_model``) are defined
before them. What casmon then holds is checked run by run, and ``search_runs``' DataFrame is compared with
the real ``mlflow.search_runs`` on a file store (mlflow-skinny is in the test extras) for the same script.
"""

import json
import sys
import textwrap

import pytest

import casmon
from casmon.errors import CasmonError
from tests.conftest import run_python

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

# examples/quickstart/mlflow_tracking.py, as MLflow ships it but for its import line.
QUICKSTART = '''\
import os
from random import random, randint

from casmon.compat.mlflow import log_metric, log_param, log_artifacts

if __name__ == "__main__":
    print("Running mlflow_tracking.py")

    log_param("param1", randint(0, 100))

    log_metric("foo", random())
    log_metric("foo", random() + 1)
    log_metric("foo", random() + 2)
    log_metric("accuracy 2", random())

    if not os.path.exists("outputs"):
        os.makedirs("outputs")
    with open("outputs/test.txt", "w") as f:
        f.write("hello world!")

    log_artifacts("outputs")
'''

# The tracking API guide: "Manual Logging" (2.x) and "Hierarchical Runs with Parent-Child Relationships".
MANUAL = '''\
import casmon.compat.mlflow as mlflow

with mlflow.start_run():
    for epoch in range(0, 3):
        mlflow.log_metric(key="quality", value=2 * epoch, step=epoch)
'''

HELPERS = '''\
def train_model(lr, batch_size):
    return (lr, batch_size)


def evaluate_model(model):
    lr, batch_size = model
    return round(1.0 - abs(lr - 0.01) - batch_size / 1000, 6)
'''

HIERARCHICAL = '''\
import mlflow

# Parent run for the entire experiment
with mlflow.start_run(run_name="hyperparameter_sweep") as parent_run:
    mlflow.log_param("search_strategy", "random")

    best_score = 0
    best_params = {}

    # Child runs for each parameter combination
    for lr in [0.001, 0.01, 0.1]:
        for batch_size in [16, 32, 64]:
            with mlflow.start_run(
                nested=True, run_name=f"lr_{lr}_bs_{batch_size}"
            ) as child_run:
                mlflow.log_params({"learning_rate": lr, "batch_size": batch_size})

                # Train and evaluate
                model = train_model(lr, batch_size)
                score = evaluate_model(model)
                mlflow.log_metric("accuracy", score)

                # Track best configuration in parent
                if score > best_score:
                    best_score = score
                    best_params = {"learning_rate": lr, "batch_size": batch_size}

    # Log best results to parent run
    mlflow.log_params(best_params)
    mlflow.log_metric("best_accuracy", best_score)

# Query child runs
child_runs = mlflow.search_runs(
    filter_string=f"tags.mlflow.parentRunId = '{parent_run.info.run_id}'"
)
print("Child run results:")
print(child_runs[["run_id", "params.learning_rate", "metrics.accuracy"]])
'''

SEQUENTIAL = '''\
import mlflow

configs = [
    {"model": "RandomForest", "n_estimators": 100},
    {"model": "XGBoost", "max_depth": 6},
    {"model": "LogisticRegression", "C": 1.0},
]

for config in configs:
    with mlflow.start_run(run_name=config["model"]):
        mlflow.log_params(config)
        model = train_model(config)
        score = evaluate_model(model)
        mlflow.log_metric("f1_score", score)
'''


def _casmon(example: str) -> str:
    return example.replace("import mlflow\n", "import casmon.compat.mlflow as mlflow\n", 1)


def test_the_quickstart_script_runs_unchanged_and_its_run_ends_ok_at_exit(tmp_path):
    (tmp_path / "mlflow_tracking.py").write_text(QUICKSTART)
    store = tmp_path / "store"
    p = run_python(f"import runpy; runpy.run_path('mlflow_tracking.py', run_name='__main__')", cwd=tmp_path,
                   env={"CASMON_STORE": str(store)})
    assert "Running mlflow_tracking.py" in p.stdout
    r = casmon.load_run("latest", str(store))
    assert r.status == "ok", "the run MLflow's logging started ends with the script"
    assert 0 <= r.flat_params()["param1"] <= 100
    foo = r.metric("foo")
    assert list(foo.steps) == [0, 0, 0] and 0 <= foo.values[0] < 1 <= foo.values[1] < 2 <= foo.values[2] < 3
    assert len(r.metric("accuracy 2")) == 1
    assert r.load("test.txt") == b"hello world!"


def test_manual_logging_with_steps(tmp_path):
    run_python(MANUAL, cwd=tmp_path, env={"CASMON_STORE": str(tmp_path / "store")})
    r = casmon.load_run("latest", str(tmp_path / "store"))
    q = r.metric("quality")
    assert (r.status, list(q.steps), list(q.values)) == ("ok", [0, 1, 2], [0.0, 2.0, 4.0])


def test_hierarchical_runs_and_search_by_parent(tmp_path):
    p = run_python(HELPERS + _casmon(HIERARCHICAL), cwd=tmp_path, env={"CASMON_STORE": str(tmp_path / "store")})
    assert "Child run results:" in p.stdout
    runs = casmon.list_runs(str(tmp_path / "store"))
    parent = [r for r in runs if r.manifest["comment"] == "hyperparameter_sweep"]
    assert len(runs) == 10 and len(parent) == 1 and all(r.status == "ok" for r in runs)
    children = [r for r in runs if r.manifest.get("parent") == parent[0].ref]
    assert sorted(r.manifest["comment"] for r in children) == sorted(
        f"lr_{lr}_bs_{bs}" for lr in [0.001, 0.01, 0.1] for bs in [16, 32, 64])
    assert parent[0].flat_params() == {"search_strategy": "random", "learning_rate": 0.01, "batch_size": 16}
    assert parent[0].metric_summary()["best_accuracy"]["last"] == pytest.approx(0.984)
    lines = [ln for ln in p.stdout.splitlines()[2:] if ln.strip()]
    assert len(lines) == 9, p.stdout  # the nine children, by the parent's run_id


def test_sequential_runs_keep_their_names_and_params(tmp_path):
    helpers = "def train_model(config):\n    return config\n\n\ndef evaluate_model(model):\n    return 0.5\n\n\n"
    run_python(helpers + _casmon(SEQUENTIAL), cwd=tmp_path, env={"CASMON_STORE": str(tmp_path / "store")})
    runs = casmon.list_runs(str(tmp_path / "store"))
    assert [(r.name, r.flat_params()) for r in runs] == [
        ("1-RandomForest", {"model": "RandomForest", "n_estimators": 100}),
        ("2-XGBoost", {"model": "XGBoost", "max_depth": 6}),
        ("3-LogisticRegression", {"model": "LogisticRegression", "C": 1.0})]


# The same script through MLflow and through casmon: search_runs' columns, types and values agree.
COMPARED = '''\
import json, sys
import mlflow
mlflow.set_tracking_uri(sys.argv[1])
mlflow.set_experiment("compare")
with mlflow.start_run(run_name="first", tags={"team": "vision"}) as run:
    mlflow.log_param("lr", 0.1)
    mlflow.log_params({"depth": 3, "opt": "adam"})
    for step in range(3):
        mlflow.log_metric("loss", 1.0 / (step + 1), step=step)
    mlflow.log_metrics({"acc": 0.9})
    mlflow.set_tag("stage", "dev")
    mlflow.set_tags({"Training Info": "Basic LR model"})
    assert mlflow.active_run().info.run_id == run.info.run_id
second = mlflow.start_run(run_name="second")
mlflow.log_metric("loss", 2.0)
mlflow.end_run(status="FAILED")
df = mlflow.search_runs(order_by=["metrics.loss ASC"])
mine = [c for c in df.columns if c.split(".")[0] in ("metrics", "params") or c in (
    "tags.team", "tags.stage", "tags.Training Info", "tags.mlflow.runName")]
print(json.dumps({"columns": list(df.columns), "kinds": {c: df[c].dtype.kind for c in df.columns},
                  "tz": str(df["start_time"].dt.tz),
                  "rows": [{c: (None if v != v else v) for c, v in zip(mine, row)} for row in df[mine].itertuples(index=False)],
                  "status": list(df["status"]),
                  "filtered": len(mlflow.search_runs(filter_string="params.opt = 'adam' AND metrics.loss < 0.5")),
                  "none": len(mlflow.search_runs(filter_string="tags.team = 'nlp'"))}))
'''


def test_search_runs_agrees_with_mlflow_on_columns_types_and_values(tmp_path):
    pytest.importorskip("mlflow")
    real = run_python(COMPARED, (tmp_path / "mlruns").as_uri(), cwd=tmp_path,
                      env={"MLFLOW_ALLOW_FILE_STORE": "true", "GIT_PYTHON_REFRESH": "quiet"})
    ours = run_python(_casmon(COMPARED), str(tmp_path / "store"), cwd=tmp_path)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (real, ours))
    assert b["columns"][:6] == a["columns"][:6] == ["run_id", "experiment_id", "status", "artifact_uri", "start_time",
                                                   "end_time"]
    assert set(b["columns"]) <= set(a["columns"]), set(b["columns"]) - set(a["columns"])
    assert {c for c in a["columns"] if c.split(".")[0] in ("metrics", "params")} == {
        c for c in b["columns"] if c.split(".")[0] in ("metrics", "params")}
    assert {c: b["kinds"][c] for c in b["columns"]} == {c: a["kinds"][c] for c in b["columns"]}
    assert a["tz"] == b["tz"] == "UTC"
    a_rows = [{k: v for k, v in r.items() if k != "tags.mlflow.runName"} for r in a["rows"]]
    b_rows = [{k: v for k, v in r.items() if k != "tags.mlflow.runName"} for r in b["rows"]]
    assert a_rows == b_rows
    assert a["status"] == b["status"] == ["FINISHED", "FAILED"]
    assert (a["filtered"], a["none"]) == (b["filtered"], b["none"]) == (1, 0)


def test_mlflow_tags_that_are_casmon_tags_are_both(tmp_path, monkeypatch):
    import casmon.compat.mlflow as mlflow

    s = casmon.open(tmp_path / "s")
    s.close()
    monkeypatch.setattr(mlflow, "_tracking_uri", None)  # put back after the test
    mlflow.set_tracking_uri(str(tmp_path / "s"))
    try:
        with mlflow.start_run(tags={"team": "vision", "Training Info": "two words"}) as run:
            mlflow.log_artifact(__file__, artifact_path="code")
            mlflow.log_dict({"a": 1}, "cfg.json")
            mlflow.log_text("hi", "notes.txt")
        r = casmon.load_run(run.info.run_id, str(tmp_path / "s"))
        assert r.tags == ("team=vision",)
        assert r.info()["mlflow_tags"] == {"team": "vision", "Training Info": "two words"}
        assert {a["name"] for a in r.artifacts()} == {"code/test_mlflow.py", "cfg.json", "notes.txt"}
        assert json.loads(r.load("cfg.json")) == {"a": 1} and r.load("notes.txt") == b"hi"
        assert mlflow.last_active_run() is run and run.info.status == "FINISHED"
    finally:
        mlflow.end_run()


@pytest.mark.parametrize("uri", ["http://localhost:5000", "sqlite:///mlflow.db", "databricks"])
def test_a_tracking_server_uri_is_refused_in_one_line(uri):
    import casmon.compat.mlflow as mlflow

    with pytest.raises(CasmonError, match="tracking server or database"):
        mlflow.set_tracking_uri(uri)


def test_what_the_drop_in_lacks_says_so():
    import casmon.compat.mlflow as mlflow

    with pytest.raises(AttributeError, match="model flavors, autolog"):
        mlflow.sklearn
    with pytest.raises(CasmonError, match="cannot read the filter"):
        from casmon.compat.mlflow_search import where

        where([{"run_id": "1"}], "metrics.x >")
    with pytest.raises(ValueError, match="FINISHED, FAILED or KILLED"):
        mlflow.end_run("DONE")


def test_a_failing_block_reads_failed_and_ctrl_c_killed(tmp_path):
    code = textwrap.dedent("""
        import casmon.compat.mlflow as mlflow, sys
        mlflow.set_tracking_uri(sys.argv[1])
        try:
            with mlflow.start_run(run_name="boom"):
                mlflow.log_metric("x", 1.0)
                raise ValueError("diverged")
        except ValueError:
            pass
        try:
            with mlflow.start_run(run_name="stopped"):
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            pass
        print(list(mlflow.search_runs()["status"]))
    """)
    p = run_python(code, str(tmp_path / "s"), cwd=tmp_path)
    assert p.stdout.strip().splitlines()[-1] == "['KILLED', 'FAILED']"
    assert [r.status for r in casmon.list_runs(str(tmp_path / "s"))] == ["failed", "killed"]


def test_start_run_with_a_run_id_continues_that_run(tmp_path):
    code = textwrap.dedent("""
        import casmon.compat.mlflow as mlflow, sys
        mlflow.set_tracking_uri(sys.argv[1])
        run = mlflow.start_run(run_name="long")
        mlflow.log_metric("loss", 1.0, step=0)
        mlflow.end_run("KILLED")
        with mlflow.start_run(run_id=run.info.run_id) as again:
            mlflow.log_metric("loss", 0.5, step=1)
        print(again.info.run_id == run.info.run_id, again.info.status)
    """)
    p = run_python(code, str(tmp_path / "s"), cwd=tmp_path)
    assert p.stdout.split() == ["True", "FINISHED"]
    (r,) = casmon.list_runs(str(tmp_path / "s"))
    assert (r.status, list(r.metric("loss").steps), len(r.resumes)) == ("ok", [0, 1], 1)


def test_each_thread_has_its_own_active_run_as_in_mlflow(tmp_path):
    """MLflow's active run is per thread (``mlflow.active_run`` says so): a second thread runs its own
    ``with mlflow.start_run()`` while the first's is active, and one thread's ``end_run`` leaves the other's
    run going."""
    code = textwrap.dedent("""
        import casmon.compat.mlflow as mlflow, sys, threading
        mlflow.set_tracking_uri(sys.argv[1])
        first_on, second_on, first_ended = threading.Event(), threading.Event(), threading.Event()
        errors = []

        def train(i):
            try:
                if i == 1:
                    first_on.wait(60)
                with mlflow.start_run(run_name=f"t{i}") as run:
                    mlflow.log_metric("acc", i / 10)
                    if i == 0:
                        first_on.set()
                        second_on.wait(60)
                        mlflow.end_run()
                        first_ended.set()
                    else:
                        second_on.set()
                        first_ended.wait(60)
                        assert mlflow.active_run() is run, "the other thread's end_run ended this run"
            except Exception as e:
                errors.append(repr(e))
                first_on.set(), second_on.set(), first_ended.set()

        ts = [threading.Thread(target=train, args=(i,)) for i in range(2)]
        for t in ts: t.start()
        for t in ts: t.join()
        print(errors, mlflow.active_run())
    """)
    p = run_python(code, str(tmp_path / "s"), cwd=tmp_path)
    assert p.stdout.strip().splitlines()[-1] == "[] None", p.stdout
    runs = {r.manifest["comment"]: r for r in casmon.list_runs(str(tmp_path / "s"))}
    assert sorted(runs) == ["t0", "t1"]
    for i in (0, 1):
        r = runs[f"t{i}"]
        assert (r.status, r.metric_summary()["acc"]["last"], r.manifest.get("parent")) == ("ok", i / 10, None)


def test_a_nested_run_continued_by_its_run_id_keeps_its_parent_run_id(tmp_path):
    code = textwrap.dedent("""
        import casmon.compat.mlflow as mlflow, sys
        mlflow.set_tracking_uri(sys.argv[1])
        with mlflow.start_run() as parent:
            with mlflow.start_run(nested=True) as child:
                mlflow.log_metric("acc", 0.5)
        with mlflow.start_run(run_id=child.info.run_id):
            mlflow.log_metric("acc", 0.9, step=1)
        df = mlflow.search_runs(filter_string="metrics.acc > 0.8")
        print(list(df["run_id"]), list(df["tags.mlflow.parentRunId"]), parent.info.run_id)
    """)
    p = run_python(code, str(tmp_path / "s"), cwd=tmp_path)
    assert p.stdout.split() == ["['2']", "['1']", "1"], p.stdout


FILTERS = '''\
import json, sys
import mlflow

mlflow.set_tracking_uri(sys.argv[1])
with mlflow.start_run(run_name="tiny"):
    mlflow.log_metric("acc", 0.0001)
    mlflow.log_param("lr", 0.01)
with mlflow.start_run(run_name="good"):
    mlflow.log_metric("acc", 0.95)
    mlflow.log_param("lr", "0.01")
    mlflow.set_tag("x y", "v")
filters = ["metrics.acc < 1e-3", "metrics.acc < 1E-3", "metrics.acc > 5.0e-1", "metrics.acc > .5",
           "metrics.acc > 0.9 and params.lr = '0.01'", "tags.`x y` = 'v'", "metrics.acc != 0.95",
           "attributes.run_name LIKE 'g%'", "params.lr = '0.01' AND metrics.acc <= 1e2"]
print(json.dumps([len(mlflow.search_runs(filter_string=f)) for f in filters]))
'''


def test_search_runs_reads_the_filters_mlflow_reads_numbers_with_exponents_too(tmp_path):
    pytest.importorskip("mlflow")
    real = run_python(FILTERS, (tmp_path / "mlruns").as_uri(), cwd=tmp_path,
                      env={"MLFLOW_ALLOW_FILE_STORE": "true", "GIT_PYTHON_REFRESH": "quiet"})
    ours = run_python(_casmon(FILTERS), str(tmp_path / "store"), cwd=tmp_path)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (real, ours))
    assert a == b == [1, 1, 1, 1, 1, 1, 1, 1, 2]


@pytest.mark.parametrize("status", [["FAILED"], {"FAILED": 1}, None, 3])
def test_end_run_with_a_status_that_is_no_name_is_one_line(status):
    import casmon.compat.mlflow as mlflow

    with pytest.raises(ValueError, match="end_run: status must be FINISHED, FAILED or KILLED"):
        mlflow.end_run(status)


ORDERED = '''\
import json, sys
import mlflow

mlflow.set_tracking_uri(sys.argv[1])
for name, acc, lr in [("a", 0.5, "0.1"), ("b", None, "0.01"), ("c", float("nan"), "0.001"), ("d", 0.9, None),
                      ("e", float("inf"), "1"), ("f", -1.0, "0.1")]:
    with mlflow.start_run(run_name=name):
        if acc is not None:
            mlflow.log_metric("acc", acc)
        if lr is not None:
            mlflow.log_param("lr", lr)
orders = [["metrics.acc DESC"], ["metrics.acc"], ["params.lr DESC"], ["params.lr ASC", "metrics.acc DESC"],
          ["attributes.run_name"], ["start_time ASC"]]
print(json.dumps([list(mlflow.search_runs(order_by=o)["tags.mlflow.runName"]) for o in orders]))
'''


def test_search_runs_orders_nan_and_missing_values_as_mlflow_does(tmp_path):
    pytest.importorskip("mlflow")
    real = run_python(ORDERED, (tmp_path / "mlruns").as_uri(), cwd=tmp_path,
                      env={"MLFLOW_ALLOW_FILE_STORE": "true", "GIT_PYTHON_REFRESH": "quiet"})
    ours = run_python(_casmon(ORDERED), str(tmp_path / "store"), cwd=tmp_path)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (real, ours))
    assert b == a
    assert a[0] == ["e", "d", "a", "f", "c", "b"], "NaN after every number, then the run without the metric"


def test_search_runs_filters_nan_and_inf_as_mlflow_does(tmp_path):
    pytest.importorskip("mlflow")
    filters = ["metrics.acc != 0.5", "metrics.acc > 0", "metrics.acc < 1", "metrics.acc = 0.5", "metrics.acc >= -1"]
    code = ORDERED.rsplit("orders = ", 1)[0] + textwrap.dedent(f"""
        print(json.dumps([sorted(mlflow.search_runs(filter_string=f).get("tags.mlflow.runName", []))
                          for f in {filters!r}]))
    """)
    real = run_python(code, (tmp_path / "mlruns").as_uri(), cwd=tmp_path,
                      env={"MLFLOW_ALLOW_FILE_STORE": "true", "GIT_PYTHON_REFRESH": "quiet"})
    ours = run_python(_casmon(code), str(tmp_path / "store"), cwd=tmp_path)
    a, b = (json.loads(p.stdout.strip().splitlines()[-1]) for p in (real, ours))
    assert b == a
    assert a[0] == ["c", "d", "e", "f"], "a NaN is unequal to 0.5"
