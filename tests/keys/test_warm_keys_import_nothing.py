"""Once warm, an array's key runs no import statement: a function-level import (for a module a first hit
leaves unloaded) cost each small array's key a third more; such modules are imported once, then kept."""

import builtins
import threading

import numpy as np

from casmon.keys.fingerprint import fingerprint


def _imports_in_this_thread(fn, times=20):
    me = threading.get_ident()
    seen = []
    real = builtins.__import__

    def counting(name, *args, **kwargs):
        if threading.get_ident() == me:
            seen.append(name)
        return real(name, *args, **kwargs)

    builtins.__import__ = counting
    try:
        for _ in range(times):
            fn()
    finally:
        builtins.__import__ = real
    return seen


def test_a_warm_arrays_key_runs_no_import_statement():
    plain, scalar = np.arange(16.0), np.float64(2.5)
    structured = np.zeros(3, dtype=[("x", "f8"), ("y", "i1")])
    strided = np.arange(64.0).reshape(8, 8)[::2, ::3]
    values = (plain, scalar, structured, structured[0], strided)
    for v in values:
        fingerprint(v)
    assert _imports_in_this_thread(lambda: [fingerprint(v) for v in values]) == []

