"""A run that spans notebook cells, on a real Jupyter kernel (ipykernel through nbclient and jupyter_client).

``start_run`` in one cell, ``casmon.log`` in others, ``end`` in a last one: one ``ok`` run with every point.
A kernel shut down (as Jupyter's shutdown and restart do) with the run open leaves it ``killed``; a kernel
killed outright (kill -9) leaves it ``lost`` once its heartbeats stop; never ``running`` for ever.
"""

from __future__ import annotations

import os
import signal
import sys

import pytest

import casmon
from tests.conftest import ROOT
from tests.support import deadline
from tests.test_notebook import KERNEL, cell, kernel_dir, run_notebook, text  # noqa: F401 - kernel_dir: a fixture

START = cell("""
    import casmon
    run = casmon.start_run(comment="nb", params={"lr": 0.1}, tags=["notebook"])
    print("started", run.name)
""")
LOG = cell("""
    for i in range(5):
        casmon.log(loss=1.0 / (i + 1))
""")
LOG_MORE = cell("""
    run.log(acc=0.75)
    print("step", run._metrics.step)
""")
END = cell("""
    run.end()
    print("ended", casmon.load_run("latest").status)
""")


def test_a_run_started_in_one_cell_logged_in_others_and_ended_in_the_last_is_ok(tmp_path, kernel_dir):
    store = tmp_path / "store"
    cells = run_notebook(tmp_path / "train.ipynb", [START, LOG, LOG, LOG_MORE, END], store)
    assert "started 1-nb" in text(cells[0]) and "ended ok" in text(cells[4]), [text(c, "stderr") for c in cells]
    r = casmon.load_run("latest", str(store))
    assert (r.status, r.tags, r.flat_params()) == ("ok", ("notebook",), {"lr": 0.1})
    assert list(r.metric("loss").steps) == list(range(10))
    assert list(r.metric("loss").values) == [1.0 / (i + 1) for i in range(5)] * 2
    assert list(r.metric("acc").steps) == [10]
    assert r.manifest["notebook"] == str(tmp_path / "train.ipynb")


@pytest.fixture
def kernel(tmp_path, kernel_dir):  # noqa: F811 - the fixture imported above
    """A live kernel on a fresh store (heartbeats every half second): ``(manager, client, store)``."""
    from jupyter_client import KernelManager

    store = tmp_path / "store"
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               CASMON_STORE=str(store), CASMON_HEARTBEAT_S="0.5")
    km = KernelManager(kernel_name=KERNEL)
    km.start_kernel(env=env, cwd=str(tmp_path))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=600)
        yield km, kc, store
    finally:
        kc.stop_channels()
        if km.is_alive():
            km.shutdown_kernel(now=True)


def _execute(kc, code: str) -> str:
    out: list[str] = []

    def keep(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append("\n".join(msg["content"]["traceback"]))

    reply = kc.execute_interactive(code, timeout=600, output_hook=keep)
    assert reply["content"]["status"] == "ok", "".join(out)
    return "".join(out)


def test_a_kernel_shut_down_mid_run_leaves_it_killed(kernel):
    km, kc, store = kernel
    assert "started" in _execute(kc, START)
    _execute(kc, LOG)
    assert casmon.load_run("latest", str(store)).status == "running"
    km.shutdown_kernel(now=False)  # what Jupyter's shutdown and restart send: a shutdown request
    r = casmon.load_run("latest", str(store))
    assert (r.status, r.manifest["signal"]) == ("killed", "exit"), r.manifest
    assert list(r.metric("loss").steps) == list(range(5))


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_kernel_killed_outright_mid_run_reads_as_lost(kernel):
    km, kc, store = kernel
    _execute(kc, START)
    _execute(kc, LOG)
    deadline.until(lambda: casmon.load_run("latest", str(store)).metric_summary().get("loss", {}).get("n") == 5,
                   "the points to reach the store", 120)
    os.kill(km.provisioner.process.pid, signal.SIGKILL)
    deadline.until(lambda: casmon.load_run("latest", str(store)).status == "lost", "the run to read as lost", 120)
    r = casmon.load_run("latest", str(store))
    assert len(r.metric("loss")) == 5
