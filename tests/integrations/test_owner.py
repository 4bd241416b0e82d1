"""What the integrations share: a framework's values made plain params, its logs made metrics, a copy of an
integration that holds no run, and a training that dies with its process ending its run failed."""

import enum
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.integrations.owner import RunOwner, numbers, plain
from tests.support.processes import ROOT


class Color(enum.Enum):
    RED = "red"


def test_plain_params_keep_json_and_describe_everything_else():
    got = plain({"lr": 0.1, "n": np.int64(3), "f": np.float32(0.5), "color": Color.RED, "path": Path("/tmp/x"),
                 "t": (1, 2), "nested": {1: [None, True]}, "cls": Path, "fn": len, "nan": float("nan"),
                 "array": np.arange(3), "obj": object()})
    assert got["lr"] == 0.1 and got["n"] == 3 and type(got["n"]) is int and got["f"] == 0.5
    assert got["color"] == "red" and got["path"] == "/tmp/x" and got["t"] == [1, 2]
    assert got["nested"] == {"1": [None, True]} and got["cls"] == "pathlib.Path" and got["fn"] == "builtins.len"
    assert got["nan"] == "nan" and isinstance(got["array"], str) and got["obj"].startswith("<object object")
    deep: dict = {}
    d = deep
    for _ in range(50):
        d["x"] = {}
        d = d["x"]
    assert isinstance(plain(deep), dict)  # cut off, not a RecursionError

    class Unlistable(dict):
        def items(self):
            raise RuntimeError("boom")

    class BadStr:
        def __str__(self):
            raise RuntimeError("no str")

    got = plain({"odd": Unlistable(x=1), BadStr(): 1})
    assert isinstance(got["odd"], str) and len(got) == 2  # described, never raised into the training


def test_numbers_keep_scalars_and_leave_out_the_rest_warning_of_names_a_run_cannot_keep():
    logs = {"loss": np.float32(0.5), "acc": 1, "flag": True, "name": "x", "vec": np.arange(3), "one": np.ones(1),
            "big": 10**400, "": 1.0, "bad\nname": 2.0, 3: 4.0}
    with pytest.warns(casmon.RunWarning, match="metric name"):
        got = numbers(logs, "")
    assert got == {"loss": 0.5, "acc": 1.0, "one": 1.0}


def test_a_copy_of_an_integration_holds_no_run_and_opens_its_own_where_it_logs(tmp_path):
    store = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=store, capture_output=False) as run:
        owner = RunOwner(run, {"capture_output": False}, "test")
        assert owner.get() is run
        copy = pickle.loads(pickle.dumps(owner))
        assert copy.given is None and copy.run is None
        assert copy.options == {"capture_output": False, "store": store.url}  # the run's store, by its location
    store.close()


def test_a_fit_that_raises_uncaught_ends_its_run_failed_with_the_error_before_the_process_exits(tmp_path):
    pytest.importorskip("keras")
    script = textwrap.dedent(f"""
        import os
        os.environ.setdefault("KERAS_BACKEND", "torch" if __import__("importlib").util.find_spec("torch") else "jax")
        import numpy as np, keras, casmon
        from casmon.integrations.keras import CasmonCallback

        class Boom(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                raise ZeroDivisionError("exploded at batch " + str(batch))

        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        cb = CasmonCallback(record_options={{"store": {str(tmp_path / "s")!r}, "capture_output": False}})
        m.fit(np.ones((8, 2)), np.ones((8, 1)), verbose=0, callbacks=[cb, Boom()])
    """)
    casmon.open(tmp_path / "s", create=True).close()
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 1 and "ZeroDivisionError" in p.stderr
    r = casmon.load_run("latest", casmon.open(tmp_path / "s"))
    assert r.status == "failed" and r.manifest["error"] == "ZeroDivisionError: exploded at batch 0"


@pytest.mark.parametrize("module,name,needs", [("lightning", "CasmonLogger", "lightning.pytorch"),
                                               ("transformers", "CasmonCallback", "transformers"),
                                               ("keras", "CasmonCallback", "keras")])
def test_an_integration_pickles_by_its_import_name(module, name, needs):
    pytest.importorskip(needs)
    import importlib

    cls = getattr(importlib.import_module(f"casmon.integrations.{module}"), name)
    copy = pickle.loads(pickle.dumps(cls(record_options={"capture_output": False})))
    assert type(copy) is cls and copy._owner.options == {"capture_output": False} and copy._owner.run is None


def test_a_namespace_is_plain_as_its_fields():
    import argparse

    assert plain({"args": argparse.Namespace(lr=0.1, layers=[1, 2])}) == {"args": {"lr": 0.1, "layers": [1, 2]}}


def test_a_dataclass_config_is_plain_as_its_fields_nested_and_its_class_by_name():
    import dataclasses

    @dataclasses.dataclass
    class Optim:
        lr: float = 0.1
        betas: tuple = (0.9, 0.99)

    @dataclasses.dataclass(slots=True, frozen=True)
    class Config:
        optim: Optim = dataclasses.field(default_factory=Optim)
        color: Color = Color.RED
        out: Path = Path("/runs/x")
        hidden: int = dataclasses.field(default=0, repr=False)

    got = plain({"cfg": Config(), "cls": Config})
    assert got["cfg"] == {"optim": {"lr": 0.1, "betas": [0.9, 0.99]}, "color": "red", "out": "/runs/x", "hidden": 0}
    assert got["cls"].endswith("Config")


def test_a_pydantic_config_is_plain_as_its_fields():
    pydantic = pytest.importorskip("pydantic")

    class Config(pydantic.BaseModel):
        lr: float = 0.1
        color: Color = Color.RED
        layers: list[int] = [1, 2]

    assert plain({"cfg": Config()}) == {"cfg": {"lr": 0.1, "color": "red", "layers": [1, 2]}}


def test_a_copy_of_an_integration_given_a_store_object_pickles_and_logs_into_that_store_not_the_default(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default store would be ./.casmon
    store = casmon.open(tmp_path / "s", create=True)
    owner = RunOwner(None, {"store": store, "capture_output": False}, "test")
    copy = pickle.loads(pickle.dumps(owner))  # a trainer sent to spawned workers
    run = copy.get()
    run.log(loss=1.0)
    copy.end()
    assert [r.name for r in casmon.list_runs(store)] == [run.name] and not (tmp_path / ".casmon").exists()
    store.close()


@pytest.mark.parametrize("how", ["given", "active"])
def test_a_copy_of_an_integration_logging_into_a_run_opens_its_own_in_that_runs_store(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    store = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=store, capture_output=False) as run:
        owner = RunOwner(run if how == "given" else None, {"capture_output": False}, "test")
        assert owner.get() is run
        blob = pickle.dumps(owner)
    copy = pickle.loads(blob)
    mine = copy.get()
    mine.log(loss=1.0)
    copy.end()
    assert mine is not run and sorted(r.name for r in casmon.list_runs(store)) == sorted([run.name, mine.name])
    assert not (tmp_path / ".casmon").exists()
    store.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
@pytest.mark.parametrize("how", ["given", "own"])
def test_in_a_forked_child_an_integration_logs_into_a_run_of_its_own_in_the_same_store(tmp_path, monkeypatch, how):
    monkeypatch.chdir(tmp_path)
    store = casmon.open(tmp_path / "s", create=True)
    if how == "given":
        rec = casmon.record(store=store, capture_output=False)
        owner = RunOwner(rec.__enter__(), {"capture_output": False}, "test")
    else:
        owner = RunOwner(None, {"store": store, "capture_output": False}, "test")
    run = owner.get()  # the parent's run, open when the worker is forked
    pid = os.fork()  # a fork-started worker (Lightning's ddp_fork) holds a copy of the parent's objects
    if pid == 0:
        code = 1
        try:
            mine = owner.get()
            mine.log(loss=1.0)
            owner.end()
            code = 0 if mine is not run else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    rec.__exit__(None, None, None) if how == "given" else owner.end()
    assert os.waitstatus_to_exitcode(status) == 0
    runs = casmon.list_runs(store)
    assert len(runs) == 2 and not (tmp_path / ".casmon").exists()
    child = next(r for r in runs if r.name != run.name)
    assert child.status == "ok" and list(casmon.load_run(child.name, store).metric("loss").values) == [1.0]
    assert casmon.load_run(run.name, store).status == "ok"
    store.close()


def test_a_fit_stopped_by_ctrl_c_that_the_user_catches_ends_its_run_killed_not_failed(tmp_path):
    pytest.importorskip("keras")
    script = textwrap.dedent(f"""
        import os, signal, time
        os.environ.setdefault("KERAS_BACKEND", "torch" if __import__("importlib").util.find_spec("torch") else "jax")
        import numpy as np, keras, casmon
        from casmon.integrations.keras import CasmonCallback

        class CtrlC(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if batch == 1:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(60)  # the KeyboardInterrupt comes first

        m = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        m.compile(optimizer="sgd", loss="mse")
        store = casmon.open({str(tmp_path / "s")!r})
        cb = CasmonCallback(record_options={{"store": store, "capture_output": False}})
        try:
            m.fit(np.ones((32, 2)), np.ones((32, 1)), batch_size=8, verbose=0, callbacks=[cb, CtrlC()])
        except KeyboardInterrupt:
            print("stopped early")  # the usual way to stop a training by hand and keep the model
        deadline = time.time() + 120
        while casmon.load_run("latest", store).status == "running" and time.time() < deadline:
            time.sleep(0.1)
        r = casmon.load_run("latest", store)
        print(r.status, r.manifest.get("error"), signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    """)
    casmon.open(tmp_path / "s", create=True).close()
    p = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.splitlines()[-2:] == ["stopped early", "killed KeyboardInterrupt:  True"]


def test_given_a_run_that_has_ended_an_integration_warns_and_logs_into_a_run_of_its_own(tmp_path):
    store = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=store, capture_output=False) as done:
        pass
    owner = RunOwner(done, {"store": store, "capture_output": False}, "CasmonLogger")
    with pytest.warns(casmon.RunWarning, match=f"CasmonLogger: run {done.name} has ended .*a run of its own"):
        run = owner.get()
    run.log({"loss": 1.0}, step=0)
    owner.end()
    assert run is not done and list(casmon.load_run(run.name, store).metric("loss").values) == [1.0]
    assert casmon.load_run(done.name, store).metric_summary() == {}
    store.close()


def test_an_integration_that_keeps_one_run_opens_a_new_one_with_a_warning_when_its_run_was_deleted(tmp_path):
    store = casmon.open(tmp_path / "s", create=True)
    owner = RunOwner(None, {"store": store, "capture_output": False}, "CasmonLogger", one_run=True)
    first = owner.get()
    first.log({"loss": 1.0}, step=0)
    owner.end()
    assert owner.get() is not first and owner.run.name == first.name  # continued
    owner.end()
    casmon.delete_run(first.name, store)
    with pytest.warns(casmon.RunWarning, match=f"cannot continue run {first.name}"):
        run = owner.get()
    run.log({"loss": 2.0}, step=0)
    owner.end()
    assert [r.status for r in casmon.list_runs(store)] == ["ok"]
    assert list(casmon.load_run(run.name, store).metric("loss").values) == [2.0]
    store.close()
