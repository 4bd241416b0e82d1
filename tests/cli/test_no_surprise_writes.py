"""Verbs write nothing they were not asked to: no store made at a mistyped path, no file changed unless
it is a casmon zip store, readers create nothing, writers still make their stores."""

import json
import os
import subprocess
import sys
import zipfile

import pytest

import casmon
from casmon.errors import StoreError
from tests.conftest import ROOT
from tests.support.cli import cli


# runs recorded in tmp folders outside git say so; that is not what these tests look at
pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


def test_verbs_never_create_a_store_at_a_mistyped_path(tmp_path):
    typo = tmp_path / "typo"
    for args in (["gc"], ["gc", "--dry-run"], ["gc", "--now"], ["cache", "clear", "f"], ["verify", "--repair"],
                 ["stats"], ["verify"], ["calls"], ["runs"], ["show", "x"], ["cache"]):
        r = cli(*args, "--store", str(typo), check=False)
        assert r.returncode == 1 and "no such folder" in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
        assert not typo.exists(), args
    empty = tmp_path / "empty"
    empty.mkdir()
    r = cli("gc", "--store", str(empty), check=False)
    assert r.returncode == 1 and "no casmon store" in r.stderr and list(empty.iterdir()) == []
    r = cli("gc", "--store", str(tmp_path / "missing.zip"), check=False)
    assert r.returncode == 1 and not (tmp_path / "missing.zip").exists()


def test_a_file_is_never_modified_unless_it_is_a_casmon_zip_store(tmp_path):
    notzip = tmp_path / "notes.zip"
    notzip.write_text("my notes, not a zip\n")
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("holiday.txt", "photos")
    plain = tmp_path / "data.txt"
    plain.write_text("data")
    for f in (notzip, other, plain):
        before = f.read_bytes()
        for args in (["gc"], ["gc", "--now"], ["cache", "clear", "f"], ["verify", "--repair"], ["stats"]):
            r = cli(*args, "--store", str(f), check=False)
            assert r.returncode == 1 and "Traceback" not in r.stderr, (f, args, r.stderr)
        with pytest.raises(casmon.CasmonError):  # the library refuses too, writing or not
            casmon.open(f)
        assert f.read_bytes() == before, f
    # a casmon zip store is opened and written as always
    z = casmon.open(tmp_path / "ok.zip")
    z.set_ref("x", z.put([1, 2]))
    z.close()
    assert json.loads(cli("stats", "--json", "--store", str(tmp_path / "ok.zip")).stdout)["refs"] == 1


def test_readers_create_nothing_and_writers_still_make_stores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in ("typo", "typo.zip", str(tmp_path / "deep" / "typo")):
        with pytest.raises(StoreError, match="no such"):
            casmon.load(path)
        with pytest.raises(StoreError, match="no such"):
            casmon.load_run("latest", path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="no casmon store"):
        casmon.load("empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"] and not any((tmp_path / "empty").iterdir())
    # writing still makes a store where there is none: casmon.open, the default store, the decorators
    code = (
        "import casmon\n"
        "@casmon.intercept\n"
        "def f(x): return x + 1\n"
        "@casmon.cache\n"
        "def g(x): return x * 2\n"
        "f(1); g(2)\n"
        "log = casmon.load()\n"  # the default store, open in this process, is read as it is
        "assert log.result('f', 1) == 2, log\n"
        "s = casmon.open('made/here'); s.set_ref('x', s.put(1)); s.close()\n"
    )
    p = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    assert (tmp_path / ".casmon" / "casmon.json").exists() and (tmp_path / "made" / "here" / "casmon.json").exists()
    assert casmon.load(".casmon").result("f", 1) == 2
