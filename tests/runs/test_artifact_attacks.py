"""Attacks on what runs keep: special files in a saved folder, crafted artifact records, the files load_file writes."""

import math
import os
import threading

import numpy as np
import pytest

import casmon
from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def _in_thread(fn, deadline=30.0):
    """``fn()``'s result or exception, or "hung" if it has not returned within ``deadline`` seconds."""
    got = {}

    def go():
        try:
            got["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            got["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(deadline)
    return "hung" if t.is_alive() else got


def test_a_folder_with_a_fifo_socket_or_device_is_saved_without_them_never_hanging(store, tmp_path):
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / "a.txt").write_bytes(b"kept")
    os.mkfifo(folder / "pipe")
    with casmon.record(store=store, capture_output=False) as run:
        got = _in_thread(lambda: run.save_file(folder))
    assert got != "hung", "save_file blocked reading a FIFO"
    assert "error" not in got, got
    assert casmon.load_run("latest", store).load("out").keys() == {"a.txt"}


def test_saving_a_fifo_itself_is_a_clear_error_not_a_hang(store, tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with casmon.record(store=store, capture_output=False) as run:
        got = _in_thread(lambda: run.save_file(tmp_path / "pipe"))
    assert got != "hung", "save_file blocked reading a FIFO"
    err = got.get("error")
    assert isinstance(err, ValueError) and "pipe" in str(err) and "not a regular file" in str(err)


@pytest.mark.parametrize("bad", [{"time": 10**400}, {"time": float("nan")}, {"time": float("inf")}, {"time": True},
                                 {"seq": 10**400, "time": 1e300}, {"step": 10**400}, {"size": 10**400}])
def test_crafted_artifact_record_numbers_never_raise_from_readers(store, bad):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", np.arange(3))
        run.checkpoint({"w": 1}, step=2)
    for name, kind in (("x", "value"), ("checkpoint/9", "checkpoint")):
        rec = {"run": run.ref, "name": name, "kind": kind, "digest": "0" * 32, "size": 1, "step": 9, "time": 5.0,
               **bad}
        store.append(KIND_ARTIFACT, rec, key=artifacts_key(run.ref))
    store.flush()
    r = casmon.load_run(run.name, store)
    arts = r.artifacts()
    for a in arts:
        assert isinstance(a["time"], float) and math.isfinite(a["time"])
    for read in (lambda: r.load("x"), lambda: r.checkpoint("latest")):
        try:
            read()
        except (casmon.CasmonError, LookupError):
            pass
    with casmon.record(store=store, resume=run.name, resume_ok=True, capture_output=False) as again:
        again.save("y", 1)
    assert "y" in {a["name"] for a in casmon.load_run(run.name, store).artifacts()}


def test_names_that_differ_only_by_unicode_normalization_are_one_artifact(store, tmp_path):
    import unicodedata

    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    f = tmp_path / nfd  # as a macOS file system spells it
    f.write_bytes(b"v1")
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(f)
        assert casmon.load_run(run.name, store).load(nfc) == b"v1"
        run.save(nfc, b"v2")
    r = casmon.load_run(run.name, store)
    assert [a["name"] for a in r.artifacts()] == [nfc]
    assert r.load(nfd) == b"v2" and r.load_file(nfd, tmp_path / "out").read_bytes() == b"v2"


@pytest.mark.parametrize("name", ["a\u202eb", "\ufeffmodel.pt", "a\u200bb", "a\x7fb", "a\x85b"],
                         ids=["bidi-override", "bom", "zero-width", "del", "c1-control"])
def test_a_name_with_invisible_or_control_characters_is_refused(store, name):
    with casmon.record(store=store, capture_output=False) as run:
        with pytest.raises(ValueError, match="control or invisible character"):
            run.save(name, 1)


def _saved(store, tmp_path):
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "x").write_bytes(b"folder file")
    with casmon.record(store=store, capture_output=False) as run:
        run.save("model.pt", b"weights")
        run.save_file(folder, "tree")
    return casmon.load_run(run.name, store)


def test_load_file_never_follows_a_link_planted_at_its_partial_file(store, tmp_path):
    r = _saved(store, tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    dest = tmp_path / "shared"
    dest.mkdir()
    (dest / "model.pt.casmon-partial").symlink_to(victim)
    assert r.load_file("model.pt", dest / "model.pt").read_bytes() == b"weights"
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize("case", ["file-onto-folder-in-the-way", "folder-onto-a-file", "folder-part-is-a-file"])
def test_load_file_onto_something_in_the_way_is_a_casmon_error_leaving_no_partial_file(store, tmp_path, case):
    r = _saved(store, tmp_path)
    dest = tmp_path / "dest"
    dest.mkdir()
    if case == "file-onto-folder-in-the-way":
        (dest / "model.pt").mkdir()
        (dest / "model.pt" / "keep").write_bytes(b"k")
        name, target = "model.pt", dest  # into the folder, where a folder of that name stands
    elif case == "folder-onto-a-file":
        (dest / "tree").write_bytes(b"a file")
        name, target = "tree", dest / "tree"
    else:
        (dest / "sub").write_bytes(b"a file where the folder goes")
        name, target = "tree", dest
    with pytest.raises(casmon.CasmonError, match="cannot write"):
        r.load_file(name, target)
    left = [p.name for p in dest.rglob("*") if "casmon-partial" in p.name]
    assert left == []


def test_a_checkpoint_saved_again_after_a_resume_on_a_host_whose_clock_is_behind_is_not_hidden_by_its_release(store):
    with pytest.raises(RuntimeError), casmon.record(store=store, capture_output=False) as run:
        for step in range(4):
            run.checkpoint({"step": step}, step=step, keep_last=1)  # 0..2 released, 3 kept
        raise RuntimeError("preempted")
    # the first host's clock ran ahead: its release of step 2 is stamped later than anything the resumer writes
    store.append(KIND_ARTIFACT, {"run": run.ref, "name": "checkpoint/2", "released": True, "time": 1e12, "seq": 99},
                 key=artifacts_key(run.ref))
    store.flush()
    with casmon.record(store=store, resume=run.name, capture_output=False) as again:
        again.checkpoint({"step": "2 again"}, step=2)
    r = casmon.load_run(run.name, store)
    assert r.checkpoint(2) == {"step": "2 again"}


def test_numpy_integers_are_whole_numbers_for_retention_and_for_reading_a_checkpoint(store):
    with casmon.record(store=store, capture_output=False) as run:
        for step in range(4):
            run.checkpoint({"step": step}, step=np.int64(step), keep_last=np.int64(2), keep_every=np.uint8(3))
        for bad in (True, 2.0, 0, -1, np.float64(2)):
            with pytest.raises(ValueError, match="keep_last must be a whole number"):
                run.checkpoint({}, step=9, keep_last=bad)
    r = casmon.load_run(run.name, store)
    assert sorted(a["step"] for a in r.artifacts()) == [0, 2, 3]
    assert r.checkpoint(np.int64(2)) == {"step": 2}
    with pytest.raises(ValueError, match="give a step"):
        r.checkpoint(np.float64(2))


def test_a_saved_folder_with_version_control_metadata_leaves_it_out_and_loads_back(store, tmp_path):
    proj = tmp_path / "proj"
    (proj / ".git" / "hooks").mkdir(parents=True)
    (proj / ".git" / "hooks" / "post-checkout").write_text("#!/bin/sh\necho run\n")
    (proj / "sub" / ".HG").mkdir(parents=True)
    (proj / "sub" / ".HG" / "hgrc").write_text("[hooks]\n")
    (proj / "train.py").write_text("print(1)\n")
    (proj / "worktree").mkdir()
    (proj / "worktree" / ".git").write_text("gitdir: /elsewhere\n")
    with casmon.record(store=store, capture_output=False) as run:
        assert run.save_file(proj).files == 1
    out = casmon.load_run(run.name, store).load_file("proj", tmp_path / "out")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == ["train.py"]


def test_a_crafted_record_whose_digest_is_not_hex_is_passed_over_by_load_and_checkpoint(store):
    with casmon.record(store=store, capture_output=False) as run:
        run.save("x", 1)
    for name, kind in (("v", "value"), ("checkpoint/3", "checkpoint")):
        store.append(KIND_ARTIFACT, {"run": run.ref, "name": name, "kind": kind, "digest": "zz" * 16, "size": 1,
                                     "step": 3, "time": 9e9}, key=artifacts_key(run.ref))
    store.flush()
    r = casmon.load_run(run.name, store)
    assert [a["name"] for a in r.artifacts()] == ["x"]
    with pytest.raises(LookupError):
        r.load("v")
    with pytest.raises(LookupError):
        r.checkpoint()


def test_a_file_whose_long_name_fits_the_file_system_loads_back_under_that_name(store, tmp_path):
    """Its partial file's name must fit too: 255 bytes, however many characters."""
    name = "\u00e9" * 127  # 254 bytes in UTF-8
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / name).write_bytes(b"in a folder")
    (tmp_path / name).write_bytes(b"alone")
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(tmp_path / "d", name="d")
        run.save_file(tmp_path / name)
    r = casmon.load_run("latest", store)
    (tmp_path / "out").mkdir()
    assert r.load_file("d", tmp_path / "out" / "d") == tmp_path / "out" / "d"
    assert (tmp_path / "out" / "d" / name).read_bytes() == b"in a folder"
    assert r.load_file(name, tmp_path / "out") == tmp_path / "out" / name
    assert (tmp_path / "out" / name).read_bytes() == b"alone"
    assert not [p for p in (tmp_path / "out").rglob("*") if "casmon-partial" in p.name]
