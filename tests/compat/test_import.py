"""``casmon import``: folders made by callmonitor 0.3.7 and FineCache 0.1.4 round-trip into a store.

The folders are made by the real packages when they are installed (the test
extra has them), else taken from ``tests/seeds/`` (made by the same scripts,
``tests/seeds/make_*.py``, with the real packages). The command runs as a
real subprocess; reading back uses the compat APIs and ``casmon export``.
"""

import importlib.util
import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.compat.importer import ImportSourceError, import_path
from tests.conftest import ROOT
from tests.runs.test_runs import git

SEEDS = Path(__file__).resolve().parents[1] / "support" / "seeds"


def _real(name: str) -> bool:
    spec = importlib.util.find_spec(name)
    return spec is not None and spec.origin is not None and "casmon" not in spec.origin


#: The real packages make the folders when installed; else the committed folders they made stand in.
SOURCE = "real" if _real("callmonitor") and _real("FineCache") else "fixture"


@pytest.fixture(scope="module")
def shims(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("shims")
    (d / "callmonitor").mkdir()
    (d / "callmonitor" / "__init__.py").write_text("from casmon.compat.callmonitor import *  # noqa: F401,F403\n")
    return d


def cli(*args: str, cwd, extra_path=()) -> subprocess.CompletedProcess:
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([*map(str, extra_path), str(ROOT)]))
    e.pop("CASMON_STORE", None)
    return subprocess.run([sys.executable, "-m", "casmon.cli", *args], cwd=cwd, env=e, capture_output=True, text=True,
                          timeout=300)


def import_json(path: Path, store: Path, *flags: str, extra_path=()) -> dict:
    p = cli("import", str(path), "--store", str(store), "--json", *flags, cwd=path.parent, extra_path=extra_path)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def seed_python(code_dir: Path, script: str, cwd: Path) -> None:
    """Run a seed script with the real package (no casmon on the path: the package itself writes)."""
    e = dict(os.environ, PYTHONPATH=str(code_dir))
    e.pop("CASMON_STORE", None)
    p = subprocess.run([sys.executable, script], cwd=cwd, env=e, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr


def _callmonitor_folder(tmp_path: Path, source: str) -> Path:
    work = tmp_path / "old"
    work.mkdir(parents=True)
    shutil.copy(SEEDS / "fancy_handlers.py", work)
    if source == "real":
        shutil.copy(SEEDS / "make_callmonitor.py", work)
        seed_python(work, "make_callmonitor.py", work)
    else:
        shutil.copytree(next((SEEDS / "callmonitor-0.3.7").iterdir()), work / "call-monitor-pid=12084-tident=1")
    (folder,) = work.glob("call-monitor*")
    return folder


@pytest.fixture
def callmonitor_folder(tmp_path) -> Path:
    return _callmonitor_folder(tmp_path, SOURCE)


def test_callmonitor_folder_round_trip(callmonitor_folder, tmp_path, shims):
    store = tmp_path / "store"
    report = import_json(callmonitor_folder, store)
    assert (report["sessions"], report["calls"], report["runs"]) == (1, 10, 0)
    assert report["deduplicated_values"] >= 1, "the array passed twice is stored once"
    assert report["not_stored"] == 1, "fancy_handlers.Point needs --trust"
    from casmon.compat.callmonitor import load

    db = load(str(store))
    assert db.get("test_fn_1", 1) == ([1, "two"], {})
    assert db.get("test_fn_1", 2) == ([2], {"y": "three", "z": []})
    big = np.arange(2_000, dtype=np.float64)
    args, kwargs = db.get("test_np_1", 1)
    assert args[0] == 10 and np.array_equal(args[1], np.zeros(10))
    args, kwargs = db.get("test_np_1", 2)
    assert args == [10] and np.array_equal(kwargs["n"], big)
    args, _ = db.get("test_np_1", 3)
    assert np.array_equal(args[1], big)
    assert [db.get("run", i) for i in (1, 2, 3)] == [([1], {}), ([2], {"y": 5}), ([3], {})]
    a = db.get_args("test_fn_1", 1)
    assert (a.x, a.y, a.z) == (1, "two", 3)
    (p,), _ = db.get("point", 1)
    assert isinstance(p, casmon.NotStored) and "--trust" in p.reason
    log = casmon.load(str(store))
    session = log.sessions[1]
    assert session["imported"]["format"] == "callmonitor 0.3" and session["pid"] > 0
    assert "sig1.run" in log.functions and "sig2.run" in log.functions  # one __name__, two signatures

    # The custom handler's files are the value: they load once the handler is registered, as with callmonitor.
    (tmp_path / "read.py").write_text(
        "import sys\nfrom callmonitor import REGISTRY, load\nfrom fancy_handlers import Fancy, FancyHandler\n"
        "REGISTRY.add(Fancy, FancyHandler)\n(f,), kw = load(sys.argv[1]).get('fancy', 1)\nprint(f.text, kw['g'].text)\n")
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shims), str(SEEDS), str(ROOT)]))
    p = subprocess.run([sys.executable, "read.py", str(store)], cwd=tmp_path, env=e, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["hello", "kw"]

    again = import_path(callmonitor_folder, str(store))
    assert (again.already, again.calls, again.sessions) == (1, 0, 0)


def test_callmonitor_import_with_trust_loads_user_classes(callmonitor_folder, tmp_path, shims):
    store = str(tmp_path / "store")
    # fancy_handlers.Point importable, as for the user who made the folder (its "import callmonitor" finds
    # the package, or the shim where the package is not installed)
    sys.path[:0] = [str(SEEDS), str(shims)]
    try:
        from click.testing import CliRunner

        from casmon.cli.app import main

        res = CliRunner().invoke(main, ["--trust", "import", str(callmonitor_folder), "--store", store, "--json"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.output)["not_stored"] == 0  # casmon --trust import: the group's flag counts too
        from casmon.compat.callmonitor import load

        (p,), _ = load(store).get("point", 1)
        assert (type(p).__module__, p.x, p.y) == ("fancy_handlers", 1, 2)
    finally:
        sys.path.remove(str(SEEDS))
        sys.path.remove(str(shims))
        sys.modules.pop("fancy_handlers", None)


def test_compat_load_reads_a_callmonitor_folder(callmonitor_folder):
    """``callmonitor.load("call-monitor-...")`` on callmonitor's own folder, as a user's script would call it."""
    from casmon.compat.callmonitor import load

    db = load(str(callmonitor_folder))
    assert db.get("test_fn_1", 2) == ([2], {"y": "three", "z": []})
    assert db.counter["run"] == 3


def test_callmonitor_folder_without_db_pkl(callmonitor_folder, tmp_path):
    """A killed callmonitor run never wrote db.pkl: its call folders are imported all the same."""
    (callmonitor_folder / "db.pkl").unlink()
    report = import_path(callmonitor_folder, str(tmp_path / "s"))
    assert report.calls == 10 and any("no db.pkl" in n for n in report.notes)


def _finecache_folder(tmp_path: Path, source: str) -> Path:
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    if source == "real":
        git(project, "init", "-q", "-b", "main")
        (project / "README").write_text("x\n")
        git(project, "add", ".")
        git(project, "commit", "-q", "-m", "init")
        (project / "README").write_text("x\ny\n")  # an uncommitted change: the patch is not empty
        shutil.copy(SEEDS / "make_finecache.py", project / "tests")
        seed_python(project / "tests", "make_finecache.py", project / "tests")
        return project / "tests" / ".cache"
    shutil.copytree(SEEDS / "finecache-0.1.4", project / "tests" / ".cache")
    return project / "tests" / ".cache"


@pytest.fixture
def finecache_folder(tmp_path) -> Path:
    return _finecache_folder(tmp_path, SOURCE)


def test_committed_seed_folders_import(tmp_path):
    """The folders in tests/seeds (made by the real packages) import, whichever source the other tests use."""
    store = str(tmp_path / "store")
    cm = import_path(_callmonitor_folder(tmp_path / "a", "fixture"), store)
    fc = import_path(_finecache_folder(tmp_path / "b", "fixture"), store)
    assert (cm.calls, cm.not_stored, fc.cache_files, fc.runs) == (10, 1, 2, 2)
    from casmon.compat.callmonitor import load

    assert load(store).get("run", 2) == ([2], {"y": 5})
    info = json.loads((tmp_path / "b" / "project" / "tests" / ".cache" / "test2" / "information.json").read_text())
    assert casmon.load_run("test2", store).information() == info


def test_finecache_folder_round_trip(finecache_folder, tmp_path):
    store = tmp_path / "store"
    report = import_json(finecache_folder, store)
    assert (report["cache_files"], report["runs"], report["sessions"], report["calls"]) == (2, 2, 1, 2)
    assert report["deduplicated_values"] >= 1, "the tracked temp.yml of both runs is stored once"
    log = casmon.load(str(store))
    results = sorted(c.result() for c in log.calls("__main__.func"))
    assert results == [(4, 6, "1v", "3v"), (6, 8, "1v", "2v")]
    runs = [r.name for r in casmon.list_runs(str(store))]
    assert sorted(runs) == ["test1-first", "test2"]
    for name in runs:
        out = casmon.export(name, tmp_path / "exported" / name, str(store))
        original = finecache_folder / name
        got = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
        want = {p.relative_to(original).as_posix(): p.read_bytes() for p in original.rglob("*") if p.is_file()}
        assert sorted(got) == sorted(want)
        assert json.loads(got.pop("information.json")) == json.loads(want.pop("information.json"))
        assert got == want  # console.log, current_changes.patch, tracked files: the same bytes
    r1 = casmon.load_run("test1-first", str(store))
    assert r1.info()["accuracy"] == 0.5 and r1.output() == "epoch 1\n" and r1.status == "ok"
    again = import_path(finecache_folder, str(store))
    assert (again.already, again.runs, again.cache_files) == (4, 0, 0)


def test_finecache_run_number_taken_is_renumbered(finecache_folder, tmp_path):
    store = casmon.open(str(tmp_path / "store"))
    with casmon.record(store=store, prefix="test", capture_output=False):
        pass
    report = import_path(finecache_folder / "test1-first", store)
    assert report.runs == 1 and report.renumbered == ["test1-first -> test2-first (run test1 was taken)"]
    assert casmon.load_run("test2-first", store).info()["accuracy"] == 0.5


def test_hostile_pickle_runs_nothing_without_trust(tmp_path):
    """A cache file whose pickle calls os.system: read without --trust, nothing it names is called."""
    src = tmp_path / "fc"
    src.mkdir()
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (src / "f(1;).pk").write_bytes(pickle.dumps({"func": "f", "module": "m", "args": [1], "kwargs": {},
                                                 "result": Evil(), "runtime": "2024-01-01 00:00:00"}))
    report = import_json(src, tmp_path / "store")
    assert not marker.exists()
    assert report["cache_files"] == 1 and report["not_stored"] == 1
    c = casmon.load(str(tmp_path / "store")).calls("m.f")[0]
    assert c.inputs() == ([1], {})
    assert "--trust" in c.result().reason and "system" in c.result().type_name


def test_nothing_to_import_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    p = cli("import", str(tmp_path / "empty"), "--store", str(tmp_path / "s"), cwd=tmp_path)
    assert p.returncode == 1 and "nothing to import" in p.stderr and "Traceback" not in p.stderr
    bad = tmp_path / "bad"
    (bad / "f" / "1").mkdir(parents=True)
    (bad / "f" / "1" / "input_descriptor.pkl").write_bytes(b"\x80\x04not a pickle")
    report = import_path(bad, str(tmp_path / "s2"))
    assert report.calls == 0 and any("cannot read this pickle" in n for n in report.notes)
    runs = tmp_path / "runs"
    (runs / "exp1").mkdir(parents=True)
    (runs / "exp1" / "information.json").write_text("[" * 100_000 + "]" * 100_000)
    (runs / "exp2").mkdir()
    (runs / "exp2" / "information.json").write_text('{"commit": null, "k": 1}')
    report = import_path(runs, str(tmp_path / "s4"))
    assert report.runs == 1 and any("exp1 not imported" in n and "not JSON" in n for n in report.notes)
    with pytest.raises(ImportSourceError, match="casmon store already"):
        import_path(tmp_path / "s2", str(tmp_path / "s3"))


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")  # no git repository here
def test_run_folders_the_compat_layer_wrote_are_not_imported_twice(tmp_path, monkeypatch):
    """Old FineCache folders next to folders casmon.compat wrote: importing the base folder adds only the old ones."""
    base = _finecache_folder(tmp_path, "fixture")  # test1-first and test2, made by FineCache itself
    monkeypatch.chdir(base.parent)
    from casmon.compat.finecache import FineCache, IncrementDir

    fc = FineCache(str(base))
    with fc.record_context(IncrementDir(str(base), "test"), comment="new") as info:
        info["k"] = 1
    assert (base / "test3-new" / "information.json").exists()
    report = import_path(base, fc.store)
    assert (report.runs, report.already) == (2, 1) and not report.renumbered
    assert sorted(r.name for r in casmon.list_runs(fc.store)) == ["test1-first", "test2", "test3-new"]


@pytest.mark.parametrize("proto", [0, 2, 4, 5])
def test_import_unpickler_loads_plain_data_and_calls_nothing_else(proto, tmp_path):
    import collections
    import datetime
    import decimal
    import io

    from casmon.compat.importer import Unresolved, _ImportUnpickler

    v = {"t": int, "a": np.arange(3), "s": {1, 2}, "c": 1 + 2j, "d": datetime.datetime(2020, 1, 1), "b": b"xy",
         "o": collections.OrderedDict(a=1), "dec": decimal.Decimal("1.5"), "f": np.float32(2.5),
         "obj": np.array([1, "x"], dtype=object), "fs": frozenset([1])}
    out = _ImportUnpickler(io.BytesIO(pickle.dumps(v, protocol=proto)), trust=False).load()
    assert out["t"] is int and out["s"] == {1, 2} and out["c"] == 1 + 2j and out["b"] == b"xy"
    assert np.array_equal(out["a"], np.arange(3)) and out["f"] == np.float32(2.5) and list(out["obj"]) == [1, "x"]
    assert out["d"] == v["d"] and out["o"] == v["o"] and out["dec"] == v["dec"] and out["fs"] == v["fs"]
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (e,) = _ImportUnpickler(io.BytesIO(pickle.dumps([Evil()], protocol=proto)), trust=False).load()
    assert isinstance(e, Unresolved) and e._qualname == "system" and not marker.exists()


def test_malformed_callmonitor_descriptors_are_reported_not_fatal(tmp_path):
    import inspect

    src = tmp_path / "call-monitor"

    def put(name, n, obj):
        (src / name / str(n)).mkdir(parents=True)
        (src / name / str(n) / "input_descriptor.pkl").write_bytes(pickle.dumps(obj))

    spec = inspect.FullArgSpec(["x"], None, None, 5, [], None, {})  # defaults is not a tuple
    put("f", 1, {"args": [], "kwargs": "not a dict", "argspec": spec})
    put("f", 2, ["not", "a", "dict"])
    put("g", 1, {"args": [], "kwargs": {}, "argspec": spec})
    put("h", 1, {"args": "xy", "kwargs": {}, "argspec": "not a spec"})
    report = import_path(src, str(tmp_path / "s"))
    assert report.calls == 1 and sum("not a callmonitor input descriptor" in n for n in report.notes) == 3
    log = casmon.load(str(tmp_path / "s"))
    assert log.get("g", 1) == ([], {}) and log.functions["g"].params == []
