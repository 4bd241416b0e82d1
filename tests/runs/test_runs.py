import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.runs import RunWarning, safe_target
from tests.conftest import ROOT, run_parallel, run_python
from tests.support.git import git



@pytest.fixture
def repo(tmp_path, monkeypatch):
    r = tmp_path / "project"
    r.mkdir()
    git(r, "init", "-q", "-b", "main")
    (r / "train.py").write_text("print('train')\n")
    (r / "config").mkdir()
    (r / "config" / "base.yaml").write_text("lr: 0.1\n")
    (r / ".gitignore").write_text("*.log\n")
    git(r, "add", ".")
    git(r, "commit", "-q", "-m", "first")
    monkeypatch.chdir(r)
    return r


def test_records_code_state_and_restores_byte_for_byte(repo, tmp_path):
    (repo / "train.py").write_text("print('train v2')\n")  # uncommitted edit
    (repo / "new_module.py").write_text("X = 1\n")  # untracked
    (repo / "weights.bin").write_bytes(bytes(range(256)) * 10)  # untracked binary
    (repo / "run.log").write_text("ignored\n")  # ignored: not in the patch
    (repo / "config" / "base.yaml").write_text("lr: 0.2\n")
    with casmon.record(comment="baseline", track=[r"config/.*\.yaml$"]) as run:
        run.info["accuracy"] = 0.93
    r = casmon.load_run("latest")
    g = r.manifest["git"]
    assert r.name == "1-baseline" and r.status == "ok"
    assert g["commit"] == git(repo, "rev-parse", "HEAD") and g["branch"] == "main" and g["dirty"]
    assert sorted(g["untracked"]) == ["new_module.py", "weights.bin"]
    patch = r.patch()
    assert b"GIT binary patch" in patch and b"train v2" in patch and b"run.log" not in patch
    assert b".casmon" not in patch, "the store's own folder is never recorded"
    assert r.file("config/base.yaml") == b"lr: 0.2\n"
    assert r.info() == {"accuracy": 0.93}
    out = casmon.restore("1-baseline", tmp_path / "restored")
    for rel in ["train.py", "new_module.py", "weights.bin", "config/base.yaml", ".gitignore"]:
        assert (out / rel).read_bytes() == (repo / rel).read_bytes(), rel
    assert not (out / "run.log").exists() and not (out / ".casmon").exists()
    with pytest.raises(FileExistsError, match="not empty"):
        casmon.restore("1", tmp_path / "restored")


def test_code_state_is_taken_at_the_start(repo):
    with casmon.record() as run:
        (repo / "train.py").write_text("print('edited during the run')\n")
    assert casmon.load_run(run.name).patch() == b""


def test_unchanged_tracked_files_cost_nothing(repo):
    (repo / "config" / "big.yaml").write_text("x: 1\n" * 100_000)
    with casmon.record(track=[r"\.yaml$"]):
        pass
    store = casmon.default_store()
    store.flush()
    before = store.stats()["chunk_bytes"]
    with casmon.record(track=[r"\.yaml$"]):
        pass
    runs = casmon.list_runs()
    assert runs[0].manifest["files"] == runs[1].manifest["files"]
    after = store.stats()["chunk_bytes"]
    assert after - before < 20_000  # manifests only, no second copy of the 500 kB file


def test_output_is_captured_and_progress_bars_collapse(repo):
    with casmon.record() as run:
        print("epoch 1")
        for i in range(1000):
            sys.stdout.write(f"\r{i / 10:.1f}%")
        print()
        print("to stderr", file=sys.stderr)
    out = casmon.load_run(run.name).output()
    assert out.splitlines() == ["epoch 1", "99.9%", "to stderr"]


def test_fd_capture_sees_subprocesses(repo, capfd):
    with casmon.record(capture_output="fd") as run:
        print("from python", flush=True)
        os.write(1, b"from the fd\n")
        subprocess.run(["echo", "from a subprocess"], check=True)
    out = casmon.load_run(run.name).output()
    assert "from python" in out and "from the fd" in out and "from a subprocess" in out
    shown = capfd.readouterr().out
    assert "from a subprocess" in shown, "still shown on the terminal"


def test_failed_run_is_recorded_and_reraised(repo):
    class Boom(Exception):
        pass

    with pytest.raises(Boom, match="bad step"):
        with casmon.record(comment="crash") as run:
            print("before the crash")
            raise Boom("bad step")
    r = casmon.load_run(run.name)
    assert r.status == "failed" and "Boom: bad step" in r.manifest["traceback"]
    assert "before the crash" in r.output()


def test_decorator_records_function_and_end(repo):
    @casmon.record(comment="fit")
    def fit(x):
        return x * 2

    assert fit(21) == 42
    r = casmon.load_run("latest")
    assert r.manifest["function"].endswith("fit") and r.manifest["end"] >= r.manifest["start"]
    assert fit(1) == 2
    assert [x.name for x in casmon.list_runs()] == ["1-fit", "2-fit"]


def test_outside_git_detached_and_no_commits(tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    plain.mkdir()
    monkeypatch.chdir(plain)
    (plain / "cfg.json").write_text("{}")
    with pytest.warns(RunWarning, match="not a git repository"):
        with casmon.record(track=[r"\.json$"]) as run:
            pass
    r = casmon.load_run(run.name)
    assert r.manifest["git"]["commit"] is None and not r.manifest["git"]["in_git"]
    assert r.file("cfg.json") == b"{}"
    out = casmon.restore(run.name, tmp_path / "plain-restored")
    assert (out / "cfg.json").read_bytes() == b"{}"

    fresh = tmp_path / "fresh"
    fresh.mkdir()
    git(fresh, "init", "-q")
    (fresh / "a.py").write_text("A = 1\n")
    monkeypatch.chdir(fresh)
    with pytest.warns(RunWarning, match="no commits"):
        with casmon.record() as run2:
            pass
    r2 = casmon.load_run(run2.name)
    assert r2.manifest["git"]["commit"] is None and b"A = 1" in r2.patch()
    out2 = casmon.restore(run2.name, tmp_path / "fresh-restored")
    assert (out2 / "a.py").read_text() == "A = 1\n"


def test_detached_head_and_huge_untracked_file(repo):
    git(repo, "checkout", "-q", "--detach")
    (repo / "huge.dat").write_bytes(b"\0" * 2000)
    with pytest.warns(RunWarning, match="huge.dat"):
        with casmon.record(untracked_max=1000) as run:
            pass
    g = casmon.load_run(run.name).manifest["git"]
    assert g["branch"] is None and "detached HEAD" in g["notes"] and g["skipped"] == ["huge.dat"]


def test_bad_regex_fails_before_the_run(repo):
    ran = []
    with pytest.raises(ValueError, match=r"track='\(unclosed' is not a valid regular expression"):
        with casmon.record(track=["(unclosed"]):
            ran.append(1)
    assert not ran
    with pytest.raises(casmon.CasmonError, match="no such folder"):  # no store was made, and reading makes none
        casmon.list_runs()


def test_concurrent_runs_get_distinct_numbers(repo):
    code = textwrap.dedent(
        """
        import casmon, time, sys
        with casmon.record(comment="w" + sys.argv[1]) as run:
            time.sleep(0.2)
        """
    )
    run_parallel([["-c", code, str(i)] for i in range(4)], cwd=repo)
    runs = casmon.list_runs()
    assert sorted(r.manifest["n"] for r in runs) == [1, 2, 3, 4]


def test_prefix_and_finecache_parameter_names(repo):
    class IncrementDir:  # FineCache's: only its dir_prefix matters here
        dir_prefix = "exp"

    with casmon.record_context(increment_dir=IncrementDir(), comment="a", tracking_files=[r"\.yaml$"], save_output=False) as run:
        print("not captured")
    with casmon.record(prefix="exp") as run2:
        pass
    assert (run.name, run2.name) == ("exp1-a", "exp2")
    r = casmon.load_run("exp1-a")
    assert r.manifest.get("output") is None and "config/base.yaml" in r.manifest["files"]
    with pytest.raises(ValueError, match="prefix"):
        casmon.record(prefix="../x")


def test_secrets_are_not_recorded(repo, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "hunter2")
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    monkeypatch.setattr(sys, "argv", ["train.py", "--data", "s3://AKIA:hunter2@bucket/x"])
    with casmon.record() as run:
        pass
    m = casmon.load_run(run.name).manifest
    assert m["env"]["OMP_NUM_THREADS"] == "4" and "AWS_SECRET_ACCESS_KEY" not in m["env"]
    assert "hunter2" not in json.dumps(m)
    with pytest.raises(ValueError, match="secret"):
        casmon.record(env=["MY_API_KEY"])


def test_links_and_diff(repo):
    store = casmon.default_store()
    state = {"bias": 0.0}

    @casmon.cache(store=store)
    def prep(x):
        return x + 1

    @casmon.intercept(store=store)
    def score(x):
        return x * 2 + state["bias"]

    with casmon.record(comment="a", track=[r"\.yaml$"]) as a:
        prep(1)
        score(3)
        a.info["seed"] = 1
    (repo / "config" / "base.yaml").write_text("lr: 0.5\n")
    (repo / "config" / "extra.yaml").write_text("x: 1\n")
    state["bias"] = 1.0  # the same inputs now give another result
    with casmon.record(comment="b", track=[r"\.yaml$"]) as b:
        prep(1)
        score(3)
        b.info["seed"] = 2
    ra = casmon.load_run(a.name)
    assert [(c["fn"].endswith("prep"), c["hit"]) for c in ra.manifest["links"]["cache"]] == [(True, False)]
    d = casmon.diff(a.name, b.name)
    assert d["commit"]["same"] and not d["patch"]["same"]
    assert d["files"] == {"added": ["config/extra.yaml"], "removed": [], "changed": ["config/base.yaml"]}
    assert d["info"] == {"seed": {"a": 1, "b": 2}}
    fns = {r["function"].rsplit(".", 1)[-1] for r in d["results"]}
    assert fns == {"score"}, d["results"]  # prep was a hit (same result); score changed
    assert casmon.diff(a.name, a.name)["same_manifest"]


def test_safe_paths(tmp_path):
    root = tmp_path / "t"
    root.mkdir()
    for bad in ["../escape", "/etc/passwd", "a/../../x", "C:/x", "a\\..\\..\\x"]:
        with pytest.raises(ValueError, match="escape"):
            safe_target(root, bad)
    with pytest.raises(ValueError, match="not a file name"):
        safe_target(root, "")
    for vcs in [".git/config", ".GIT/hooks/post-checkout", "sub/.git/HEAD", ".git", ".Git./config", "x/.hg/hgrc",
                ".svn/entries", "GIT~1/config", ".g\u200cit/config", ".git::$INDEX_ALLOCATION/config", "a\\.git\\config"]:
        with pytest.raises(casmon.CasmonError, match="version-control"):
            safe_target(root, vcs)
    for fine in [".gitignore", ".github/workflows/ci.yml", "git/config", "src/.gitattributes", "a.git/x"]:
        assert safe_target(root, fine) == root / fine
    (tmp_path / "elsewhere").mkdir()
    (root / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="symlink"):
        safe_target(root, "link/file")
    assert safe_target(root, "ok/file.txt") == root / "ok" / "file.txt"


def test_export_and_cli(repo, tmp_path):
    with casmon.record(comment="cli", track=[r"\.yaml$"]) as run:
        print("hello")
        run.info["note"] = "x"
        run.info["obj"] = {1, 2}  # not JSON: stored as a value
    from tests.cli.test_cli import cli

    store = str(repo / ".casmon")
    out = cli("runs", "--store", store).stdout
    assert "1-cli" in out and "ok" in out
    out = cli("show", "1-cli", "--store", store).stdout
    assert "hello" in out and "config/base.yaml" in out and "info note = 'x'" in out
    assert "info obj = {1, 2}" in out
    cli("export", "1", str(tmp_path / "exported"), "--store", store)
    info = json.loads((tmp_path / "exported" / "information.json").read_text())
    assert info["commit"] == git(repo, "rev-parse", "HEAD") and info["project_root"] == str(repo)
    assert info["tracking_records"] == {r"\.yaml$": [str(repo / "config" / "base.yaml")]} and info["note"] == "x"
    assert "patch_time" in info
    assert (tmp_path / "exported" / "console.log").read_text() == "hello\n"
    assert (tmp_path / "exported" / "config" / "base.yaml").read_text() == "lr: 0.1\n"
    cli("restore", "1-cli", str(tmp_path / "restored"), "--store", store)
    assert (tmp_path / "restored" / "train.py").read_text() == "print('train')\n"
    with casmon.record(comment="second"):
        pass
    out = cli("diff", "1", "2", "--store", store).stdout
    assert "1-cli" in out and "2-second" in out and "tracked file removed: config/base.yaml" in out
    bad = cli("show", "nope", "--store", store, check=False)
    assert bad.returncode != 0 and "no function or run named 'nope'" in bad.stderr


def test_runnable_example(repo):
    example = ROOT / "docs" / "examples" / "record_run.py"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, str(example), str(repo / ".casmon")], capture_output=True, text=True, env=env,
                       cwd=repo, timeout=300, check=True)
    assert "recorded run 1-baseline" in p.stdout and "['final_loss', 'weights']" in p.stdout
    r = casmon.load_run("1-baseline", str(repo / ".casmon"))
    assert "epoch 2" in r.output() and "config/base.yaml" in r.manifest["files"]


def test_diff_pairs_only_each_runs_own_calls(repo):
    """Runs recorded in one process share a call-log session: a diff compares the calls made *during* each run."""
    store = casmon.default_store()
    state = {"bias": 0.0}

    @casmon.intercept(store=store)
    def score(x):
        return x * 2 + state["bias"]

    with casmon.record(comment="a") as a:
        score(3)
    state["bias"] = 1.0
    with casmon.record(comment="b") as b:
        score(3)  # another result for the same input, in another run
    state["bias"] = 0.0
    with casmon.record(comment="c") as c:
        score(3)
    assert {r["function"].rsplit(".", 1)[-1] for r in casmon.diff(a.name, b.name)["results"]} == {"score"}
    assert casmon.diff(a.name, c.name)["results"] == []  # a and c returned the same; b's call is not theirs


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_record_context_takes_item_assignment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with casmon.record_context(comment="fc", store=str(tmp_path / "s"), save_output=False) as info:
        info["accuracy"] = 0.9
        info["weights"] = np.ones(3)
        assert info["accuracy"] == 0.9 and "weights" in info
    r = casmon.load_run("latest", str(tmp_path / "s"))
    assert r.info()["accuracy"] == 0.9 and r.info()["weights"].tolist() == [1, 1, 1]


def test_track_env_and_tracking_files_given_as_one_string_are_one_pattern_or_name(repo, monkeypatch):
    monkeypatch.setenv("MY_VAR", "7")
    monkeypatch.setenv("M", "letter")
    with casmon.record(track=r"config/base\.yaml$", env="MY_VAR") as run:
        pass
    m = casmon.load_run(run.name).manifest
    assert list(m["files"]) == ["config/base.yaml"]  # "." alone would have matched train.py and .gitignore
    assert m["env"]["MY_VAR"] == "7" and "M" not in m["env"]
    with casmon.record_context(tracking_files=r"\.py$") as run2:
        pass
    assert list(casmon.load_run(run2.name).manifest["files"]) == ["train.py"]


def test_a_run_in_a_store_opened_read_only_is_refused_before_its_body_runs(repo):
    casmon.open(repo / "s").close()
    ran = []
    with pytest.raises(casmon.StoreError, match="read-only"):
        with casmon.record(store=casmon.open(repo / "s", read_only=True)):
            ran.append(1)
    assert ran == []


def test_a_run_in_a_zip_store_warns_nothing_and_reads_back_as_ended(repo):
    """A run's ref is written again as it ends; a zip archive keeps both entries and reads the last, and zipfile's
    "Duplicate name" warning is casmon's business, not the user's."""
    p = repo / "runs.zip"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with casmon.record(store=p, capture_output=False) as run:
            run.log(loss=1.0)
        casmon.default_store(p).close()
    assert [str(w.message) for w in caught if "zipfile" in w.filename] == []
    out = run_python(f"import casmon; r = casmon.load_run({run.name!r}, store={str(p)!r}); print(r.status)")
    assert out.stdout.split() == ["ok"]


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_diff_of_a_script_run_and_a_notebook_run_shows_no_kernel_command_line(tmp_path, monkeypatch):
    from casmon.runs import recorder

    monkeypatch.chdir(tmp_path)  # outside this repository: its patch would hold this test's text
    store = str(tmp_path / "s")
    with casmon.record(store=store, capture_output=False, system_metrics=False) as script:
        pass
    monkeypatch.setattr(recorder, "notebook_path", lambda: "/work/train.ipynb")
    monkeypatch.setattr(sys, "argv", ["/venv/ipykernel_launcher.py", "-f", "/tmp/tmpab12.json"])
    with casmon.record(store=store, capture_output=False, system_metrics=False) as nb:
        pass
    meta = casmon.diff(script.name, nb.name, store=store)["meta"]
    assert meta["notebook"] == {"a": None, "b": "/work/train.ipynb"}
    assert meta["argv"]["b"] is None  # the notebook line says where it ran; the kernel's argv names a temporary file
    assert "ipykernel_launcher" not in str(casmon.diff(script.name, nb.name, store=store))


@pytest.mark.filterwarnings("ignore::casmon.RunWarning")
def test_another_casmon_store_inside_the_repository_is_not_in_the_patch(repo):
    # joblib's Memory("cachedir") keeps a store in cachedir/casmon; a second store beside the default one
    other = casmon.open(repo / "cachedir" / "casmon")
    other.put(b"x" * 1000)
    other.close()
    (repo / "mine").mkdir()
    (repo / "mine" / "casmon.json").write_text("{}\n")  # the user's own file of that name, no store
    with casmon.record(capture_output=False, system_metrics=False) as run:
        pass
    info = casmon.load_run(run.name)
    assert info.manifest["git"]["untracked"] == ["mine/casmon.json"]
    assert b"cachedir" not in info.patch()
