"""Per-call control of the cache: f.explain says why a call misses; f.lookup, f.refresh and expires_after."""

import datetime
import json
import textwrap
import time
import warnings

import pytest

import casmon
from casmon.caching.files import path_digest
from casmon.caching.explain import code_versions, explain_entry
from tests.conftest import run_python
from tests.support.sources import write_module


def test_explain_names_the_parameter_that_differs(tmp_path):
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s)
    def fit(data, lr=0.1, epochs=10, verbose=False):
        return sum(data) * lr * epochs

    fit([1, 2, 3], lr=0.1)
    fit([1, 2, 3], lr=0.2, epochs=30)
    assert fit.explain([1, 2, 3], lr=0.1).hit
    ex = fit.explain([1, 2, 3], lr=0.1, epochs=20)
    assert not ex.hit
    assert [(d.what, d.name) for d in ex.differences] == [("parameter", "epochs")]
    assert [(d.what, d.name) for d in ex.nearest[1].differences] == [("parameter", "epochs"), ("parameter", "lr")]
    assert "parameter 'epochs': differs" in str(ex)
    ex = fit.explain([9], lr=0.1)
    assert [(d.what, d.name) for d in ex.differences] == [("parameter", "data")]


def test_explain_names_the_changed_helper_with_a_source_diff(tmp_path):
    """A run caches a result; the helper it calls is edited; a new process's explain names the helper (not the
    function, whose own code is the same) and shows what changed in it."""
    write_module(tmp_path / "prep.py", textwrap.dedent("""
        import casmon

        def scale(x):
            return x * 2

        @casmon.cache(store="s")
        def features(x):
            return scale(x) + 1
        """))
    run = "import prep\nprint(prep.features(20))\n"
    assert run_python(run, cwd=tmp_path).stdout.strip() == "41"
    write_module(tmp_path / "prep.py", (tmp_path / "prep.py").read_text().replace("x * 2", "x * 3"))
    out = run_python("import prep, warnings\nwarnings.simplefilter('ignore')\nex = prep.features.explain(20)\n"
                     "print(ex.hit, [(d.what, d.name) for d in ex.differences])\nprint(ex)\n", cwd=tmp_path).stdout
    first, rest = out.split("\n", 1)
    assert first == "False [('code', 'prep.scale')]"
    assert "-    return x * 2" in rest and "+    return x * 3" in rest
    # casmon cache NAME's view: the two versions, the second saying what changed.
    versions = code_versions(casmon.open(str(tmp_path / "s")), "prep.features")
    assert len(versions) == 2 and [(d.what, d.name) for d in versions[1].changes] == [("code", "prep.scale")]


def test_the_code_change_warning_says_what_changed(tmp_path):
    write_module(tmp_path / "cfg.py", "import casmon\nTHRESH = 2\n\n@casmon.cache(store='s')\ndef f(x):\n    return x > THRESH\n")
    run_python("import cfg\ncfg.f(1)\n", cwd=tmp_path)
    write_module(tmp_path / "cfg.py", (tmp_path / "cfg.py").read_text().replace("THRESH = 2", "THRESH = 3"))
    err = run_python("import cfg\ncfg.f(1)\n", cwd=tmp_path).stderr
    assert "Since the version cached last: global 'THRESH' changed" in " ".join(err.split())


def test_explain_names_the_changed_file(tmp_path):
    s = casmon.open(str(tmp_path / "s"))
    data = tmp_path / "data.csv"
    data.write_text("a,b\n1,2\n")

    @casmon.cache(store=s, files=["path"])
    def load(path, sep=","):
        return open(path).read().split(sep)

    load(str(data))
    old = path_digest(data)[1].hex()
    data.write_text("a,b\n1,3\n")
    new = path_digest(data)[1].hex()
    ex = load.explain(str(data))
    assert not ex.hit
    assert [(d.what, d.name) for d in ex.differences] == [("file", str(data))]
    # both contents' digests, as lineage prints a file (its first 8 hex digits)
    assert f"its content changed: was {old[:8]}, now {new[:8]} (parameter 'path')" in str(ex)


def test_explain_of_a_stored_entry_names_what_differs_from_its_neighbours(tmp_path):
    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s)
    def f(a, b):
        return a + b

    f(1, 2)
    f(1, 3)
    key = f.__casmon_cache__.key((1, 3), {})
    ex = explain_entry(s, f.__casmon_cache__.name, key)
    assert [(d.what, d.name) for d in ex.differences] == [("parameter", "b")]


def test_lookup_returns_a_stored_result_and_never_computes(tmp_path):
    s = casmon.open(str(tmp_path / "s"))
    calls = []

    @casmon.cache(store=s)
    def f(x):
        calls.append(x)
        return [x]

    with pytest.raises(KeyError, match="this call is not cached"):
        f.lookup(1)
    f(1)
    assert f.lookup(1) == [1] and calls == [1]
    with pytest.raises(KeyError, match="against the nearest stored entry, parameter 'x' differs"):
        f.lookup(2)
    assert calls == [1]


def test_refresh_computes_again_and_replaces_the_entry(tmp_path):
    s = casmon.open(str(tmp_path / "s"))
    n = [0]

    @casmon.cache(store=s)
    def f(x):
        n[0] += 1
        return (x, n[0])

    assert f(1) == (1, 1) and f(1) == (1, 1)
    assert f.refresh(1) == (1, 2)
    assert f(1) == (1, 2)
    s.flush()
    assert casmon.cache(store=casmon.open(str(tmp_path / "s")))(f.__wrapped__).lookup(1) == (1, 2)


def test_entries_older_than_expires_after_are_misses_and_gc_drops_them(tmp_path, min_grace):
    loc = str(tmp_path / "s")
    s = casmon.open(loc)
    n = [0]

    def body(x):
        n[0] += 1
        return (x, n[0])

    f = casmon.cache(store=s, expires_after=datetime.timedelta(seconds=0.6))(body)
    assert f(1) == (1, 1) and f(1) == (1, 1)
    time.sleep(0.8)
    assert f(1) == (1, 2), "an expired entry is a miss"
    ex = f.explain(2)
    assert not ex.hit
    s.flush()
    with pytest.raises(ValueError, match="expires_after"):
        casmon.cache(expires_after=0)(body)
    with pytest.raises(ValueError, match="wait="):
        casmon.cache(wait="yes")(body)
    time.sleep(0.8)
    from casmon.caching import eviction_plan

    from casmon.caching import duplicates_plan

    assert len(eviction_plan(s)) == 1, "key 1's entry expired: gc drops it"
    assert len(duplicates_plan(s)) == 1, "and the older record of the key, as a duplicate"
    f(3)
    assert len(eviction_plan(s)) == 1, "an entry that has not expired stays"


def test_a_module_function_missing_on_a_scripts_entry_says_where_the_entry_is(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import casmon

        @casmon.cache(store="s")
        def make_data(n):
            return list(range(n))

        if __name__ == "__main__":
            make_data(5)
        """))
    import subprocess
    import sys

    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True,
                   env={**__import__("os").environ, "PYTHONPATH": str(__import__("tests.conftest").conftest.ROOT)})
    out = run_python("import train\ntry:\n    train.make_data.ref(5)\nexcept KeyError as e:\n    print(e)\n",
                     cwd=tmp_path).stdout
    assert "__main__.make_data has entries" in out and "python train.py" in out


def test_a_cache_clear_in_another_process_is_seen_by_a_running_one(tmp_path):
    loc = str(tmp_path / "s")
    s = casmon.open(loc)
    n = [0]

    @casmon.cache(store=s)
    def f(x):
        n[0] += 1
        return n[0]

    assert f(1) == 1 and f(1) == 1
    s.flush()
    run_python(f"import casmon\nfrom casmon.caching import clear_function\nclear_function(casmon.open({loc!r}), 'f')\n")
    deadline = time.monotonic() + 10
    while f(1) == 1:
        assert time.monotonic() < deadline, "the clear was not seen"
        time.sleep(0.1)
    assert n[0] == 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert f(1) == 2


def test_casmon_cache_name_lists_code_versions_and_what_changed(tmp_path):
    from click.testing import CliRunner

    from casmon.cli.app import main as cli_main

    write_module(tmp_path / "m.py", "import casmon\n\ndef helper(x):\n    return x + 1\n\n@casmon.cache(store='s')\n"
                                    "def g(x):\n    return helper(x)\n")
    run_python("import m\nm.g(1)\nm.g(2)\n", cwd=tmp_path)
    write_module(tmp_path / "m.py", (tmp_path / "m.py").read_text().replace("x + 1", "x + 2"))
    run_python("import m, warnings\nwarnings.simplefilter('ignore')\nm.g(1)\n", cwd=tmp_path)
    r = CliRunner().invoke(cli_main, ["cache", "g", "--store", str(tmp_path / "s")], terminal_width=200)
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "m.g: 3 entries" in out
    assert "code m.helper changed" in out
    rows = [line for line in r.output.splitlines() if line.startswith("│ 1 ") or line.startswith("│ 2 ")]
    assert [row.split("│")[4].strip() for row in rows] == ["2", "1"], "entries per version"


def test_expired_entries_are_not_counted_as_entries(tmp_path):
    s = casmon.open(str(tmp_path / "s"))
    f = casmon.cache(store=s, expires_after=0.3)(lambda x: x)
    f(1), f(2)
    s.flush()
    assert f.cache_info().entries == 2
    time.sleep(0.5)
    from casmon.caching import cache_entries

    stats = cache_entries(s)[f.__casmon_cache__.name]
    assert (stats["entries"], stats["duplicates"]) == (0, 0)
    assert f.cache_info().entries == 0


def test_lookup_names_a_changed_file_first_and_forgets_the_other_names_entries_once_they_are_cleared(tmp_path):
    # As a user: the script run as __main__ and imported, then its files= file edited.
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import sys
        import casmon

        @casmon.cache(store="s", files=["path"])
        def load(path):
            with open(path) as fh:
                return fh.read()

        if __name__ == "__main__":
            print(load(sys.argv[1]))
        """))
    (tmp_path / "data.txt").write_text("one")
    import os
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": str(__import__("tests.conftest").conftest.ROOT)}
    subprocess.run([sys.executable, "train.py", "data.txt"], cwd=tmp_path, check=True, env=env, capture_output=True)
    run_python("import train\ntrain.load('data.txt')\n", cwd=tmp_path)
    (tmp_path / "data.txt").write_text("two")
    ask = ("import train\ntry:\n    train.load.lookup('data.txt')\nexcept KeyError as e:\n    print(e)\n"
           "print('EXPLAIN')\nprint(train.load.explain('data.txt'))\n")
    why, explained = run_python(ask, cwd=tmp_path).stdout.split("EXPLAIN")
    assert "file 'data.txt': its content changed" in why
    assert why.index("content changed") < why.find("__main__.load has entries") or "__main__.load" not in why
    assert explained.index("its content changed") < explained.index("__main__.load has entries")

    from casmon.cli import main as cli
    from click.testing import CliRunner

    for args in (["cache", "clear", "__main__.load"], ["gc"]):
        r = CliRunner().invoke(cli, [*args, "--store", str(tmp_path / "s")])
        assert r.exit_code == 0, r.output
    why, explained = run_python(ask, cwd=tmp_path).stdout.split("EXPLAIN")
    assert "content changed" in why and "__main__" not in why, "its entries were cleared: no note about them"
    assert "__main__" not in explained


def test_refresh_leaves_one_entry_and_no_duplicates(tmp_path):
    from click.testing import CliRunner

    from casmon.caching import cache_entries
    from casmon.cli import main as cli

    s = casmon.open(str(tmp_path / "s"))

    @casmon.cache(store=s)
    def f(x):
        return x * 2

    f(1)
    f.refresh(1)
    f.refresh(1)
    s.flush()
    stats = cache_entries(s)[f.__casmon_cache__.name]
    assert (stats["entries"], stats["duplicates"], stats["replaced"]) == (1, 0, 2)
    assert len(f.entries()) == 1 and f.cache_info().entries == 1
    out = CliRunner().invoke(cli, ["cache", "--store", str(tmp_path / "s")]).output
    assert "duplicate entr" not in out and "two processes" not in out, out

    # A call two processes computed at once is still a duplicate, and a refresh after it replaces both.
    from casmon.caching.entries import KIND

    f(2)
    s.flush()
    key = f.__casmon_cache__.key((2,), {})
    s.append(KIND, {**s.lookup(KIND, key)[0], "time": time.time()}, key=key)  # as a second process would
    s.flush()
    assert cache_entries(s)[f.__casmon_cache__.name]["duplicates"] == 1
    f.refresh(2)
    s.flush()
    stats = cache_entries(s)[f.__casmon_cache__.name]
    assert (stats["entries"], stats["duplicates"], stats["replaced"]) == (2, 0, 4)


def test_gc_names_entries_a_refresh_replaced_apart_from_duplicates(tmp_path):
    from click.testing import CliRunner

    from casmon.caching.entries import KIND
    from casmon.cli import main as cli

    loc = str(tmp_path / "s")
    s = casmon.open(loc)

    @casmon.cache(store=s)
    def f(x):
        return x * 2

    f(1)
    f.refresh(1)
    f(2)
    s.flush()
    key = f.__casmon_cache__.key((2,), {})
    s.append(KIND, {**s.lookup(KIND, key)[0], "time": time.time()}, key=key)  # as a second process would
    s.close()
    r = CliRunner().invoke(cli, ["gc", "--dry-run", "--json", "--store", loc])
    d = json.loads(r.output)
    assert (d["duplicate_entries"], d["replaced_entries"]) == (1, 1), d
    out = CliRunner().invoke(cli, ["gc", "--dry-run", "--store", loc]).output
    assert "would drop 1 duplicate cache entry" in out and "1 cache entry a refresh replaced" in out, out


def test_explain_of_another_call_says_the_functions_entries_expired_not_that_none_is_stored(tmp_path):
    s = casmon.open(tmp_path / "s")
    f = casmon.cache(store=s, expires_after=0.3)(lambda x: x)
    f(1), f(2)
    time.sleep(0.5)  # past expires_after: both entries are misses now (waiting longer only makes that truer)
    why = f.explain(3).why()
    assert "no entry of this function is stored" not in why, why
    assert "2 entries of this function are past expires_after" in why, why
    with pytest.raises(KeyError, match="past expires_after"):
        f.lookup(3)


def test_a_changed_file_reads_as_a_clause_with_its_name_then_what_happened():
    """``stale`` and the code-change warning join clauses into sentences: a file's needs a colon after its name."""
    from casmon.caching.explain import Difference

    assert Difference("file", "data.txt", "its content changed (parameter 'path')").clause() == \
        "file 'data.txt': its content changed (parameter 'path')"
    assert Difference("parameter", "lr", "differs").clause() == "parameter 'lr' differs"
