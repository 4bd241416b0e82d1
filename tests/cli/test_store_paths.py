"""An error about ``--store`` names the location as it was given, in every form (``zip://``, ``file://``, a plain
or ``~`` path, ``memory://``, ``s3://`` without credentials), and the path it means where that reads otherwise;
``zip://PATH`` is the archive at PATH (fsspec's zip:// would open the current folder as one)."""

import os

import pytest

import casmon
from casmon.errors import StoreError
from tests.support.cli import cli


def refusal(location, cwd):
    r = cli("stats", "--store", location, cwd=cwd, check=False)
    assert r.returncode == 1 and r.stderr.count("\n") == 1, (r.stdout, r.stderr)
    return r.stderr.strip()


@pytest.mark.parametrize("form, words", [
    ("zip://{d}/nope.zip", "cannot open zip store at zip://{d}/nope.zip ({d}/nope.zip): no such file"),
    ("zip://{d}/nope", "cannot open zip store at zip://{d}/nope ({d}/nope): no such file"),
    ("zip://rel.zip", "cannot open zip store at zip://rel.zip (rel.zip): no such file"),
    ("zip://{d}/afolder", "cannot open zip store at zip://{d}/afolder ({d}/afolder): it is a folder"),
    ("file://{d}/nope", "cannot open store at file://{d}/nope ({d}/nope): no such folder"),
    ("file://{d}/afile", "cannot open store at file://{d}/afile ({d}/afile): it is a file, not a folder"),
    ("{d}/nope", "cannot open store at {d}/nope: no such folder"),
    ("rel/nope", "cannot open store at rel/nope: no such folder"),
    ("{d}/nope.zip", "cannot open zip store at {d}/nope.zip: no such file"),
    ("memory://nope", "no casmon store at memory://nope: it is empty"),
])
def test_a_store_error_names_the_location_as_given(tmp_path, form, words):
    (tmp_path / "afolder").mkdir()
    (tmp_path / "afile").write_text("x")
    cwd = tmp_path / "here"
    cwd.mkdir()
    err = refusal(form.format(d=tmp_path), cwd)
    assert err == "Error: " + words.format(d=tmp_path), err
    assert str(cwd) not in err  # never the folder the command ran in


def test_a_home_path_names_what_was_typed_and_where_it_is(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert refusal("~/nope", tmp_path) == f"Error: cannot open store at ~/nope ({tmp_path}/nope): no such folder"


def test_an_s3_store_without_credentials_is_named(tmp_path, monkeypatch):
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    err = refusal("s3://casmon-no-such-bucket/prefix", tmp_path)
    assert err.startswith("Error: cannot open s3://casmon-no-such-bucket/prefix: "), err


def test_zip_url_is_the_archive_at_its_path(tmp_path):
    cwd = tmp_path / "here"
    cwd.mkdir()
    url = f"zip://{tmp_path}/s.zip"
    s = casmon.open(url)
    d = s.put({"a": 1})
    s.close()
    assert (tmp_path / "s.zip").is_file() and not list(cwd.iterdir())
    s = casmon.open(tmp_path / "s.zip", read_only=True)
    assert s.get(d) == {"a": 1}
    s.close()
    assert "values" in cli("stats", "--store", url, cwd=cwd).stdout
    with pytest.raises(StoreError, match=r"zip://.*nope\.zip \(.*nope\.zip\): no such file"):
        casmon.open(f"zip://{tmp_path}/nope.zip", create=False)
