"""The documented examples of callmonitor 0.3.x and FineCache 0.1.x, run through casmon.compat."""

import json
import os
import pickle
import shutil
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import casmon
from tests.conftest import ROOT, run_python
from tests.runs.test_runs import git


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CASMON_STORE", raising=False)
    return tmp_path


# -- callmonitor --------------------------------------------------------------------------


def test_callmonitor_readme_usage(workdir):
    code = textwrap.dedent(
        """
        from casmon.compat.callmonitor import intercept
        import numpy as np

        @intercept
        def test_fn_2(x, y=2, z=3):
            pass

        @intercept
        def test_np_1(x, n):
            pass

        test_fn_2(1)
        test_fn_2(5, y=7)
        test_np_1(10, np.zeros(10))
        test_np_1(11, np.ones(3))
        """
    )
    run_python(code, cwd=workdir)
    assert (workdir / "call-monitor" / "casmon.json").exists()
    from casmon.compat.callmonitor import REGISTRY, load

    db = load("call-monitor")
    assert db.get("test_fn_2", 1) == ([1], {})
    assert db.get("test_fn_2", 2) == ([5], {"y": 7})
    args, kwargs = db.get("test_np_1", 1)
    assert args[0] == 10 and np.array_equal(args[1], np.zeros(10)) and kwargs == {}
    a = db.get_args("test_fn_2", 2)
    assert (a.x, a.y, a.z) == (5, 7, 3)
    assert repr(a) == "dict_keys(['x', 'y', 'z'])"
    text = repr(db)
    assert text.startswith("{\n    Locked: True\n")
    assert "    test_np_1: {\n        calls: 2\n        args: ['x', 'n']\n        defaults: None\n    }" in text
    assert "    test_fn_2: {\n        calls: 2\n        args: ['x', 'y', 'z']\n        defaults: (2, 3)\n    }" in text
    assert "<class 'numpy.ndarray'>: <class 'casmon.compat.callmonitor.NPHandler'>" in repr(REGISTRY)


def test_callmonitor_new_runs_never_overwrite(workdir):
    code = "from casmon.compat.callmonitor import intercept\n@intercept\ndef f(x):\n    return x\nimport sys\nf(int(sys.argv[1]))\n"
    run_python(code, "1", cwd=workdir)
    run_python(code, "2", cwd=workdir)
    from casmon.compat.callmonitor import load

    db = load("call-monitor")
    assert db.get("f", 1) == ([2], {})  # the latest run
    assert sorted(c.inputs()[0][0] for c in db.log.calls("f")) == [1, 2]
    assert not (workdir / "call-monitor-1").exists()


def test_callmonitor_custom_handler(workdir):
    from casmon.compat.callmonitor import REGISTRY, Handler, Settings, intercept, load

    class Fancy:
        def __init__(self, text):
            self.text = text
            self.lock = threading.Lock()  # pickle will not cut it

    done = []

    class FancyHandler(Handler):
        def load(self, path):
            self.data = Fancy(Path(path, f"arg_{self.target}.txt").read_text())

        def save(self, path):
            Path(path, f"arg_{self.target}.txt").write_text(self.data.text)

        @classmethod
        def accumulator_done(cls):
            done.append(1)

    REGISTRY.add(Fancy, FancyHandler)
    try:
        Settings().enable_multi_threading(os.getpid(), threading.get_ident())
        assert Settings().multi_threading_enabled

        @intercept
        def use(f, k=1):
            return f.text

        use(Fancy("hello"))
        casmon.flush()
        (f,), kw = load("call-monitor").get("use", 1)
        assert f.text == "hello" and kw == {} and done
        assert REGISTRY[Fancy] is FancyHandler
    finally:
        casmon.unregister_handler(Fancy)


# -- FineCache ------------------------------------------------------------------------------


@pytest.fixture
def gitdir(workdir):
    git(workdir, "init", "-q", "-b", "main")
    (workdir / "cfg.yaml").write_text("a: 1\n")
    (workdir / ".gitignore").write_text(".casmon/\n")
    git(workdir, "add", ".")
    git(workdir, "commit", "-q", "-m", "init")
    return workdir


def test_finecache_readme_cache_example(gitdir):
    from casmon.compat.finecache import FineCache

    fc = FineCache()
    calls = []

    @fc.cache()
    def func(a1: int, a2: int, k1="v1", k2="v2"):
        """normal run function"""
        calls.append(1)
        a3 = a1 + 1
        a4 = a2 + 2
        kr1, kr2 = k1[::-1], k2[::-1]
        return a3, a4, kr1, kr2

    assert func(3, a2=4, k2="v3") == (4, 6, "1v", "3v")
    assert func(3, a2=4, k2="v3") == (4, 6, "1v", "3v")
    assert len(calls) == 1
    assert (gitdir / ".casmon" / "casmon.json").exists()


def test_finecache_args_hash_on_a_method_and_label(gitdir):
    from casmon.compat.finecache import CacheFilenameConfig, FineCache

    loads = []

    class DataLoader:
        def __init__(self, seed):
            self.seed = seed

        @FineCache().cache(args_hash=[lambda x: "DataLoader"])
        def load(self):
            loads.append(self.seed)
            return self.seed

    assert DataLoader(1).load() == 1
    assert DataLoader(2).load() == 1, "args_hash says every DataLoader is the same"
    assert loads == [1]
    from casmon.caching import cache_entries

    store = casmon.default_store(str(gitdir / ".casmon"))
    labels = [r.get("label") for _, r in store.records("cache")]
    assert "load('DataLoader';).pk" in labels
    fc = FineCache()

    @fc.cache(kwargs_hash=[lambda k, v: (k, len(v))], config=CacheFilenameConfig(suffix=".cache"))
    def size(items=()):
        return len(items)

    assert size(items=[1, 2]) == 2 and size(items=[3, 4]) == 2
    assert any(str(lab).endswith(".cache") for lab in (r.get("label") for _, r in store.records("cache")))
    assert cache_entries(store)


def test_finecache_fixes_repr_collisions(gitdir):
    from casmon.compat.finecache import FineCache

    fc = FineCache()

    @fc.cache()
    def total(arr):
        return float(arr.sum())

    a = np.zeros(10_000)
    b = a.copy()
    b[5_000] = 1
    assert total(a) == 0.0 and total(b) == 1.0

    @fc.cache()
    def eight(a, b, c, d, e, f, g, h):
        return a + h

    assert eight(*(["x" * 100] * 8)) == "x" * 200  # no "File name too long"


def test_finecache_unpicklable_argument_and_result(gitdir):
    from casmon.compat.finecache import FineCache

    fc = FineCache()

    @fc.cache()
    def f(x, lock):
        return x

    with pytest.warns(casmon.CacheWarning, match="skipped"):
        assert f(1, threading.Lock()) == 1

    @fc.cache()
    def g(x):
        return threading.Lock()

    with pytest.raises(pickle.PickleError, match="not picklable"):
        g(1)


def test_finecache_record_context_and_export(gitdir, tmp_path):
    from casmon.compat.finecache import FineCache, IncrementDir

    fc = FineCache()
    (gitdir / "cfg.yaml").write_text("a: 2\n")  # an uncommitted change, captured when FineCache was created? no: after
    with fc.record_context(IncrementDir(str(gitdir), "exp"), comment="first", tracking_files=[r"\.yaml$"]) as info:
        print("training")
        info["accuracy"] = 0.9
    run = casmon.load_run("exp1-first", str(gitdir / ".casmon"))
    information = run.information()
    assert information["commit"] == git(gitdir, "rev-parse", "HEAD")
    assert information["project_root"] == str(gitdir)
    assert information["tracking_records"] == {r"\.yaml$": [str(gitdir / "cfg.yaml")]}
    assert information["accuracy"] == 0.9 and "patch_time" in information
    assert run.patch() == b"", "FineCache takes the patch when it is created, before the edit"
    assert run.output() == "training\n"
    out = casmon.export("exp1-first", tmp_path / "exported", str(gitdir / ".casmon"))
    exported = json.loads((out / "information.json").read_text())
    assert exported["accuracy"] == 0.9 and exported["commit"] == information["commit"]
    assert (out / "console.log").read_text() == "training\n"
    assert (out / "cfg.yaml").read_text() == "a: 2\n"

    @fc.record(comment="decorated")
    def experiment():
        return 42

    assert experiment() == 42
    info2 = casmon.load_run("latest", str(gitdir / ".casmon")).information()
    assert info2["record_function"].endswith("experiment") and "run_end_time" in info2


def test_increment_dir(tmp_path):
    from casmon.compat.finecache import IncrementDir

    inc = IncrementDir(str(tmp_path), "exp")
    assert inc.latest_dir == (None, None)
    assert Path(inc.create_new_dir()).name == "exp1"
    assert Path(inc.create_new_dir("note")).name == "exp2-note"
    assert inc.latest_dir == (2, "exp2-note")


def test_importing_finecache_compat_configures_no_logging():
    p = run_python("import logging\nimport casmon.compat.finecache, casmon.compat.callmonitor\n"
                   "print(logging.getLogger().level, logging.getLogger().handlers)\n")
    assert p.stdout.strip() == "30 []"


def test_callmonitor_handler_value_inside_a_container(workdir):
    """A REGISTRY handler's object inside a list round-trips (Python 3.13 made persistent_load read-only on
    unpicklers: issue 15); an untrusted store refuses it with casmon's error, not an AttributeError."""
    from casmon.compat.callmonitor import REGISTRY, Handler

    class Note:
        def __init__(self, text):
            self.text = text
            self.lock = threading.Lock()

    class NoteHandler(Handler):
        def load(self, path):
            self.data = Note(Path(path, f"n_{self.target}.txt").read_text())

        def save(self, path):
            Path(path, f"n_{self.target}.txt").write_text(self.data.text)

    REGISTRY.add(Note, NoteHandler)
    try:
        s = casmon.open(workdir / "s")
        d = s.put({"notes": [Note("a"), Note("b")], "n": 2})
        got = s.get(d)
        assert [n.text for n in got["notes"]] == ["a", "b"] and got["n"] == 2
        assert s.manifest(d).children
        s.close()
        with pytest.raises(casmon.UntrustedStoreError, match="refers to other values"):
            casmon.open(workdir / "s", trust=False).get(d)
    finally:
        casmon.unregister_handler(Note)
        REGISTRY._registry.pop(Note, None)


def test_callmonitor_never_writes_into_callmonitor_s_own_folder(workdir):
    """An old ``call-monitor`` folder (callmonitor's own data) is left alone: as callmonitor would, the log goes
    to ``call-monitor-1``; ``load("call-monitor")`` still reads the old folder."""
    old = workdir / "call-monitor"
    shutil.copytree(next((ROOT / "tests" / "support" / "seeds" / "callmonitor-0.3.7").iterdir()), old)
    before = sorted(p.relative_to(old).as_posix() for p in old.rglob("*"))
    code = "from casmon.compat.callmonitor import intercept\n@intercept\ndef f(x):\n    return x\nf(1)\n"
    p = run_python(code, cwd=workdir)
    assert "not logged" not in p.stderr
    assert sorted(q.relative_to(old).as_posix() for q in old.rglob("*")) == before
    from casmon.compat.callmonitor import load

    assert load("call-monitor-1").get("f", 1) == ([1], {})
    assert load("call-monitor").get("test_fn_1", 1) == ([1, "two"], {})
