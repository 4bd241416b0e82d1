"""A run that spans notebook cells, on a real Jupyter kernel (ipykernel through nbclient and jupyter_client).
A cell that raises or is interrupted stops that cell, not the run.

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


def _execute_any(kc, code: str) -> tuple[str, str]:
    """``(status, output)`` of a cell that may raise."""
    out: list[str] = []

    def keep(msg):
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            out.append(msg["content"]["ename"])

    # stop_on_error=False: after a failed cell ipykernel aborts the requests that reach it while it resets,
    # and on a busy machine the next cell can be one of them ('aborted'); a user's next cell comes later.
    reply = kc.execute_interactive(code, timeout=600, output_hook=keep, stop_on_error=False)
    return reply["content"]["status"], "".join(out)


def test_a_cell_that_raises_or_is_interrupted_leaves_the_run_going(kernel):
    """A notebook user's failing cell or Interrupt (SIGINT to the kernel) stops that cell, not the run, as in
    MLflow: the run goes on, takes the next cells' points, and ends as the user ends it."""
    km, kc, store = kernel
    assert "started" in _execute(kc, START)
    _execute(kc, LOG)
    assert _execute_any(kc, "1 / 0") == ("error", "ZeroDivisionError")
    sleeping = cell("""
        import time
        print("sleeping", flush=True)
        time.sleep(600)
    """)
    msg_id = kc.execute(sleeping, stop_on_error=False)  # as _execute_any
    deadline.until(lambda: _iopub_says(kc, "sleeping"), "the cell to start sleeping", 120)
    km.interrupt_kernel()
    reply = kc.get_shell_msg(timeout=120)
    while reply["parent_header"].get("msg_id") != msg_id:
        reply = kc.get_shell_msg(timeout=120)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "KeyboardInterrupt"
    assert casmon.load_run("latest", str(store)).status == "running"
    assert "step" in _execute(kc, LOG_MORE)
    assert "ended ok" in _execute(kc, END)
    r = casmon.load_run("latest", str(store))
    assert (r.status, list(r.metric("loss").steps), list(r.metric("acc").steps)) == ("ok", list(range(5)), [5])


def _iopub_says(kc, text: str) -> bool:
    import queue

    try:
        while True:
            msg = kc.get_iopub_msg(timeout=0.2)
            if msg["msg_type"] == "stream" and text in msg["content"]["text"]:
                return True
    except queue.Empty:
        return False


def test_a_restarted_kernel_and_a_second_notebook_on_the_store_each_keep_their_own_run(kernel, tmp_path):
    from jupyter_client import KernelManager

    km, kc, store = kernel
    _execute(kc, START)
    _execute(kc, LOG)
    km.restart_kernel(now=False)  # Jupyter's "Restart": a shutdown request, then a fresh kernel
    kc.wait_for_ready(timeout=600)
    first = casmon.load_run("1", str(store))
    assert (first.status, first.manifest["signal"]) == ("killed", "exit")
    other = KernelManager(kernel_name=KERNEL)
    other.start_kernel(env=dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                                CASMON_STORE=str(store)), cwd=str(tmp_path))
    oc = other.client()
    oc.start_channels()
    try:
        oc.wait_for_ready(timeout=600)
        outs = [_execute(c, START) for c in (kc, oc)]
        names = {o.split("started ")[-1].split()[0] for o in outs}
        _execute(kc, LOG)
        _execute(oc, LOG_MORE)
        for c in (kc, oc):  # "latest" is the other notebook's run at times: each reads its own
            assert "ended ok" in _execute(c, 'run.end()\nprint("ended", casmon.load_run(run.name).status)')
    finally:
        oc.stop_channels()
        other.shutdown_kernel(now=True)
    runs = {r.name: r for r in casmon.list_runs(str(store))}
    assert names == {"2-nb", "3-nb"} and runs.keys() == {"1-nb", "2-nb", "3-nb"}
    assert [runs[n].status for n in ("1-nb", "2-nb", "3-nb")] == ["killed", "ok", "ok"]
    assert sorted(tuple(r.metric_summary()) for r in (runs["2-nb"], runs["3-nb"])) == [("acc",), ("loss",)]


def test_casmon_log_after_the_run_ended_points_at_start_run(tmp_path):
    """The notebook flow: a cell logs after ``end_run``; the error says how a notebook starts another run."""
    run = casmon.start_run(store=str(tmp_path / "s"), capture_output=False)
    casmon.log(a=1.0)
    casmon.end_run()
    with pytest.raises(casmon.NoActiveRunError) as e:
        casmon.log(a=2.0)
    assert "casmon.start_run(" in str(e.value) and "\n" not in str(e.value)
    assert casmon.load_run("latest", str(tmp_path / "s")).manifest["status"] == "ok"
