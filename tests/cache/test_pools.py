"""Work done in pool workers is kept when the pool ends the usual way (issue 18).

``with multiprocessing.Pool() as p: p.map(cached, ...)`` terminates its workers
(SIGTERM) as soon as the block ends; joblib's multiprocessing backend does the
same, loky and Dask keep their workers for later and kill them when they like.
A worker's background flush (every 5 s) never gets to run. So in a pool worker
casmon flushes what a decorated call wrote before the call returns
(:func:`casmon.store.lifecycle.in_worker_process`), and these tests check, for every pool
kind, that a fresh reader finds all 20 cache entries and all 20 logged calls
right after the pool's normal end -- while the driver process (and loky's
reusable workers) are still alive, so no exit flush helped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest

import casmon
from casmon.store.lifecycle import in_worker_process
from tests.support.pool_workers import POOLS, inputs
from tests.conftest import ROOT

#: The pool kinds where the platform offers them (fork and forkserver are POSIX start methods).
KINDS = [k for k in POOLS if not (("fork" in k) and sys.platform == "win32") and k != "joblib-loky-killed"
         and not k.endswith("-many")]


def _env(store) -> dict:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["CASMON_STORE"] = str(store)
    e.pop("CASMON_FLUSH_EACH_CALL", None)
    return e


class Driver:
    """One process that runs pool kinds on request (``tests/support/pool_workers.py``) and stays alive between them."""

    def __init__(self, store) -> None:
        self.store = str(store)
        code = ("import sys\nfrom tests.support.pool_workers import main\n"
                "for line in sys.stdin:\n    main([line.strip()], wait=False)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], env=_env(store), cwd=str(ROOT), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def run(self, kind: str) -> dict:
        """Run ``kind``'s pool to its normal end; returns the driver's report once the pool has ended."""
        self.proc.stdin.write(kind + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read() if self.proc.poll() is not None else "(still running)"
            raise AssertionError(f"the driver stopped while running {kind}: {err[-3000:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    d = Driver(tmp_path_factory.mktemp("pools") / "store")
    yield d
    d.close()


def found(store_location: str, xs: list[int]) -> tuple[set, set]:
    """Inputs of ``xs`` that a fresh reader finds cached, and those it finds logged."""
    s = casmon.open(store_location, trust=False)
    try:
        want = {str(x) for x in xs}
        cached = {r.get("label") for _k, r in s.records("cache") if r.get("fn") == "tests.support.pool_workers.square"}
        log = casmon.load(s)
        logged = {c.args_cells[0] for c in log.calls("tests.support.pool_workers.log_value")} if log.functions else set()
        return cached & want, logged & set(xs)
    finally:
        s.close()


@pytest.mark.parametrize("kind", KINDS)
def test_work_done_in_pool_workers_survives_the_pools_normal_end(driver, kind):
    """20 cached calls and 20 logged calls in the workers: all 20 of each are in the store once the pool ended."""
    report = driver.run(kind)
    assert report == {"kind": kind, "ok": True}
    xs = inputs(kind)
    cached, logged = found(driver.store, xs)
    assert len(cached) == 20, f"{kind}: {len(cached)} of 20 cache entries found"
    assert len(logged) == 20, f"{kind}: {len(logged)} of 20 logged calls found"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pool-fork-many", "pool-spawn-many"])
def test_many_chunked_tasks_with_replaced_workers_all_survive(driver, kind):
    """200 tasks in chunks of 7, unordered, each worker replaced after 3 tasks, the pool ended by ``with``."""
    assert driver.run(kind) == {"kind": kind, "ok": True}
    cached, logged = found(driver.store, inputs(kind))
    assert (len(cached), len(logged)) == (200, 200)


def test_loky_workers_killed_right_after_the_call_lose_nothing(driver):
    """loky kills its workers with SIGKILL when it shuts down by force: what they computed is already stored."""
    report = driver.run("joblib-loky-killed")
    assert report == {"kind": "joblib-loky-killed", "ok": True}
    cached, logged = found(driver.store, inputs("joblib-loky-killed"))
    assert (len(cached), len(logged)) == (20, 20)


# -- when casmon flushes after every call, and when it does not ----------------------------------------------

def _flag(code: str, env_extra: dict | None = None, script=None) -> list[str]:
    env = _env("unused")
    env.update(env_extra or {})
    cmd = [sys.executable, str(script)] if script else [sys.executable, "-c", code]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_only_workers_flush_after_every_call(tmp_path):
    """The main process keeps batching (its per-call cost is unchanged); multiprocessing's children flush each call.

    The fork child uses the store its parent opened; the spawned child's store is opened while
    the child imports the parent's script, before multiprocessing tells it who its parent is.
    A plain ``os.fork`` (a server forking its workers, a zygote) is not a pool's worker.
    """
    script = tmp_path / "flags.py"
    script.write_text(f"""
import multiprocessing as mp, os, casmon
S = casmon.open({str(tmp_path / 's')!r})  # in a spawned child: opened while the child imports this script

def child(q):
    q.put((S._flush_each_call, casmon.open({str(tmp_path / 't')!r})._flush_each_call))

if __name__ == "__main__":
    print(S._flush_each_call, casmon.open({str(tmp_path / 's')!r}, durable=True)._flush_each_call)
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start(); print(*q.get(timeout=120)); p.join()
    pid = os.fork()
    if pid == 0:
        os.write(1, (str(S._flush_each_call) + " " + str(casmon.open({str(tmp_path / 'u')!r})._flush_each_call)).encode()
                 + b"\\n")  # a plain fork: not a pool's worker
        os._exit(0)
    os.waitpid(pid, 0)
""")
    assert _flag("", script=script) == ["False", "True"] + ["True"] * 4 + ["False", "False"]
    forced = "import casmon; print(casmon.open({!r})._flush_each_call)".format(str(tmp_path / "u"))
    assert _flag(forced, {"CASMON_FLUSH_EACH_CALL": "1"}) == ["True"]
    assert not in_worker_process()  # the test process itself


def test_a_store_opened_before_multiprocessing_is_imported_still_knows_its_fork_workers(tmp_path):
    """Opening a store does not import multiprocessing (milliseconds a cache hit need not pay); a fork pool made
    after it is imported still tells the store, in each worker, that it is a worker."""
    script = tmp_path / "late.py"
    script.write_text(f"""
import sys, casmon
S = casmon.open({str(tmp_path / 's')!r})
assert "multiprocessing" not in sys.modules
import multiprocessing as mp

def child(_):
    return S._flush_each_call

if __name__ == "__main__":
    with mp.get_context("fork").Pool(2) as pool:
        print(*pool.map(child, range(4)))
    print(S._flush_each_call)
""")
    assert _flag("", script=script) == ["True"] * 4 + ["False"]


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_FSIZE is POSIX")
def test_a_worker_that_cannot_flush_returns_its_results_and_warns_once(tmp_path):
    """A storage error in a worker's per-call flush is one warning; what waits is written by a later flush.

    The error is real: the file size limit (RLIMIT_FSIZE) makes every file write fail with EFBIG.
    """
    loc = tmp_path / "s"
    code = f"""
import resource, signal, warnings, casmon
s = casmon.open({str(loc)!r})
assert s._flush_each_call
def g(x):
    return x * 2
g = casmon.cache(store=s)(g)
g(0)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (8, hard))
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    print(g(1), g(2))
print(sum("could not flush" in str(x.message) for x in w), len(w))
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
s.flush()
"""
    out = _flag(code, {"CASMON_FLUSH_EACH_CALL": "1"})
    assert out == ["2", "4", "1", "1"]
    s = casmon.open(str(loc))
    assert sorted(s.get(casmon.Digest(r["result"])) for _k, r in s.records("cache")) == [0, 2, 4]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert s.verify().ok


# -- concurrent misses --------------------------------------------------------------------------------------

def test_concurrent_misses_count_once_and_gc_drops_the_duplicates(tmp_path):
    """Four threads miss the same ten keys at once, not waiting for each other (wait=False): 40 records, 10 entries;
    `casmon cache` says 30 duplicates, `casmon gc` drops them (their results too) and every key still hits, with the
    newest result."""
    import threading

    from click.testing import CliRunner

    from casmon.cli.app import main as cli_main

    loc = str(tmp_path / "s")
    s = casmon.open(loc)
    gate = threading.Barrier(4, timeout=300)  # all four threads have missed a key before any stores it

    @casmon.cache(store=s, ignore=["gate"], wait=False)
    def noisy(x, gate):
        gate.wait()
        return (x, os.urandom(8))  # every computation differs: duplicates hold results of their own

    threads = [threading.Thread(target=lambda: [noisy(x, gate) for x in range(10)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.flush()
    assert sum(1 for _ in s.records("cache")) == 40
    info = noisy.cache_info()
    assert (info.misses, info.entries) == (40, 10)
    assert info.stored_bytes == sum(int(r["size"]) for _k, r in noisy.__casmon_cache__.entries())

    cli = CliRunner()
    shown = cli.invoke(cli_main, ["cache", "--store", loc])
    assert shown.exit_code == 0, shown.output
    assert "30 duplicate entries" in " ".join(shown.output.split())
    preview = json.loads(cli.invoke(cli_main, ["gc", "--now", "--dry-run", "--json", "--store", loc]).output)
    assert preview["duplicate_entries"] == 30 and preview["unreachable"] >= 30
    done = json.loads(cli.invoke(cli_main, ["gc", "--now", "--json", "--store", loc]).output)
    assert done["duplicate_entries"] == 30
    assert done["deleted_objects"] == preview["deleted_objects"] >= 30, "the preview matched the real run"

    fresh = casmon.open(loc)
    newest = dict(fresh.records("cache"))
    assert len(newest) == 10 and fresh.verify().ok, "one record a key is left"
    assert "duplicate entr" not in cli.invoke(cli_main, ["cache", "--store", loc]).output
    got = {x: noisy(x, None) for x in range(10)}
    assert noisy.cache_info().misses == 40, "every key still hits"
    stored = {fresh.get(casmon.Digest(r["result"]))[0]: fresh.get(casmon.Digest(r["result"])) for r in newest.values()}
    assert got == stored


def test_a_process_whose_remembered_result_gc_dropped_as_a_duplicate_hits_the_newest(tmp_path):
    """Process A computes ten keys, B computes them too before A flushes: A's entries are the older duplicates.
    gc drops them and deletes their results; A's next calls find B's results, without a 'damaged' warning."""
    from tests.support.pool_workers import noisy

    loc = str(tmp_path / "s")
    s = casmon.open(loc, autoflush=None)
    f = casmon.cache(store=s)(noisy)
    mine = [f(x) for x in range(10)]
    code = "import casmon\nfrom tests.support.pool_workers import noisy\nf = casmon.cache(store={!r})(noisy)\n[f(x) for x in range(10)]"
    _flag(code.format(loc))
    s.flush()
    assert sum(1 for _ in s.records("cache")) == 20
    r = subprocess.run([sys.executable, "-m", "casmon.cli", "gc", "--now", "--json", "--store", loc], env=_env(loc),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["duplicate_entries"] == 10
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = [f(x) for x in range(10)]
    theirs = {x[0]: x for x in (casmon.open(loc).get(casmon.Digest(r["result"])) for _k, r in s.records("cache"))}
    assert again == [theirs[x] for x in range(10)] and again != mine
    assert f.cache_info().misses == 10


# -- the exit flush -----------------------------------------------------------------------------------------

def test_a_process_whose_writes_wait_for_the_exit_flush_keeps_them(tmp_path):
    """A process that reads nothing through casmon's I/O threads and writes only at exit keeps its writes.

    Python 3.12 refuses to start a thread while the interpreter exits: casmon's I/O threads must exist
    before then (on 3.12 a child's ten entries were lost without them).
    """
    loc = str(tmp_path / "s")
    casmon.open(loc).close()  # an existing store: opening it writes nothing
    code = ("import casmon\nfrom tests.support.pool_workers import noisy\n"
            f"f = casmon.cache(store={loc!r})(noisy)\nprint(len([f(x) for x in range(3)]))")
    r = subprocess.run([sys.executable, "-W", "error::RuntimeWarning", "-c", code], env=_env(loc),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.split() == ["3"], r.stderr
    assert "could not flush" not in r.stderr, r.stderr
    assert sum(1 for _ in casmon.open(loc).records("cache")) == 3
