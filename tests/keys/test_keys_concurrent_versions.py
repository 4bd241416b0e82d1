"""A version computed while another thread computes the same one comes out as it does alone.

A class whose values refer back to it (a slots dataclass, an Enum, a registry) reaches its own
version in its walk; there its name stands for it. If another thread stored the class's version
meanwhile, the walk must still take the name, never the stored version: else the version depends
on thread timing, and concurrent first calls (dask, threads) make keys that no other program
computes, so those entries never hit again.
"""

import importlib
import sys
import threading

import pytest

from casmon.keys import codeversion as cv

SOURCE = '''
import threading

AGAIN = threading.Event()
OTHER = []


class Hook:
    """Its pickle names Cfg; the first time it is read, another thread computes Cfg's version."""

    def __reduce__(self):
        if OTHER and not AGAIN.is_set():
            AGAIN.set()
            t = threading.Thread(target=OTHER[0])
            t.start()
            t.join(120)
        return (Cfg, (1,))


class Cfg:
    HOOK = Hook()

    def __init__(self, x):
        self.x = x

    def value(self):
        return self.x
'''


@pytest.mark.filterwarnings("ignore::UserWarning")  # Hook's pickle is a Cfg: it keys unlike its copies
def test_a_version_stored_by_another_thread_mid_walk_does_not_change_this_walks_version(tmp_path, monkeypatch):
    name = f"concurrent_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    other = {}

    def compute_on_another_thread():
        other["version"] = cv.function_version(mod.Cfg)

    mod.OTHER.append(compute_on_another_thread)
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("version", cv.function_version(mod.Cfg)), daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the version walk did not end"
    assert mod.AGAIN.is_set() and "version" in other
    assert box["version"] == other["version"]
    assert cv.function_version(mod.Cfg) == other["version"]
