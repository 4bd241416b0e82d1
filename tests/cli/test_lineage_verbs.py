"""``casmon lineage``, ``used-by`` and ``stale`` print text, ``--json`` (nodes with kind/id/label/link, edges with
kind) and ``--dot``; ``casmon diff`` says where two runs' lineages part; a name that names nothing is one line."""

import json

import numpy as np
import pytest

import casmon
from casmon.caching import edges
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


@pytest.fixture
def two_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outside this checkout: the runs record no commit or uncommitted changes
    store = str(tmp_path / "store")
    data = tmp_path / "data.txt"
    data.write_text("1 2 3 4 5 6 7 8 9\n")

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    @casmon.cache(store=store)
    def fit(x, lr):
        return x * lr

    for lr in (0.1, 0.2):
        with casmon.record(store=store, capture_output=False):
            fit(load(str(data)), lr)
    fit.__casmon_cache__.store.flush()
    edges.forget_all()
    return store, data


def test_lineage_of_a_run_as_json_dot_and_text(two_runs):
    store, data = two_runs
    g = json.loads(cli("lineage", "1", "--store", store, "--json").stdout)
    kinds = {n["kind"] for n in g["nodes"]}
    assert kinds == {"run", "entry", "file"}
    assert all({"id", "kind", "label", "link"} <= set(n) for n in g["nodes"])
    assert {e["kind"] for e in g["edges"]} == {"used", "result", "file"}
    assert any(n["kind"] == "entry" and n["link"].startswith("/cache?fn=") for n in g["nodes"])
    dot = cli("lineage", "1", "--store", store, "--dot").stdout
    assert dot.startswith("digraph lineage {") and "->" in dot
    text = cli("lineage", "1", "--store", store).stdout
    assert "lineage of 1:" in text and "data.txt" in text


def test_lineage_and_used_by_text_name_each_entrys_code_version(two_runs):
    store, _data = two_runs
    g = json.loads(cli("lineage", "1", "--store", store, "--json").stdout)
    versions = {n["label"]: n["version"][:12] for n in g["nodes"] if n["kind"] == "entry"}
    assert len(versions) == 2
    for verb in ("lineage", "used-by"):
        text = cli(verb, "1" if verb == "lineage" else "load", "--store", store).stdout
        for label, v in versions.items():
            assert f"entry {label} (code {v})" in text, (verb, text)  # as `casmon cache NAME` and FN@VERSION name it


def test_used_by_a_file_reaches_both_runs_and_stale_follows_its_bytes(two_runs):
    store, data = two_runs
    g = json.loads(cli("used-by", str(data), "--store", store, "--json").stdout)
    assert sorted(n["label"] for n in g["nodes"] if n["kind"] == "run") == ["1", "2"]
    assert json.loads(cli("stale", "--store", store, "--json").stdout)["nodes"] == []
    data.write_text("1 2 3\n")
    g = json.loads(cli("stale", "--store", store, "--json").stdout)
    assert sorted(n["label"] for n in g["nodes"] if n["kind"] == "run") == ["1", "2"]
    assert all("its content changed" in n["reason"] for n in g["nodes"])
    assert "its content changed" in cli("stale", "--store", store).stdout
    dot = cli("stale", "--store", store, "--dot").stdout
    labels = [line for line in dot.splitlines() if "shape=" in line]  # the nodes
    assert labels and all("its content changed" in line for line in labels), dot  # the why, drawn too


def test_a_runs_collected_entry_is_named_by_its_function_in_lineage(two_runs):
    store, _data = two_runs
    load_key = json.loads(cli("lineage", "1", "--store", store, "--json").stdout)
    (key,) = [n["key"] for n in load_key["nodes"] if n["kind"] == "entry" and n["fn"].endswith(".load")]
    cli("cache", "clear", "load", "--store", store)
    for _ in range(2):  # condemned, then removed
        cli("gc", "--now", "--store", store)
    text = cli("lineage", "1", "--store", store).stdout
    assert f"  entry load {key[:12]}  [missing]" in text, text  # what the run's record says it called
    assert "entry missing entry" not in text
    node = [n for n in json.loads(cli("lineage", "1", "--store", store, "--json").stdout)["nodes"]
            if n.get("key") == key][0]
    assert node["status"] == "missing" and node["fn"].endswith(".load") and node["link"] == ""


def test_each_verb_heads_its_text_with_a_phrase_that_reads(two_runs):
    store, data = two_runs
    assert cli("lineage", "1", "--store", store).stdout.startswith("lineage of 1:")
    assert cli("used-by", str(data), "--store", store).stdout.startswith(f"what used {data}:")
    assert cli("stale", "--store", store).stdout.startswith("stale in ")
    data.write_text("1 2 3\n")
    assert cli("stale", "--store", store).stdout.startswith("stale in ")


def test_diff_names_the_first_difference_in_lineage(two_runs):
    store, _data = two_runs
    out = cli("diff", "1", "2", "--store", store).stdout
    assert "first difference in lineage:" in out and "parameter 'lr': differs" in out
    d = json.loads(cli("diff", "1", "2", "--store", store, "--json").stdout)
    (p,) = d["lineage"]
    assert p["function"].endswith("fit") and p["differences"][0]["name"] == "lr"


@pytest.mark.parametrize("verb", ["lineage", "used-by"])
def test_a_target_that_names_nothing_is_one_line(two_runs, verb):
    store, _data = two_runs
    r = cli(verb, "nosuchthing", "--store", store, check=False)
    assert r.returncode == 1
    assert "names no run, cached function, entry, file or digest" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli(verb, "1", "--store", store, "--json", "--dot", check=False)
    assert r.returncode == 1 and "choose one" in r.stderr


@pytest.mark.parametrize("verb", ["lineage", "used-by"])
def test_a_key_prefix_too_short_to_name_an_entry_says_how_many_digits_it_takes(two_runs, verb):
    store, _data = two_runs
    key = json.loads(cli("lineage", "1", "--store", store, "--json").stdout)["nodes"][1]["key"]
    r = cli(verb, key[:4], "--store", store, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert f"{key[:4]!r} is too short to name an entry: give at least 6 hex digits of its key" in r.stderr, r.stderr
    assert "no cached function" not in r.stderr
    assert cli(verb, key[:6], "--store", store).returncode == 0


@pytest.mark.parametrize("verb", ["lineage", "used-by"])
def test_a_short_name_two_functions_share_is_one_line_naming_both(tmp_path, verb):
    """A script's ``__main__.clean`` and its import's ``pipeline.clean``: 'clean' is ambiguous, not unknown."""
    store = str(tmp_path / "store")
    for fn in ("__main__", "pipeline"):
        @casmon.cache(store=store)
        def clean(x):
            return x + 1

        clean.__casmon_cache__.name = f"{fn}.clean"
        clean(np.arange(10.0))
        clean.__casmon_cache__.store.flush()
    r = cli(verb, "clean", "--store", store, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "'clean' is ambiguous: __main__.clean, pipeline.clean" in r.stderr
    assert "names no" not in r.stderr
    assert "pipeline.clean" in cli(verb, "pipeline.clean", "--store", store).stdout


def test_a_big_answer_prints_its_first_nodes_and_how_many_more_unless_all_or_json(tmp_path):
    import os

    from casmon.caching import KIND
    from casmon.keys.digest import Digest

    store = str(tmp_path / "s")
    s = casmon.open(store, create=True)
    first = prev = None
    for i in range(250):
        key = Digest.from_raw(os.urandom(16))
        rec = {"fn": "p.step", "result": os.urandom(16).hex(), "time": 1000.0 + i, "rf": os.urandom(16).hex()}
        if prev is not None:
            rec["up"] = {"state": [prev]}
        s.append(KIND, rec, key=key)
        prev = bytes(key).hex()
        first = first or prev
    s.close()
    out = cli("used-by", first, "--store", store).stdout
    assert out.count("  entry step ") == 200
    assert "and 50 more nodes (250 in all; --all or --json lists every one)" in out
    assert cli("used-by", first, "--store", store, "--all").stdout.count("  entry step ") == 250
    assert len(json.loads(cli("used-by", first, "--store", store, "--json").stdout)["nodes"]) == 250


def _used_nodes(store, target):
    g = json.loads(cli("used-by", target, "--store", store, "--json").stdout)
    return sorted((n["kind"], n["label"]) for n in g["nodes"]), g


def test_used_by_file_at_digest_answers_as_the_bare_digest_and_unknown_content_is_one_line(two_runs):
    store, data = two_runs
    _nodes, g = _used_nodes(store, str(data))
    (f,) = [n for n in g["nodes"] if n["kind"] == "file"]
    old = f["digest"]
    assert f["label"].endswith(old[:8])  # lineage prints the first 8 hex digits
    bare = _used_nodes(store, old[:8])[0]
    assert any(k == "run" for k, _l in bare)
    for target in (f"{data}@{old[:8]}", f"{data}@{old}", f"{data.name}@{old[:8]}", f"{data}@{old[:8].upper()}"):
        assert _used_nodes(store, target)[0] == bare, target
    assert cli("used-by", f"{data}@{old[:8]}", "--store", store).stdout.startswith(f"what used {data}@{old[:8]}:")
    # The file's bytes change and a new run reads them: each digest names its own content's consumers.
    data.write_text("1 2 3\n")

    @casmon.cache(store=store, files=["path"])
    def reload(path):
        return np.loadtxt(path)

    reload(str(data))
    reload.__casmon_cache__.store.flush()
    new = [n for n in _used_nodes(store, str(data))[1]["nodes"] if n["kind"] == "file" and n["digest"] != old]
    new = new[0]["digest"]
    assert _used_nodes(store, f"{data.name}@{new[:8]}")[0] == _used_nodes(store, new[:8])[0]
    assert [k for k, _l in _used_nodes(store, f"{data.name}@{new[:8]}")[0]] == ["entry", "file"]
    # one line naming the file and the contents it was read with, for a digest it never had
    r = cli("used-by", f"{data}@abcdef12", "--store", store, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    had = ", ".join(sorted((old[:8], new[:8])))
    assert f"no content of {str(data)!r} read by a cached call has digest 'abcdef12' (it had: {had})" in r.stderr
    r = cli("used-by", "nosuch.csv@abcdef12", "--store", store, check=False)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "names no run, cached function, entry, file or digest" in r.stderr


@pytest.mark.parametrize("verb", ["lineage", "used-by"])
def test_a_logged_function_is_one_line_saying_call_logs_are_not_in_lineage_and_what_lists_its_calls(two_runs, verb):
    store, data = two_runs

    @casmon.intercept(store=store)
    def score(x):
        return float(x.sum())

    score(np.arange(40.0))
    casmon.flush()
    for target in ("score", f"{score.__module__}.{score.__qualname__}"):
        r = cli(verb, target, "--store", store, check=False)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert "no cached function" not in r.stderr
        assert f"'{target}' is a logged (intercepted) function, not a cached one: call logs are not part of " \
               "lineage's graph of cached calls" in r.stderr, r.stderr
        assert f"`casmon calls {target}` lists its calls" in r.stderr
    # a name neither logs nor caches keeps the plain answer
    r = cli(verb, "nosuchthing", "--store", store, check=False)
    assert "names no run, cached function, entry, file or digest" in r.stderr and "logged" not in r.stderr


@pytest.fixture
def changed_file(tmp_path, monkeypatch):
    """Two runs of one cached load, the file's bytes changed between them: (store, data, digest in 1, in 2)."""
    monkeypatch.chdir(tmp_path)
    store = str(tmp_path / "store")
    data = tmp_path / "data.txt"

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    for text in ("1 2 3 4 5 6 7 8 9\n", "9 8 7 6 5 4 3 2 1\n"):
        data.write_text(text)
        with casmon.record(store=store, capture_output=False):
            load(str(data))
    load.__casmon_cache__.store.flush()
    edges.forget_all()
    (a,), (b,) = ([n["digest"] for n in json.loads(cli("lineage", run, "--store", store, "--json").stdout)["nodes"]
                   if n["kind"] == "file"] for run in ("1", "2"))
    assert a != b
    return store, data, a, b


def test_diff_says_a_changed_files_old_and_new_content_digests_as_lineage_prints_them(changed_file):
    store, data, a, b = changed_file
    out = cli("diff", "1", "2", "--store", store).stdout
    assert f"file {str(data)!r}: its content changed: {a[:8]} in 1, {b[:8]} in 2 (parameter 'path')" in out, out
    assert f"its content changed: {b[:8]} in 2, {a[:8]} in 1" in cli("diff", "2", "1", "--store", store).stdout
    (p,) = json.loads(cli("diff", "1", "2", "--store", store, "--json").stdout)["lineage"]
    assert p["differences"] == [{"what": "file", "name": str(data), "diff": "",
                                 "detail": f"its content changed: {a[:8]} in 1, {b[:8]} in 2 (parameter 'path')"}]
    assert f"data.txt {a[:8]}" in cli("lineage", "1", "--store", store).stdout  # the digest as lineage prints it
