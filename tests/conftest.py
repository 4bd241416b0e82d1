import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import casmon

ROOT = Path(__file__).resolve().parent.parent


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", default=False, help="run long soak and fuzz variants")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="long variant: run with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def local_store(tmp_path):
    s = casmon.open(tmp_path / "store", autoflush=None)
    yield s
    s.close()


@pytest.fixture(params=["local", "memory", "zip"])
def any_store(request, tmp_path):
    """The same tests on every backend casmon supports without a server."""
    if request.param == "local":
        loc = tmp_path / "store"
    elif request.param == "memory":
        loc = f"memory://{uuid.uuid4().hex}"
    else:
        loc = tmp_path / "store.zip"
    s = casmon.open(loc, autoflush=None)
    s.kind = request.param
    yield s
    s.close()


def run_python(code: str, *args: str, env: dict | None = None, cwd=None, check=True) -> subprocess.CompletedProcess:
    """Run code in a fresh interpreter with casmon importable."""
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    if env:
        e.update(env)
    p = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=e, cwd=cwd, timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"subprocess failed ({p.returncode}):\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p
