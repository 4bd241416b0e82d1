"""Tags and notes of runs: given at the start, changed while the run goes on and after its end, by several
editors at once; kept through gc, gone with the run, and never a raw error from a crafted store."""

import threading

import pytest

import casmon
from casmon.errors import CasmonError
from casmon.runs import note_run, tag_run
from casmon.runs.tags import KIND_RUNEDIT, MAX_NOTE, MAX_TAG, check_tags, edit_key

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s")
    yield s
    s.close()


def test_record_tags_and_live_changes_are_read_back_sorted(store):
    with casmon.record(store=store, tags=["b", "a", "b"], capture_output=False) as run:
        assert sorted(run.tags) == ["a", "b"] and "a" in run.tags
        run.tags.add("c")
        run.tags.discard("a")
        run.tags.discard("never")
        assert casmon.load_run("latest", store).tags == ("b", "c"), "a live run's edits are read at once"
    r = casmon.load_run("latest", store)
    assert (r.tags, r.note) == (("b", "c"), "")
    assert r.manifest["tags"] == ["a", "b"], "the manifest keeps the tags the run started with"
    assert [(e.get("add"), e.get("remove")) for e in r.edits()] == [(["a", "b"], []), (["c"], []), ([], ["a"])]


def test_replacing_the_tags_keeps_the_difference(store):
    with casmon.record(store=store, tags="x", capture_output=False) as run:
        run.tags = ["y", "z"]
    assert casmon.load_run("latest", store).tags == ("y", "z")


@pytest.mark.parametrize("bad, why", [("", "empty"), ("a b", "whitespace"), ("a,b", "comma"), ("a\nb", "whitespace"),
                                      ("x" * (MAX_TAG + 1), "characters long"), ("-x", "starts with"),
                                      ("a\x00", "control"), (3, "a string")])
def test_a_bad_tag_is_one_line_naming_it(store, bad, why):
    with pytest.raises((ValueError, TypeError), match=why) as e:
        check_tags([bad], "casmon.record")
    assert "\n" not in str(e.value).replace("\\n", "")
    with pytest.raises((ValueError, TypeError), match=why):
        casmon.record(store=store, tags=[bad])
    with casmon.record(store=store, capture_output=False) as run:
        with pytest.raises((ValueError, TypeError), match=why):
            run.tags.add(bad)
    assert casmon.load_run("latest", store).tags == ()


def test_tags_and_notes_change_after_the_end_and_keep_their_history(store):
    with casmon.record(store=store, tags=["base"], capture_output=False):
        pass
    digest = casmon.load_run("latest", store).digest
    assert tag_run("latest", ["good", "v2"], ["base"], store=store) == ("good", "v2")
    note_run("latest", "first try", store=store)
    note_run("latest", "lr too high", store=store)
    r = casmon.load_run("latest", store)
    assert (r.tags, r.note, r.digest) == (("good", "v2"), "lr too high", digest), "the ended manifest is untouched"
    assert [e["note"] for e in r.edits() if "note" in e] == ["first try", "lr too high"]
    note_run("latest", "", store=store)
    assert casmon.load_run("latest", store).note == ""
    with pytest.raises(ValueError, match="both added and removed"):
        tag_run("latest", ["x"], ["x"], store=store)
    with pytest.raises(ValueError, match="at most"):
        note_run("latest", "n" * (MAX_NOTE + 1), store=store)
    with pytest.raises(LookupError):
        tag_run("nope", ["x"], store=store)


def test_two_editors_at_once_both_land(tmp_path):
    path = tmp_path / "s"
    s = casmon.open(path)
    with casmon.record(store=s, capture_output=False):
        pass
    s.close()
    go = threading.Barrier(8)
    errors = []

    def edit(i):
        st = casmon.open(path)  # each editor its own store, as two `casmon tag` processes
        try:
            go.wait()
            tag_run("1", [f"t{i}"], store=st)
        except Exception as e:  # noqa: BLE001
            errors.append(e)
        finally:
            st.close()

    ts = [threading.Thread(target=edit, args=(i,)) for i in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert casmon.load_run("1", str(path)).tags == tuple(f"t{i}" for i in range(8))


def test_edits_survive_gc_and_go_with_a_deleted_run(store, min_grace):
    min_grace(0.2)
    with casmon.record(store=store, capture_output=False):
        pass
    tag_run("1", ["keep"], store=store)
    note_run("1", "kept", store=store)
    store.gc(grace=0.2)
    store.gc(grace=0.2)
    r = casmon.load_run("1", store)
    assert (r.tags, r.note) == (("keep",), "kept")
    casmon.delete_run("1", store=store)
    assert store.lookup(KIND_RUNEDIT, edit_key("runs/1")) == []
    with casmon.record(store=store, capture_output=False):  # the freed number: no tags of the run before
        pass
    assert [(r.name, r.tags, r.note) for r in casmon.list_runs(store)] == [("1", (), "")]


def test_crafted_edits_and_manifest_tags_are_left_out_never_raised(store):
    with casmon.record(store=store, tags=["real"], capture_output=False):
        pass
    key = edit_key("runs/1")
    for rec in ({"run": "runs/1", "time": "soon", "add": ["a"], "remove": []},
                {"run": "runs/1", "time": 1.0, "add": "abc", "remove": []},
                {"run": "runs/1", "time": 2.0, "add": ["ok", "bad tag", 7], "remove": [None]},
                {"run": "runs/2", "time": 3.0, "add": ["other"], "remove": []},
                {"run": "runs/1", "time": 4.0, "note": {"x": 1}}):
        store.append(KIND_RUNEDIT, rec, key=key)
    store.append(KIND_RUNEDIT, {"run": "runs/1", "time": 5.0, "add": ["elsewhere"], "remove": []})  # wrong key
    store.flush()
    for r in (casmon.load_run("1", store), casmon.list_runs(store)[0]):
        assert (r.tags, r.note) == (("ok", "real"), "")


def test_a_crafted_manifest_tags_field_is_damage_not_a_type_error(store):
    from casmon.runs.manifest import check_run_manifest

    with pytest.raises(casmon.DamagedObjectError, match="tags"):
        check_run_manifest({"tags": "a"}, "run x")
    from casmon.runs.tags import merged

    assert merged({"tags": ["a", 3, "b c", None]}, []) == (("a",), "")


def test_a_resumed_run_keeps_its_tags_and_adds_its_own(store):
    run = casmon.start_run(store=store, tags=["first"], capture_output=False)
    run.tags.add("second")
    run.tags.discard("first")
    run.end("killed")
    tag_run("1", ["first"], store=store)  # an edit after the end, older than the resume
    with casmon.record(store=store, resume="1", tags=["resumed", "first"], capture_output=False) as again:
        assert sorted(again.tags) == ["first", "resumed", "second"]
    assert casmon.load_run("1", store).tags == ("first", "resumed", "second")


def test_tags_cannot_change_in_a_read_only_store(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False):
        pass
    s.close()
    ro = casmon.open(tmp_path / "s", read_only=True)
    with pytest.raises(CasmonError, match="read-only"):
        tag_run("1", ["x"], store=ro)


def test_a_live_tag_edit_waits_for_the_users_flush_when_autoflush_is_off(tmp_path):
    s = casmon.open(tmp_path / "s", autoflush=None)
    with casmon.record(store=s, capture_output=False) as run:
        run.tags.add("later")
        assert casmon.load_run("1", str(tmp_path / "s")).tags == ()
        s.flush()
        assert casmon.load_run("1", str(tmp_path / "s")).tags == ("later",)
    s.close()


def test_an_edit_that_raced_a_deletion_never_lands_on_the_run_that_takes_the_freed_number(store):
    from casmon.runs.tags import append_edit

    with casmon.record(store=store, capture_output=False):
        pass
    old_start = casmon.load_run("1", store).manifest["start"]
    casmon.delete_run("1", store=store)
    append_edit(store, "runs/1", old_start, add=["stale"])  # a `casmon tag` that read the run before
    append_edit(store, "runs/1", old_start, note="stale note")
    store.flush()
    with casmon.record(store=store, capture_output=False):
        pass
    r = casmon.load_run("1", store)
    assert (r.tags, r.note, r.edits()) == ((), "", [])
    assert (casmon.list_runs(store)[0].tags, casmon.list_runs(store)[0].note) == ((), "")


def test_a_malformed_edit_hides_no_other_edit_of_its_run_and_is_warned(store):
    from casmon.runs.tags import read_edits

    with casmon.record(store=store, tags=["real"], capture_output=False):
        pass
    tag_run("1", ["a"], store=store)
    note_run("1", "kept", store=store)
    store.append(KIND_RUNEDIT, {}, key=edit_key("runs/1"), encoded="[1, 2]")  # JSON, not an object
    store.flush()
    with pytest.warns(casmon.StoreDamageWarning, match="not a JSON object"):
        edits = read_edits(store, "runs/1")
    assert [e.get("note", e.get("add")) for e in edits] == [["a"], "kept"]


@pytest.mark.parametrize("rec", [
    {"run": "runs/1", "time": 9e9, "note": "N" * (MAX_NOTE + 1)},
    {"run": "runs/1", "time": 9e9, "add": ["t"] * 1001, "remove": []},
    {"run": "runs/1", "time": float("nan"), "note": "nan"},
    {"run": "runs/2", "time": 9e9, "note": "another run's"},
    {"run": ["runs/1"], "time": 9e9, "note": "a list"},
    {"time": 9e9, "note": "no run"},
], ids=["huge-note", "too-many-tags", "nan-time", "other-run", "run-a-list", "no-run"])
def test_a_crafted_edit_is_passed_over_with_a_warning_by_every_reader(store, rec, monkeypatch):
    from casmon import errors
    from casmon.runs.tags import read_edits

    with casmon.record(store=store, capture_output=False):
        pass
    note_run("1", "real", store=store)
    store.append(KIND_RUNEDIT, rec, key=edit_key("runs/1"))
    store.flush()
    for read in (lambda: casmon.list_runs(store)[0], lambda: casmon.load_run("1", store)):
        with pytest.warns(casmon.StoreDamageWarning, match="passed over"):
            r = read()
            assert (r.tags, r.note) == ((), "real")
        monkeypatch.setattr(errors, "_warned", set())  # warn_damage says each once a process
    with pytest.warns(casmon.StoreDamageWarning, match="passed over"):
        assert [e["note"] for e in read_edits(store, "runs/1")] == ["real"]


def test_a_child_forked_while_another_thread_edits_tags_can_edit_them(tmp_path):
    import multiprocessing
    import os

    from casmon.runs import tags

    if not hasattr(os, "fork"):
        pytest.skip("fork")
    with casmon.record(store=str(tmp_path / "s"), capture_output=False):
        pass

    def child(path):
        tag_run("1", ["from-child"], store=path)

    with tags._clock_lock:  # as if another thread were stamping an edit at the fork
        p = multiprocessing.get_context("fork").Process(target=child, args=(str(tmp_path / "s"),))
        p.start()
        p.join(120)
    if p.is_alive():
        p.kill()
    assert p.exitcode == 0
    assert casmon.load_run("1", str(tmp_path / "s")).tags == ("from-child",)


def test_a_live_runs_tag_change_reads_the_edits_made_elsewhere_first(tmp_path):
    """``casmon tag`` from another process added x and removed a: the run's own discard("x") and add("a")
    are not taken as done already on its stale view."""
    path = str(tmp_path / "s")
    run = casmon.start_run(store=path, tags=["a", "b"], capture_output=False)
    try:
        other = casmon.open(path)  # another process's view of the store
        tag_run(run.name, ["x"], ["a"], store=other)
        other.close()
        run.tags.discard("x")
        run.tags.add("a")
        assert casmon.load_run(run.name, path).tags == ("a", "b")
        run.tags = ["b", "y"]
        assert casmon.load_run(run.name, path).tags == ("b", "y")
        assert sorted(run.tags) == ["b", "y"]
    finally:
        run.end()
    assert casmon.load_run(run.name, path).tags == ("b", "y")
