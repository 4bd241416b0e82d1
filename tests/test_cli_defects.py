"""The command line as a new user meets it (issue 17): previews that match, no surprise writes,
replay of a script's functions, messages that say what to do."""

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.errors import StoreError

ROOT = Path(__file__).resolve().parent.parent
# runs recorded in tmp folders outside git say so; that is not what these tests look at
pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


class Ran:
    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(*args, cwd=None, check=True):
    """`casmon ARGS` in this process (click's runner: no interpreter start-up, so many calls stay cheap)."""
    from click.testing import CliRunner

    from casmon.cli.app import main

    old = os.getcwd()
    os.chdir(cwd or old)
    try:
        r = CliRunner().invoke(main, list(args), env={"CASMON_STORE": None})
    finally:
        os.chdir(old)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    ran = Ran(r.exit_code, r.stdout, r.stderr)
    if check and ran.returncode != 0:
        raise AssertionError(f"casmon {' '.join(args)} failed ({ran.returncode}):\n{ran.stdout}\n{ran.stderr}")
    return ran


def cli_process(*args, cwd=None, check=True):
    """`casmon ARGS` in a process of its own (for replay, which imports the user's code)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.pop("CASMON_STORE", None)
    p = subprocess.run([sys.executable, "-m", "casmon.cli", *args], capture_output=True, text=True, env=e, cwd=cwd,
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"casmon {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def tree(path: Path) -> dict:
    """Every file under path with its bytes: what "changed nothing" is checked against."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def cached_store(path: Path) -> None:
    """A store with cache entries of two functions: large results (loose objects) and small ones (packed)."""
    s = casmon.open(path)

    @casmon.cache(store=s)
    def big(i):
        return np.random.default_rng(i).random(40_000)  # 320 KB: loose

    @casmon.cache(store=s)
    def small(i):
        return np.full(50, float(i))  # packed

    for i in range(6):
        big(i)
        small(i)
    for i in range(6, 12):
        small(i)
    s.close()


# -- 1. gc --dry-run previews exactly what the real run does ----------------------------------------------

REPORT = ("evicted_entries", "evicted_bytes", "deleted_objects", "deleted_bytes", "repacked_packs", "deleted_packs",
          "unreachable", "condemned", "waiting", "live_values")


@pytest.mark.parametrize("limits", [["--max-size", "700K"], ["--older-than", "0s"], ["--max-size", "1M", "--older-than", "30d"]])
def test_gc_dry_run_with_eviction_equals_the_real_run(tmp_path, limits):
    st = tmp_path / "s"
    cached_store(st)
    before = tree(st)
    dry = json.loads(cli("gc", "--store", str(st), "--now", "--dry-run", "--json", *limits).stdout)
    assert tree(st) == before, "a dry run changes nothing"
    assert dry["evicted_entries"] > 0 and dry["deleted_objects"] > 0 and dry["deleted_bytes"] > 0
    real = json.loads(cli("gc", "--store", str(st), "--now", "--json", *limits).stdout)
    assert {k: dry[k] for k in REPORT} == {k: real[k] for k in REPORT}
    assert "store is sound" in cli("verify", "--store", str(st)).stdout


def test_gc_dry_run_text_lists_the_eviction_and_the_condemned(tmp_path):
    st = tmp_path / "s"
    cached_store(st)
    out = cli("gc", "--store", str(st), "--dry-run", "--max-size", "700K").stdout
    assert "would drop" in out and "tests.test_cli_defects" in out or "big" in out
    dry = json.loads(cli("gc", "--store", str(st), "--dry-run", "--json", "--max-size", "700K").stdout)
    real = json.loads(cli("gc", "--store", str(st), "--json", "--max-size", "700K").stdout)
    # with the grace period the real run condemns what the eviction made unreachable; the preview says how many
    assert real["condemned"] == dry["condemned"] > 0 and real["deleted_objects"] == dry["deleted_objects"] == 0


def test_cache_clear_then_gc_frees_the_space_as_the_message_says(tmp_path):
    st = tmp_path / "s"
    cached_store(st)
    out = cli("cache", "clear", "big", "--store", str(st)).stdout
    assert "gc --now" in " ".join(out.split()) and "grace" in out
    rep = json.loads(cli("gc", "--now", "--json", "--store", str(st)).stdout)
    assert rep["evicted_entries"] == 6 and rep["deleted_bytes"] >= 6 * 300_000


def test_gc_now_and_grace_conflict_and_help_texts(tmp_path):
    st = tmp_path / "s"
    cached_store(st)
    r = cli("gc", "--now", "--grace", "5", "--store", str(st), check=False)
    assert r.returncode == 2 and "--now" in r.stderr and "--grace" in r.stderr
    for cmd in ("gc", "runs", "diff"):
        h = " ".join(cli(cmd, "--help").stdout.split())
        assert "--json" in h and "JSON" in h.split("--json", 1)[1][:80], cmd
    assert "CASMON_STORE" in cli("stats", "--help").stdout


# -- 2. no surprise writes ---------------------------------------------------------------------------------


def test_verbs_never_create_a_store_at_a_mistyped_path(tmp_path):
    typo = tmp_path / "typo"
    for args in (["gc"], ["gc", "--dry-run"], ["gc", "--now"], ["cache", "clear", "f"], ["verify", "--repair"],
                 ["stats"], ["verify"], ["calls"], ["runs"], ["show", "x"], ["cache"]):
        r = cli(*args, "--store", str(typo), check=False)
        assert r.returncode == 1 and "no such folder" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not typo.exists(), args
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("gc", "--store", str(empty), check=False)
    assert r.returncode == 1 and "no casmon store" in r.stderr and list(empty.iterdir()) == []
    r = cli("gc", "--store", str(tmp_path / "missing.zip"), check=False)
    assert r.returncode == 1 and not (tmp_path / "missing.zip").exists()


def test_a_file_is_never_modified_unless_it_is_a_casmon_zip_store(tmp_path):
    notzip = tmp_path / "notes.zip"
    notzip.write_text("my notes, not a zip\n")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("holiday.txt", "photos")
    plain = tmp_path / "data.txt"
    plain.write_text("data")
    for f in (notzip, other, plain):
        before = f.read_bytes()
        for args in (["gc"], ["gc", "--now"], ["cache", "clear", "f"], ["verify", "--repair"], ["stats"]):
            r = cli(*args, "--store", str(f), check=False)
            assert r.returncode == 1 and "Traceback" not in r.stderr, (f, args, r.stderr)
        with pytest.raises(casmon.CasmonError):  # the library refuses too, writing or not
            casmon.open(f)
        assert f.read_bytes() == before, f
    # a casmon zip store is opened and written as always
    z = casmon.open(tmp_path / "ok.zip")
    z.set_ref("x", z.put([1, 2]))
    z.close()
    assert json.loads(cli("stats", "--json", "--store", str(tmp_path / "ok.zip")).stdout)["refs"] == 1


def test_readers_create_nothing_and_writers_still_make_stores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("typo", "typo.zip", str(tmp_path / "deep" / "typo")):
        with pytest.raises(StoreError, match="no such"):
            casmon.load(path)
        with pytest.raises(StoreError, match="no such"):
            casmon.load_run("latest", path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no casmon store"):
        casmon.load("empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and not any((tmp_path / "empty").iterdir())
    # writing still makes a store where there is none: casmon.open, the default store, the decorators
    code = (
        "import casmon\n"
        "@casmon.intercept\n"
        "def f(x): return x + 1\n"
        "@casmon.cache\n"
        "def g(x): return x * 2\n"
        "f(1); g(2)\n"
        "log = casmon.load()\n"  # the default store, open in this process, is read as it is
        "assert log.result('f', 1) == 2, log\n"
        "s = casmon.open('made/here'); s.set_ref('x', s.put(1)); s.close()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / ".casmon" / "casmon.json").exists() and (tmp_path / "made" / "here" / "casmon.json").exists()
    assert casmon.load(".casmon").result("f", 1) == 2


# -- 3. replay of a function from a script run as `python x.py` ---------------------------------------------


def test_replay_the_readme_call_log_example(tmp_path):
    shutil.copy(ROOT / "docs" / "examples" / "call_log.py", tmp_path / "call_log.py")
    p = subprocess.run([sys.executable, "call_log.py", "st"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    script = str(tmp_path / "call_log.py")
    assert casmon.load(tmp_path / "st").sessions[1]["main"] == {"script": script}
    before = sorted(os.listdir(tmp_path)), tree(tmp_path / "st")

    r = cli_process("replay", "normalise", "2", "--store", "st", cwd=tmp_path, check=False)
    assert r.returncode == 1 and script in r.stderr and "--import-main" in r.stderr, "it says how to vouch for the script"
    r = cli_process("replay", "normalise", "2", "--store", "st", "--import-main", cwd=tmp_path)
    assert "same result as recorded" in r.stdout and script in r.stderr
    r = cli_process("replay", "normalise", "3", "--store", "st", "--import", "call_log.py", cwd=tmp_path)
    assert "same result as recorded" in r.stdout
    # the script's `if __name__ == "__main__"` block did not run: no new session, no store made from argv
    assert (sorted(os.listdir(tmp_path)), tree(tmp_path / "st")) == before

    os.rename(tmp_path / "call_log.py", tmp_path / "moved.py")
    r = cli_process("replay", "normalise", "2", "--store", "st", "--import-main", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "no such file" in r.stderr


def test_replay_import_main_runs_the_top_level_not_the_main_block(tmp_path):
    (tmp_path / "job.py").write_text(
        "import pathlib, casmon\n"
        "pathlib.Path('top-level-ran').write_text('x')\n"
        "@casmon.intercept(store='st')\n"
        "def step(x):\n"
        "    return x * 3\n"
        "if __name__ == '__main__':\n"
        "    pathlib.Path('main-block-ran').write_text('x')\n"
        "    step(2)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, timeout=120).returncode == 0
    (tmp_path / "top-level-ran").unlink()
    (tmp_path / "main-block-ran").unlink()
    assert "same result" in cli_process("replay", "step", "1", "--store", "st", "--import-main", cwd=tmp_path).stdout
    assert (tmp_path / "top-level-ran").exists() and not (tmp_path / "main-block-ran").exists()


def test_a_recorded_main_path_is_data(tmp_path):
    """A store can name any path as its __main__: only an absolute .py path is offered, and only on request."""
    from casmon.cli.app import _recorded_main

    class Log:
        sessions = {1: {"main": {"script": "relative.py"}}, 2: {"main": {"script": "/etc/passwd"}},
                    3: {"main": "x"}, 4: {"main": {"script": ["/a.py"]}}, 5: {"main": {"script": "/abs/ok.py"}}, 6: {}}

    assert [_recorded_main(Log, n) for n in range(1, 8)] == [None, None, None, None, "/abs/ok.py", None, None]


# -- 4. show NAME without N; README's RUN forms -------------------------------------------------------------


def test_show_a_function_name_without_a_call_number(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.intercept(store=s)
    def step(x):
        return x

    step(1)
    step(2)
    s.close()
    r = cli("show", "step", "--store", str(tmp_path / "s"), check=False)
    assert r.returncode == 1
    msg = " ".join(r.stderr.split())
    assert "'step' is a logged function" in msg and "casmon show step N" in msg and "calls 1-2" in msg
    assert "step call 2" in cli("show", "step", "2", "--store", str(tmp_path / "s")).stdout
    r = cli("show", "nothing", "--store", str(tmp_path / "s"), check=False)
    assert r.returncode == 1 and "no runs recorded" in r.stderr


def test_run_names_as_the_readme_says(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    st = tmp_path / "s"
    with casmon.record(comment="base", store=str(st), capture_output=False):
        pass
    with casmon.record(comment="lr", store=str(st), capture_output=False, prefix="exp"):
        pass
    for which, name in (("1", "1-base"), ("1-base", "1-base"), ("exp1", "exp1-lr"), ("exp1-lr", "exp1-lr"),
                        ("latest", "exp1-lr")):
        assert f"run {name}" in cli("show", which, "--store", str(st)).stdout, which
    assert "`exp3` with `prefix=\"exp\"`" in (ROOT / "README.md").read_text()


# -- 5. diff of stored info values ---------------------------------------------------------------------------


def test_diff_says_how_arrays_differ_and_tells_pickles_apart_by_digest(tmp_path, monkeypatch):
    import collections

    monkeypatch.chdir(tmp_path)
    st = str(tmp_path / "s")
    w = np.linspace(0, 1, 8)
    w2 = w.copy()
    w2[[1, 5, 6]] += [0.5, -0.25, 0.125]
    for weights, shape, od in ((w, np.zeros((2, 3)), collections.OrderedDict(a=1)),
                               (w2, np.zeros((3, 3), dtype=np.float32), collections.OrderedDict(a=2))):
        with casmon.record(store=st, capture_output=False) as run:
            run.info["weights"] = weights
            run.info["grid"] = shape
            run.info["od"] = od
            run.info["same"] = np.arange(10)
    out = " ".join(cli("diff", "1", "2", "--store", st).stdout.split())
    assert "info weights:" in out and "3 of 8 elements differ, max abs difference 0.5" in out
    assert "shape (2, 3) -> (3, 3), dtype float64 -> float32" in out
    assert "info same" not in out
    od = out.split("info od:", 1)[1]
    assert "needs collections.OrderedDict" in od and "(digest " in od, "a pickle is described and told apart by digest"
    d = json.loads(cli("diff", "1", "2", "--store", st, "--json").stdout)
    assert d["info"]["weights"]["how"].startswith("3 of 8 elements differ")


# -- 7. warnings point at the user's line --------------------------------------------------------------------


GLOBAL_CONN = sqlite3.connect(":memory:", check_same_thread=False)


def test_cache_warnings_point_at_the_callers_line(tmp_path):
    from casmon.caching.memoize import KIND_FN, name_digest
    from casmon.keys.codeversion import function_name

    s = casmon.open(tmp_path / "s")

    @casmon.cache(store=s)
    def takes(x, lock):
        return x

    @casmon.cache(store=s)
    def reads_global(x):
        return GLOBAL_CONN.execute("select ?", (x,)).fetchone()[0]

    @casmon.cache(store=s)
    def changed(x):
        return x

    name = function_name(changed)  # results of an older version of `changed` were cached
    s.append(KIND_FN, {"fn": name, "version": "0" * 32, "time": 1.0}, key=name_digest(name))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        takes(1, threading.Lock())
        reads_global(1)
        changed(1)
    cw = [w for w in got if issubclass(w.category, casmon.CacheWarning)]
    texts = " | ".join(str(w.message) for w in cw)
    assert len(cw) == 3, texts
    assert all(w.filename == __file__ for w in cw), [(w.filename, w.lineno) for w in cw]
    assert "ignore=['lock']" in texts and "hashers={'lock'" in texts
    assert "gc --now" in texts
    s.close()


# -- 8. record_context: info["k"] = v ---------------------------------------------------------------------


def test_record_context_takes_item_assignment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with casmon.record_context(comment="fc", store=str(tmp_path / "s"), save_output=False) as info:
        info["accuracy"] = 0.9
        info["weights"] = np.ones(3)
        assert info["accuracy"] == 0.9 and "weights" in info
    r = casmon.load_run("latest", str(tmp_path / "s"))
    assert r.info()["accuracy"] == 0.9 and r.info()["weights"].tolist() == [1, 1, 1]


# -- 9. grammar ------------------------------------------------------------------------------------------------


def test_counts_agree_with_their_nouns(tmp_path):
    s = casmon.open(tmp_path / "s")

    @casmon.intercept(store=s)
    def only(x):
        return x

    only(1)
    s.set_ref("r", s.put(1))
    s.close()
    out = cli("calls", "--store", str(tmp_path / "s")).stdout
    assert "1 function, 1 session" in out and "sessions" not in out.splitlines()[0]
    assert "1 call" in cli("calls", "only", "--store", str(tmp_path / "s")).stdout
    one_plural = re.compile(r"(?<![\d,.])1 (\w+ )?(packs|values|refs|records|objects|files|functions|sessions|calls)\b")
    v = cli("verify", "--store", str(tmp_path / "s")).stdout
    assert "1 pack," in v and not one_plural.search(v), v
    g = cli("gc", "--store", str(tmp_path / "s")).stdout
    assert "live value" in g and not one_plural.search(g), g
