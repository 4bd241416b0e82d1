"""`import casmon` stays light: heavy dependencies load when a store is first used (issue 14).

Behavioural, not timed: which modules an import pulls in, checked in fresh interpreters.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Loaded only when a store is opened (zarr, asyncio), a chunk compressed (numcodecs), a run
#: recorded (git, importlib.metadata) or the CLI started (rich, click).
HEAVY = ["zarr", "numcodecs", "asyncio", "git", "rich", "click", "importlib.metadata", "obstore", "fsspec"]


def _loaded_after(code: str, cwd: Path) -> dict:
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))
    """)
    r = subprocess.run([sys.executable, "-c", probe], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", r.stderr  # importing casmon prints nothing
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_casmon_loads_no_heavy_dependency(tmp_path):
    loaded = _loaded_after("import casmon", tmp_path)
    assert not any(loaded.values()), [m for m, v in loaded.items() if v]


def test_decorating_a_module_loads_no_heavy_dependency(tmp_path):
    """A user module that decorates functions at import pays for zarr only at its first call."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import casmon

        @casmon.cache
        def square(x):
            return x * x

        @casmon.intercept
        def add(a, b=1):
            return a + b

        @casmon.cache(store="memory://deco")
        def cube(x):
            return x ** 3
    """))
    loaded = _loaded_after("import usermod", tmp_path)
    assert not any(loaded.values()), [m for m, v in loaded.items() if v]
    assert not (tmp_path / ".casmon").exists()  # no store opened or created by decorating


def test_a_local_folder_is_used_without_zarr_and_is_still_a_zarr_store(tmp_path):
    """A local folder is read and written with plain system calls: zarr (a third of a second to
    import, tens of milliseconds at exit) and asyncio are never loaded for it. The folder keeps
    zarr's LocalStore layout: zarr itself, opened on it afterwards, lists and reads the same keys."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import casmon

        @casmon.cache
        def square(x):
            return x * x
    """))
    loaded = _loaded_after("""
        import numpy as np
        import usermod
        assert usermod.square(7) == 49 and usermod.square(7) == 49
        import casmon
        s = casmon.open("s")
        d = s.put(np.arange(300_000.0))
        assert s.get(d)[-1] == 299_999.0
        s.flush()
        assert s.verify().ok
    """, tmp_path)
    assert not loaded["zarr"] and not loaded["asyncio"]
    assert loaded["numcodecs"]  # the array was compressed
    assert not loaded["git"] and not loaded["rich"] and not loaded["click"]
    import asyncio

    from zarr.storage import LocalStore

    z = LocalStore(tmp_path / "s", read_only=True)

    async def keys():
        return sorted([k async for k in z.list()])

    listed = asyncio.run(keys())
    on_disk = sorted(str(p.relative_to(tmp_path / "s")) for p in (tmp_path / "s").rglob("*") if p.is_file())
    assert listed == on_disk and "casmon.json" in listed and not any(k.endswith(".partial") for k in listed)
    from zarr.buffer import default_buffer_prototype

    got = asyncio.run(z.get("casmon.json", prototype=default_buffer_prototype()))
    assert got.to_bytes() == (tmp_path / "s" / "casmon.json").read_bytes()
    assert (tmp_path / ".casmon" / "casmon.json").exists()
