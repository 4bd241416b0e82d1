"""A script's first cached call that hits loads only what a hit needs: a fresh process reading a stored
multi-chunk array back imports no thread-pool machinery, no logging and no OpenSSL, and gets the array whole.

Behavioural, not timed: which modules a first hit pulls in, checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
#: What a hit never needs: the chunk pool's executor (and the logging and traceback it imports), OpenSSL's
#: hashes, and casmon's layers above the cache.
NEVER = ["concurrent.futures", "logging", "traceback", "hashlib", "_hashlib", "queue", "asyncio", "zarr",
         "numcodecs", "casmon.maintenance", "casmon.runs", "casmon.calllog.reader", "casmon.view.display",
         "casmon.ui", "casmon.cli",
         # a table's cold halves: read whole, sealed batches changed, merges, repair, gc's fences
         "casmon.store.table.whole", "casmon.store.table.batches", "casmon.store.table.merge",
         "casmon.store.table.survey", "casmon.store.table.encode", "casmon.store.table.fence_gc",
         "casmon.store.table.lookaside",
         "casmon.store.blobwrite", "casmon.store.backend.urls", "casmon.store.condemnedlist",
         "casmon.keys.arrays", "casmon.caching.edges", "casmon.caching.saving"]

SCRIPT = textwrap.dedent("""
    import json, sys
    import numpy as np
    import casmon

    CALLS = []

    def noise(seed, n):  # incompressible floats (as most results are) without numpy.random, which loads OpenSSL
        x = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(seed)
        x ^= x >> np.uint64(29)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        return (x >> np.uint64(11)).astype(np.float64) * 2.0 ** -53

    @casmon.cache(store=casmon.open(sys.argv[1]))
    def make(seed, n):
        CALLS.append(seed)
        return noise(seed, n)

    a = make(1, 3_000_000)  # 24 MB: six 4 MiB chunks, read on several threads
    ok = bool((a == noise(1, 3_000_000)).all())
    print(json.dumps({"calls": len(CALLS), "ok": ok, "loaded": [m for m in %r if m in sys.modules]}))
""" % (NEVER,))


def _run(script: Path, store: Path) -> dict:
    r = subprocess.run([sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, cwd=script.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_fresh_processs_first_hit_on_a_large_array_loads_no_pool_logging_or_openssl(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    miss = _run(script, tmp_path / "store")
    assert miss["calls"] == 1 and miss["ok"]
    hit = _run(script, tmp_path / "store")
    assert hit["calls"] == 0, "the second process missed"
    assert hit["ok"], "the hit returned a different array"
    assert hit["loaded"] == [], f"a first hit loaded {hit['loaded']}"


def test_a_damaged_chunk_met_by_a_fresh_processs_threaded_read_is_recomputed_never_returned(tmp_path):
    """The first hit reads chunks on short-lived threads: a chunk damaged on disk is caught on its thread and
    the call recomputes, never returning the damaged bytes."""
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    assert _run(script, tmp_path / "store")["calls"] == 1
    loose = sorted((p for p in (tmp_path / "store" / "objects").rglob("*") if p.is_file()),
                   key=lambda p: p.stat().st_size)
    assert len(loose) >= 6
    for victim in loose[-6:][1::2]:  # every other chunk: one early, one late, whichever thread reads them
        data = bytearray(victim.read_bytes())
        data[-100] ^= 0xFF
        victim.write_bytes(bytes(data))
    again = _run(script, tmp_path / "store")
    assert again["ok"], "a damaged chunk was returned"
    assert again["calls"] == 1, "the damaged value was not recomputed"


#: What a bare script's first hit of a plain function never needs: inspect (the parameters are read from the
#: code), the parsers a code version uses only where its kept parse is missing, linecache and tokenize (a plain
#: source file is read without them), pickle.py (the C pickler serves), the array codecs, the cache's listing
#: and eviction, the tables' writing, merging and surveying halves, and typing (its names are the type checker's);
#: the json package (its C scanner and string escaping serve), threading (its C locks serve), weakref.py, math,
#: binascii (an inline value is decoded in Python), struct.py and bisect.py (their C halves serve), array
#: and copy; the C pickler and what it imports (a plain result's pickle is read by casmon.store.plainpickle,
#: a keyword-only default's dict checked by identity); the lz4 and xxhash packages (their C extensions serve
#: alone); gc's time bounds; what only writes (encoding a value, and the fault points), gc checks, large values,
#: arrays, ML values and views need.
BARE_NEVER = ["typing", "inspect", "ast", "dis", "textwrap", "linecache", "tokenize", "pickle", "numcodecs", "zarr", "numpy",
              "concurrent.futures", "logging", "casmon.caching.eviction", "casmon.store.pickleinfo",
              "casmon.store.table.encode", "casmon.store.table.survey", "casmon.store.table.merge",
              "json", "threading", "weakref", "math", "copy", "signal", "struct", "_struct", "bisect", "array", "binascii",
              "casmon.store.reliance", "casmon.store.libraries", "casmon.keys.dtypes", "casmon.keys.segments", "casmon.view.guards",
              "casmon.faultpoints", "casmon.store.encode",
              "casmon.store.blobwrite", "casmon.store.chunkio", "casmon.store.backend.urls", "casmon.store.manifestcheck",
              "casmon.store.condemnedlist", "casmon.store.valuewrite", "casmon.store.refwrite",
              "casmon.caching.edges", "casmon.rare_errors", "casmon.keys.libraries",
              "casmon.caching.saving", "casmon.keys.arrays", "casmon.caching.resultref",
              "_weakrefset",
              "_bisect",
              "lz4", "lz4._version", "lz4.version",
              "_pickle", "_compat_pickle", "casmon.keys.cpickle", "casmon.store.unpicklers",
              "xxhash", "xxhash.version",
              "casmon.store.condemned",
              ]
# BARE's text names no "coding": a CR-newline file is one line to tokenize, so one that names it anywhere is
# left to linecache (as the interpreter would read its declaration).

BARE = textwrap.dedent("""
    import sys
    before = set(sys.modules)  # what the interpreter's start loaded (an editable install's finder: pathlib...)
    import casmon

    CALLS = []

    def helper(x):
        return x * 3

    @casmon.cache(store=casmon.open(sys.argv[1]))
    def work(i, scale=2, *, offset=1):
        CALLS.append(i)
        return helper(i) * scale + offset

    r = work(5, offset=4)
    loaded = [m for m in %r if m in sys.modules and m not in before]
    import json
    print(json.dumps({"calls": len(CALLS), "r": r, "loaded": loaded}))
""" % (BARE_NEVER,))


def test_a_bare_scripts_first_hit_loads_no_inspect_parser_or_array_codec(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(BARE)
    miss = _run(script, tmp_path / "store")
    assert miss["calls"] == 1 and miss["r"] == 34
    hit = _run(script, tmp_path / "store")
    assert hit["calls"] == 0, "the second process missed"
    assert hit["r"] == 34
    assert hit["loaded"] == [], f"a bare first hit loaded {hit['loaded']}"


@pytest.mark.parametrize("form", ["crlf_bom", "cr", "coding_latin1"])
def test_a_script_hits_whether_or_not_linecache_read_its_source(tmp_path, form):
    """casmon reads a plain UTF-8 source without linecache, and leaves other files to it: the code version, and so
    the key, is the same either way, so a script that imports linecache itself (as most programs end up doing)
    hits the entry a bare one stored, and the other way round."""
    text = BARE.replace("import sys\n", "import sys\nLINECACHE\n", 1)
    if form == "coding_latin1":
        text = "# -*- coding: latin-1 -*-\n# caf\xe9\n" + text
    newline = {"crlf_bom": "\r\n", "cr": "\r", "coding_latin1": "\n"}[form]
    data = text.replace("\n", newline).encode("latin-1" if form == "coding_latin1" else "utf-8")
    if form == "crlf_bom":
        data = b"\xef\xbb\xbf" + data
    bare, with_lc = tmp_path / "bare.py", tmp_path / "with_lc.py"
    bare.write_bytes(data.replace(b"LINECACHE", b"pass"))
    with_lc.write_bytes(data.replace(b"LINECACHE", b"import linecache"))
    store = tmp_path / "store"
    assert _run(bare, store)["calls"] == 1
    assert _run(with_lc, store)["calls"] == 0, "a script that loaded linecache missed the bare script's entry"
    store2 = tmp_path / "store2"
    assert _run(with_lc, store2)["calls"] == 1
    hit = _run(bare, store2)
    assert hit["calls"] == 0, "a bare script missed the entry of one that loaded linecache"
    if form != "coding_latin1":
        assert "linecache" not in hit["loaded"]


PLAIN = textwrap.dedent("""
    import json, sys
    import casmon

    CALLS = []
    PICKLERS = ("pickle", "_pickle", "_compat_pickle", "casmon.keys.cpickle", "casmon.store.unpicklers")

    @casmon.cache(store=casmon.open(sys.argv[1]))
    def plain(kind, n):
        CALLS.append(kind)
        if kind == "int":
            return n * 3
        if kind == "str":
            return "x\\U0001F600\\udc80" * n
        return [n, {2: (3.5, -0.0, frozenset({4}))}, {5, 6}, bytearray(b"ab")]

    got = [plain(k, 10) for k in ("int", "str", "nested")]
    loaded = [m for m in PICKLERS if m in sys.modules]
    again = plain("nested", 10)  # a warm hit: a fresh copy of the kept result
    got[2][0] = "changed"
    print(json.dumps({"calls": len(CALLS), "loaded": loaded, "r": repr(got[:2]), "nested": repr(again),
                      "fresh": again is not got[2]}))
""")


def test_a_fresh_processs_first_hits_of_plain_values_load_no_pickle_module(tmp_path):
    """A plain result's pickle is read (and kept for the next hit) without the C pickler, which costs a fresh
    process's first hit ~0.6 ms to load; a warm hit still returns a fresh copy."""
    script = tmp_path / "script.py"
    script.write_text(PLAIN)
    miss = _run(script, tmp_path / "store")
    assert miss["calls"] == 3
    hit = _run(script, tmp_path / "store")
    assert hit["calls"] == 0, "the second process missed"
    assert hit["loaded"] == [], f"a plain first hit loaded {hit['loaded']}"
    assert (hit["r"], hit["nested"]) == (miss["r"], miss["nested"])
    assert hit["nested"] == repr([10, {2: (3.5, -0.0, frozenset({4}))}, {5, 6}, bytearray(b"ab")])
    assert hit["fresh"]
