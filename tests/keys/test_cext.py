"""The keys hash with xxhash's C extension alone (casmon.keys.cext): a fresh process loads neither the ``xxhash``
package nor its version module; a later ``import xxhash`` by anyone works and gives the very same functions;
where the short way fails, or finds something other than a C extension, the ordinary import serves."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent


def _run(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_fresh_process_hashes_without_the_xxhash_package_and_a_later_import_shares_its_functions():
    out = _run("""
        import json, sys
        from casmon.keys.digest import digest_bytes, xxhash as ext
        from casmon.store import codec, objects
        d = digest_bytes(b"x").hex()
        loaded = [m for m in ("xxhash", "xxhash.version") if m in sys.modules]
        import xxhash
        print(json.dumps({"loaded": loaded, "digest": d, "theirs": xxhash.xxh3_128(b"x").digest().hex(),
                          "same": all(getattr(xxhash, n) is getattr(ext, n) for n in
                                      ("xxh3_128", "xxh3_128_digest", "xxh3_128_hexdigest", "xxh3_64_hexdigest",
                                       "xxh3_64_intdigest")),
                          "version": xxhash.VERSION, "alias": xxhash.xxh128 is ext.xxh3_128}))
    """)
    import xxhash
    assert out == {"loaded": [], "digest": xxhash.xxh3_128_hexdigest(b"x"), "theirs": xxhash.xxh3_128_hexdigest(b"x"),
                   "same": True, "version": xxhash.VERSION, "alias": True}


def test_xxhash_imported_first_is_used_as_it_is():
    out = _run("""
        import json
        import xxhash
        from casmon.keys import digest
        print(json.dumps({"same": digest.xxhash is xxhash}))
    """)
    assert out == {"same": True}


@pytest.mark.parametrize("error", ["ModuleNotFoundError", "OSError"])
def test_where_the_extension_cannot_be_found_alone_the_xxhash_package_serves(error):
    out = _run("""
        import json, sys
        class Lone:  # the extension, looked up before its package is loaded, cannot be found or read
            def find_spec(self, name, path=None, target=None):
                if name == "xxhash._xxhash" and "xxhash" not in sys.modules:
                    raise %s("xxhash._xxhash")
                return None
        sys.meta_path.insert(0, Lone())
        from casmon.keys.digest import digest_bytes, xxhash
        print(json.dumps({"package": xxhash is sys.modules.get("xxhash"), "digest": digest_bytes(b"x").hex()}))
    """ % error)
    import xxhash
    assert out == {"package": True, "digest": xxhash.xxh3_128_hexdigest(b"x")}


def test_a_spec_that_is_not_an_extension_is_not_loaded_alone():
    out = _run("""
        import json, sys
        import importlib.machinery
        class Other:  # finds xxhash._xxhash as Python source somewhere: not the short way's to load
            def find_spec(self, name, path=None, target=None):
                if name == "xxhash._xxhash":
                    return importlib.machinery.ModuleSpec(name, importlib.machinery.SourceFileLoader(name, "/nonexistent.py"))
                return None
        sys.meta_path.insert(0, Other())
        try:
            from casmon.keys import digest
            result = "loaded"
        except Exception:  # the import system's own error, from the finder's source file
            result = "import error"
        print(json.dumps({"result": result, "alone": "xxhash._xxhash" in sys.modules and "xxhash" not in sys.modules}))
    """)
    assert out == {"result": "import error", "alone": False}


def test_without_xxhash_importing_the_keys_fails_as_importing_xxhash_would():
    out = _run("""
        import json, sys
        class NoXxhash:
            def find_spec(self, name, path=None, target=None):
                if name == "xxhash" or name.startswith("xxhash."):
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None
        sys.meta_path.insert(0, NoXxhash())
        try:
            from casmon.keys import digest
            print(json.dumps({"error": None}))
        except ModuleNotFoundError as e:
            print(json.dumps({"error": e.name}))
    """)
    assert out == {"error": "xxhash"}


def test_an_xxhash_package_still_being_imported_elsewhere_is_not_used_half_made():
    """Another thread's ``import xxhash`` puts the package in ``sys.modules`` before its functions are bound:
    the keys then load the extension themselves rather than take a module lacking ``xxh3_128``."""
    out = _run("""
        import json, sys, types
        half = types.ModuleType("xxhash")  # as the import system leaves it mid-import
        sys.modules["xxhash"] = half
        from casmon.keys.digest import digest_bytes, xxhash
        del sys.modules["xxhash"]
        import xxhash as real
        print(json.dumps({"half": xxhash is half, "ok": digest_bytes(b"x").hex() == real.xxh3_128_hexdigest(b"x")}))
    """)
    assert out == {"half": False, "ok": True}


def test_an_extension_at_the_top_level_is_found_and_loaded_alone():
    out = _run("""
        import json, sys
        from casmon.keys.cext import extension_alone
        mod = extension_alone("_lzma", ("LZMACompressor",), "lzma")
        print(json.dumps({"name": mod.__name__, "wrapper": "lzma" in sys.modules}))
    """)
    assert out == {"name": "_lzma", "wrapper": False}
