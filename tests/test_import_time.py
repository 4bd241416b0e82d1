"""`import casmon` stays light: heavy dependencies load when a store is first used, casmon's own layers when
their names are first used, numpy only when a value needs it.

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
#: casmon's own layers beyond what a decorator needs, loaded when their names are first used or a store is,
#: and numpy, loaded by the user's arrays alone.
LAYERS = ["numpy", "casmon.store.store", "casmon.store.backend", "casmon.store.table", "casmon.maintenance",
          "casmon.calllog.reader", "casmon.runs", "casmon.ui", "casmon.cli", "casmon.compat"]


def _loaded_after(code: str, cwd: Path) -> dict:
    probe = textwrap.dedent(code) + textwrap.dedent(f"""
        import json, sys
        print(json.dumps({{m: m in sys.modules for m in {HEAVY + LAYERS!r}}}))
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


def test_each_public_name_loads_its_layer_on_first_use(tmp_path):
    loaded = _loaded_after("""
        import casmon
        assert "Store" not in vars(casmon)
        s = casmon.open("s")
        assert casmon.Store is type(s) and "Store" in vars(casmon)  # loaded once, a plain attribute after
        assert "open" in dir(casmon) and "list_runs" in dir(casmon)
        try:
            casmon.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("casmon.no_such_name did not raise")
    """, tmp_path)
    assert loaded["casmon.store.store"] and not loaded["casmon.runs"] and not loaded["casmon.calllog.reader"]


def test_the_cli_help_loads_no_verb(tmp_path):
    """``casmon --help`` lists every verb from the table in casmon.cli.app, importing none of their modules."""
    probe = textwrap.dedent("""
        import json, sys
        from casmon.cli.app import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        verbs = [m for m in sys.modules if m.startswith("casmon.cli.") and m not in ("casmon.cli.app", "casmon.cli.options")]
        print(json.dumps({"verbs": verbs, "rich": "rich" in sys.modules, "numpy": "numpy" in sys.modules,
                          "store": "casmon.store.store" in sys.modules}))
    """)
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert "runs" in r.stdout and "verify" in r.stdout  # the verbs are listed
    assert got == {"verbs": [], "rich": False, "numpy": False, "store": False}


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


def test_a_cache_hit_in_a_fresh_process_needs_no_compressor_library(tmp_path):
    """The first lookup decodes its table block through the small lz4 package: numcodecs (30-110 ms to import,
    it scans every installed package's entry points) is for chunks of values, which a small hit has none of."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import casmon

        @casmon.cache(store="s")
        def double(x):
            return {"x": x, "twice": [x, x]}
    """))
    made = _loaded_after("""
        import usermod, casmon
        for i in range(2000):
            usermod.double(i)
        casmon.open("s").flush()
    """, tmp_path)
    assert made["casmon.store.table"]
    loaded = _loaded_after("""
        import usermod
        assert usermod.double(1234) == {"x": 1234, "twice": [1234, 1234]}
        assert usermod.double.cache_info().hits == 1
    """, tmp_path)
    assert not loaded["numcodecs"] and not loaded["zarr"] and not loaded["git"], loaded


def test_values_that_are_not_arrays_never_load_numpy(tmp_path):
    """numpy (50-70 ms to import) loads with the user's arrays: hits on small plain values (stored uncompressed)
    in a store of merged generations and level-0 files above and below a block's size never load it, nor does
    casmon on a miss (numcodecs, which compresses and decodes larger values, imports it)."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import casmon

        @casmon.cache(store="s")
        def double(x):
            return {"x": x, "twice": [x, x], "s": "v" * (x % 50)}
    """))
    made = _loaded_after("""
        import usermod, casmon
        for i in range(3000):
            usermod.double(i)
        casmon.open("s").flush()
    """, tmp_path)
    assert made["numcodecs"] or not made["numpy"], "casmon loaded numpy for plain values"  # zstd's library needs it
    _loaded_after("""
        import casmon
        from casmon.caching.entries import KIND
        t = casmon.open("s").table(KIND)
        t.consolidate(min_l0=1, force=True)  # merges work with numpy: a merge may load it
        assert t._active_gens
    """, tmp_path)
    made = _loaded_after("""
        import usermod, casmon
        for i in range(3000, 3400):  # a level-0 file above a block's size
            usermod.double(i)
        casmon.open("s").flush()
        for i in range(3400, 3410):
            usermod.double(i)
        casmon.open("s").flush()
    """, tmp_path)
    assert made["numcodecs"] or not made["numpy"], "casmon loaded numpy for plain values"
    loaded = _loaded_after("""
        import usermod
        for i in (0, 2999, 3000, 3399, 3405):
            assert usermod.double(i) == {"x": i, "twice": [i, i], "s": "v" * (i % 50)}
        assert usermod.double.cache_info().hits == 5
    """, tmp_path)
    assert not loaded["numpy"], "hits on plain values loaded numpy"


def test_a_hit_on_an_incompressible_array_needs_no_compressor_library(tmp_path):
    """An array that does not compress is stored raw and its manifest in lz4: a fresh process's first hit on it
    reads both without numcodecs (40-100 ms to import), which only compressed chunks need."""
    (tmp_path / "usermod.py").write_text(textwrap.dedent("""
        import casmon
        import numpy as np

        @casmon.cache(store="s")
        def noise(n):
            return np.random.default_rng(0).random(n)

        @casmon.cache(store="s")
        def table(n):
            return {"rows": list(range(n)), "names": ["row %d" % i for i in range(n)]}
    """))
    _loaded_after("import usermod\nusermod.noise(2_000_000)\nusermod.table(5_000)", tmp_path)
    loaded = _loaded_after("""
        import usermod
        a = usermod.noise(2_000_000)
        assert a.shape == (2_000_000,) and usermod.table(5_000)["names"][-1] == "row 4999"
        assert usermod.noise.cache_info().hits == 1 and usermod.table.cache_info().hits == 1
    """, tmp_path)
    assert not loaded["numcodecs"] and not loaded["zarr"], loaded
