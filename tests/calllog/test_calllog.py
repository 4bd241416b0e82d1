import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import casmon
from casmon.calllog import CallLogWarning, NotStored
from tests.conftest import ROOT, run_parallel, run_python


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    yield s
    s.close()


def test_records_calls_and_reads_them_back(store):
    @casmon.intercept(store=store)
    def f(x, y=2, *rest, z=None, **kw):
        """Doc."""
        return x * y

    assert f(1) == 2 and f(2, 3) == 6 and f(1, 2, 3, 4, z="q", w=5) == 2
    assert f.__name__ == "f" and f.__doc__ == "Doc."
    import inspect

    assert str(inspect.signature(f)) == "(x, y=2, *rest, z=None, **kw)"
    log = casmon.load(store)
    assert log.get("f", 2) == ([2, 3], {})
    a = log.get_args("f", 1)
    assert (a.x, a.y, a.rest, a.z, a.kw) == (1, 2, (), None, {})
    a3 = log.get_args("f", 3)
    assert (a3.rest, a3.z, a3.kw) == ((3, 4), "q", {"w": 5})
    assert log.result("f", 2) == 6
    assert [c.n for c in log.calls("f")] == [1, 2, 3]
    name = log.resolve("f")
    assert name.endswith("test_records_calls_and_reads_them_back.<locals>.f")
    assert log.get(name, 1) == ([1], {})


def test_inputs_are_captured_before_the_call(store):
    @casmon.intercept(store=store)
    def normalise(a, opts):
        a /= a.max()
        opts["done"] = True
        return a

    arr = np.arange(1.0, 6.0)
    normalise(arr, {"scale": 1})
    args, _ = casmon.load(store).get("normalise", 1)
    assert np.array_equal(args[0], np.arange(1.0, 6.0))
    assert args[1] == {"scale": 1}


def test_exceptions_are_recorded_and_reraised(store):
    @casmon.intercept(store=store)
    def boom(x):
        raise ValueError(f"bad {x}")

    with pytest.raises(ValueError, match="bad 3"):
        boom(3)
    c = casmon.load(store).call("boom", 1)
    assert c.exception == ("ValueError", "bad 3")
    with pytest.raises(LookupError, match="raised ValueError: bad 3"):
        c.result()


def test_methods_and_async(store):
    class Model:
        def __init__(self, w):
            self.w = w

        @casmon.intercept(store=store)
        def predict(self, x):
            return self.w * x

        @casmon.intercept(store=store)
        @staticmethod
        def helper(x):
            return -x

        @classmethod
        @casmon.intercept(store=store)
        def build(cls, w):
            return w

    assert Model(2).predict(3) == 6 and Model.helper(1) == -1 and Model.build(5) == 5

    @casmon.intercept(store=store)
    async def fetch(x):
        await asyncio.sleep(0)
        return x + 1

    assert asyncio.run(fetch(1)) == 2
    log = casmon.load(store)
    assert log.result("predict", 1) == 6
    assert log.get("helper", 1) == ([1], {})
    assert log.get("build", 1)[0][1] == 5
    assert log.result("fetch", 1) == 2


def test_unpicklable_argument_gets_a_marker_and_one_warning(store):
    @casmon.intercept(store=store)
    def f(x, cb):
        return x

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert f(1, lambda: 0) == 1
        assert f(2, lambda: 0) == 2
    msgs = [str(x.message) for x in w if issubclass(x.category, CallLogWarning)]
    assert len(msgs) == 1 and "function" in msgs[0]
    args, _ = casmon.load(store).get("f", 2)
    assert args[0] == 2
    assert isinstance(args[1], NotStored) and "function" in repr(args[1])


def test_missing_names_and_numbers_say_what_exists(store):
    @casmon.intercept(store=store)
    def alpha(x):
        return x

    for i in range(5):
        alpha(i)
    log = casmon.load(store)
    with pytest.raises(LookupError, match=r"no logged function 'beta'; logged functions: .*alpha"):
        log.get("beta", 1)
    with pytest.raises(LookupError, match=r"no call 9 in session 1; its calls there are 1-5"):
        log.get("alpha", 9)
    with pytest.raises(LookupError, match="no calls in session 7"):
        log.get("alpha", 1, session=7)


def test_result_false(store):
    @casmon.intercept(store=store, result=False)
    def f(x):
        return x * 2

    f(1)
    with pytest.raises(LookupError, match="not recorded"):
        casmon.load(store).result("f", 1)


def test_replay_is_a_regression_check(store):
    @casmon.intercept(store=store)
    def area(w, h):
        return {"area": w * h, "arr": np.full(3, w)}

    area(2, 3)
    log = casmon.load(store)
    r = log.replay("area", 1)
    assert r.matches and r.result["area"] == 6
    r2 = log.replay("area", 1, fn=lambda w, h: {"area": w * h + 1, "arr": np.full(3, w)})
    assert not r2.matches and r2.recorded != r2.replayed


def test_same_array_stored_once_and_few_files(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    big = np.random.default_rng(0).random(16 * 1024 * 1024 // 8)
    one = casmon.open(tmp_path / "one")
    one.put(big)
    one.close()
    one_bytes = sum(p.stat().st_size for p in (tmp_path / "one").rglob("*") if p.is_file())

    @casmon.intercept(store=s)
    def consume(a, i):
        return i

    for i in range(200):
        consume(big, i)
    s.flush()
    total = sum(p.stat().st_size for p in (tmp_path / "s").rglob("*") if p.is_file())
    assert total <= one_bytes * 1.05

    @casmon.intercept(store=s)
    def small(a, b, c):
        return a

    before = sum(1 for p in (tmp_path / "s").rglob("*") if p.is_file())
    for i in range(10_000):
        small(i, 2.5, "abc")
        if i % 2500 == 0:
            s.flush()
    s.flush()
    after = sum(1 for p in (tmp_path / "s").rglob("*") if p.is_file())
    assert after - before <= 20
    assert len(casmon.load(s).calls("small")) == 10_000


def test_threads_write_at_once(store):
    @casmon.intercept(store=store)
    def work(t, i):
        return t * 1000 + i

    def run(t):
        for i in range(200):
            work(t, i)

    threads = [threading.Thread(target=run, args=(t,), name=f"worker-{t}") for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    log = casmon.load(store)
    calls = log.calls("work")
    assert sorted(c.n for c in calls) == list(range(1, 801))
    assert sorted((c.inputs()[0][0], c.inputs()[0][1]) for c in calls) == [(t, i) for t in range(4) for i in range(200)]
    assert len(log.calls("work", thread="worker-2")) == 200


WORKER = textwrap.dedent(
    """
    import sys, time, casmon, numpy as np
    @casmon.intercept(store=sys.argv[1])
    def step(i, data):
        return float(data.sum())
    n = int(sys.argv[2])
    for i in range(n):
        step(i, np.full(100, i))
    if len(sys.argv) > 3:                 # flush, say so, then wait to be killed
        casmon.flush()
        print("flushed", flush=True)
        for i in range(n, n + 1000):
            step(i, np.full(100, i))      # never flushed: lost with SIGKILL
        time.sleep(60)
    """
)


def test_sessions_from_processes_never_overwrite(tmp_path):
    loc = str(tmp_path / "s")
    run_parallel([["-c", WORKER, loc, "300"] for _ in range(4)])
    run_python(WORKER, loc, "5")
    log = casmon.load(casmon.open(loc))
    assert sorted(log.sessions) == [1, 2, 3, 4, 5]
    assert len(log.calls("step")) == 4 * 300 + 5
    assert {len(log.calls("step", session=s)) for s in range(1, 5)} == {300}
    assert len(log.calls("step", session=5)) == 5
    latest, in5 = log.get("step", 5), log.get("step", 5, session=5)  # the latest session by default
    assert latest[0][0] == in5[0][0] == 4 and np.array_equal(latest[0][1], in5[0][1])
    with pytest.raises(LookupError):
        log.get("step", 6)
    pids = {c.pid for c in log.calls("step")}
    assert len(pids) == 5
    assert len(log.calls("step", process=sorted(pids)[0])) in (5, 300)
    assert casmon.open(loc).verify().ok


def test_load_while_running_and_after_sigkill(tmp_path):
    loc = str(tmp_path / "s")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", WORKER, loc, "50", "wait"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "flushed"
        log = casmon.load(casmon.open(loc))  # the writer is still running
        assert len(log.calls("step")) == 50
        assert log.get("step", 50)[0][0] == 49
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    s = casmon.open(loc)
    log = casmon.load(s)
    assert len(log.calls("step")) >= 50
    assert s.verify().ok
    run_python(WORKER, loc, "3")  # the next writer continues
    assert len(casmon.load(casmon.open(loc)).calls("step", session=2)) == 3


def test_forked_child_is_a_new_session(tmp_path):
    code = textwrap.dedent(
        """
        import os, sys, casmon
        @casmon.intercept(store=sys.argv[1])
        def f(x):
            return x
        f("parent")
        pid = os.fork()
        if pid == 0:
            f("child"); f("child")
            casmon.flush()
            os._exit(0)
        os.waitpid(pid, 0)
        f("parent")
        """
    )
    run_python(code, str(tmp_path / "s"))
    log = casmon.load(casmon.open(tmp_path / "s"))
    by_session = {s: [c.inputs()[0][0] for c in log.calls("f", session=s)] for s in log.sessions}
    assert sorted(by_session.values()) == [["child", "child"], ["parent", "parent"]]


def test_mpi_rank_from_environment(tmp_path):
    code = "import sys, casmon\n@casmon.intercept(store=sys.argv[1])\ndef f(x):\n    return x\nf(1)\n"
    run_python(code, str(tmp_path / "s"), env={"OMPI_COMM_WORLD_RANK": "3"})
    log = casmon.load(casmon.open(tmp_path / "s"))
    assert log.calls("f")[0].rank == 3
    assert len(log.calls("f", rank=3)) == 1


@pytest.mark.skipif(not __import__("shutil").which("mpiexec") or __import__("importlib").util.find_spec("mpi4py") is None,
                    reason="needs mpiexec and mpi4py")
def test_mpi_ranks_write_concurrently(tmp_path):
    code = "import sys, casmon\nfrom mpi4py import MPI\n@casmon.intercept(store=sys.argv[1])\ndef f(x):\n    return x\nf(MPI.COMM_WORLD.Get_rank())\n"
    script = tmp_path / "mpi_job.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run(["mpiexec", "--allow-run-as-root", "-n", "2", sys.executable, str(script), str(tmp_path / "s")], env=env, check=True, timeout=120)
    log = casmon.load(casmon.open(tmp_path / "s"))
    assert sorted(c.rank for c in log.calls("f")) == [0, 1]


def test_custom_handler(store):
    class Blob:
        def __init__(self, data):
            self.data = data
            self.lock = threading.Lock()

    class BlobHandler:
        name = "tests.Blob"

        def encode(self, b):
            return {}, [b.data]

        def decode(self, meta, buffers):
            return Blob(buffers[0].tobytes())

    casmon.register_handler(Blob, BlobHandler())
    try:

        @casmon.intercept(store=store)
        def f(b):
            return len(b.data)

        f(Blob(b"xyz"))
        (b,), _ = casmon.load(store).get("f", 1)
        assert b.data == b"xyz"
    finally:
        casmon.unregister_handler(Blob)


def test_summaries(store):
    @casmon.intercept(store=store)
    def fit(data, lr=0.1, epochs=10):
        return lr

    fit([1, 2], lr=0.5)
    fit([1, 2])
    log = casmon.load(store)
    r = repr(log)
    assert "fit: calls 2 in session 1" in r and "['data', 'lr', 'epochs']" in r and "lr=0.1" in r and "epochs=10" in r
    h = log._repr_html_()
    assert "<table>" in h and "fit(data, lr=0.1, epochs=10)" in h
    assert repr(log.get_args("fit", 1)) == "Args(data=[1, 2], lr=0.5, epochs=10)"
    assert "numpy.ndarray" in repr(casmon.handlers)


def test_cli_calls_show_replay(tmp_path):
    mod = tmp_path / "pipeline.py"
    mod.write_text(textwrap.dedent(
        """
        import sys, casmon, numpy as np
        @casmon.intercept(store=sys.argv[1] if len(sys.argv) > 1 else None)
        def train(data, lr=0.1, epochs=3):
            return float(data.sum() * lr)
        if __name__ == "__main__":
            pass
        """
    ))
    run_python("import sys; sys.path.insert(0, sys.argv[2]); import pipeline, numpy as np\n"
               "for i in range(3): pipeline.train(np.arange(10.0) * i, lr=0.5)\n", str(tmp_path / "s"), str(tmp_path),
               env={"CASMON_STORE": str(tmp_path / "s")})
    from tests.cli.test_cli import cli

    out = cli("calls", "--store", str(tmp_path / "s")).stdout
    assert "pipeline.train(data, lr=0.1, epochs=3)" in out
    out = cli("calls", "train", "--store", str(tmp_path / "s")).stdout
    assert "array(10,) float64" in out and "lr=0.5" in out
    out = cli("show", "train", "3", "--store", str(tmp_path / "s")).stdout
    assert "lr = 0.5" in out and "epochs = 3" in out and "result = 45.0" in out
    r = cli("replay", "train", "2", "--store", str(tmp_path / "s"), cwd=tmp_path, check=False)
    assert r.returncode == 1 and "--import" in r.stderr and "Traceback" not in r.stderr, "replay runs only code the user names"
    r = cli("replay", "train", "2", "--import", str(mod), "--store", str(tmp_path / "s"))
    assert "same result as recorded" in r.stdout
    r = cli("replay", "train", "2", "--import", "pipeline", "--store", str(tmp_path / "s"), cwd=tmp_path)
    assert "same result as recorded" in r.stdout
    bad = cli("show", "train", "9", "--store", str(tmp_path / "s"), check=False)
    assert bad.returncode != 0 and "its calls there are 1-3" in bad.stderr


def test_runnable_example(tmp_path):
    example = ROOT / "docs" / "examples" / "call_log.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, str(example), str(tmp_path / "s")], capture_output=True, text=True, env=env, timeout=300, check=True).stdout
    assert "normalise: calls 5 in session 1" in out
    assert "clip=3.0" in out and "matches" in out


def test_a_none_result_is_a_recorded_result(store):
    @casmon.intercept(store=store)
    def nothing(x):
        return None

    nothing(1)
    assert casmon.load(store).result("nothing", 1) is None


def test_thread_names_survive_reused_thread_ids(store):
    @casmon.intercept(store=store)
    def who(x):
        return x

    for t in range(3):  # one after another: the OS hands the same ident to each
        th = threading.Thread(target=who, args=(t,), name=f"seq-{t}")
        th.start()
        th.join()
    log = casmon.load(store)
    assert sorted((c.inputs()[0][0], c.thread_name) for c in log.calls("who")) == [(0, "seq-0"), (1, "seq-1"), (2, "seq-2")]


def test_rows_encoded_while_calls_run_read_back_whole(tmp_path, monkeypatch):
    """Rows encoded in blocks on the background thread (issue 14) make the same record as rows encoded at
    the flush: every call once, in order, with the right function -- also after a flush that failed and
    put its rows back while a new function was logged (which renumbers the newer rows)."""
    import errno

    from casmon.calllog import writer as calllog

    monkeypatch.setattr(calllog, "ENCODE_BLOCK", 500)
    s = casmon.open(tmp_path / "s", autoflush=None)

    @casmon.intercept(store=s)
    def f(x):
        return x + 1

    @casmon.intercept(store=s)
    def g(x, y=1.5):
        return x * y

    for i in range(3_000):
        f(i)
    rec = calllog.recorder_for(s)
    deadline = time.monotonic() + 60
    while rec.encoded_rows < 2_500 and time.monotonic() < deadline:  # the encoder catches up (no timing asserted)
        time.sleep(0.01)
    assert rec.encoded_rows >= 2_500 and rec.encoded

    def enospc(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(s.backend, "create", enospc)
    with pytest.raises(casmon.StoreError):
        s.flush()  # the record is made (from the encoded blocks) and waits in its table
    monkeypatch.undo()
    monkeypatch.setattr(calllog, "ENCODE_BLOCK", 500)
    for i in range(3_000, 4_000):
        f(i)
    while rec.encoded_rows < 500 and time.monotonic() < deadline:
        time.sleep(0.01)

    def refuse(*a, **k):
        raise KeyboardInterrupt  # a Ctrl-C while the record is made: the rows go back
    monkeypatch.setattr(s, "append", refuse)
    with pytest.raises(KeyboardInterrupt):
        s.flush()
    monkeypatch.undo()
    monkeypatch.setattr(calllog, "ENCODE_BLOCK", 500)
    for i in range(1_200):
        g(i, y=float("nan") if i == 7 else 2.0)
    for i in range(4_000, 4_100):
        f(i)
    s.flush()
    log = casmon.load(s)
    assert [c.n for c in log.calls("f")] == list(range(1, 4_101))
    assert [log.get("f", n)[0] for n in (1, 2_500, 3_001, 4_000, 4_100)] == [[0], [2_499], [3_000], [3_999], [4_099]]
    assert log.result("f", 4_100) == 4_100
    assert [c.n for c in log.calls("g")] == list(range(1, 1_201))
    assert log.get("g", 5) == ([4], {"y": 2.0}) and log.result("g", 5) == 8.0
    assert np.isnan(log.get("g", 8)[1]["y"])
    s.close()


def test_a_flush_waits_for_the_block_being_encoded_instead_of_encoding_it_again(tmp_path, monkeypatch):
    """At exit the encoder is often halfway through a block: the flush waits for it (it holds the GIL
    anyway) and uses it, rather than drop it and encode its rows a second time."""
    import threading

    from casmon.calllog import writer as calllog

    monkeypatch.setattr(calllog, "ENCODE_BLOCK", 500)
    encoded_in = []  # (thread name, rows) of every encoding of rows
    started = threading.Event()
    real_dumps = json.dumps

    def dumps(obj, *a, **k):
        if isinstance(obj, list) and obj and isinstance(obj[0], list):
            encoded_in.append((threading.current_thread().name, len(obj)))
            if threading.current_thread().name == "casmon-calllog-encode":
                started.set()
                time.sleep(0.3)  # a slow block: the flush below comes while it is being encoded
        return real_dumps(obj, *a, **k)

    monkeypatch.setattr(calllog.json, "dumps", dumps)
    s = casmon.open(tmp_path / "s", autoflush=None)

    @casmon.intercept(store=s)
    def f(x):
        return x + 1

    for i in range(700):
        f(i)
    assert started.wait(30)
    s.flush()
    by_flush = [n for who, n in encoded_in if who != "casmon-calllog-encode"]
    assert by_flush == [200], encoded_in  # only the rows after the block; the block itself was used
    log = casmon.load(s)
    assert [c.n for c in log.calls("f")] == list(range(1, 701))
    assert log.get("f", 500)[0] == [499] and log.result("f", 700) == 700
    s.close()


def test_a_warning_for_an_unstorable_argument_names_the_parameter_and_points_at_the_callers_line(store):
    """The warning said "argument 0" and pointed into casmon's own code; it names the parameter (as the cache's
    warning does) and points at the line that made the call."""

    @casmon.intercept(store=store)
    def f(x, cb, *more, key=None, **extra):
        return x

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        f(1, lambda: 0)
        f(2, 3, lambda: 1)
        f(3, 4, key=lambda: 2)
        f(4, 5, other=lambda: 3)
        f(5, lambda: 4, lambda: 5, lambda: 6, key=lambda: 7, other=lambda: 8, more=lambda: 9)  # once a parameter
    got = [x for x in w if issubclass(x.category, CallLogWarning)]
    assert [str(x.message).split(" (")[0] for x in got] == [
        f"casmon: {f.__casmon_intercept__.name}: parameter 'cb'",
        f"casmon: {f.__casmon_intercept__.name}: parameter 'more' item 0",
        f"casmon: {f.__casmon_intercept__.name}: parameter 'key'",
        f"casmon: {f.__casmon_intercept__.name}: parameter 'extra' key 'other'",
    ]
    assert all("function" in str(x.message) and "is not logged" in str(x.message) for x in got)
    assert [(x.filename, x.lineno) for x in got] == [(__file__, line + i) for i in range(4)]


def test_a_warning_for_an_unstorable_result_points_at_the_callers_line(store):
    @casmon.intercept(store=store)
    def make():
        return lambda: 0

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        make()
    (got,) = [x for x in w if issubclass(x.category, CallLogWarning)]
    assert "the result (function)" in str(got.message) and (got.filename, got.lineno) == (__file__, line)


def test_replay_logs_no_call_neither_the_replayed_one_nor_those_it_makes(store):
    """``log.replay(name, n, fn=the intercepted function)`` logged a call in a new session. A replay is a check,
    not a run: nothing inside it is logged (the calls it makes would otherwise become the "latest session" of
    those functions, and ``show helper 1`` would find the replay's call instead of the run's)."""

    @casmon.intercept(store=store)
    def helper(x):
        return x + 1

    @casmon.intercept(store=store)
    def step(x):
        return helper(x) * 2

    for i in range(3):
        step(i)
    casmon.flush()
    log = casmon.load(store)
    before = {c.name: len(log.calls(c.name)) for c in log}
    assert log.replay("step", 2, fn=step).matches  # the wrapper itself, as `fn=pipeline.step` passes it
    assert log.replay("step", 3).matches  # the function registered in this process
    assert log.replay("helper", 1, fn=helper).matches
    step(10)  # logging goes on after a replay, numbered on
    store.flush()
    after = casmon.load(store)
    assert {c.name: len(after.calls(c.name)) for c in after} == {k: v + 1 for k, v in before.items()}
    assert sorted(after.sessions) == [1]
    assert [c.n for c in after.calls("step")] == [1, 2, 3, 4] and [c.n for c in after.calls("helper")] == [1, 2, 3, 4]


def test_show_resolves_the_name_after_replaying_a_scripts_call_with_the_modules_function(tmp_path):
    """`python pipeline.py` logs `__main__.normalise`; replaying it with `fn=pipeline.normalise` (intercepted too)
    logged `pipeline.normalise`, and `casmon show normalise 37` then said "'normalise' is ambiguous"."""
    (tmp_path / "pipeline.py").write_text(textwrap.dedent(
        """
        import casmon, numpy as np

        @casmon.intercept
        def normalise(batch, eps=1e-6):
            return batch / (batch.max() + eps)

        if __name__ == "__main__":
            for i in range(40):
                normalise(np.arange(1.0, 5.0) + i)
        """))
    env = {"CASMON_STORE": str(tmp_path / ".casmon")}
    subprocess.run([sys.executable, "pipeline.py"], cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT), **env),
                   check=True, timeout=120)
    out = run_python("import casmon, pipeline\nlog = casmon.load()\n"
                     "print(log.replay('normalise', 37, fn=pipeline.normalise).matches)\n", cwd=tmp_path, env=env)
    assert out.stdout.strip() == "True"
    from tests.cli.test_cli import cli

    shown = cli("show", "normalise", "37", "--store", str(tmp_path / ".casmon"), check=False)
    assert shown.returncode == 0 and "eps = 1e-06" in shown.stdout, shown.stderr
    log = casmon.load(casmon.open(tmp_path / ".casmon"))
    assert list(log.functions) == ["__main__.normalise"] and sorted(log.sessions) == [1]


def test_an_intercepted_function_shipped_by_value_numbers_on_in_its_session(tmp_path):
    """cloudpickle ships a script's functions by value (Dask, Ray, loky): each unpickled copy had a counter of its
    own, so every call a Dask worker logged was #1, and a function called once could no longer be pickled at all
    (its state held the store's lock). Copies share their session's numbering and its one signature record."""
    cloudpickle = pytest.importorskip("cloudpickle")
    loc = str(tmp_path / "s")

    @casmon.intercept(store=loc)
    def evaluate(i, scale=2):
        return i * scale

    assert evaluate(0) == 0
    blob = cloudpickle.dumps(evaluate)  # after a call: the state a call binds does not travel
    copies = [cloudpickle.loads(blob) for _ in range(3)]
    assert all(c is not evaluate for c in copies)
    assert [c(i) for i, c in enumerate(copies, 1)] == [2, 4, 6]
    assert evaluate(4) == 8
    casmon.flush()
    s = casmon.open(loc)
    log = casmon.load(s)
    assert sorted(log.sessions) == [1]
    assert [(c.n, c.inputs()[0][0]) for c in log.calls("evaluate")] == [(0 + 1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    assert len(list(s.records("callfn"))) == 1
    assert log.signature("evaluate").endswith("evaluate(i, scale=2)")


def test_an_intercepted_function_defined_again_numbers_on_in_its_session(store):
    """A notebook cell run twice defines the function again under the same name: its calls go on from the
    numbers the session gave, never a second #1."""
    defs = []
    for _ in range(2):
        @casmon.intercept(store=store)
        def f(x):
            return x

        defs.append(f)
    defs[0](1)
    defs[1](2)
    defs[1](3)
    log = casmon.load(store)
    assert [(c.n, c.inputs()[0][0]) for c in log.calls("f")] == [(1, 1), (2, 2), (3, 3)]


def test_an_int_too_long_to_write_as_json_is_logged_as_a_value_and_the_other_calls_stay(tmp_path):
    s = tmp_path / "s"

    @casmon.intercept(store=str(s))
    def f(x):
        return x + 1

    @casmon.intercept(store=str(s))
    def g(x):
        return 1

    big = 10**5000
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert g(5) == 1 and f(big) == big + 1 and g(3) == 1
        casmon.flush()
    log = casmon.load(str(s))
    assert sorted((c.name.rsplit(".", 1)[-1], c.n) for c in log) == [("f", 1), ("g", 1), ("g", 2)]
    (call,) = [c for c in log if c.name.endswith(".f")]
    assert call.inputs() == ([big], {}) and call.result() == big + 1


def test_arguments_bind_as_python_bound_them_when_a_keyword_shares_a_positional_only_name(tmp_path):
    @casmon.intercept(store=str(tmp_path / "s"))
    def po(a=1, /, **kw):
        return (a, kw)

    assert po(a=9) == (1, {"a": 9}) and po(7, a=9) == (7, {"a": 9})
    casmon.flush()
    log = casmon.load(str(tmp_path / "s"))
    name = next(iter(log.functions))
    for n, (a, kw) in ((1, (1, {"a": 9})), (2, (7, {"a": 9}))):
        got = vars(log.get_args(name, n))
        assert (got["a"], got["kw"]) == (a, kw)
