"""The code version's parse cache (casmon/keys/versioncache.py): a fresh process reuses the parses an earlier one
made of unchanged functions, gets the same version it would have computed, and never a stale one: an edited
helper misses, and a damaged or crafted cache file is ignored.

Behavioural: each step is a fresh interpreter, as each run of a user's script is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

HELPERS = textwrap.dedent("""
    SCALE = 3

    def helper(x):
        return x * SCALE + 1

    def other(x):
        return [helper(i) for i in range(x)]
""")

MAIN = textwrap.dedent("""
    import json, sys
    from casmon.keys import codeversion, versioncache
    import helpers

    def step(n):
        return helpers.other(n) + [helpers.helper(n)]

    version = codeversion.function_version(step).hex()
    versioncache.write_all()  # what the exit does
    print(json.dumps({"version": version, "stats": versioncache.STATS}))
""")


def _version(d: Path, write: bool = True) -> dict:
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    r = subprocess.run([sys.executable, "main.py"], cwd=d, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _project(tmp_path: Path, helpers: str = HELPERS) -> Path:
    (tmp_path / "helpers.py").write_text(helpers)
    (tmp_path / "main.py").write_text(MAIN)
    return tmp_path


def _cache_files(d: Path) -> list[Path]:
    return sorted((d / "__pycache__").glob("*.casmon-parses"))


def _edit(d: Path, old: str, new: str) -> None:
    """Edit helpers.py as a user does; its bytecode goes, so the edit runs even within the same second."""
    (d / "helpers.py").write_text(HELPERS.replace(old, new))
    for f in (d / "__pycache__").glob("*.pyc"):
        f.unlink()


def _uncached(d: Path) -> str:
    for f in _cache_files(d):
        f.unlink()
    got = _version(d, write=False)
    assert got["stats"]["hits"] == 0 and not _cache_files(d)
    return got["version"]


def test_a_fresh_process_reuses_the_parses_of_unchanged_functions_and_gets_the_same_version(tmp_path):
    d = _project(tmp_path)
    first = _version(d)
    assert first["stats"]["misses"] >= 3  # step, other, helper
    assert first["stats"]["writes"] == 2  # once per source file, not once per function
    assert {f.name.split(".")[0] for f in _cache_files(d)} == {"main", "helpers"}
    second = _version(d)
    assert second["stats"]["misses"] == 0 and second["stats"]["hits"] >= 3, second["stats"]
    assert second["stats"]["writes"] == 0  # a process that only reuses parses writes nothing
    assert second["version"] == first["version"] == _uncached(d)


def test_an_edited_helper_misses_and_changes_the_version(tmp_path):
    d = _project(tmp_path)
    before = _version(d)["version"]
    assert _version(d)["stats"]["misses"] == 0
    _edit(d, "x * SCALE + 1", "x * SCALE + 20")
    after = _version(d)
    assert after["stats"]["misses"] == 1, after["stats"]  # helper alone: other and step are unchanged
    assert after["version"] != before
    assert after["version"] == _uncached(d)


def test_a_comment_only_edit_keeps_the_version_through_the_cache(tmp_path):
    d = _project(tmp_path)
    before = _version(d)["version"]
    _edit(d, "return x * SCALE + 1", "return x * SCALE + 1  # why")
    after = _version(d)
    assert after["stats"]["misses"] == 1 and after["version"] == before


def test_a_crafted_cache_file_is_ignored_never_trusted(tmp_path):
    """Entries that name the real keys but carry another parse (a wrong check) are ignored; so is a file that
    is not JSON, nests too deep, is too large, or has the wrong shape."""
    d = _project(tmp_path)
    true = _version(d)["version"]
    _edit(d, "x * SCALE + 1", "x * SCALE - 10")
    edited = _uncached(d)
    assert edited != true
    _version(d)
    for f in _cache_files(d):  # every entry now says "the parse of the code before the edit"
        doc = json.loads(f.read_text())
        for key, entry in doc["entries"].items():
            entry[0] = entry[0].replace("Sub()", "Add()")
        f.write_text(json.dumps(doc))
    got = _version(d)
    assert got["version"] == edited, "a crafted entry was trusted"
    assert got["stats"]["ignored"] >= 1 and got["stats"]["hits"] >= 1  # untouched entries still serve
    crafted = [b"\x00garbage", b"[" * 100_000 + b"]" * 100_000, b'{"format": 1, "entries": []}',
               b'{"format": 1, "entries": {"k": [1, 2, 3]}}', b"{}", b" " * (9 << 20)]
    for raw in crafted:
        for f in _cache_files(d):
            f.write_bytes(raw)
        got = _version(d)
        assert got["version"] == edited, raw[:40]


def test_an_unwritable_or_odd_cache_place_is_ignored(tmp_path):
    d = _project(tmp_path)
    (d / "__pycache__").mkdir()
    (d / "__pycache__" / f"helpers.{sys.implementation.cache_tag}.casmon-parses").mkdir()  # a folder in its place
    first = _version(d)
    assert first["version"] == _version(d)["version"]
    os.chmod(d / "__pycache__", 0o500)
    try:
        assert _version(d)["version"] == first["version"]
    finally:
        os.chmod(d / "__pycache__", 0o700)


def test_parses_are_written_at_exit_without_the_explicit_call(tmp_path):
    d = _project(tmp_path)
    (d / "main.py").write_text(MAIN.replace("versioncache.write_all()", "pass"))
    assert _version(d)["stats"]["writes"] == 0
    assert len(_cache_files(d)) == 2  # written by the exit hook
    assert _version(d)["stats"]["misses"] == 0


def test_under_pythondontwritebytecode_nothing_is_written(tmp_path):
    d = _project(tmp_path)
    got = _version(d, write=False)
    assert got["stats"]["writes"] == 0 and not _cache_files(d)


def test_code_whose_file_does_not_exist_keeps_no_cache(tmp_path):
    """A notebook cell's code names a file that was never written (ipykernel's ``/tmp/ipykernel_N/M.py``):
    its version is computed from linecache's lines, and no ``__pycache__`` is made for it."""
    cell = tmp_path / "ipykernel_1" / "12345.py"
    code = textwrap.dedent(f"""
        import json, linecache
        from casmon.keys import codeversion, versioncache
        src = "def f(x):\\n    return x + 1\\n"
        linecache.cache[{str(cell)!r}] = (len(src), None, src.splitlines(True), {str(cell)!r})
        ns = {{}}
        exec(compile(src, {str(cell)!r}, "exec"), ns)
        v = codeversion.function_version(ns["f"]).hex()
        versioncache.write_all()
        print(json.dumps({{"version": v, "stats": versioncache.STATS}}))
    """)
    env = {"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                       env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["stats"]["writes"] == 0
    assert not (tmp_path / "ipykernel_1").exists()
