"""Cached functions travel to worker processes (issue 12): pickling, spawn naming, joblib, multiprocessing, Dask.

The module-level functions here are what the workers import.
"""

import json
import multiprocessing as mp
import os
import pickle
import re
import subprocess
import sys
import textwrap

import pytest

import casmon
from casmon.caching import cache_entries
from tests.conftest import ROOT


@casmon.cache
def square(x):
    return x * x


def plain_cube(x):
    return x**3


def _env(store):
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["CASMON_STORE"] = str(store)
    return e


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pool_map_of_a_wrapper_made_on_the_spot(tmp_path, method):
    """``Pool.map(casmon.cache(f), ...)``: the wrapper pickles as "cache f with these options"."""
    loc = str(tmp_path / "s")
    code = textwrap.dedent(
        f"""
        import multiprocessing as mp, casmon, json
        from tests.cache.test_cache_workers import plain_cube
        if __name__ == "__main__":
            g = casmon.cache(store={loc!r})(plain_cube)
            with mp.get_context({method!r}).Pool(2) as pool:
                out = pool.map(g, range(6))
                pool.close(); pool.join()
            print(json.dumps(out))
        """
    )
    r = subprocess.run([sys.executable, "-c", code], env=_env(loc), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [x**3 for x in range(6)]
    s = casmon.open(loc)
    assert cache_entries(s)["tests.cache.test_cache_workers.plain_cube"]["entries"] == 6


ENGINES_SCRIPT = '''
import json, os, sys
import casmon

LOG = os.environ["CASMON_TEST_LOG"]
PARAMS = {"scale": 3}


@casmon.cache
def features(i):
    with open(LOG, "a") as fh:            # one line per computation, in whichever process
        fh.write(f"{os.getpid()} {i}\\n")
    return i * PARAMS["scale"]


@casmon.intercept
def evaluate(i, f):
    return f + 1


def task(i):
    return evaluate(i, features(i))


def run(engine, n):
    if engine == "loky":
        from joblib import Parallel, delayed
        return Parallel(n_jobs=2, backend="loky")(delayed(task)(i) for i in range(n))
    if engine in ("fork", "spawn"):
        import multiprocessing as mp
        with mp.get_context(engine).Pool(2) as pool:
            out = pool.map(task, range(n))
            pool.close()
            pool.join()
        return out
    if engine == "dask":
        from distributed import Client, LocalCluster
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \\
                Client(cluster) as client:
            out = client.gather(client.map(task, range(n)))
            client.run(casmon.flush)
        return out
    return [task(i) for i in range(n)]


if __name__ == "__main__":
    engine, n = sys.argv[1], int(sys.argv[2])
    out = run(engine, n)
    casmon.flush()
    print(json.dumps(out))
'''


def _run_engine(script, engine, n, env):
    r = subprocess.run([sys.executable, str(script), engine, str(n)], env=env, capture_output=True, text=True,
                       timeout=600, cwd=script.parent)
    assert r.returncode == 0, f"{engine} failed:\n{r.stderr[-4000:]}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def _computed(log):
    return [int(line.split()[1]) for line in log.read_text().splitlines()] if log.exists() else []


def test_main_script_functions_share_entries_across_engines(tmp_path):
    """A ``__main__`` cached function computes each value once, whichever engine runs it: joblib (loky),
    multiprocessing (fork, spawn) and Dask share one set of entries under one name."""
    pytest.importorskip("joblib")
    pytest.importorskip("distributed")
    script = tmp_path / "job.py"
    script.write_text(ENGINES_SCRIPT)
    loc = tmp_path / "s"
    log = tmp_path / "computed.log"
    env = _env(loc)
    env["CASMON_TEST_LOG"] = str(log)
    n = 12
    engines = ["loky", "fork", "spawn", "dask"]
    first = _run_engine(script, engines[0], n, env)
    assert first == [3 * i + 1 for i in range(n)]
    assert sorted(_computed(log)) == list(range(n))
    # The other engines only hit what loky stored: all three at once (each logs its calls, beside the others).
    later = {e: subprocess.Popen([sys.executable, str(script), e, str(n)], env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=script.parent) for e in engines[1:]}
    try:
        done = {e: p.communicate(timeout=600) for e, p in later.items()}
    finally:
        for p in later.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for engine, (out, err) in done.items():
        assert later[engine].returncode == 0, f"{engine} failed:\n{err[-4000:]}"
        assert json.loads(out.strip().splitlines()[-1]) == first, engine
    assert sorted(_computed(log)) == list(range(n)), f"one of {engines[1:]} recomputed what was cached"
    s = casmon.open(loc)
    entries = cache_entries(s)
    assert list(entries) == ["__main__.features"], "one name wherever the function ran"
    assert entries["__main__.features"]["entries"] == n
    logged = {name for _k, r in s.records("calls") for name in r.get("fns", [])}
    assert logged == {"__main__.evaluate"}, "the call log names it __main__.evaluate in spawn workers too"
    assert len(casmon.load(s).calls("evaluate")) == n * len(engines)
    assert s.verify().ok


def _readme_dask_example() -> str:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    (block,) = [b for b in blocks if "LocalCluster" in b]
    return block


def test_readme_dask_example_runs_as_a_script(tmp_path):
    pytest.importorskip("distributed")
    script = tmp_path / "readme_dask.py"
    script.write_text(_readme_dask_example())
    loc = tmp_path / "s"
    r = subprocess.run([sys.executable, str(script)], env=_env(loc), capture_output=True, text=True, timeout=600,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    s = casmon.open(loc)
    (name,) = cache_entries(s)
    assert name == "__main__.features" and cache_entries(s)[name]["entries"] >= 1
    assert s.verify().ok


def test_wrappers_pickle_by_reference_and_by_value():
    assert pickle.loads(pickle.dumps(square)) is square
    g = casmon.cache(plain_cube)
    h = pickle.loads(pickle.dumps(g))
    assert h.__wrapped__ is plain_cube and h.__casmon_cache__.name == "tests.cache.test_cache_workers.plain_cube"
    cloudpickle = pytest.importorskip("cloudpickle")
    assert cloudpickle.loads(cloudpickle.dumps(square)) is square
    assert cloudpickle.loads(cloudpickle.dumps(g)).__wrapped__ is plain_cube
