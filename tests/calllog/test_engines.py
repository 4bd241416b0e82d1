"""The call log under engines that run calls in other processes: Dask, Ray tasks and actors, job arrays.

Each worker process is a session of its own, numbered from 1 per function, and the session says what
ran it (``engine``, ``array``). The module-level functions here are what Ray's workers import.
"""

import os
import re
import subprocess
import sys
import textwrap

import pytest

import casmon
from casmon.calllog import session_where
from tests.conftest import ROOT


def _readme_dask_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if "LocalCluster" in b]
    return block


def _assert_numbered_per_session(log: casmon.CallLog, name: str) -> dict[int, list]:
    """Every session's calls of ``name`` are 1..k, each found by its number; returns them by session."""
    by_session = {s: log.calls(name, session=s) for s in log.functions[log.resolve(name)].sessions}
    for s, calls in by_session.items():
        assert [c.n for c in calls] == list(range(1, len(calls) + 1)), f"session {s}"
        for c in calls:
            assert log.call(name, c.n, session=s) is c
    return by_session


def test_the_readme_dask_example_numbers_each_workers_calls_so_show_finds_every_one(tmp_path):
    """Each task unpickled the script's intercepted function afresh, with a counter of its own: every row of a
    worker's session was #1 and ``casmon show evaluate 50`` said "its calls there are 1". (A real cluster of
    two worker processes: about 4 s.)"""
    pytest.importorskip("distributed")
    script = tmp_path / "readme_dask.py"
    script.write_text(_readme_dask_example())
    loc = tmp_path / ".casmon"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_STORE=str(loc))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    log = casmon.load(casmon.open(loc))
    by_session = _assert_numbered_per_session(log, "evaluate")
    assert sorted(c.inputs()[0][0] for calls in by_session.values() for c in calls) == list(range(100))
    assert {log.sessions[s]["engine"]["name"] for s in by_session} == {"dask"}
    assert all(session_where(log.sessions[s]).startswith("dask worker ") for s in by_session)
    assert len(list(log.store.records("callfn"))) == len(by_session)  # one signature a session, not one a task
    from tests.cli.test_cli import cli

    latest = max(by_session)
    n = len(by_session[latest])
    shown = cli("show", "evaluate", str(n), "--store", str(loc), check=False)
    assert shown.returncode == 0, shown.stderr
    last = by_session[latest][-1]
    assert f"__main__.evaluate call {n} of session {latest}" in shown.stdout and f"i = {last.inputs()[0][0]}\n" in shown.stdout


JOB_SCRIPT = "import casmon\n@casmon.intercept\ndef f(x):\n    return x\nf(1)\nf(2)\n"
ARRAY_VARS = ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_ID", "PBS_ARRAYID", "PBS_JOBID", "PBS_ARRAY_INDEX",
              "PBS_ARRAY_ID", "LSB_JOBINDEX", "LSB_JOBID", "SGE_TASK_ID", "JOB_ID")


@pytest.mark.parametrize("env, expected, where", [
    ({"SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "7", "SLURM_JOB_ID": "4250"},
     {"scheduler": "slurm", "job": "4242", "task": 7}, "slurm array 4242 task 7"),
    ({"PBS_ARRAYID": "3", "PBS_JOBID": "99[3].head"}, {"scheduler": "pbs", "job": "99[3].head", "task": 3},
     "pbs array 99[3].head task 3"),
    ({"PBS_ARRAY_INDEX": "5", "PBS_ARRAY_ID": "120[].pbs"}, {"scheduler": "pbs", "job": "120[].pbs", "task": 5},
     "pbs array 120[].pbs task 5"),
    ({"LSB_JOBINDEX": "2", "LSB_JOBID": "777"}, {"scheduler": "lsf", "job": "777", "task": 2}, "lsf array 777 task 2"),
    ({"SGE_TASK_ID": "11", "JOB_ID": "31"}, {"scheduler": "sge", "job": "31", "task": 11}, "sge array 31 task 11"),
    ({"LSB_JOBINDEX": "0", "LSB_JOBID": "778", "SGE_TASK_ID": "undefined", "SLURM_JOB_ID": "1"}, None, ""),
], ids=["slurm", "pbs-torque", "pbs-pro", "lsf", "sge", "not-an-array"])
def test_a_job_array_task_is_recorded_with_its_session(tmp_path, env, expected, where):
    clean = {k: v for k, v in os.environ.items() if k not in ARRAY_VARS}
    loc = tmp_path / "s"
    p = subprocess.run([sys.executable, "-c", JOB_SCRIPT], capture_output=True, text=True, timeout=120,
                       env=dict(clean, PYTHONPATH=str(ROOT), CASMON_STORE=str(loc), **env))
    assert p.returncode == 0, p.stderr
    log = casmon.load(casmon.open(loc))
    (session,) = log.sessions.values()
    assert session.get("array") == expected
    assert session_where(session) == where
    if where:
        assert where in " ".join(repr(log.sessions).split()), "the sessions view says what ran each"
        assert log.sessions.to_pandas()["ran_in"].tolist() == [where]
    assert [c.n for c in log.calls("f")] == [1, 2]
    ref = log.store.get_ref(f"calllog/sessions/{session['n']:06d}")
    assert ref is not None and ref.data.get("array") == expected  # the claim says it too: a session listing reads refs alone


def test_a_multiprocessing_worker_says_so_in_its_session(tmp_path):
    code = textwrap.dedent(
        """
        import multiprocessing as mp, sys, casmon

        @casmon.intercept(store=sys.argv[1])
        def f(x):
            return x

        if __name__ == "__main__":
            with mp.get_context("spawn").Pool(1) as pool:
                pool.map(f, range(3))
                pool.close(); pool.join()
        """)
    script = tmp_path / "mp_job.py"
    script.write_text(code)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    log = casmon.load(casmon.open(tmp_path / "s"))
    (s,) = log.functions[log.resolve("f")].sessions
    assert log.sessions[s]["engine"]["name"] == "multiprocessing"
    assert session_where(log.sessions[s]).startswith("multiprocessing SpawnPoolWorker-")
    assert [c.n for c in log.calls("f")] == [1, 2, 3]


# -- Ray: tasks and actors on a local instance of 2 CPUs, bound to the loopback address -----------------------------
@casmon.cache
def features(i):
    return [i, i * i]


@casmon.intercept
def evaluate(i, f):
    return sum(f) + i


def ray_task(i):
    return evaluate(i, features(i))


class Scorer:
    """A Ray actor's class: its method is intercepted, and calls a cached function."""

    def __init__(self, scale):
        self.scale = scale

    @casmon.intercept
    def score(self, i):
        return features(i)[1] * self.scale

    def actor_id(self):
        import ray

        return ray.get_runtime_context().get_actor_id()


@pytest.fixture(scope="module")
def ray_store(tmp_path_factory):
    """A local Ray instance (2 CPUs, no dashboard, every address on 127.0.0.1) whose workers use one store."""
    loc = tmp_path_factory.mktemp("ray") / "s"
    env = {"CASMON_STORE": str(loc), "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           # Ray binds to the machine's address unless told that this is not a cluster; no usage reports.
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # the raylet, and so every worker, inherits them
    try:
        ray = pytest.importorskip("ray")
        if ray._private.ray_constants.ENABLE_RAY_CLUSTER:
            pytest.skip("ray was imported before this module could keep it on the loopback address")
        ctx = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
        try:
            assert ctx.address_info["node_ip_address"] == "127.0.0.1"
            yield ray, loc
        finally:
            ray.shutdown()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _ray_sessions(log, name):
    by_session = _assert_numbered_per_session(log, name)
    for s in by_session:
        engine = log.sessions[s]["engine"]
        assert engine["name"] == "ray" and re.fullmatch(r"[0-9a-f]{16,}", engine["worker"]), engine
    return by_session


def test_ray_tasks_log_every_call_numbered_in_each_workers_session(ray_store):
    ray, loc = ray_store
    task = ray.remote(ray_task)
    out = ray.get([task.remote(i) for i in range(20)])
    assert out == [i + i + i * i for i in range(20)]
    log = casmon.load(casmon.open(loc))
    by_session = _ray_sessions(log, "tests.calllog.test_engines.evaluate")
    assert sorted(c.inputs()[0][0] for calls in by_session.values() for c in calls) == list(range(20))
    assert all(log.sessions[s]["engine"].get("actor") is None for s in by_session)
    assert all(session_where(log.sessions[s]).startswith("ray worker ") for s in by_session)
    from casmon.caching import cache_entries

    assert cache_entries(log.store)["tests.calllog.test_engines.features"]["entries"] >= 20  # written before return


def test_a_ray_actor_logs_its_calls_in_a_session_that_names_the_actor(ray_store):
    ray, loc = ray_store
    actor = ray.remote(Scorer).remote(3)
    assert ray.get([actor.score.remote(i) for i in range(6)]) == [i * i * 3 for i in range(6)]
    actor_id = ray.get(actor.actor_id.remote())
    log = casmon.load(casmon.open(loc))
    by_session = _ray_sessions(log, "Scorer.score")
    (s,) = by_session
    assert log.sessions[s]["engine"]["actor"] == actor_id
    assert f"actor {actor_id[:12]}" in session_where(log.sessions[s])
    assert [c.get_args().i for c in by_session[s]] == list(range(6))


def test_a_function_shipped_to_ray_by_value_numbers_on_in_each_workers_session(ray_store):
    """A function Ray's workers cannot import (a script's, a notebook's) travels by value, unpickled per task."""
    ray, loc = ray_store

    @casmon.intercept(store=str(loc))
    def local_eval(i):
        return -i

    local_eval(-1)  # called here first: the copy the workers get still pickles

    @ray.remote
    def run(i):
        return local_eval(i)

    assert ray.get([run.remote(i) for i in range(12)]) == [-i for i in range(12)]
    log = casmon.load(casmon.open(loc))
    name = log.resolve("local_eval")
    by_session = _assert_numbered_per_session(log, name)
    ray_sessions = [s for s in by_session if log.sessions[s].get("engine", {}).get("name") == "ray"]
    assert sorted(c.inputs()[0][0] for s in ray_sessions for c in by_session[s]) == list(range(12))


RAY_SCRIPT = '''
import json, sys
import casmon
import ray


@casmon.intercept
def ev(i):
    return i * 10


@casmon.cache
def sq(i):
    return i * i


if __name__ == "__main__":
    ev(-1)  # called in the driver first: the copy that travels still pickles
    ray.init(address=sys.argv[1], log_to_driver=False)
    out = {}
    for name, fn in (("intercept", lambda i: ev(i)), ("cache", lambda i: sq(i))):
        task = ray.remote(fn)
        try:
            out[name] = ray.get([task.remote(i) for i in range(8)])
        except Exception as e:  # reported, so each half is judged on its own
            out[name] = f"{type(e).__name__}: {str(e)[-400:]}"
    ray.shutdown()
    print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def ray_script(ray_store, tmp_path_factory):
    """A user's script run as ``python script.py``, its functions shipped to Ray by value (Ray's own cloudpickle);
    it joins the module's Ray instance (about 2 s) rather than start one."""
    import json

    ray, loc = ray_store
    script = tmp_path_factory.mktemp("rayscript") / "sweep.py"
    script.write_text(RAY_SCRIPT)
    address = ray.get_runtime_context().gcs_address
    p = subprocess.run([sys.executable, str(script), address], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), CASMON_STORE=str(loc)), cwd=script.parent)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), loc


def test_a_scripts_intercepted_function_numbers_its_calls_in_each_ray_workers_session(ray_script):
    out, loc = ray_script
    assert out["intercept"] == [i * 10 for i in range(8)]
    log = casmon.load(casmon.open(loc))
    by_session = _assert_numbered_per_session(log, "__main__.ev")
    workers = [s for s in by_session if (log.sessions[s].get("engine") or {}).get("name") == "ray"]
    assert sorted(c.inputs()[0][0] for s in workers for c in by_session[s]) == list(range(8))
    assert [c.inputs()[0][0] for s in by_session if s not in workers for c in by_session[s]] == [-1]  # the driver


def test_a_scripts_cached_function_runs_in_ray_tasks(ray_script):
    out, loc = ray_script
    assert out["cache"] == [i * i for i in range(8)], out["cache"]
    from casmon.caching import cache_entries

    assert cache_entries(casmon.open(loc))["__main__.sq"]["entries"] == 8


def test_a_joblib_loky_worker_says_joblib_in_its_session(tmp_path):
    code = textwrap.dedent(
        """
        import sys, casmon
        from joblib import Parallel, delayed

        @casmon.intercept(store=sys.argv[1])
        def f(x):
            return x

        if __name__ == "__main__":
            Parallel(n_jobs=1, backend="loky")(delayed(f)(i) for i in range(2))
            Parallel(n_jobs=2, backend="loky")(delayed(f)(i) for i in range(2, 4))
        """)
    script = tmp_path / "loky_job.py"
    script.write_text(code)
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "s")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    log = casmon.load(casmon.open(tmp_path / "s"))
    workers = [s for s in log.sessions.values() if (s.get("engine") or {}).get("name") == "joblib-loky"]
    assert workers, [s.get("engine") for s in log.sessions.values()]
    assert all(session_where(s).startswith("joblib (loky) LokyProcess-") for s in workers)
