"""casmon's errors stay what user code catches: every public name imports, the hierarchy holds, each class is one
object however it was reached (the rarer ones are made on first use), and pickles and keys name them as before."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import pytest

import casmon
import casmon.errors as errors
from casmon.keys.fingerprint import fingerprint
from tests.support.processes import ENV

#: (name, its bases' names) for every public class of casmon.errors.
HIERARCHY = {
    "CasmonError": ("Exception",), "StoreError": ("CasmonError",), "StoreFormatError": ("StoreError",),
    "DamagedObjectError": ("CasmonError",), "MissingObjectError": ("CasmonError", "KeyError"),
    "UnpicklableError": ("TypeError",), "NotKeyableError": ("UnpicklableError",), "NotKeyable": ("Exception",),
    "UnstableKeyWarning": ("UserWarning",), "UntrustedStoreError": ("CasmonError",),
    "StoreDamageWarning": ("UserWarning",), "NoActiveRunError": ("CasmonError", "RuntimeError"),
    "RunSignal": ("BaseException",),
}


def _run(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=ENV,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_public_name_imports_and_the_hierarchy_is_unchanged():
    for name in errors.__all__:
        assert getattr(errors, name) is not None
    for name, bases in HIERARCHY.items():
        cls = getattr(errors, name)
        assert tuple(b.__name__ for b in cls.__bases__) == bases, name
        assert cls.__name__ == cls.__qualname__ == name
    assert set(HIERARCHY) <= set(dir(errors))
    with pytest.raises(AttributeError):
        errors.NoSuchError  # noqa: B018


def test_a_rare_class_is_one_object_by_every_route_and_pickles_round_trip():
    from casmon.errors import RunSignal, UnpicklableError
    from casmon.rare_errors import RunSignal as Home

    assert RunSignal is Home is errors.RunSignal is casmon.RunSignal
    assert UnpicklableError is casmon.UnpicklableError
    e = pickle.loads(pickle.dumps(errors.NoActiveRunError("outside a run")))
    assert type(e) is errors.NoActiveRunError and isinstance(e, errors.CasmonError) and str(e) == "outside a run"
    w = pickle.loads(pickle.dumps(errors.StoreDamageWarning("x")))
    assert type(w) is errors.StoreDamageWarning
    assert pickle.dumps(errors.UnpicklableError) == pickle.dumps(getattr(sys.modules["casmon.errors"],
                                                                         "UnpicklableError"))
    assert b"casmon.errors" in pickle.dumps(errors.UnpicklableError)  # named where it always was
    assert b"casmon.table" in pickle.dumps(errors.StoreDamageWarning)


def test_a_rare_class_is_the_same_whether_a_fresh_process_meets_it_by_except_pickle_or_key():
    """In a fresh process the rare classes are not built until named; each route then gets the one class, and
    its key (a type's fingerprint names its module) is the one it had when casmon.errors defined it."""
    got = _run("""
        import json, pickle, sys
        import casmon.errors as errors
        out = {"built_at_import": "casmon.rare_errors" in sys.modules}
        # a pickle naming the class, before anything else named it
        cls = pickle.loads(b"\\x80\\x04\\x95\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x8c\\rcasmon.errors\\x94"
                           b"\\x8c\\tRunSignal\\x94\\x93\\x94.")
        out["pickle_route"] = cls is errors.RunSignal
        try:
            raise errors.NotKeyable("no")
        except Exception as e:
            out["except_route"] = isinstance(e, errors.NotKeyable) and type(e).__module__ == "casmon.errors"
        from casmon.keys.fingerprint import fingerprint
        out["key"] = fingerprint(errors.UnpicklableError).hex()
        print(json.dumps(out))
    """)
    assert got["built_at_import"] is False
    assert got["pickle_route"] and got["except_route"]
    assert got["key"] == fingerprint(errors.UnpicklableError).hex()


def test_a_hasher_raising_notkeyable_still_gives_a_notkeyableerror_naming_where_the_value_sits():
    class Live:
        pass

    def refuse(v):
        raise errors.NotKeyable("bound to a socket")

    casmon.register_hasher(Live, refuse)
    try:
        with pytest.raises(errors.NotKeyableError, match=r"value\[1\].*bound to a socket"):
            fingerprint((1, Live()))
    finally:
        casmon.unregister_hasher(Live)
