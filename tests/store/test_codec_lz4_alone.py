"""A fresh process decodes lz4 with the block extension alone (casmon.keys.cext): no ``lz4`` package ``__init__``, no second shared
library; a later ``import lz4.block`` or ``lz4.frame`` by anyone works and shares the loaded extension; and
where the short way fails, the ordinary import serves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def _run(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_fresh_process_decodes_lz4_without_loading_the_lz4_package():
    out = _run("""
        import json, sys
        from casmon.store import codec
        data = bytes(range(256)) * 64
        ok = codec._lz4_block_decompress()(codec._lz4_compress()(data)) == data
        loaded = [m for m in ("lz4", "lz4._version", "lz4.version", "lz4.block") if m in sys.modules]
        block = codec.lz4_block()
        import lz4.block, lz4.frame
        shared = lz4.block.decompress is block.decompress and lz4.block.compress is block.compress
        again = lz4.block.decompress(lz4.block.compress(data)) == data
        frame = lz4.frame.decompress(lz4.frame.compress(data)) == data
        print(json.dumps({"ok": ok, "loaded": loaded, "shared": shared, "again": again, "frame": frame,
                          "version": lz4.library_version_number() > 0}))
    """)
    assert out == {"ok": True, "loaded": [], "shared": True, "again": True, "frame": True, "version": True}


def test_lz4_block_loaded_first_is_used_as_it_is():
    out = _run("""
        import json, sys
        import lz4.block
        from casmon.store import codec
        print(json.dumps({"same": codec.lz4_block() is lz4.block}))
    """)
    assert out == {"same": True}


def test_where_the_extension_cannot_be_found_alone_the_ordinary_import_serves():
    out = _run("""
        import json, sys
        from casmon.keys import cext
        from casmon.store import codec
        def broken(name):
            raise OSError("the extension's folder cannot be read")
        cext._load_alone = broken
        block = codec.lz4_block()
        data = b"abc" * 1000
        print(json.dumps({"package": "lz4" in sys.modules, "ok": block.decompress(block.compress(data)) == data}))
    """)
    assert out == {"package": True, "ok": True}


def test_a_spec_that_is_not_an_extension_is_not_loaded_alone():
    out = _run("""
        import json, sys
        import importlib.machinery
        class Other:  # finds lz4.block._block as Python source somewhere: not the short way's to load
            def find_spec(self, name, path=None, target=None):
                if name == "lz4.block._block":
                    return importlib.machinery.ModuleSpec(name, importlib.machinery.SourceFileLoader(name, "/nonexistent.py"))
                return None
        sys.meta_path.insert(0, Other())
        from casmon.store import codec
        try:
            codec.lz4_block()
            result = "loaded"
        except Exception:  # the import system's own error, from the finder's source file
            result = "import error"
        print(json.dumps({"result": result, "alone": "lz4.block._block" in sys.modules and "lz4" not in sys.modules}))
    """)
    # the ordinary import then meets the same finder, as it would have without casmon; nothing was loaded alone
    assert out == {"result": "import error", "alone": False}


def test_without_lz4_there_is_no_block_codec_and_numcodecs_serves():
    out = _run("""
        import json, sys
        class NoLz4:
            def find_spec(self, name, path=None, target=None):
                if name == "lz4" or name.startswith("lz4."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, NoLz4())
        from casmon.store import codec
        data = bytes(range(256)) * 64
        print(json.dumps({"block": codec.lz4_block() is None,
                          "ok": codec._lz4_block_decompress()(codec._lz4_compress()(data)) == data}))
    """)
    assert out == {"block": True, "ok": True}


def test_an_lz4_block_module_still_being_imported_elsewhere_is_not_used_half_made():
    """Another thread's ``import lz4.block`` puts the module in ``sys.modules`` before its functions are bound:
    the codec then loads the extension itself rather than answer with a module lacking ``decompress``."""
    out = _run("""
        import json, sys, types
        half = types.ModuleType("lz4.block")  # as the import system leaves it mid-import
        sys.modules["lz4.block"] = half
        from casmon.store import codec
        block = codec.lz4_block()
        data = b"xyz" * 500
        print(json.dumps({"half": block is half, "ok": block.decompress(block.compress(data)) == data}))
    """)
    assert out == {"half": False, "ok": True}
