"""Every number option of the CLI refuses NaN, infinities and absurd values with one line naming the option
(``gc --grace/--max-size/--older-than``): a NaN grace is never due, 1e308 seconds overflows every clock it is
added to. The Python options are checked in tests/cache, tests/maintenance and tests/store."""

import pytest

from tests.support.stores import one_cached_call
from tests.support.cli import cli

BAD_SECONDS = ["nan", "inf", "1e308", "NaN"]
HUGE = "9" * 400


@pytest.fixture
def store(tmp_path):
    return one_cached_call(tmp_path / "s")


def one_line_refusal(*args, option):
    r = cli(*args, check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    assert option in r.stderr and "finite number" in r.stderr and "Traceback" not in r.stderr, r.stderr
    return r.stderr


@pytest.mark.parametrize("value", BAD_SECONDS)
def test_gc_grace_refuses_nan_inf_and_absurd(store, value):
    one_line_refusal("gc", "--store", store, "--dry-run", "--grace", value, option="--grace")


@pytest.mark.parametrize("option, value", [("--max-size", "99999999999999999999999T"), ("--max-size", HUGE),
                                          ("--older-than", HUGE + "w"), ("--older-than", "99999999999w")])
def test_gc_sizes_and_ages_refuse_absurd_values(store, option, value):
    err = one_line_refusal("gc", "--store", store, "--dry-run", option, value, option=option)
    assert len(err) < 300, err  # the value is cut, the line stays short


def test_gc_still_takes_ordinary_values(store):
    cli("gc", "--store", store, "--dry-run", "--grace", "7200", "--max-size", "1.5GiB", "--older-than", "30d")
