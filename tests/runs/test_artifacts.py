"""What runs keep: artifacts, files and folders, checkpoints with retention, deleting a run, gc racing saves."""

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import casmon
from casmon.errors import CasmonError, MissingObjectError
from casmon.runs.artifacts import drop_superseded
from tests.support.processes import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def test_saved_values_files_and_folders_read_back_with_names_modes_and_sizes(store, tmp_path):
    f = tmp_path / "notes.txt"
    f.write_bytes(b"hello")
    os.chmod(f, 0o640)
    folder = tmp_path / "plots"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.png").write_bytes(b"A" * 100)
    (folder / "sub" / "run.sh").write_bytes(b"#!/bin/sh\n")
    os.chmod(folder / "sub" / "run.sh", 0o755)
    with casmon.record(store=store, capture_output=False) as run:
        run.save("weights", np.arange(1000.0))
        run.save("table", {"a": [1, 2, 3]})
        run.save_file(f)
        run.save_file(folder, "figures/plots")
    r = casmon.load_run("latest", store)
    arts = {a["name"]: a for a in r.artifacts()}
    assert set(arts) == {"weights", "table", "notes.txt", "figures/plots"}
    assert arts["weights"]["kind"] == "value" and arts["weights"]["size"] == 8000 and 0 < arts["weights"]["stored"]
    assert arts["notes.txt"]["kind"] == "file" and arts["notes.txt"]["size"] == 5
    assert arts["figures/plots"]["kind"] == "folder" and arts["figures/plots"]["files"] == 2
    assert arts["figures/plots"]["size"] == 110
    np.testing.assert_array_equal(r.load("weights"), np.arange(1000.0))
    assert r.load("table") == {"a": [1, 2, 3]} and r.load("notes.txt") == b"hello"
    out = r.load_file("notes.txt", tmp_path / "back.txt")
    assert out.read_bytes() == b"hello" and oct(out.stat().st_mode & 0o777) == oct(0o640)
    dest = r.load_file("figures/plots", tmp_path / "restored")
    assert (dest / "a.png").read_bytes() == b"A" * 100
    assert (dest / "sub" / "run.sh").stat().st_mode & 0o777 == 0o755


def test_saving_under_a_name_again_replaces_it(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
        run.save("x", 2)
    r = casmon.load_run("latest", store)
    assert r.load("x") == 2 and [a["name"] for a in r.artifacts()] == ["x"]


@pytest.mark.parametrize("name,why", [("", "empty"), ("   ", "empty"), ("/etc/passwd", "absolute"),
                                      ("a/../b", "'..'"), ("..", "'..'"), ("x" * 300, "too long"),
                                      ("C:/x", "absolute"), ("a\nb", "control")])
def test_a_bad_artifact_name_is_a_one_line_error_naming_it(store, name, why):
    with casmon.record(store=store, capture_output=False) as run:
        with pytest.raises(ValueError, match=why) as e:
            run.save(name, 1)
        assert "\n" not in str(e.value).replace(repr(name), "") and "artifact name" in str(e.value)
        with pytest.raises(ValueError, match=why):
            run.save_file(__file__, name)
        with pytest.raises(ValueError, match="must be a string"):
            run.save(3, 1)


def test_an_unknown_artifact_is_a_lookup_error_that_lists_the_others(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("model", 1)
    with pytest.raises(LookupError, match="no artifact 'modle'.*model"):
        casmon.load_run("latest", store).load("modle")


def test_checkpoints_keep_the_last_k_and_every_nth_and_latest_is_the_highest_step(store, tmp_path):
    with casmon.record(store=store, capture_output=False, keep_last=2, keep_every=5) as run:
        for step in range(12):
            run.checkpoint({"w": np.full(100, step)}, step=step)
    r = casmon.load_run("latest", store)
    kept = sorted(a["step"] for a in r.artifacts() if a["kind"] == "checkpoint")
    assert kept == [0, 5, 10, 11]
    assert r.checkpoint()["w"][0] == 11 and r.checkpoint(5)["w"][0] == 5
    with pytest.raises(LookupError, match="no checkpoint at step 3"):
        r.checkpoint(3)


def test_checkpoint_retention_given_per_call_wins_and_steps_count_up_by_default(store):
    with casmon.record(store=store, capture_output=False) as run:
        for _ in range(4):
            run.checkpoint(b"state")
        run.checkpoint(b"last", keep_last=1)
        with pytest.raises(ValueError, match="keep_last"):
            run.checkpoint(b"x", keep_last=0)
    r = casmon.load_run("latest", store)
    assert [a["step"] for a in r.artifacts()] == [4] and r.checkpoint() == b"last"


def test_released_checkpoints_are_freed_by_gc_and_kept_ones_stay(store, min_grace):
    min_grace(0.2)
    with casmon.record(store=store, capture_output=False, keep_last=1) as run:
        digests = [run.checkpoint(np.full(1000, step, dtype=np.int64), step=step).digest for step in range(3)]
    assert drop_superseded(store) == 2  # the saves of steps 0 and 1: their releases are now the newest records
    for _ in range(2):
        store.gc(grace=0.2)
        time.sleep(0.3)
    store.gc(grace=0.2)
    for d in digests[:2]:
        with pytest.raises(MissingObjectError):
            store.get(d)
    assert casmon.load_run("latest", store).checkpoint()[0] == 2


def test_deleting_a_run_frees_what_only_it_held_and_keeps_what_another_run_shares(store, min_grace):
    min_grace(0.2)
    shared = np.arange(5000)
    with casmon.record(store=store, capture_output=False, comment="a") as a:
        a.save("shared", shared)
        only_a = a.save("mine", np.arange(7000.0)).digest
        a.log(loss=1.0)
    with casmon.record(store=store, capture_output=False, comment="b") as b:
        kept = b.save("shared", shared).digest
    gone = casmon.delete_run("1-a", store=store)
    assert gone.name == "1-a" and gone.artifacts == 2
    assert [r.name for r in casmon.list_runs(store)] == ["2-b"]
    store.gc(grace=0.2)
    time.sleep(0.3)
    store.gc(grace=0.2)
    with pytest.raises(MissingObjectError):
        store.get(only_a)
    np.testing.assert_array_equal(store.get(kept), shared)
    np.testing.assert_array_equal(casmon.load_run("2-b", store).load("shared"), shared)
    rep = store.verify()
    assert rep.ok, (rep.damaged, rep.missing)


def test_a_running_run_is_not_deleted_unless_forced(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
        with pytest.raises(CasmonError, match="is running.*force"):
            casmon.delete_run(run, store=store)
        assert casmon.delete_run(run.name, store=store, dry_run=True, force=True).records >= 1
        assert casmon.list_runs(store)
    casmon.delete_run(run.name, store=store)
    assert not casmon.list_runs(store)


WRITER = textwrap.dedent("""
    import sys, numpy as np, casmon
    store = casmon.open(sys.argv[1])
    with casmon.record(store=store, capture_output=False) as run:
        for i in range(int(sys.argv[2])):
            run.save(f"a{i}", np.full(2000, i, dtype=np.int64))
            if i % 5 == 0:
                run.checkpoint(np.full(500, i), step=i, keep_last=2)
            if i % 20 == 0:  # a large file, kept in content-defined pieces
                with open(sys.argv[1] + ".bin", "wb") as f:
                    f.write(np.random.default_rng(i).bytes(5 << 20))
                run.save_file(sys.argv[1] + ".bin", name=f"f{i}")
    store.close()
""")


def test_gc_racing_the_saves_at_the_shortest_grace_loses_no_artifact(tmp_path, min_grace, figures):
    min_grace(0.3)
    path = tmp_path / "s"
    casmon.open(path, create=True).close()
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    n = 60
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CASMON_MIN_GRACE": "0.3"}
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(n)], env=env, stderr=subprocess.PIPE)
    gcs = 0
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        s = casmon.open(path)
        try:
            s.gc(grace=0.3)
            gcs += 1
        except casmon.StoreError:
            pass  # the writer's merge holds the lock a moment
        finally:
            s.close()
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()
    s = casmon.open(path)
    for _ in range(2):
        time.sleep(0.4)
        s.gc(grace=0.3)
    r = casmon.load_run("latest", s)
    for i in range(n):
        assert r.load(f"a{i}")[0] == i
    assert r.checkpoint()[0] == 55 and r.checkpoint(50)[0] == 50
    for i in range(0, n, 20):
        assert r.load(f"f{i}") == np.random.default_rng(i).bytes(5 << 20)
    figures("artifact race: gc runs", gcs)
    rep = s.verify()
    assert rep.ok, (rep.damaged, rep.missing)
    s.close()


def test_a_run_that_takes_a_deleted_runs_number_inherits_none_of_its_artifacts_or_metrics(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("old", 1)
        run.log(loss=1.0)
    casmon.delete_run("1", store=store)
    with casmon.record(store=store, capture_output=False) as run:
        run.save("new", 2)
    r = casmon.load_run("latest", store)
    assert r.name == "1" and [a["name"] for a in r.artifacts()] == ["new"] and not r.metrics()


def test_a_crafted_folder_listing_never_writes_outside_the_destination(store, tmp_path):
    from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key

    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
    evil = store.put(b"pwned")
    listing = store.put({"casmon_folder": 1, "files": {"../escaped.txt": {"digest": evil.hex(), "size": 5, "mode": 0o644}}})
    store.append(KIND_ARTIFACT, {"run": "runs/1", "name": "f", "kind": "folder", "digest": listing.hex(), "size": 5,
                                 "files": 1, "time": time.time(), "seq": 99}, key=artifacts_key("runs/1"), refs=[listing, evil])
    store.flush()
    with pytest.raises(CasmonError, match="escape"):
        casmon.load_run("1", store).load_file("f", tmp_path / "dest")
    assert not (tmp_path / "escaped.txt").exists()


def test_crafted_artifact_records_are_passed_over_not_raised_on(store):
    from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key

    with casmon.record(store=store, capture_output=False) as run:
        run.save("good", 1)
    for rec in ({"run": "runs/1", "name": "bad", "kind": 3, "digest": "zz", "size": "big"},
                {"run": "runs/1", "name": ["x"]}, {"run": "runs/1", "name": "t", "kind": "value", "time": "soon"}):
        store.append(KIND_ARTIFACT, rec, key=artifacts_key("runs/1"))
    store.flush()
    assert [a["name"] for a in casmon.load_run("1", store).artifacts()] == ["good"]


def test_stored_size_counts_every_object_an_artifact_needs(store):
    data = os.urandom(3 << 20)  # incompressible: stored about as large as it is
    with casmon.record(store=store, capture_output=False) as run:
        run.save("blob", data)
    (a,) = casmon.load_run("latest", store).artifacts()
    assert a["size"] == len(data) and len(data) <= a["stored"] <= len(data) * 1.01


def test_a_checkpoint_of_a_lower_step_is_kept_when_saved_and_latest_stays_the_highest(store):
    with casmon.record(store=store, capture_output=False, keep_last=1) as run:
        run.checkpoint(b"ten", step=10)
        run.checkpoint(b"five", step=5)
    r = casmon.load_run("latest", store)
    assert r.checkpoint(5) == b"five" and r.checkpoint() == b"ten"


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork with the live thread running (3.12+)
def test_saving_after_the_run_ended_or_from_a_forked_child_is_a_clear_error(store):
    with casmon.record(store=store, capture_output=False) as run:
        if hasattr(os, "fork"):
            pid = os.fork()
            if pid == 0:
                try:
                    run.save("x", 1)
                except CasmonError as e:
                    os._exit(0 if "the process that records it" in str(e) else 2)
                os._exit(1)
            assert os.waitpid(pid, 0)[1] == 0
    with pytest.raises(CasmonError, match="has ended"):
        run.save("late", 1)
    assert not casmon.load_run("latest", store).artifacts()


@pytest.mark.parametrize("bad", ["zz/../../escaped.txt", ".", "sub/.", "/abs.txt", "nul\0.txt"])
def test_a_crafted_folder_listing_is_refused_before_any_file_is_written(store, tmp_path, bad):
    from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key
    from casmon.runs.folders import UnsafePathError

    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
    ok, evil = store.put(b"fine"), store.put(b"pwned")
    files = {"a.txt": {"digest": ok.hex(), "size": 4, "mode": 0o644}, bad: {"digest": evil.hex(), "size": 5, "mode": 0o644}}
    listing = store.put({"casmon_folder": 1, "files": files})
    store.append(KIND_ARTIFACT, {"run": "runs/1", "name": "f", "kind": "folder", "digest": listing.hex(), "size": 9,
                                 "files": 2, "time": time.time() + 100, "seq": 99}, key=artifacts_key("runs/1"),
                 refs=[listing, ok, evil])
    store.flush()
    (tmp_path / "dest").mkdir()
    with pytest.raises(UnsafePathError):
        casmon.load_run("1", store).load_file("f", tmp_path / "dest")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "s"] and not list((tmp_path / "dest").iterdir())
