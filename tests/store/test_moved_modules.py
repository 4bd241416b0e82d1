"""Values pickled before casmon's modules became packages name casmon's classes by their flat paths
(``casmon.digest.Digest``, ``casmon.objects.Location``); they still load: the public types through
the namespaces ``casmon.keys.names`` keeps, every other class through ``serialize.MOVED_MODULES``."""

from __future__ import annotations

import importlib.util
import pickle
import pickletools
import sys

import casmon
from casmon.keys.digest import Digest
from casmon.store import serialize


def _old_stream(value: object) -> bytes:
    """``value`` pickled as casmon before the package move wrote it: Digest named ``casmon.digest.Digest``."""
    stream = pickle.dumps(value, protocol=2)  # GLOBAL opcodes name the module as text, no length to fix
    globals_named = [arg for op, arg, _ in pickletools.genops(stream) if op.name == "GLOBAL"]
    assert "casmon.digest Digest" in globals_named  # the name it had, still
    return stream


def test_the_old_module_path_is_gone_and_mapped():
    assert importlib.util.find_spec("casmon.keys.digest") is not None
    assert not hasattr(sys.modules["casmon.digest"], "__file__")  # a namespace, not a module on disk
    assert serialize.MOVED_MODULES["casmon.digest"] == "casmon.keys.digest"


def test_a_class_of_an_old_module_with_no_namespace_loads_through_the_map():
    from casmon.store.objects import Location

    loc = Location("p" * 32, 3, 4, 0, 4)
    stream = pickle.dumps(loc, protocol=2).replace(b"casmon.store.objects\n", b"casmon.objects\n")
    assert b"casmon.objects\n" in stream and "casmon.objects" not in sys.modules
    enc = serialize.Encoded("pickle", {"oob": 0}, inline=stream, nbytes=len(stream))
    assert serialize.decode(enc, []) == loc


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
