"""Shared stores: S3 on a real S3 API (moto's server on 127.0.0.1), and many writers at once."""

import datetime
import multiprocessing
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import casmon
from casmon.caching import cache_entries
from tests.conftest import ROOT, run_parallel, run_python


def s3_url(s3_env, name="store"):
    return f"s3://{s3_env[1]}/{name}"


def test_s3_store_round_trip_across_processes(s3_env):
    env, _bucket = s3_env
    url = s3_url(s3_env)
    code = textwrap.dedent(
        """
        import sys, casmon, numpy as np
        calls = []
        @casmon.cache(store=sys.argv[1])
        def prep(n):
            calls.append(n)
            return np.arange(n, dtype=float)
        @casmon.intercept(store=sys.argv[1])
        def step(x):
            return x + 1
        assert prep(300_000)[-1] == 299_999
        step(1)
        print(len(calls))
        """
    )
    assert run_python(code, url, env=env).stdout.strip() == "1"
    assert run_python(code, url, env=env).stdout.strip() == "0"  # a hit from the other process's entry
    s = casmon.open(url)
    log = casmon.load(s)
    assert sorted(log.sessions) == [1, 2] and len(log.calls("step")) == 2
    assert s.verify().ok


def test_create_if_absent_is_race_free_on_s3(s3_env):
    env, _ = s3_env
    url = s3_url(s3_env, "race")
    casmon.open(url).close()
    code = textwrap.dedent(
        """
        import sys, casmon
        s = casmon.open(sys.argv[1])
        won = [i for i in range(40) if s.create_ref(f"claims/{i}", None, {"who": sys.argv[2]})]
        print(" ".join(map(str, won)))
        """
    )
    outs = run_parallel([["-c", code, url, str(w)] for w in range(6)], env=env)
    wins = [int(x) for out in outs for x in out.split()]
    assert sorted(wins) == list(range(40)), "every ref has exactly one winner"


def test_run_record_on_s3(s3_env, tmp_path, monkeypatch):
    from tests.runs.test_runs import git

    repo = tmp_path / "proj"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "cfg.yaml").write_text("a: 1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "x")
    (repo / "cfg.yaml").write_text("a: 2\n")
    monkeypatch.chdir(repo)
    url = s3_url(s3_env, "runs")
    with casmon.record(comment="s3", track=[r"\.yaml$"], store=url) as run:
        print("on s3")
    r = casmon.load_run(run.name, casmon.open(url))
    assert r.output() == "on s3\n" and r.file("cfg.yaml") == b"a: 2\n" and b"a: 2" in r.patch()
    out = casmon.restore(r, tmp_path / "restored")
    assert (out / "cfg.yaml").read_text() == "a: 2\n"


def test_bad_s3_locations_fail_at_open_and_create_nothing(s3_env, monkeypatch):
    from casmon.store.backend import objstore

    with pytest.raises(casmon.StoreError, match="bucket does not exist"):
        casmon.open("s3://no-such-bucket-here/x")
    monkeypatch.setattr(objstore, "OPEN_SECONDS", 1.0)  # opening retries through a 10 s outage: not here
    with pytest.raises(casmon.StoreError, match="cannot reach the endpoint"):
        casmon.open(s3_url(s3_env, "unreachable"), storage_options={
            "endpoint": "http://127.0.0.1:9", "retry_config": {"max_retries": 1, "retry_timeout": datetime.timedelta(seconds=2)}})
    import boto3

    env, bucket = s3_env
    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0, "no partial store"


def test_opening_a_store_on_s3_is_one_read_of_its_marker(s3_proxy):
    """Opening reaches the bucket by reading casmon.json, which it needs anyway: an existing store is one GET
    (not a LIST to reach it, a HEAD and a GET). An empty prefix opened with create=False is refused and left
    empty."""
    proxy, bucket = s3_proxy
    url = f"s3://{bucket}/opened"
    with casmon.open(url) as s:
        s.put("x")
    seen = len(proxy.log)
    s = casmon.open(url, create=False)
    opened = [(x.method, x.path, x.query) for x in proxy.log[seen:]]
    assert opened == [("GET", f"/{bucket}/opened/casmon.json", "")], opened
    assert s.format["format"] == 2 and s.get(s.put("x")) == "x"
    s.close()
    with pytest.raises(casmon.StoreError, match="it is empty"):
        casmon.open(f"s3://{bucket}/nothing-here", create=False)
    listed = [x for x in proxy.log if x.method == "PUT" and "nothing-here" in x.path]
    assert listed == [], "create=False wrote to an empty prefix"
    s = casmon.open(url, create=False)
    b = s.backend
    b.reach("casmon.json")
    n = b.requests
    # What reach() read serves the one read that follows it, not later ones: it is no cache.
    assert b.get("no/such/key") is None and b.get("casmon.json") is not None and b.requests == n + 2
    s.close()


def test_an_s3_store_is_used_without_zarr_and_zarr_reads_the_same_keys(s3_env, tmp_path):
    """S3 is reached through obstore directly: a process that opens, hits, misses and flushes never imports zarr
    (a fifth of a second for every worker), and zarr's ObjectStore on the same bucket sees the same keys."""
    env, _bucket = s3_env
    url = s3_url(s3_env, "nozarr")
    (tmp_path / "usermod.py").write_text(textwrap.dedent(f"""
        import casmon

        URL = {url!r}

        @casmon.cache(store=URL)
        def double(x):
            return [x, x]
    """))
    for _ in range(2):  # misses and a flush, then hits in a fresh process
        r = run_python(textwrap.dedent("""
            import sys
            import numpy as np
            import usermod, casmon
            assert [usermod.double(i) for i in range(5)] == [[i, i] for i in range(5)]
            s = casmon.open(usermod.URL, create=False)
            d = s.put(np.arange(100_000.0))
            assert s.get(d)[-1] == 99_999.0
            s.flush()
            print("zarr" in sys.modules, usermod.double.cache_info().hits)
        """), env=env, cwd=tmp_path)
    assert r.stdout.split() == ["False", "5"], r.stdout
    s = casmon.open(url, create=False)
    import asyncio

    async def zarr_keys():
        return sorted([k async for k in s.backend.zstore.list()])

    assert asyncio.run(zarr_keys()) == sorted(s.backend.list("")) and "casmon.json" in s.backend.list("")
    s.close()


def test_a_first_cache_hit_on_s3_lists_its_three_tables_at_once(s3_proxy, tmp_path):
    """A fresh process's first hit reads three tables (code versions, clears, entries): on S3 their listings
    go out together, so it waits for one table's round trips, not three's. The proxy holds every listing
    0.5 s: a table lists level-0 files, then generations, so tables listed one after another would send
    their first listings a second or more apart."""
    import re

    from tests.support.s3proxy import Rule

    proxy, bucket = s3_proxy
    url = f"s3://{bucket}/prefetch"
    (tmp_path / "usermod.py").write_text(textwrap.dedent(f"""
        import casmon

        @casmon.cache(store={url!r})
        def double(x):
            return [x, x]
    """))
    run_python("import usermod\nassert usermod.double(3) == [3, 3]", cwd=tmp_path)
    proxy.add(Rule("delay_before", method="GET", path=re.compile(f"^/{bucket}$"), delay=0.5))  # listings only
    seen = len(proxy.log)
    r = run_python("import usermod\nassert usermod.double(3) == [3, 3]\nprint(usermod.double.cache_info().hits)",
                   cwd=tmp_path)
    assert r.stdout.split() == ["1"]
    l0: dict[str, float] = {}
    for x in proxy.log[seen:]:
        if "list-type" in x.query and x.query.endswith("l0%2F"):
            l0.setdefault(x.query.split("records%2F")[1].split("%2F")[0], x.time)
    assert set(l0) == {"cachefn", "cacheclear", "cache"}, l0
    assert max(l0.values()) - min(l0.values()) < 0.5, l0


@pytest.mark.parametrize("make", [memoryview, lambda a: a], ids=["memoryview", "ndarray"])
def test_an_s3_backend_writes_any_contiguous_buffer(s3_env, make):
    """A backend write takes any contiguous buffer (a float array's memoryview, the array itself), as the local,
    memory and zip media do: its bytes are stored, whatever the element type."""
    from casmon.store.backend import open_backend

    _env, bucket = s3_env
    a = np.arange(10.0)
    for be in (open_backend(f"s3://{bucket}/buffers"), open_backend("memory://buffers")):
        be.set("k", make(a))
        be.create("k2", make(a))
        be.create_many([("k3", make(a))])
        assert [bytes(be.get(k)) for k in ("k", "k2", "k3")] == [a.tobytes()] * 3


def test_a_read_past_the_end_of_an_s3_object_is_damage_found_at_once(s3_env):
    """A pack cut short (its index says more than it holds) answers a range read past its end with 416 on S3: that
    is an answer, not a failure to retry for half a minute, and the value reads as damaged, as on a local folder."""
    import time

    from casmon.errors import DamagedObjectError

    _env, bucket = s3_env
    url = f"s3://{bucket}/cut"
    s = casmon.open(url)
    ds = [s.put({"i": i, "pad": "x" * 3000}) for i in range(20)]
    s.close()
    be = casmon.open(url).backend
    for pk in be.list("packs/"):
        data = bytes(be.get(pk))
        be.set(pk, data[: len(data) // 3])
    assert bytes(be.get_range(be.list("packs/")[0], 10**6, 10**6 + 10)) == b""  # as a local file reads
    s = casmon.open(url)
    t = time.monotonic()
    with pytest.raises(DamagedObjectError):
        s.get(ds[-1])
    assert s.backend.retrier.retries == 0 and time.monotonic() - t < 10


def test_a_forked_child_of_an_s3_user_says_why_it_cannot_reach_the_store_and_computes(s3_env):
    """obstore's client does not survive a fork (its runtime's threads stay in the parent): a forked child's
    cached call must not hang. It warns, naming the cause and what to use instead, and returns its result."""
    env, bucket = s3_env
    code = textwrap.dedent("""
        import os, sys, warnings, casmon
        st = casmon.open(sys.argv[1])  # reaches the bucket: obstore's runtime runs in this process now

        @casmon.cache(store=st)
        def f(x):
            return [x] * 3

        assert f(0) == [0, 0, 0]
        pid = os.fork()
        if pid == 0:
            import faulthandler
            faulthandler.dump_traceback_later(60, exit=True)  # a hang fails the test, not the run
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                got = f(1)
            print("child", got, any("forkserver" in str(w.message) for w in seen), flush=True)
            try:  # a store opened anew in the child uses the same runtime: refused as well, not a hang
                casmon.open(sys.argv[1] + "-other")
            except casmon.StoreError as e:
                print("reopen refused", "forkserver" in str(e), flush=True)
            os._exit(0)
        print("exit", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]), flush=True)
    """)
    r = run_python(code, f"s3://{bucket}/forked", env=env)
    assert "child [1, 1, 1] True" in r.stdout and "reopen refused True" in r.stdout and "exit 0" in r.stdout, \
        r.stdout + r.stderr[-2000:]


def test_a_cached_call_first_made_at_exit_on_s3_computes(s3_env):
    """A cached function first called from an atexit handler (a script's last report): casmon's I/O thread
    cannot start while the interpreter exits, and the call computes with a warning instead of raising."""
    env, bucket = s3_env
    code = textwrap.dedent("""
        import atexit, sys, casmon

        @casmon.cache(store=sys.argv[1])
        def f(x):
            return [x, x]

        atexit.register(lambda: print("at exit", f(1), flush=True))
    """)
    r = run_python(code, f"s3://{bucket}/atexit", env=env)
    assert "at exit [1, 1]" in r.stdout, r.stdout + r.stderr[-2000:]
    assert "Traceback" not in r.stderr, r.stderr[-2000:]


def test_credentials_never_reach_the_store(s3_env):
    env, bucket = s3_env
    s = casmon.open(f"s3://{bucket}/creds", storage_options={"access_key_id": "testing", "secret_access_key": "testing"})
    s.put("x")
    s.close()
    import boto3

    s3 = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    for obj in s3.list_objects_v2(Bucket=bucket)["Contents"]:
        body = s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()
        assert b"testing" not in body


def test_failed_flush_keeps_records_and_damages_nothing(s3_env, monkeypatch):
    url = s3_url(s3_env, "flaky")
    s = casmon.open(url, autoflush=None)
    s.backend.retrier.seconds = 0.3  # an outage longer than the retries
    d = s.put({"v": 1})
    s.append("call", {"n": 1}, refs=[d])
    b = s.backend
    real = b._acreate  # create-if-absent, as every flush writes
    down = {"on": True}

    async def flaky(key, value):
        if down["on"]:
            raise ConnectionError("connection reset by peer")
        return await real(key, value)

    monkeypatch.setattr(b, "_acreate", flaky)
    with pytest.raises(casmon.StoreError, match="connection reset"):
        s.flush()
    fresh = casmon.open(url)
    assert list(fresh.records("call")) == [] and fresh.verify().ok
    with pytest.raises(casmon.StoreError):
        s.flush()
    down["on"] = False
    s.flush()  # the network is back: everything pending is written
    fresh = casmon.open(url)
    assert [r["n"] for _, r in fresh.records("call")] == [1] and fresh.get(d) == {"v": 1}
    assert fresh.verify().ok


def test_a_few_failed_requests_are_retried_and_the_flush_succeeds(s3_env, monkeypatch):
    url = s3_url(s3_env, "blips")
    s = casmon.open(url, autoflush=None)
    d = s.put({"v": 1})
    s.append("call", {"n": 1}, refs=[d])
    b = s.backend
    real = b._acreate
    failures = {"left": 3}

    async def flaky(key, value):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise ConnectionError("connection reset by peer")
        return await real(key, value)

    monkeypatch.setattr(b, "_acreate", flaky)
    s.flush()
    assert failures["left"] == 0 and s.backend.retrier.retries >= 3
    fresh = casmon.open(url)
    assert [r["n"] for _, r in fresh.records("call")] == [1] and fresh.get(d) == {"v": 1}


def _many_writers_check(loc, n_tasks, k=20):
    s = casmon.open(loc)
    log = casmon.load(s)
    calls = log.calls("log_value")
    assert len(calls) == n_tasks, "every call is there, exactly once"
    assert sorted(c.inputs()[0][0] for c in calls) == list(range(n_tasks))
    assert all(c.inputs()[0][1] == (c.inputs()[0][0] % k) ** 2 for c in calls)
    entries = {r["result"] for _, r in s.records("cache") if r["fn"].endswith("square")}
    keys = {k_ for k_, r in s.records("cache") if r["fn"].endswith("square")}
    assert len(keys) == k, "one key per distinct input"
    assert len(entries) == k
    rep = s.verify()
    assert rep.ok, rep.as_dict()


def _shared_location(kind, name, tmp_path, request, monkeypatch) -> str:
    """A store for worker processes: $CASMON_STORE (and S3 credentials) reach them through the environment."""
    if kind == "s3":
        _env, bucket = request.getfixturevalue("s3_env")
        loc = f"s3://{bucket}/{name}"
    else:
        loc = str(tmp_path / name)
    monkeypatch.setenv("CASMON_STORE", loc)
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return loc


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.slow)])  # s3: a soak, --runslow
def test_spawned_processes_write_one_store(kind, tmp_path, request, monkeypatch):
    loc = _shared_location(kind, "mp", tmp_path, request, monkeypatch)
    from tests.support import workers as _workers

    ctx = multiprocessing.get_context("spawn")
    pool = ctx.Pool(3)
    try:
        results = pool.map(_workers.work, range(240), chunksize=10)
    finally:
        pool.close()
        pool.join()  # workers exit normally: each flushes at exit
    assert results == [(i % 20) ** 2 for i in range(240)]
    _many_writers_check(loc, 240)


@pytest.mark.parametrize("kind", ["local", pytest.param("s3", marks=pytest.mark.slow)])  # s3: a soak, --runslow
def test_dask_cluster_writes_one_store(kind, tmp_path, request, monkeypatch):
    distributed = pytest.importorskip("distributed")
    loc = _shared_location(kind, "dask", tmp_path, request, monkeypatch)
    from tests.support import workers as _workers

    with distributed.LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster:
        with distributed.Client(cluster) as client:
            futures = client.map(_workers.work, range(160), pure=False)
            results = client.gather(futures)
            client.run(_workers.flush)  # workers are long-lived: flush before the cluster goes
    assert results == [(i % 20) ** 2 for i in range(160)]
    _many_writers_check(loc, 160)


@pytest.mark.skipif(not __import__("shutil").which("mpiexec") or __import__("importlib").util.find_spec("mpi4py") is None,
                    reason="needs mpiexec and mpi4py")
def test_mpi_ranks_share_a_store(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys; sys.path.insert(0, sys.argv[1])\nfrom tests.support import workers as _workers\n"
                      "from mpi4py import MPI\nr = MPI.COMM_WORLD.Get_rank()\n"
                      "for i in range(r * 50, r * 50 + 50):\n    _workers.work(i)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CASMON_STORE=str(tmp_path / "mpi"))
    subprocess.run(["mpiexec", "--allow-run-as-root", "-n", "2", sys.executable, str(script), str(ROOT)], env=env, check=True, timeout=300)
    _many_writers_check(str(tmp_path / "mpi"), 100)
    ranks = {c.rank for c in casmon.load(casmon.open(tmp_path / "mpi")).calls("log_value")}
    assert ranks == {0, 1}


def test_a_write_once_file_read_in_many_ranges_is_fetched_once_on_s3(s3_env):
    """A writer that misses many keys reads one block of a bucket file per miss: after a few range reads the
    file is fetched whole and read from memory (hundreds of requests were one), until its generation is
    merged away (forget)."""
    from casmon.store.backend import base

    s = casmon.open(s3_url(s3_env, "kept"))
    b = s.backend
    data = os.urandom(64 << 10)
    b.set("records/x/buckets/g1/0000", data)
    before = b.requests
    spans = [(i * 1000, i * 1000 + 700) for i in range(40)]
    assert [bytes(b.read_kept("records/x/buckets/g1/0000", lo, hi)) for lo, hi in spans] == [data[lo:hi] for lo, hi in spans]
    assert b.requests - before == base.WHOLE_AFTER + 2  # the first ranges, then one size and one whole read
    b.forget("records/x/buckets/g1/")
    before = b.requests
    assert bytes(b.read_kept("records/x/buckets/g1/0000", 5, 9)) == data[5:9] and b.requests - before == 1
    assert b.read_kept("records/x/buckets/g2/0000", 0, 4) is None  # absent: None, as a range read says
