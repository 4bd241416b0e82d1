"""A name given wrong gets "did you mean": verbs (``casmon stat``), cache verbs (``casmon cache cleer f``), run
names and ``latest`` (``casmon show lates``), cached and logged functions (``casmon cache clear mod.fnuc``) --
in the CLI and in the Python lookups it calls; a name close to nothing gets no guess."""

import pytest

import casmon
from tests.support.cli import cli

pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


def _function(module: str, name: str):
    ns: dict = {"__name__": module}
    exec(f"def {name}(x):\n    return x\n", ns)
    return ns[name]


@pytest.fixture
def store(tmp_path):
    """Runs 1-baseline and 2; cached mod.func; logged mod.prepare."""
    path = tmp_path / "s"
    s = casmon.open(path)
    with casmon.record(store=s, comment="baseline") as r:
        r.log(loss=1.0)
    with casmon.record(store=s) as r:
        r.log(loss=0.5)
    casmon.cache(store=s)(_function("mod", "func"))(1)
    casmon.intercept(store=s)(_function("mod", "prepare"))(2)
    s.close()
    return str(path)


def error(*args):
    r = cli(*args, check=False)
    assert r.returncode == 1 and not r.stdout, (r.stdout, r.stderr)
    line = " ".join(r.stderr.split())
    assert r.stderr.count("\n") == 1, r.stderr  # one line
    return line


@pytest.mark.parametrize("typed, meant", [("stts", "stats"), ("cahce", "cache"), ("shwo", "show"), ("verfiy", "verify"),
                                          ("rusn", "runs")])
def test_a_mistyped_verb_gets_the_verb_it_is_close_to(typed, meant):
    assert error(typed) == f"Error: no such command {typed!r}; did you mean {meant!r}? (see casmon --help)"


def test_a_mistyped_verb_close_to_two_names_both():
    assert error("stat") == "Error: no such command 'stat'; did you mean 'stats' or 'stale'? (see casmon --help)"


def test_a_verb_close_to_none_gets_no_guess():
    assert error("frobnicate") == "Error: no such command 'frobnicate' (see casmon --help)"


def test_a_mistyped_cache_verb_before_a_name_is_a_verb_given_wrong(store):
    line = error("cache", "cleer", "mod.func", "--store", store)
    assert "no such command 'cleer'; did you mean 'clear'?" in line
    assert "(or did you mean `casmon cache clear NAME`?)" in error("cache", "clera", "--store", store)


@pytest.mark.parametrize("args", [("show", "lates"), ("diff", "lates", "1"), ("export", "lates", "OUT"),
                                  ("restore", "lates", "OUT"), ("report", "lates", "-o", "OUT/r.html")])
def test_a_mistyped_run_name_or_latest_gets_did_you_mean_in_every_verb(store, tmp_path, args):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    assert "(did you mean 'latest'?)" in error(*args, "--store", store)


def test_a_mistyped_run_name_gets_the_run(store):
    assert "(did you mean '1-baseline'?)" in error("show", "1-baselien", "--store", store)
    s = casmon.open(store, read_only=True)
    with pytest.raises(LookupError, match=r"no run '1-baselnie' \(did you mean '1-baseline'\?\)"):
        casmon.load_run("1-baselnie", s)
    s.close()


@pytest.mark.parametrize("args", [("cache", "clear", "mod.fnuc"), ("cache", "fnuc"), ("cache", "clear", "fnuc")])
def test_a_mistyped_cached_function_gets_the_function(store, args):
    assert "(did you mean 'mod.func'?)" in error(*args, "--store", store)


@pytest.mark.parametrize("args", [("calls", "mod.prepaer"), ("show", "prepaer", "1"), ("replay", "prepaer", "1")])
def test_a_mistyped_logged_function_gets_the_function(store, args):
    assert "(did you mean 'mod.prepare'?)" in error(*args, "--store", store)


def test_a_name_close_to_nothing_gets_no_guess(store):
    assert "did you mean" not in error("show", "zzzzzz", "--store", store)
    assert "did you mean" not in error("cache", "clear", "qqqq", "--store", store)


def test_a_mistyped_metric_or_column_gets_the_metric(store):
    assert "(did you mean 'loss'?)" in error("runs", "--columns", "lsos", "--store", store)
    s = casmon.open(store, read_only=True)
    with pytest.raises(LookupError, match=r"has no metric 'lsos' \(did you mean 'loss'\?\)"):
        casmon.load_run("latest", s).metric("lsos")
    s.close()
    assert "(did you mean 'metric.loss'?)" in error("runs", "--columns", "metric.lsos", "--store", store)


def test_show_of_a_cached_function_points_at_casmon_cache(store):
    """`casmon show mod.func` (cached, not logged) said only "no function or run named"."""
    for name in ("mod.func", "func"):
        r = cli("show", name, "--store", store, check=False)
        assert r.returncode == 1 and "is a cached function (mod.func)" in r.stderr
        assert "`casmon cache mod.func`" in r.stderr and len(r.stderr.strip().splitlines()) == 1
