"""The installed ``casmon`` script sees the current folder as ``python -m casmon`` does, and a value that
``--trust`` cannot load is one line naming it and why, never a traceback.

These run the console script itself (``bin/casmon`` beside the interpreter running the tests), not
``python -m``: only the script starts without the current folder on ``sys.path``.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).parent / "casmon"

MODEL = '''
class Model:
    """The project's own class, as a user's `model.py` holds it."""

    def __init__(self, w):
        self.w = w

    def __repr__(self):
        return f"Model(w={self.w})"
'''

TRAIN = '''
import warnings

import casmon
import model

warnings.simplefilter("ignore")  # "not a git repository": not what these tests look at


@casmon.intercept
def fit(m, steps=3):
    return m.w * steps


with casmon.record(comment="proj", capture_output=False) as run:
    run.info["model"] = model.Model(3)
    fit(model.Model(4))
'''


def casmon_script(*args, cwd):
    """The installed `casmon` script, in a clean environment: no PYTHONPATH, no CASMON_STORE."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CASMON_STORE")}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project folder with `model.py` and a store holding a run and a call that hold `model.Model` objects,
    recorded by a real `python train.py`."""
    if not SCRIPT.exists():
        pytest.skip(f"no console script at {SCRIPT} (casmon not installed in this environment)")
    root = tmp_path_factory.mktemp("project")
    (root / "model.py").write_text(textwrap.dedent(MODEL))
    (root / "train.py").write_text(textwrap.dedent(TRAIN))
    env = {k: v for k, v in os.environ.items() if k != "CASMON_STORE"}
    p = subprocess.run([sys.executable, "train.py"], cwd=root, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert (root / ".casmon" / "casmon.json").exists()
    (root / "elsewhere").mkdir()
    return root


def test_console_script_loads_the_projects_classes_from_the_current_folder(project):
    r = casmon_script("--trust", "show", "latest", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "info model = Model(w=3)" in r.stdout, r.stdout
    assert "Traceback" not in r.stderr
    r = casmon_script("show", "fit", "1", "--trust", cwd=project)
    assert r.returncode == 0, r.stderr
    assert "m = Model(w=4)" in r.stdout and "result = 12" in r.stdout, r.stdout


def test_a_value_trust_cannot_load_is_one_line_naming_it_and_why(project):
    store = str(project / ".casmon")
    r = casmon_script("--trust", "show", "latest", "--store", store, cwd=project / "elsewhere")
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.returncode == 0, r.stderr
    assert "run 1-proj" in r.stdout, "the rest of the run is still shown"
    line = next(ln for ln in r.stdout.splitlines() if "info model" in ln)
    assert "cannot load" in line and "model.Model" in line and "No module named 'model'" in line, line
    r = casmon_script("--trust", "show", "fit", "1", "--store", store, cwd=project / "elsewhere")
    assert "Traceback" not in r.stderr + r.stdout and r.returncode == 0, r.stderr
    line = next(ln for ln in r.stdout.splitlines() if ln.strip().startswith("m ="))
    assert "cannot load" in line and "model.Model" in line and "No module named 'model'" in line, line
    assert "steps = 3" in r.stdout and "result = 12" in r.stdout


def test_a_usage_error_of_the_console_script_is_one_line_with_status_1(project):
    r = casmon_script("diff", "1", cwd=project)
    assert r.returncode == 1 and r.stdout == "", (r.returncode, r.stdout, r.stderr)
    assert len(r.stderr.strip().splitlines()) == 1 and "casmon diff --help" in r.stderr, r.stderr
