"""The CLI says plainly what it could not do: ambiguous and unknown names, sessions and empty selections,
usage errors in one line with status 1, never an option silently ignored, and help that tells the truth."""

import os
import sys

import pytest

import casmon
from tests.support.cli import cli

# runs recorded in tmp folders outside git say so; that is not what these tests look at
pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


def _function(module: str, name: str = "normalise"):
    """A function whose module is ``module``, as if defined in that file (two files may define one name)."""
    ns: dict = {"__name__": module}
    exec(f"def {name}(x, eps=1e-6):\n    return x\n", ns)
    return ns[name]


@pytest.fixture
def two_sessions(tmp_path):
    """Session 1: pipeline.normalise (calls 1, 2) and prep (call 1); session 2: __main__.normalise (call 1)."""
    path = tmp_path / "s"
    s = casmon.open(path)
    a = casmon.intercept(store=s)(_function("pipeline"))
    prep = casmon.intercept(store=s)(_function("pipeline", "prep"))
    a(1)
    prep(10)
    a(2)
    s.close()
    s = casmon.open(path)  # a second store object: a session of its own
    b = casmon.intercept(store=s)(_function("__main__"))
    b(3)
    s.close()
    return str(path)


def one_line_error(r) -> str:
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_show_an_ambiguous_name_lists_the_candidates(two_sessions):
    err = one_line_error(cli("show", "normalise", "--store", two_sessions, check=False))
    assert "ambiguous" in err and "__main__.normalise" in err and "pipeline.normalise" in err, err
    assert "no run 'normalise'" not in err
    # the same name with a call number says the same
    err = one_line_error(cli("show", "normalise", "1", "--store", two_sessions, check=False))
    assert "ambiguous" in err and "pipeline.normalise" in err


def test_show_an_unknown_name_says_no_function_or_run_and_what_exists(two_sessions, tmp_path, monkeypatch):
    err = one_line_error(cli("show", "nothing", "--store", two_sessions, check=False))
    assert "no function or run named 'nothing'" in err, err
    assert "no runs recorded" in err and "pipeline.normalise" in err and "pipeline.prep" in err, err
    monkeypatch.chdir(tmp_path)
    with casmon.record(comment="base", store=two_sessions, capture_output=False):
        pass
    err = one_line_error(cli("show", "nothing", "--store", two_sessions, check=False))
    assert "no function or run named 'nothing'" in err and "1-base" in err and "pipeline.prep" in err, err
    # a store with neither
    empty = casmon.open(tmp_path / "empty")
    empty.set_ref("x", empty.put(1))
    empty.close()
    err = one_line_error(cli("show", "nothing", "--store", str(tmp_path / "empty"), check=False))
    assert "no function or run named 'nothing'" in err and "no runs recorded" in err and "no logged functions" in err


def test_calls_with_a_session_and_no_name_lists_that_sessions_calls(two_sessions):
    out = cli("calls", "--session", "1", "--store", two_sessions).stdout
    assert "session 1: 3 calls of 2 functions" in " ".join(out.split()), out
    assert "pipeline.normalise" in out and "pipeline.prep" in out and "__main__.normalise" not in out
    out = cli("calls", "--session", "2", "--store", two_sessions).stdout
    flat = " ".join(out.split())  # the title wraps where the store's path is long (an xdist worker's tmp_path)
    assert "__main__.normalise" in out and "pipeline" not in flat.split("session 2", 1)[1], out
    err = one_line_error(cli("calls", "--session", "7", "--store", two_sessions, check=False))
    assert "no session 7" in err and "1-2" in err, err


def test_calls_of_a_function_with_none_in_the_session_say_so_in_one_line(two_sessions):
    r = cli("calls", "pipeline.normalise", "--session", "2", "--store", two_sessions)
    assert r.stdout.strip().splitlines() == [r.stdout.strip()], r.stdout
    msg = " ".join(r.stdout.split())
    assert "pipeline.normalise has no calls in session 2" in msg and "its calls are in session 1" in msg, msg
    err = one_line_error(cli("calls", "pipeline.normalise", "--session", "9", "--store", two_sessions, check=False))
    assert "no session 9" in err, err


@pytest.mark.parametrize("args, words", [
    (("show",), ["missing argument 'NAME'", "casmon show --help"]),
    (("diff", "1"), ["missing argument 'B'", "casmon diff --help"]),
    (("gc", "--older-than", "2x"), ["--older-than", "'2x' is not an age", "casmon gc --help"]),
    (("calls", "--sesion", "3"), ["no such option '--sesion'", "--session", "casmon calls --help"]),
    (("shwo",), ["no such command 'shwo'", "casmon --help"]),
    (("--bogus", "runs"), ["no such option '--bogus'", "casmon --help"]),
    (("cache", "clear"), ["missing argument 'NAME'", "casmon cache clear --help"]),
    (("show", "step", "x"), ["'x' is not a valid integer", "casmon show --help"]),
    (("gc", "--now", "--grace", "90"), ["--now", "--grace", "casmon gc --help"]),
])
def test_usage_errors_are_one_line_on_stderr_with_status_1(tmp_path, args, words):
    s = casmon.open(tmp_path / "s")
    s.set_ref("x", s.put(1))
    s.close()
    r = cli(*args, cwd=tmp_path / "s", check=False)
    err = one_line_error(r)
    assert r.stdout == "" and "Usage:" not in r.stderr, r.stderr
    for w in words:
        assert w in err, (w, err)


def test_help_stays_as_it_is():
    for args in (("--help",), ("show", "--help"), ("cache", "clear", "--help")):
        r = cli(*args)
        assert r.returncode == 0 and r.stdout.startswith("Usage: casmon"), r.stdout


def test_show_refuses_a_session_without_a_call_number(two_sessions, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with casmon.record(comment="base", store=two_sessions, capture_output=False):
        pass
    err = one_line_error(cli("show", "1", "--session", "2", "--store", two_sessions, check=False))
    assert "--session" in err and "show NAME N" in err, err


def test_store_help_says_which_verbs_create_a_store():
    for verb in ("stats", "verify", "gc", "cache", "calls", "show", "replay", "runs", "diff", "restore", "export",
                 "ui", "report"):
        h = " ".join(cli(verb, "--help").stdout.split())
        store = h.split("--store PATH_OR_URL", 1)[1].split(" --", 1)[0]
        assert "never creates" in store and "`demo` and `import`" in store, (verb, store)
    for verb in ("demo", "import"):
        store = " ".join(cli(verb, "--help").stdout.split()).split("--store PATH_OR_URL", 1)[1].split(" --", 1)[0]
        assert "created if there is none" in store, (verb, store)


def test_current_folder_goes_last_on_sys_path_and_only_with_trust(two_sessions, tmp_path, monkeypatch):
    """`--trust` loads the project's classes from the current folder, appended last so that a file there
    (say `random.py`) never shadows a module casmon or a library imports; without --trust nothing is
    imported from the project, so the folder is not added."""
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    cli("calls", "--store", two_sessions)
    assert os.getcwd() not in sys.path
    cli("--trust", "calls", "--store", two_sessions)
    assert sys.path[-1] == os.getcwd() and sys.path.count(os.getcwd()) == 1
    cli("show", "prep", "1", "--trust", "--store", two_sessions)
    assert sys.path.count(os.getcwd()) == 1


def test_the_verb_table_says_what_each_verb_says_of_itself():
    """``casmon --help`` lists verbs from casmon.cli.app.VERBS without loading them: the table must match them."""
    import importlib

    import click

    from casmon.cli.app import VERBS, main

    ctx = click.Context(main)
    assert set(VERBS) == set(main.list_commands(ctx))
    for name, (module, attr, summary) in VERBS.items():
        cmd = getattr(importlib.import_module(module), attr)
        assert cmd.name == name
        assert main.get_command(ctx, name) is cmd
        assert click.Command(name, help=summary).get_short_help_str(10_000) == cmd.get_short_help_str(10_000), name
