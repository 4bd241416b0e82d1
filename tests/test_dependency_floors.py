"""The lowest versions pyproject.toml allows for casmon's core dependencies work: a floor no one tests is a promise
no one keeps.

On Python 3.11 (the oldest casmon supports), a fresh virtual environment gets every core dependency at exactly its
floor (``name>=X`` becomes ``name==X``, wheels only), with the test extra's tools the core suite uses, and the core
suite runs against it from this tree. Long (a venv, a download, minutes of tests): ``--runslow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import ROOT

#: The core suite: the layers every install uses, and the command line (click's and rich's floors).
CORE = ["tests/keys", "tests/store", "tests/cache", "tests/maintenance", "tests/cli"]
#: The test extra's packages the core suite uses (S3 through moto, pools of workers, frames), as the extra pins them.
TEST_TOOLS = {"pytest", "hypothesis", "pandas", "obstore", "moto", "boto3", "dask", "joblib"}


def floors() -> dict[str, str]:
    """Each core dependency's name and its floor (the version of its ``>=``), as pyproject.toml declares them."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    out = {}
    for text in deps:
        req = Requirement(text)
        lows = [s.version for s in req.specifier if s.operator == ">="]
        assert len(lows) == 1, f"pyproject.toml: {text!r} has no single floor (>=) to test"
        out[req.name] = lows[0]
    return out


def tool_requirements() -> list[str]:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    return [text for text in extra if Requirement(text).name in TEST_TOOLS]


def python311() -> str:
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip() if _has("pyenv") else ""
    found = sorted(Path(root or Path.home() / ".pyenv").glob("versions/3.11.*/bin/python3"),
                   key=lambda p: [int(x) for x in p.parent.parent.name.split(".")[:3] if x.isdigit()])
    if not found:
        pytest.fail("the floors are checked on Python 3.11, which is neither this interpreter nor under pyenv")
    return str(found[-1])


def _has(cmd: str) -> bool:
    return any(os.access(Path(d, cmd), os.X_OK) for d in os.environ.get("PATH", "").split(os.pathsep))


def test_every_core_dependency_has_a_floor():
    assert {"zarr", "numcodecs", "numpy"} <= set(floors())
    assert {Requirement(t).name for t in tool_requirements()} == TEST_TOOLS


@pytest.mark.slow
def test_the_core_suite_passes_on_python_3_11_with_every_core_dependency_at_its_floor(tmp_path):
    pins = [f"{name}=={version}" for name, version in floors().items()]
    venv = tmp_path / "venv"
    subprocess.run([python311(), "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    p = subprocess.run([py, "-m", "pip", "install", "-q", "--only-binary=:all:", *pins, *tool_requirements()],
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, f"the floors do not install together: {pins}\n{p.stderr[-3000:]}"
    check = "import importlib.metadata as m, json, sys; print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    got = json.loads(subprocess.run([py, "-c", check, *floors()], capture_output=True, text=True, timeout=120,
                                    check=True).stdout)
    assert {n: Version(v) for n, v in got.items()} == {n: Version(v) for n, v in floors().items()}  # not newer ones
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([py, "-m", "pytest", "-q", "--tb=short", "--disable-warnings", "-p", "no:cacheprovider", *CORE],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=3600)
    assert p.returncode == 0, p.stdout[-6000:] + p.stderr[-2000:]
