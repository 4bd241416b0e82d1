"""Values pickled before casmon's modules became packages name casmon's classes by their flat paths
(``casmon.digest.Digest``); they still load, through ``serialize.MOVED_MODULES``."""

from __future__ import annotations

import importlib.util
import pickle
import pickletools

import casmon
from casmon.keys.digest import Digest
from casmon.store import serialize


def _old_stream(value: object) -> bytes:
    """``value`` pickled as casmon before the package move wrote it: Digest named ``casmon.digest.Digest``."""
    stream = pickle.dumps(value, protocol=2)  # GLOBAL opcodes name the module as text, no length to fix
    old = stream.replace(b"casmon.keys.digest\n", b"casmon.digest\n")
    assert old != stream
    globals_named = [arg for op, arg, _ in pickletools.genops(old) if op.name == "GLOBAL"]
    assert "casmon.digest Digest" in globals_named
    return old


def test_the_old_module_path_is_gone_and_mapped():
    assert importlib.util.find_spec("casmon.digest") is None  # so the load below goes through the map
    assert serialize.MOVED_MODULES["casmon.digest"] == "casmon.keys.digest"


def test_a_pickle_naming_casmon_digest_decodes():
    d = Digest("0123456789abcdef0123456789abcdef")
    stream = _old_stream({"key": d, "more": [d]})
    enc = serialize.Encoded("pickle", {"oob": 0}, inline=stream, nbytes=len(stream))
    got = serialize.decode(enc, [])
    assert got == {"key": d, "more": [d]}
    assert type(got["key"]) is Digest


def test_a_stored_value_naming_casmon_digest_loads_from_a_store(tmp_path):
    d = Digest("fedcba9876543210fedcba9876543210")
    stream = _old_stream((d, "x"))
    with casmon.open(tmp_path / "s") as s:
        ref = s.put_encoded(serialize.Encoded("pickle", {"oob": 0}, inline=stream, nbytes=len(stream)))
    s = casmon.open(tmp_path / "s")
    assert s.get(ref) == (d, "x")
    assert type(s.get(ref)[0]) is Digest
