"""The sdist and the wheel as a packager builds them (``python -m build``): what each holds, and their metadata.

One build of both for the module, from a copy of the source tree (a build writes ``casmon.egg-info`` and
``build/`` beside its sources: copies of the suite running at once must not share them), without build
isolation: the test extra's setuptools builds it, so nothing is downloaded.
"""

from __future__ import annotations

import email
import email.policy
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import casmon
from tests.conftest import ROOT

#: Never part of a source tree, whatever a checkout holds beside it.
JUNK = {".git", "__pycache__", "build", "dist", ".casmon", ".hypothesis", ".pytest_cache", ".mypy_cache"}


def _junk(part: str) -> bool:
    return part in JUNK or part.startswith(".venv") or part.endswith((".egg-info", ".pyc"))


def source_files() -> list[str]:
    """The source tree's files, relative to its root: git's tracked and not-ignored files in a checkout, and
    every file but build output and caches elsewhere (an unpacked sdist)."""
    try:
        p = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           timeout=120)
    except OSError:
        p = None
    if p is not None and p.returncode == 0 and p.stdout:
        names = [n for n in p.stdout.decode().split("\0") if n]
    else:
        names = [str(f.relative_to(ROOT)) for f in ROOT.rglob("*") if f.is_file()]
    return sorted(n for n in names if (ROOT / n).is_file() and not any(_junk(part) for part in Path(n).parts))


@pytest.fixture(scope="module")
def dists(tmp_path_factory):
    """The source files, and the sdist and wheel built from a copy of them (the wheel from the sdist, as
    ``python -m build`` does by default)."""
    files = source_files()
    src, out = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("dist")
    for name in files:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, src / name)
    for junk in ("tests/.hypothesis/examples/x", "tests/cache/.casmon/zarr.json", "docs/__pycache__/x.cpython-311.pyc"):
        (src / junk).parent.mkdir(parents=True, exist_ok=True)  # what a test run leaves in a checkout CI builds from
        (src / junk).write_text("left by a test run")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(out), str(src)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (sdist,) = out.glob("casmon-*.tar.gz")
    (wheel,) = out.glob("casmon-*.whl")
    return files, sdist, wheel


def _metadata(text: str) -> email.message.Message:
    return email.message_from_string(text, policy=email.policy.compat32)


def test_the_wheel_holds_the_package_with_its_data_and_licences_and_nothing_else(dists):
    files, _sdist, wheel = dists
    v = casmon.__version__
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        licence = z.read(f"casmon-{v}.dist-info/licenses/LICENSE").decode()
        uplot = z.read(f"casmon-{v}.dist-info/licenses/casmon/ui/static/uPlot.LICENSE").decode()
        meta = _metadata(z.read(f"casmon-{v}.dist-info/METADATA").decode())
        entry_points = z.read(f"casmon-{v}.dist-info/entry_points.txt").decode()
    assert wheel.name == f"casmon-{v}-py3-none-any.whl"
    package = {n for n in files if n.startswith("casmon/")}
    assert package - names == set()  # every file of the package: its code, py.typed, the UI's static files
    assert {"casmon/py.typed", "casmon/ui/static/uPlot.LICENSE", "casmon/ui/static/uPlot.iife.min.js"} <= names
    strays = {n for n in names - package if not n.startswith(f"casmon-{v}.dist-info/")}
    assert strays == set()  # nothing of tests/, benchmarks/, docs/, no cache files
    assert licence == (ROOT / "LICENSE").read_text() and "MIT License" in licence
    assert uplot == (ROOT / "casmon/ui/static/uPlot.LICENSE").read_text()
    assert meta["Version"] == v and meta["License-Expression"] == "MIT"
    assert sorted(meta.get_all("License-File")) == ["LICENSE", "casmon/ui/static/uPlot.LICENSE"]
    classifiers = meta.get_all("Classifier")
    assert not [c for c in classifiers if c.startswith("License ::")]  # PEP 639: the SPDX field alone
    assert {f"Programming Language :: Python :: 3.{m}" for m in (11, 12, 13)} <= set(classifiers)
    assert meta["Requires-Python"] == ">=3.11" and meta["Author"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert set(urls) >= {"Homepage", "Documentation", "Source", "Issues"}
    assert all(u.startswith("https://github.com/casmon-dev/casmon") for u in urls.values())
    assert "casmon = casmon.cli:main" in entry_points
    # The README is the index page: a relative link there leads nowhere.
    description = meta.get_payload()
    assert "casmon remembers values" in description
    assert re.findall(r"\]\((?!https://|#)[^)]*\)", description) == []
    assert re.findall(r'(?:href|src)="(?!https://|#)[^"]*"', description) == []


def test_the_sdist_holds_the_whole_test_tree_and_docs_and_no_benchmarks(dists):
    files, sdist, _wheel = dists
    top = f"casmon-{casmon.__version__}/"
    with tarfile.open(sdist) as t:
        names = {m.name[len(top):] for m in t.getmembers() if m.isfile() and m.name.startswith(top)}
    wanted = {n for n in files if n.split("/")[0] in ("casmon", "tests", "docs")}
    assert wanted - names == set()  # conftest.py, tests/support, the seeds' data, docs/examples among them
    assert {"tests/conftest.py", "tests/support/__init__.py", "LICENSE", "README.md", "pyproject.toml"} <= names
    shipped = [n for n in names if not n.startswith("casmon.egg-info/")]  # setuptools' own metadata, always there
    assert [n for n in shipped if n.split("/")[0] in ("benchmarks", ".ci") or any(map(_junk, Path(n).parts))] == []


def test_a_test_runs_from_the_unpacked_sdist(dists, tmp_path):
    """The sdist's test tree is whole: a test using the shared fixtures and a docs example passes from it."""
    _files, sdist, _wheel = dists
    with tarfile.open(sdist) as t:
        t.extractall(tmp_path, filter="data")
    (root,) = tmp_path.iterdir()
    env = dict(os.environ, PYTHONPATH=str(root))
    where = subprocess.run([sys.executable, "-c", "import casmon, tests.conftest as c; print(casmon.__file__, c.ROOT)"],
                           cwd=root, capture_output=True, text=True, env=env, timeout=120)
    assert where.stdout.split() == [str(root / "casmon" / "__init__.py"), str(root)], where.stderr  # not the checkout's
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/cache/test_cache.py::test_runnable_example"],
                       cwd=root, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "1 passed" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]
