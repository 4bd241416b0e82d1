"""Stores written by an older casmon (``OLD_COMMIT`` in tests/conftest.py: table format 1, before the
large-value changes) read back exactly, are upgraded in place, and lose nothing to an old writer
still open while a new one upgrades the store; chunks written now still decode with the old reader."""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pickle
import random
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.errors import StoreFormatError
from casmon.store.objects import loose_key
from casmon.errors import StoreDamageWarning
from tests.support.processes import run_code_in
from tests.support.stores import loose_headers


OLD_WRITER = r"""
import sys, casmon
sys.path.insert(0, sys.argv[3])
import workmod
store = casmon.open(sys.argv[1])
work = casmon.cache(store=store)(workmod.work)
for i in range(int(sys.argv[2])):
    work(i)
    if i % 200 == 199:
        store.flush()  # level-0 files, then format-1 generations as they accumulate (16 files: a merge)
store.append("note", {"n": 1}, key=b"k" * 16)
store.close()
"""


# The cached function lives in a module file both processes import: its code version then comes from
# the same source on both sides (Python 3.13 keeps `python -c` source for inspect, older ones do not,
# so a function defined in `-c` code and one made by exec() would be two versions there).
WORKMOD = """
def work(i):
    return {"i": i, "sq": i * i}
"""


def run_old(old: Path, code: str, *args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(old))
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=str(old), timeout=600)


def test_a_store_written_before_format_2_is_read_then_upgraded(tmp_path, old_casmon, monkeypatch):
    root = tmp_path / "store"
    n = 4_000  # 20 level-0 files of 200: 16 merged into a format-1 generation, 4 left
    (tmp_path / "workmod.py").write_text(WORKMOD)
    p = run_old(old_casmon, OLD_WRITER, root, n, tmp_path)
    assert p.returncode == 0, p.stderr
    assert json.loads((root / "casmon.json").read_text())["format"] == 1
    assert list((root / "records/cache/gens").iterdir())  # it has format-1 generations to read

    # Read by this casmon as it is: read-only opens change nothing.
    ro = casmon.open(root, read_only=True)
    assert ro.verify().ok
    assert ro.lookup("note", b"k" * 16) == [{"n": 1}]
    assert json.loads((root / "casmon.json").read_text())["format"] == 1

    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "workmod", raising=False)
    work_fn = importlib.import_module("workmod").work
    with warnings.catch_warnings():
        warnings.simplefilter("error", StoreDamageWarning)
        store = casmon.open(root)
        cached = casmon.cache(store=store)(work_fn)
        for i in random.Random(0).sample(range(n), 300):
            assert cached(i) == {"i": i, "sq": i * i}
        # Every one a hit: the old process's entries, found in format-1 generations and level-0 files.
        assert cached.cache_info().hits == 300 and cached.cache_info().misses == 0
        # More writing: merges write format-2 generations, and the marker says format 2 first.
        for i in range(n, n + 3_000):
            cached(i)
            if i % 200 == 199:
                store.flush()
        store.flush()
        t = store.table("cache")
        t.consolidate(force=True)
        t.refresh()
        assert all(g.v == 2 for g in t._active_gens)
        assert t.count() == n + 3_000
        store.close()
    assert json.loads((root / "casmon.json").read_text())["format"] == 2
    again = casmon.open(root)
    assert again.verify().ok
    assert again.lookup("note", b"k" * 16) == [{"n": 1}]
    assert len({k for k, _ in again.records("cache")}) >= n
    again.close()
    # The casmon before format 2 now refuses the store, saying to upgrade, instead of misreading it.
    p = run_old(old_casmon, "import sys, casmon; casmon.open(sys.argv[1])", root)
    assert p.returncode != 0 and "Upgrade casmon" in p.stderr, p.stderr
    with pytest.raises(StoreFormatError):  # and this one refuses a newer format than its own
        from casmon.store.marker import marker_bytes

        (tmp_path / "newer").mkdir()
        (tmp_path / "newer/casmon.json").write_bytes(marker_bytes({"format": 99}))
        casmon.open(tmp_path / "newer")


OLD_APPENDER = r"""
import sys, os, time, hashlib, casmon
root, n = sys.argv[1], int(sys.argv[2])
store = casmon.open(root, autoflush=None)
print("open", flush=True)
while not os.path.exists(root + ".go"):
    time.sleep(0.01)
for i in range(n):
    store.append("x", {"who": "old", "i": i}, key=hashlib.blake2b(b"old%d" % i, digest_size=16).digest())
    if i % 20 == 19:
        store.flush()  # level-0 files, and format-1 merges as they accumulate
store.flush()
store.close()
"""


def test_an_old_writer_already_open_while_a_new_one_upgrades_the_store_loses_nothing(tmp_path, old_casmon):
    """The old casmon opened the store before it was marked format 2, so it keeps writing: it takes
    the new format-2 generations for damage (warnings in its stderr) while both merge. Held: every
    record of both is read exactly once afterwards and verify is clean."""
    root = tmp_path / "store"
    n = 1500
    env = dict(os.environ, PYTHONPATH=str(old_casmon))
    p = subprocess.Popen([sys.executable, "-c", OLD_APPENDER, str(root), str(n)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, cwd=str(old_casmon))
    try:
        assert p.stdout.readline().strip() == "open", p.stderr.read()
        assert json.loads((root / "casmon.json").read_text())["format"] == 1
        s = casmon.open(root, autoflush=None)
        Path(str(root) + ".go").touch()
        for i in range(n):
            s.append("x", {"who": "new", "i": i}, key=hashlib.blake2b(b"new%d" % i, digest_size=16).digest())
            if i % 20 == 19:
                s.flush()
        s.flush()
        _, err = p.communicate(timeout=600)
    finally:
        p.kill()
    assert p.returncode == 0, err
    assert json.loads((root / "casmon.json").read_text())["format"] == 2
    s.close()
    r = casmon.open(root, read_only=True)
    recs = [(k, v["who"], v["i"]) for k, v in r.records("x")]
    assert max(Counter(recs).values()) == 1
    assert Counter(who for _, who, _ in recs) == {"old": n, "new": n}
    assert r.verify().ok


#: The last commit before issue 14 changed how chunks are written (raw storage, the chunk pool).
MiB = 1 << 20


_MAKE = """
import dataclasses, pickle, sys
import numpy as np
import casmon
print(casmon.__file__, file=sys.stderr)
rng = np.random.default_rng(11)
values = {
    "random": rng.random(5 << 20 >> 3 << 1),                     # 10 MiB, compressed by the old code
    "ints": rng.integers(0, 1000, 6 << 20 >> 3).astype(np.float64),
    "nested": {"x": rng.random(300_000).astype(np.float32), "n": 3},
    "bytes": bytes(rng.integers(0, 255, 300_000, dtype=np.uint8)),
    "json": {"a": [1, 2.5, "x"]},
    "tuple": (rng.random(40_000), "label"),
}
s = casmon.open(sys.argv[1])
digests = {k: s.put(v).hex() for k, v in values.items()}
s.close()
with open(sys.argv[2], "wb") as f:
    pickle.dump((digests, values), f)
"""


def _with_path(code: str, path: Path) -> str:
    return f"import sys; sys.path.insert(0, {str(path)!r})\n" + code


def test_store_written_by_the_old_code_reads_back_exactly(tmp_path, old_casmon):
    made = run_code_in(_with_path(_MAKE, old_casmon), str(tmp_path / "s"), str(tmp_path / "v.pkl"), cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert str(old_casmon) in made.stderr  # the old code wrote it
    assert any(h.codec == 1 for h in loose_headers(tmp_path / "s"))  # random floats compressed, as the old code did
    digests, values = pickle.loads((tmp_path / "v.pkl").read_bytes())
    s = casmon.open(tmp_path / "s")
    for k, d in digests.items():
        assert pickle.dumps(s.get(d), 5) == pickle.dumps(values[k], 5), k
    assert s.verify().ok
    # Put again by this code: same values, same digests (manifests unchanged), readable by both.
    for k, v in values.items():
        assert s.put(v).hex() == digests[k], k
    s.close()


_DECODE_OLD = """
import sys
from pathlib import Path
import numpy as np
from casmon.codec import decode_frame
print(sys.modules["casmon.codec"].__file__, file=sys.stderr)
names, want = sys.argv[2].split(","), np.load(sys.argv[3])
got = b"".join(bytes(decode_frame(Path(sys.argv[1], n).read_bytes(), n)[1]) for n in names)
assert got == want.tobytes()
print("ok")
"""


def test_chunks_written_now_decode_with_the_old_frame_reader(tmp_path, old_casmon):
    """The frame format did not change: a raw chunk is codec 0, which every casmon reads.

    (The store as a whole may carry a newer format marker, which older casmon refuses by design.)
    """
    a = np.random.default_rng(13).random(MiB)
    s = casmon.open(tmp_path / "s", autoflush=None)
    d = s.put(a)
    s.close()
    names = [loose_key(c) for c in s.manifest(d).chunk_digests()]
    assert len(names) == 2 and all(h.codec == 0 for h in loose_headers(tmp_path / "s"))
    np.save(tmp_path / "a.npy", a)
    read = run_code_in(_with_path(_DECODE_OLD, old_casmon), str(tmp_path / "s"), ",".join(names), str(tmp_path / "a.npy"),
                cwd=tmp_path)
    assert read.returncode == 0 and read.stdout.strip() == "ok", read.stderr
    assert str(old_casmon) in read.stderr
