"""The seeds' own usage, unchanged, against ``callmonitor`` and ``FineCache`` shims that re-export casmon.compat.

Every script runs as a real subprocess with the shims first on ``PYTHONPATH``
(so ``from callmonitor import intercept, rc`` and ``from FineCache import
FineCache, IncrementDir`` find casmon). The scripts follow callmonitor's
``test/simple_monitor.py``, ``numpy_monitor.py`` and ``mpi_monitor.py`` and
FineCache 0.1.4's ``tests/test_cachelib.py``; where casmon differs on purpose
(the README's migration table), the test says so and checks casmon's behaviour.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import casmon
from tests.conftest import ROOT
from tests.runs.test_runs import git


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("shims")
    (d / "callmonitor").mkdir()
    (d / "callmonitor" / "__init__.py").write_text(
        "from casmon.compat.callmonitor import *  # noqa: F401,F403\n"
        "from casmon.compat.callmonitor import VERSION, __version__  # noqa: F401\n")
    (d / "FineCache").mkdir()
    (d / "FineCache" / "__init__.py").write_text("from casmon.compat.finecache import *  # noqa: F401,F403\n")
    return d


def run(script: Path, cwd: Path, shims: Path, env: dict | None = None, extra_path: list | None = None, wait=True):
    e = dict(os.environ)
    e.pop("CASMON_STORE", None)
    e["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in extra_path or []), str(shims), str(ROOT)])
    e.update(env or {})
    p = subprocess.Popen([sys.executable, str(script)], cwd=cwd, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    if not wait:
        return p
    return finish(p)


def finish(p: subprocess.Popen):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, f"script failed ({p.returncode}):\nstdout:\n{out}\nstderr:\n{err}"
    return out, err


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CASMON_STORE", raising=False)
    return tmp_path


def script(path: Path, code: str) -> Path:
    path.write_text(textwrap.dedent(code))
    return path


# -- callmonitor's test/ scripts -------------------------------------------------------------

SIMPLE = """
    from callmonitor import intercept

    @intercept
    def test_fn_1(x, y, z=3):
        pass

    if __name__ == "__main__":
        test_fn_1(1, "two")
        test_fn_1(2, y="three", z=[])
"""

NUMPY = """
    import numpy as np

    from callmonitor import intercept

    @intercept
    def test_np_1(x, n):
        pass

    if __name__ == "__main__":
        M = 10
        ar_1 = np.zeros(M)
        ar_2 = np.ones_like(ar_1)
        test_np_1(M, ar_1)
        test_np_1(M, n=ar_2)
"""

MPI = """
    from mpi4py import MPI
    from callmonitor import intercept, rc

    @intercept
    def test_fn_1(x, y, z=3):
        pass

    @intercept
    def test_fn_2(x, y=2, z=3):
        pass

    if __name__ == "__main__":
        rc(multi_threading=True, pid=MPI.COMM_WORLD.Get_rank())
        test_fn_1(1, "two")
        test_fn_1(2, y="three", z=[])
        test_fn_2(10)
"""


def test_callmonitor_simple_and_numpy_scripts(workdir, shims):
    run(script(workdir / "simple_monitor.py", SIMPLE), workdir, shims)
    run(script(workdir / "numpy_monitor.py", NUMPY), workdir, shims)
    from casmon.compat.callmonitor import load

    db = load("call-monitor")
    assert db.get("test_fn_1", 1) == ([1, "two"], {})
    assert db.get("test_fn_1", 2) == ([2], {"y": "three", "z": []})
    a = db.get_args("test_fn_1", 1)
    assert (a.x, a.y, a.z) == (1, "two", 3)
    args, kwargs = db.get("test_np_1", 1)
    assert args[0] == 10 and np.array_equal(args[1], np.zeros(10)) and kwargs == {}
    args, kwargs = db.get("test_np_1", 2)
    assert args == [10] and np.array_equal(kwargs["n"], np.ones(10))
    assert db.counter["test_fn_1"] == 2 and db.counter["test_np_1"] == 2 and db.counter["nothing"] == 0
    with pytest.raises(LookupError, match="no call 3"):
        db.get("test_fn_1", 3)


FAKE_MPI = "import os\n\nclass _Comm:\n    def Get_rank(self):\n        return int(os.environ['FAKE_MPI_RANK'])\n\nCOMM_WORLD = _Comm()\n"


def test_callmonitor_mpi_script_two_ranks_at_once(workdir, shims, tmp_path_factory):
    """mpi_monitor.py as two ranks started together (an mpi4py stand-in gives each its rank): one session each."""
    fake = tmp_path_factory.mktemp("fakempi")
    (fake / "mpi4py").mkdir()
    (fake / "mpi4py" / "__init__.py").write_text("")
    (fake / "mpi4py" / "MPI.py").write_text(FAKE_MPI)
    s = script(workdir / "mpi_monitor.py", MPI)
    procs = [run(s, workdir, shims, env={"FAKE_MPI_RANK": str(r)}, extra_path=[fake], wait=False) for r in (0, 1)]
    for p in procs:
        finish(p)
    log = casmon.load("call-monitor")
    assert sorted(s["rank"] for s in log.sessions.values()) == [0, 1]
    for rank in (0, 1):
        calls = log.calls(rank=rank)
        assert sorted((c.name.rsplit(".", 1)[-1], c.n) for c in calls) == [("test_fn_1", 1), ("test_fn_1", 2), ("test_fn_2", 1)]
        assert [c.inputs() for c in log.calls("test_fn_2", rank=rank)] == [([10], {})]


def test_callmonitor_rc_records_the_rank_without_mpi(workdir, shims):
    s = script(workdir / "rank.py", """
        from callmonitor import intercept, rc, SETTINGS

        @intercept
        def f(x):
            return x

        rc(multi_threading=True, pid=7)
        assert SETTINGS.multi_threading_enabled and SETTINGS.pid == 7
        f(1)
    """)
    run(s, workdir, shims)
    log = casmon.load("call-monitor")
    assert [c.rank for c in log.calls("f")] == [7]


@pytest.mark.skipif(shutil.which("mpiexec") is None, reason="no mpiexec on this machine")
def test_callmonitor_mpi_script_under_mpiexec(workdir, shims):  # pragma: no cover - needs MPI
    pytest.importorskip("mpi4py")
    s = script(workdir / "mpi_monitor.py", MPI)
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shims), str(ROOT)]))
    subprocess.run(["mpiexec", "-n", "2", sys.executable, str(s)], cwd=workdir, env=e, check=True, timeout=300)
    log = casmon.load("call-monitor")
    assert sorted(s["rank"] for s in log.sessions.values()) == [0, 1]


def test_callmonitor_public_api(workdir, shims):
    """Every name callmonitor 0.3.7 exports, with its behaviour."""
    s = script(workdir / "api.py", """
        import inspect, os, threading
        import numpy as np
        import callmonitor
        from callmonitor import (intercept, rc, CONTEXT, Context, snapshot, save_db, Counter, ArgsHandler, Args,
                                 VERSION, __version__, load, save, new, DB, Registry, REGISTRY, Settings, SETTINGS,
                                 Handler, DefaultHandler, NPHandler)

        assert VERSION >= (0, 3, 0) and __version__ == "%d.%d.%d" % VERSION
        assert Registry() is REGISTRY and Settings() is SETTINGS and Context() is CONTEXT
        assert SETTINGS.multi_threading_enabled and SETTINGS.pid == os.getpid()  # callmonitor enables it at import
        assert SETTINGS.tid_tag == f"-pid={os.getpid()}-tident={threading.get_ident()}"

        c = Counter()
        c.increment("a"); c.increment("a"); c.reset_key("b")
        assert c["a"] == 2 and c["b"] == 0 and c["zzz"] == 0 and list(c) == ["a"]
        c.lock()
        try:
            c.increment("a")
            raise SystemExit("a locked Counter must refuse")
        except callmonitor.CounterLocked:
            pass

        def g(x, y=2, z=3):
            pass
        spec = inspect.getfullargspec(g)
        desc = ArgsHandler("g", spec).save((1, np.zeros(2)), {"z": "s"})
        assert [type(h) for h in desc["args"]] == [DefaultHandler, NPHandler] and desc["argspec"] is spec
        assert type(desc["kwargs"]["z"]) is DefaultHandler and desc["kwargs"]["z"].target == "z"
        a = Args(spec, [1], {"z": 5})
        assert (a.x, a.y, a.z) == (1, 2, 5) and repr(a) == "dict_keys(['x', 'y', 'z'])"

        assert not CONTEXT.initialized
        try:
            CONTEXT.db
            raise SystemExit("CONTEXT.db before any call must raise")
        except callmonitor.DBNotInitialized:
            pass

        @intercept
        def f(x):
            return x

        f(1); f(2)
        assert CONTEXT.initialized
        db = CONTEXT.db
        assert db.get("f", 2) == ([2], {}) and db.locked and db.version == VERSION
        save(db); save_db()
        snapshot()              # a new database: calls count from 1 again
        f(3)
        assert CONTEXT.db.get("f", 1) == ([3], {})
        assert load().get("f", 1) == ([3], {})
        try:
            new(db)
            raise SystemExit("new(db) must explain what replaces it")
        except NotImplementedError as e:
            assert "CONTEXT.new()" in str(e)
        print("ok")
    """)
    out, _ = run(s, workdir, shims)
    assert out.strip() == "ok"
    log = casmon.load("call-monitor")
    assert len(log.sessions) == 2, "snapshot() started a second session"
    assert [(c.session, c.n, c.inputs()[0]) for c in log.calls("f")] == [(1, 1, [1]), (1, 2, [2]), (2, 1, [3])]


def test_callmonitor_public_names_match_the_package():
    real = pytest.importorskip("callmonitor")
    if not hasattr(real, "intercept") or "casmon" in getattr(real, "__file__", ""):
        pytest.skip("the real callmonitor is not installed")
    import casmon.compat.callmonitor as compat

    incidental = {"np", "getpid", "get_ident", "register"}  # callmonitor's own imports, not its API
    public = {n for n in dir(real) if not n.startswith("_") and not isinstance(getattr(real, n), type(real))} - incidental
    assert public <= set(dir(compat)), sorted(public - set(dir(compat)))
    assert public | {"__version__"} <= set(compat.__all__) | {"__version__"}


def test_callmonitor_same_name_numbers_calls_together(workdir, shims):
    s = script(workdir / "same_name.py", """
        from callmonitor import intercept

        class A:
            @staticmethod
            @intercept
            def run(x):
                return x

        class B:
            @staticmethod
            @intercept
            def run(x, y=1):
                return x

        A.run(1)
        B.run(2, y=5)
        A.run(3)
    """)
    run(s, workdir, shims)
    from casmon.compat.callmonitor import load

    db = load("call-monitor")
    assert [db.get("run", i) for i in (1, 2, 3)] == [([1], {}), ([2], {"y": 5}), ([3], {})]
    assert db.counter["run"] == 3
    b = db.get_args("run", 2)
    assert (b.x, b.y) == (2, 5)
    assert "    run: {\n        calls: 3\n        args: ['x']\n" in repr(db)  # the first call's argspec, as callmonitor
    with pytest.raises(LookupError, match="ambiguous"):
        casmon.load("call-monitor").get("run", 1)  # casmon's own API keeps qualified names


# -- FineCache 0.1.4's tests/test_cachelib.py ----------------------------------------------------

CACHELIB = '''
import json
import os
import pickle
import unittest
import warnings
from pathlib import Path
from shutil import rmtree

from FineCache import FineCache, IncrementDir


def func(a1: int, a2: int, k1="v1", k2="v2"):
    """normal run function"""
    return a1 + 1, a2 + 2, k1[::-1], k2[::-1]


def store_labels():
    import casmon
    return [r.get("label") for _, r in casmon.default_store(os.path.abspath(".cache/.casmon")).records("cache")]


class TestFineCache(unittest.TestCase):
    def setUp(self):
        self.inc = IncrementDir(".cache", dir_prefix="test")
        self.fc = FineCache(".cache")

    def tearDown(self):
        if os.path.exists(".cache"):
            rmtree(".cache")
        if os.path.exists("temp.yml"):
            os.remove("temp.yml")

    def test_wrapped(self):
        for wrapped in (self.fc.cache()(func), self.fc.record()(func)):
            self.assertEqual(wrapped.__qualname__, func.__qualname__)
            self.assertEqual(wrapped.__doc__, func.__doc__)

    def test_pickle_cache(self):
        wrapped = self.fc.cache()(func)
        self.assertEqual(func(3, a2=4, k1="v3"), wrapped(3, a2=4, k1="v3"))
        self.assertEqual(func(3, a2=4, k1="v3"), wrapped(3, a2=4, k1="v3"))
        self.assertEqual(wrapped.cache_info().hits, 1)

    def test_unpicklable_args(self):
        # Difference (README): FineCache keys a lambda by the repr of its address and writes a .pk file;
        # casmon cannot tell two lambdas apart by content, so it runs the call uncached and says so.
        def _test_unpicklable(a1, a2, k1, k2):
            return a1, k1

        wrapped = self.fc.cache()(_test_unpicklable)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.assertEqual(wrapped(3, lambda x: x + 2, k1=4, k2=lambda x: x + 3), (3, 4))
        self.assertTrue(any("not cached" in str(x.message) for x in w))
        self.assertFalse(any(str(f).endswith(".pk") for f in os.listdir(".cache")))

    def test_unpicklable_different_action(self):
        def _test_lambda(a1, func1):
            return func1(a1)

        wrapped = self.fc.cache()(_test_lambda)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.assertEqual(wrapped(3, lambda x: x), 3)
            self.assertEqual(wrapped(3, lambda x: x + 1), 4)

    def test_not_picklable_result(self):
        def _test_unpicklable_result():
            return lambda x: 0

        wrapped = self.fc.cache()(_test_unpicklable_result)
        with self.assertRaises(pickle.PickleError):
            wrapped()

    def test_self_defined_hash(self):
        # Difference (README): the file name FineCache would write is the cache entry's label in the store.
        def test_func(a1, a2):
            return a1, a2

        wrapped = self.fc.cache(args_hash=[lambda a1: "x", lambda a2: "y"])(test_func)
        wrapped("a1", "a2")
        self.assertIn("test_func('x','y';).pk", store_labels())

    def test_record_context(self):
        Path("./temp.yml").touch()

        def output():
            print("123456789")

        with self.fc.record_context(self.inc, comment="test_record_context", tracking_files=[r".*\\.yml"]) as info:
            output()
            info["output"] = "abcdefg"

        _, latest_dir = self.inc.latest_dir
        self.assertTrue("test_record_context" in latest_dir)
        with open(os.path.join(".cache", latest_dir, "console.log")) as fp:
            self.assertTrue("123456789" in fp.read())
        with open(os.path.join(".cache", latest_dir, "information.json")) as fp:
            self.assertTrue("abcdefg" in fp.read())
        self.assertTrue(os.path.exists(os.path.join(".cache", latest_dir, "tests", "temp.yml")))

    def test_record(self):
        Path("./temp.yml").touch()

        @self.fc.record(self.inc, comment="test_record", tracking_files=[r".*\\.yml"])
        def output():
            pass

        for _ in range(3):
            output()
        num, latest_dir = self.inc.latest_dir
        self.assertEqual(num, 3)
        # Difference (README): the base folder also holds the store, .casmon
        self.assertEqual(sorted(os.listdir(".cache")), [".casmon", "test1-test_record", "test2-test_record",
                                                         "test3-test_record"])
        self.assertTrue("test_record" in latest_dir)
        with open(os.path.join(".cache", latest_dir, "information.json")) as fp:
            data = json.load(fp)
        self.assertEqual(data["record_function"], output.__qualname__)
        self.assertFalse(os.path.exists(os.path.join(".cache", latest_dir, "tests", ".cache")))
        self.assertTrue(os.path.exists(os.path.join(".cache", latest_dir, "tests", "temp.yml")))


if __name__ == "__main__":
    unittest.main()
'''


@pytest.fixture
def project(workdir):
    """A git repository with a ``tests/`` folder to run from, as FineCache's own suite runs."""
    git(workdir, "init", "-q", "-b", "main")
    (workdir / "README").write_text("x\n")
    git(workdir, "add", ".")
    git(workdir, "commit", "-q", "-m", "init")
    (workdir / "tests").mkdir()
    return workdir


def test_finecache_test_cachelib(project, shims):
    t = project / "tests"
    (t / "test_cachelib.py").write_text(CACHELIB)
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shims), str(ROOT)]))
    e.pop("CASMON_STORE", None)
    p = subprocess.run([sys.executable, "-m", "unittest", "-v", "test_cachelib"], cwd=t, env=e, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-5000:]
    assert "Ran 8 tests" in p.stderr and "OK" in p.stderr


def test_finecache_run_folders_are_casmon_exports(project, shims, tmp_path):
    """Each run folder holds exactly the bytes ``casmon export`` writes for the store's run of the same number."""
    s = script(project / "tests" / "exp.py", """
        import os
        from FineCache import FineCache, IncrementDir

        fc = FineCache(".exp")
        inc = IncrementDir(".exp", "exp")
        open("cfg.yml", "w").write("lr: 0.1\\n")
        for i in range(2):
            with fc.record_context(inc, comment=f"c{i}", tracking_files=[r"cfg\\.yml$"]) as info:
                print("epoch", i)
                n, name = inc.latest_dir
                open(os.path.join(".exp", name, "model.txt"), "w").write(f"weights {i}")  # the run writes into its folder
                if i == 1:
                    os.makedirs(os.path.join(".exp", name, "tests"))
                    open(os.path.join(".exp", name, "tests", "cfg.yml"), "w").write("mine")  # as FineCache: it stays
                info["i"] = i
    """)
    run(s, project / "tests", shims)
    base = project / "tests" / ".exp"
    store = str(base / ".casmon")
    assert sorted(p.name for p in base.iterdir()) == [".casmon", "exp1-c0", "exp2-c1"]
    for i, name in enumerate(["exp1-c0", "exp2-c1"]):
        folder = base / name
        exported = casmon.export(name, tmp_path / name, store)
        want = {p.relative_to(exported).as_posix(): p.read_bytes() for p in exported.rglob("*") if p.is_file()}
        got = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        assert got.pop("model.txt") == f"weights {i}".encode()  # the run's own file stays
        if i == 1:
            assert got.pop("tests/cfg.yml") == b"mine" and want.pop("tests/cfg.yml") == b"lr: 0.1\n"
        assert got == want
        assert json.loads(want["information.json"])["i"] == i
        assert want["console.log"] == f"epoch {i}\n".encode()
        assert casmon.load_run(name, store).manifest["n"] == i + 1


def test_finecache_concurrent_runs_agree_with_the_store(project, shims):
    """Four processes record three runs each at once: twelve numbers, each once, folders and store agreeing."""
    s = script(project / "tests" / "many.py", """
        import os, sys
        from FineCache import FineCache, IncrementDir

        fc = FineCache(".runs")
        inc = IncrementDir(".runs", "r")
        for i in range(3):
            with fc.record_context(inc, comment=f"p{sys.argv[1]}") as info:
                info["who"] = f"{sys.argv[1]}-{i}"
    """)
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shims), str(ROOT)]))
    e.pop("CASMON_STORE", None)
    procs = [subprocess.Popen([sys.executable, str(s), str(k)], cwd=project / "tests", env=e, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(4)]
    for p in procs:
        finish(p)
    base = project / "tests" / ".runs"
    folders = sorted((p for p in base.iterdir() if p.name != ".casmon"), key=lambda p: int(p.name[1:].split("-")[0]))
    numbers = [int(p.name[1:].split("-")[0]) for p in folders]
    assert numbers == list(range(1, 13)), [p.name for p in folders]
    runs = {r.name: r for r in casmon.list_runs(str(base / ".casmon"))}
    assert sorted(runs) == sorted(p.name for p in folders)
    whos = set()
    for p in folders:
        info = json.loads((p / "information.json").read_text())
        assert info["who"] == runs[p.name].information()["who"]
        assert runs[p.name].manifest["n"] == int(p.name[1:].split("-")[0])
        whos.add(info["who"])
    assert whos == {f"{k}-{i}" for k in range(4) for i in range(3)}


def test_finecache_numbers_skip_folders_made_by_hand(project, shims):
    """A folder FineCache itself (or a person) made takes its number: the next run does not reuse it."""
    base = project / "tests" / ".cache"
    (base / "test1-old").mkdir(parents=True)
    (base / "test5").mkdir()
    s = script(project / "tests" / "one.py", """
        from FineCache import FineCache, IncrementDir
        fc = FineCache(".cache")
        with fc.record_context(IncrementDir(".cache", "test")):
            pass
        with fc.record_context(IncrementDir(".cache", "test"), comment="b"):
            pass
    """)
    run(s, project / "tests", shims)
    assert sorted(p.name for p in base.iterdir()) == [".casmon", "test1-old", "test5", "test6", "test7-b"]
    assert [r.name for r in casmon.list_runs(str(base / ".casmon"))] == ["test6", "test7-b"]


def test_finecache_failed_run_still_gets_its_folder(project, shims):
    s = script(project / "tests" / "fail.py", """
        from FineCache import FineCache, IncrementDir
        fc = FineCache(".cache")
        try:
            with fc.record_context(IncrementDir(".cache", "t"), comment="x") as info:
                print("before")
                raise RuntimeError("boom")
        except RuntimeError:
            pass
    """)
    run(s, project / "tests", shims)
    folder = project / "tests" / ".cache" / "t1-x"
    assert (folder / "console.log").read_text() == "before\n"
    assert json.loads((folder / "information.json").read_text())["commit"] == git(project, "rev-parse", "HEAD")
    assert casmon.load_run("t1-x", str(project / "tests" / ".cache" / ".casmon")).status == "failed"


def test_finecache_comment_must_be_one_folder_name(project):
    from casmon.compat.finecache import FineCache, IncrementDir

    fc = FineCache(str(project / ".c"))
    with pytest.raises(ValueError, match="one folder name"):
        with fc.record_context(IncrementDir(str(project / ".c")), comment="../escape"):
            pass
    assert not (project / "escape").exists()
