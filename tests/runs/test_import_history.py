"""TensorBoard event files and MLflow stores, written by the real packages, read and imported as casmon runs.

casmon reads both formats itself (``casmon.runs.history``); the packages only
write the files here. MLflow is slow to import, so one subprocess writes both
of its stores for the whole module, and MLflow's own API says what they hold.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import casmon
from casmon.runs.history import HistoryError, HistoryWarning, import_history, read_history
from casmon.runs.history.tensorboard import masked_crc32c, read_records
from tests.conftest import run_python
from tests.support.cli import cli


def _runs(store) -> dict[str, casmon.RunInfo]:
    return {r.manifest["imported"]["name"]: r for r in casmon.list_runs(store)}


def _frames(path) -> list[tuple[int, int]]:
    """(offset, data length) of every TFRecord frame of an event file."""
    b, out, pos = path.read_bytes(), [], 0
    while pos < len(b):
        (n,) = struct.unpack_from("<Q", b, pos)
        out.append((pos, n))
        pos += 16 + n
    return out


# ---------------------------------------------------------------------------
# TensorBoard
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tb_logs(tmp_path_factory):
    """Logs as torch.utils.tensorboard and tensorboard.summary.Writer write them, and what was written."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    from tensorboard.summary import Writer
    from torch.utils.tensorboard import SummaryWriter

    root = tmp_path_factory.mktemp("tb") / "logs"
    t0 = 1.7e9
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's and tensorboard's own deprecation chatter
        w = SummaryWriter(str(root / "torch"))
        for i in range(300):  # the default, simple_value; and the new style, a float tensor; and a double one
            w.add_scalar("train/loss", 1.0 / (i + 1), i * 2, walltime=t0 + i)
            w.add_scalar("train/acc", i / 300, i, walltime=t0 + i, new_style=True)
        w.add_scalar("lr", 0.1, 0, walltime=t0, new_style=True, double_precision=True)
        w.add_scalar("lr", -3, 7, walltime=t0 + 1, new_style=True, double_precision=True)
        w.add_histogram("weights", np.arange(10.0), 0)
        w.add_text("note", "hello", 0)
        w.add_scalars("pair", {"a": 1.5, "b": 2.5}, 3, walltime=t0 + 5)  # one folder per series, as TB does
        w.add_hparams({"lr": 0.01, "opt": "adam", "layers": 4}, {"hp/best": 0.75}, run_name="hp")
        w.close()
        tw = Writer(str(root / "plain"))
        for i in range(5):
            tw.add_scalar("loss", float(5 - i), i * 100, wall_time=t0 + 10 * i)
        tw.add_scalar("loss", 1e40, 600, wall_time=t0 + 60)  # float32 overflow: inf, kept as such
        tw.close()
    return root, t0


def test_tensorboard_scalars_import_with_the_steps_values_and_times_written(tb_logs, tmp_path):
    root, t0 = tb_logs
    report = import_history(root, str(tmp_path / "s"))
    runs = _runs(str(tmp_path / "s"))
    assert set(runs) == {"torch", "torch/pair_a", "torch/pair_b", "torch/hp", "plain"} and len(report.runs) == 5
    r = runs["torch"]
    assert r.status == "ok" and r.manifest["imported"]["from"] == "tensorboard"
    loss, acc, lr = r.metric("train/loss"), r.metric("train/acc"), r.metric("lr")
    i = np.arange(300)
    assert loss.steps.tolist() == (i * 2).tolist() and acc.steps.tolist() == i.tolist()
    # simple_value and float tensors are float32: exactly what float32 keeps of the value logged
    assert np.array_equal(loss.values, (1.0 / (i + 1)).astype(np.float32).astype(np.float64))
    assert np.array_equal(acc.values, (i / 300).astype(np.float32).astype(np.float64))
    assert np.allclose(loss.times, t0 + i, rtol=0, atol=1e-6)
    assert lr.values.tolist() == [0.1, -3.0] and lr.steps.tolist() == [0, 7]  # double_precision: float64 kept
    assert set(r.metrics()) == {"train/loss", "train/acc", "lr"}
    assert any("1 histograms" in n and "1 text" in n for n in report.notes)
    assert r.manifest["start"] <= t0 and r.manifest["end"] >= t0 + 299
    p = runs["plain"].metric("loss")
    assert p.steps.tolist() == [0, 100, 200, 300, 400, 600] and p.values.tolist() == [5, 4, 3, 2, 1, np.inf]
    assert p.times.tolist() == [t0, t0 + 10, t0 + 20, t0 + 30, t0 + 40, t0 + 60]
    assert runs["torch/pair_a"].metric("pair").values.tolist() == [1.5]


def test_add_hparams_gives_its_run_params(tb_logs):
    root, _t0 = tb_logs
    (run,) = [r for r in read_history(root) if r.name == "torch/hp"]
    # torch writes numbers as doubles (4 -> 4.0) and keeps strings
    assert run.params == {"lr": 0.01, "opt": "adam", "layers": 4.0} and run.status == "ok"
    assert run.metrics["hp/best"][1].tolist() == [np.float32(0.75)]


def test_importing_the_same_logs_again_adds_no_run(tb_logs, tmp_path):
    root, _t0 = tb_logs
    store = str(tmp_path / "s")
    import_history(root / "plain", store)
    again = import_history(root, store)  # the plain run again, from a folder above it: the same run
    assert again.already == 1 and len(again.runs) == 4
    third = cli("import", str(root), "--store", store, "--json")
    assert json.loads(third.stdout)["runs"] == 0 and json.loads(third.stdout)["already_imported"] == 5
    assert len(casmon.list_runs(store)) == 5


def test_every_numeric_tensor_dtype_reads_as_tensorflow_writes_it(tmp_path):
    """TensorFlow writes ``tensor_content``; tensorboard's make_tensor_proto the typed value fields."""
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter
    from tensorboard.util import tensor_util

    values = [np.float16(1.5), np.float32(-2.25), np.float64(1e300), np.int32(-7), np.int64(-(2**40)),
              np.uint8(200), np.bool_(True)]
    w = EventFileWriter(str(tmp_path / "run"))
    for step, v in enumerate(values):
        for tag, proto in ((f"typed/{v.dtype}", tensor_util.make_tensor_proto(v)),
                           (f"content/{v.dtype}", tensor_pb2.TensorProto(
                               dtype=tensor_util.make_tensor_proto(v).dtype, tensor_content=v.tobytes()))):
            value = summary_pb2.Summary.Value(tag=tag, tensor=proto)
            value.metadata.plugin_data.plugin_name = "scalars"
            w.add_event(event_pb2.Event(wall_time=1.0 + step, step=step, summary=summary_pb2.Summary(value=[value])))
    bf16 = {"typed/bfloat16": tensor_pb2.TensorProto(dtype=types_pb2.DT_BFLOAT16, half_val=[0xC030]),  # -2.75
            "content/bfloat16": tensor_pb2.TensorProto(dtype=types_pb2.DT_BFLOAT16, tensor_content=b"\x30\xc0")}
    w.add_event(event_pb2.Event(wall_time=8.0, step=8, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag=tag, tensor=proto) for tag, proto in bf16.items()])))
    strings = tensor_pb2.TensorProto(dtype=types_pb2.DT_STRING, string_val=[b"x"])
    w.add_event(event_pb2.Event(wall_time=9.0, summary=summary_pb2.Summary(
        value=[summary_pb2.Summary.Value(tag="words", tensor=strings)])))
    w.close()
    (run,) = read_history(tmp_path)
    for step, v in enumerate(values):
        for kind in ("typed", "content"):
            steps, got, _t = run.metrics[f"{kind}/{v.dtype}"]
            assert steps.tolist() == [step] and got.tolist() == [float(v)], (kind, v.dtype)
    assert run.metrics["typed/bfloat16"][1].tolist() == run.metrics["content/bfloat16"][1].tolist() == [-2.75]
    assert "words" not in run.metrics and any("1 tensors" in n for n in run.notes)


def test_a_restart_drops_the_points_tensorboard_drops(tmp_path):
    """SummaryWriter(purge_step=s), a job resumed from a checkpoint: the first session's points at steps >= s go."""
    pytest.importorskip("tensorboard")
    pytest.importorskip("torch")
    from torch.utils.tensorboard import SummaryWriter

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        w = SummaryWriter(str(tmp_path / "run"), filename_suffix=".a")
        for i in range(10):
            w.add_scalar("loss", float(i), i, walltime=100.0 + i)
        w.close()
        w = SummaryWriter(str(tmp_path / "run"), purge_step=6, filename_suffix=".b")
        for i in range(6, 9):
            w.add_scalar("loss", 10.0 * i, i, walltime=200.0 + i)
        w.close()
    (run,) = read_history(tmp_path)
    steps, values, _t = run.metrics["loss"]
    assert steps.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8] and values.tolist() == [0, 1, 2, 3, 4, 5, 60, 70, 80]
    assert any("4 point(s) dropped" in n for n in run.notes)


@pytest.fixture
def event_file(tmp_path):
    """One event file of 20 scalar events, and its frames."""
    pytest.importorskip("tensorboard")
    from tensorboard.summary import Writer

    w = Writer(str(tmp_path / "logs" / "run"))
    for i in range(20):
        w.add_scalar("x", float(i), i, wall_time=1.0 + i)
    w.close()
    (path,) = (tmp_path / "logs" / "run").iterdir()
    return path, _frames(path)


@pytest.mark.parametrize("damage", ["data byte", "data checksum", "length", "truncated"])
def test_a_damaged_record_ends_its_file_with_a_warning_and_keeps_what_came_before(event_file, damage):
    path, frames = event_file
    b = bytearray(path.read_bytes())
    off, n = frames[11]  # frame 0 is the file_version event: frame k holds step k - 1
    if damage == "data byte":
        b[off + 12 + n // 2] ^= 0x10
    elif damage == "data checksum":
        b[off + 12 + n] ^= 0x01
    elif damage == "length":
        b[off] ^= 0x04
    else:
        del b[off + 12 + n // 2:]
    path.write_bytes(bytes(b))
    with pytest.warns(HistoryWarning, match=f"{path.name}.*reading stopped at"):
        (run,) = read_history(path.parent.parent)
    assert run.metrics["x"][0].tolist() == list(range(10))


@pytest.mark.parametrize("cut", [1, 8, 11])
def test_a_file_cut_inside_a_record_header_is_reported_as_truncated_not_damaged(event_file, cut):
    path, frames = event_file
    off, _n = frames[11]
    path.write_bytes(path.read_bytes()[:off + cut])
    records, stop = read_records(path)
    assert len(records) == 11 and stop == f"a truncated record header at byte {off}"


def test_a_file_that_is_not_an_event_file_is_a_clear_error(event_file, tmp_path):
    path, _frames_ = event_file
    bad = path.parent.parent / "other" / "events.out.tfevents.123.host.1.1"
    bad.parent.mkdir()
    bad.write_bytes(b"this is not a TFRecord file at all, whatever its name says" * 3)
    with pytest.raises(HistoryError, match=f"{bad}: not a TensorBoard event file"):
        read_history(bad)
    p = cli("import", str(bad), "--store", str(tmp_path / "s"), check=False)
    assert p.returncode == 1 and "not a TensorBoard event file" in p.stderr and "Traceback" not in p.stderr
    report = import_history(path.parent.parent, str(tmp_path / "s"))  # in a folder: the good run still comes in
    assert len(report.runs) == 1 and any(str(bad) in n and "not imported" in n for n in report.notes)


def test_masked_crc32c_matches_tensorboards_own(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c as tb_masked

    rng = np.random.default_rng(7)
    for n in (0, 1, 3, 8, 63, 4095, 4096, 4097, 20_000):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert masked_crc32c(data) == tb_masked(data), n
    (tmp_path / "events.out.tfevents.1").write_bytes(b"")
    assert read_records(tmp_path / "events.out.tfevents.1") == ([], None)  # a writer that has not flushed yet


def test_reading_event_files_imports_neither_tensorboard_nor_protobuf(event_file):
    path, _frames_ = event_file
    p = run_python(textwrap.dedent(f"""
        import sys
        from casmon.runs.history import read_history
        (run,) = read_history({str(path)!r})
        assert run.metrics["x"][1].tolist() == [float(i) for i in range(20)]
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorboard", "tensorflow", "google", "torch")))
    """))
    assert p.stdout.strip() == "[]"


# ---------------------------------------------------------------------------
# MLflow
# ---------------------------------------------------------------------------

_MLFLOW_SCRIPT = r"""
import json, os, sys
import time
import mlflow
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

out = {}
for kind, uri in (("files", "file:" + os.path.abspath("mlruns")), ("sqlite", "sqlite:///mlflow.db")):
    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    exp = mlflow.set_experiment("exp-a").experiment_id
    with mlflow.start_run(run_name="base") as r:
        mlflow.log_params({"lr": 0.1, "bs": 32, "opt": "adam", "flag": True, "code": "1e5", "cfg/depth": 3})
        now = int(time.time() * 1000)  # one batch (a log_metric a point costs ~10 ms on sqlite)
        client.log_batch(r.info.run_id, metrics=[Metric("loss", 1.0 / (i + 1), now + i, i * 10) for i in range(200)])
        mlflow.log_metric("val/acc", 0.5, step=0)
        mlflow.log_metric("val/acc", float("nan"), step=1)
        mlflow.log_metric("val/acc", 0.25, step=1)  # a step logged twice: both points kept
        mlflow.set_tag("team", "vision")
    ids = {"base": r.info.run_id}
    for status in ("FAILED", "KILLED"):
        run = mlflow.start_run(run_name=status.lower())
        mlflow.log_metric("loss", 2.0, step=3)
        mlflow.end_run(status=status)
        ids[status.lower()] = run.info.run_id
    hung = client.create_run(exp, run_name="hung")  # never ended: MLflow keeps it RUNNING
    client.log_metric(hung.info.run_id, "loss", 9.0, step=1)
    ids["hung"] = hung.info.run_id
    gone = client.create_run(exp, run_name="gone")
    client.delete_run(gone.info.run_id)
    truth = {}
    for name, rid in ids.items():
        run = client.get_run(rid)
        truth[name] = {
            "id": rid, "status": run.info.status, "start": run.info.start_time, "end": run.info.end_time,
            "user": run.info.user_id, "params": run.data.params, "tags": run.data.tags,
            "metrics": {k: sorted([m.step, repr(m.value), m.timestamp] for m in client.get_metric_history(rid, k))
                        for k in run.data.metrics}}
    out[kind] = truth
print(json.dumps(out))
"""


@pytest.fixture(scope="module", autouse=True)
def _mlflow_writer(tmp_path_factory):
    """MLflow writes its stores in a process of its own, started with the module so that its ~8 s (importing
    mlflow, creating the sqlite tables) overlap the TensorBoard tests."""
    if importlib.util.find_spec("mlflow") is None or importlib.util.find_spec("sqlalchemy") is None:
        yield None  # mlflow_stores skips
        return
    d = tmp_path_factory.mktemp("mlflow")
    env = dict(os.environ, MLFLOW_ALLOW_FILE_STORE="true", GIT_PYTHON_REFRESH="quiet")
    env.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.Popen([sys.executable, "-c", _MLFLOW_SCRIPT], cwd=d, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    yield d, proc
    if proc.poll() is None:
        proc.kill()
    proc.communicate()


@pytest.fixture(scope="module")
def mlflow_stores(_mlflow_writer):
    """An MLflow file store and an sqlite database (mlflow-skinny with sqlalchemy and alembic writes it), each
    with the same runs, and what MLflow's own API reads back from each."""
    if _mlflow_writer is None:
        pytest.skip("needs mlflow (mlflow-skinny) and sqlalchemy")
    d, proc = _mlflow_writer
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return d, json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["files", "sqlite"])
def test_mlflow_runs_import_as_mlflow_reads_them(mlflow_stores, kind, tmp_path):
    d, truth = mlflow_stores
    source = d / "mlruns" if kind == "files" else f"sqlite:///{d / 'mlflow.db'}"
    report = import_history(source, str(tmp_path / "s"))
    runs = _runs(str(tmp_path / "s"))
    assert set(runs) == {"base", "failed", "killed", "hung"} and report.by_tool == {"mlflow": 4}
    assert any("deleted" in n for n in report.notes)  # "gone" is not imported
    statuses = {"base": "ok", "failed": "failed", "killed": "killed", "hung": "lost"}
    for name, t in truth[kind].items():
        r = runs[name]
        assert r.status == statuses[name], name
        assert r.manifest["imported"]["id"] == t["id"] and r.manifest["user"] == t["user"]
        mf = r.info()["mlflow"]
        assert mf["experiment"] == "exp-a" and mf["status"] == t["status"] and mf["tags"] == t["tags"]
        assert r.manifest["start"] == t["start"] / 1000
        assert r.manifest.get("end") == (t["end"] / 1000 if t["end"] and name != "hung" else None)
        for key, points in t["metrics"].items():
            s = r.metric(key)
            got = sorted([int(a), repr(float(b)), round(c * 1000)] for a, b, c in zip(s.steps, s.values, s.times))
            assert got == points, (name, key)
    base = runs["base"]
    assert base.params() == {"lr": 0.1, "bs": 32, "opt": "adam", "flag": True, "code": "1e5", "cfg/depth": 3}
    assert truth[kind]["base"]["params"]["lr"] == "0.1"  # MLflow keeps text; casmon the value it was logged from
    assert base.metric("loss").steps.tolist() == list(range(0, 2000, 10))  # in the order logged
    assert np.isnan(base.metric("val/acc").values).tolist() == [False, True, False]
    assert "exp-a" in base.manifest["info"]["mlflow"]["experiment"]


def test_an_mlflow_store_is_found_from_its_project_folder_and_imported_once(mlflow_stores, tmp_path):
    d, _truth = mlflow_stores
    store = str(tmp_path / "s")
    first = cli("import", str(d), "--store", store, "--json")  # mlruns/ and mlflow.db both
    assert json.loads(first.stdout)["runs"] == 8
    for again in (str(d / "mlflow.db"), str(d / "mlruns"), f"sqlite:///{d / 'mlflow.db'}"):
        out = json.loads(cli("import", again, "--store", store, "--json").stdout)
        assert out["runs"] == 0 and out["already_imported"] == 4, again
    assert len(casmon.list_runs(store)) == 8


def test_a_damaged_mlflow_database_is_a_clear_error(mlflow_stores, tmp_path):
    d, _truth = mlflow_stores
    whole = (d / "mlflow.db").read_bytes()
    cut = tmp_path / "cut.db"
    cut.write_bytes(whole[: len(whole) // 3])
    garbled = tmp_path / "garbled.db"
    garbled.write_bytes(whole[:16] + bytes(len(whole) - 16))  # the sqlite header, then zeros
    for bad in (cut, garbled):
        with pytest.raises(HistoryError, match=f"{bad}"):
            read_history(bad)
        p = cli("import", str(bad), "--store", str(tmp_path / "s"), check=False)
        assert p.returncode == 1 and str(bad.name) in p.stderr and "Traceback" not in p.stderr
    other = tmp_path / "other.db"
    import sqlite3

    sqlite3.connect(other).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(HistoryError, match="not an MLflow database"):
        read_history(other)


def test_a_metric_file_cut_short_by_a_dying_writer_keeps_its_whole_lines(mlflow_stores, tmp_path):
    d, truth = mlflow_stores
    shutil.copytree(d / "mlruns", tmp_path / "mlruns")
    rid = truth["files"]["base"]["id"]
    (loss,) = (tmp_path / "mlruns").glob(f"*/{rid}/metrics/loss")
    loss.write_bytes(loss.read_bytes()[:-4])  # the last line loses its step and its newline
    base = [r for r in read_history(tmp_path / "mlruns") if r.id == rid][0]
    assert base.metrics["loss"][0].tolist() == list(range(0, 1990, 10))
    assert any("1 malformed line(s) skipped" in n for n in base.notes)
