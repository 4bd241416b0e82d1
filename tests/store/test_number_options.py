"""The seconds casmon reads from the environment (``CASMON_LOCK_LEASE``, ``CASMON_MIN_GRACE``,
``CASMON_RETRY_SECONDS``) are checked as options are: NaN, infinities, absurd values and text are one line naming
the variable, not a lease that never ends or a float() traceback."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("var", ["CASMON_LOCK_LEASE", "CASMON_MIN_GRACE", "CASMON_RETRY_SECONDS"])
@pytest.mark.parametrize("value", ["nan", "inf", "1e308", "soon"])
def test_seconds_from_the_environment_are_checked_naming_the_variable(var, value):
    code = "import casmon.store.lock, casmon.store.condemned, casmon.store.backend.retry"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={"PYTHONPATH": str(ROOT), var: value, "PATH": ""})
    assert p.returncode == 1
    last = p.stderr.strip().splitlines()[-1]
    assert last == f"ValueError: ${var} must be a finite number of seconds " + (
        "from" if var == "CASMON_RETRY_SECONDS" else "over") + f" 0 to 100 years, got {value!r}", last
