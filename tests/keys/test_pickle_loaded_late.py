"""A key of plain values loads no pickle (its C module costs a fresh process's first hit ~0.5 ms); values that
need it key the same whether pickle was loaded before casmon, after casmon's first key, or by casmon itself.

Behavioural: checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.support.processes import ENV

KEYS = textwrap.dedent("""
    class Point:  # reaches the pickle-level rule: its first key checks its copy through pickle
        def __init__(self, x):
            self.x = x

    values = [pickle.PickleBuffer(b"abc"), (1, pickle.PickleBuffer(bytearray(b"xyz"))), Point(3), [Point(4)]]
    out["keys"] = [fingerprint(v).hex() for v in values]
    print(json.dumps(out))
""")


def _run(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_key_of_plain_values_or_a_digest_loads_no_pickle():
    got = _run(textwrap.dedent("""
        import json, sys
        from casmon.keys.digest import Digest
        from casmon.keys.fingerprint import fingerprint
        fingerprint((1, 2.5, "a", b"b", None, [True], {"k": frozenset({3})}))
        fingerprint(("casmon.cache", 2, "f", Digest(bytes(16))))  # a cache key's prefix: a code version's Digest
        print(json.dumps([m for m in ("pickle", "_pickle", "casmon.keys.cpickle") if m in sys.modules]))
    """))
    assert got == []


def test_values_key_the_same_whether_pickle_was_loaded_before_or_after_the_first_key():
    before = _run("import json, pickle\nfrom casmon.keys.fingerprint import fingerprint\nout = {}\n" + KEYS)
    after = _run("import json\nfrom casmon.keys.fingerprint import fingerprint\nout = {'first': fingerprint(1).hex()}\n"
                 "import pickle\n" + KEYS)
    assert before["keys"] == after["keys"]
    assert len(set(before["keys"])) == 4
