"""A cycle of classes that is later broken: the members' versions follow what each now reaches.

Two classes holding each other's instances share one version (their cycle's). When a program
breaks the cycle and edits one of them, a version computed for the other must not stay the
cycle's old one: a cached function reaching the edited class through the other must miss.
Calls run in a thread with a generous deadline, so a hang fails instead of hanging.
"""

import importlib
import sys

import casmon
from tests.support import deadline

DEADLINE = 120.0

SOURCE = '''
class Left:
    def __init__(self, x):
        self.x = x


class Right:
    def __init__(self, x):
        self.x = x

    def value(self):
        return 1


Left.PEER = Right(1)
Right.PEER = Left(2)


def pair(p):
    return p.x + p.PEER.value()


def alone(r):
    return r.value()


def value_two(self):
    return 2
'''


def within(fn, *args, **kwargs):
    return deadline.within(DEADLINE, fn, *args, **kwargs)


def load(tmp_path, monkeypatch, stem):
    name = f"{stem}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    return mod


def test_an_edit_to_a_former_cycle_mate_misses_after_the_cycle_is_broken(tmp_path, monkeypatch):
    mod = load(tmp_path, monkeypatch, "broken_cycle")
    store = str(tmp_path / "s")
    pair = casmon.cache(mod.pair, store=store)
    alone = casmon.cache(mod.alone, store=store)
    assert within(pair, mod.Left(5)) == 6
    # Break the cycle and edit Right; another cached function computes Right's version alone first.
    mod.Right.PEER = None
    mod.Right.value = mod.value_two
    assert within(alone, mod.Right(0)) == 2
    assert within(pair, mod.Left(5)) == 7  # not the cycle era's stored 6
    assert pair.__casmon_cache__.misses == 2


def test_an_edit_to_a_former_cycle_mate_misses_when_the_code_object_is_swapped(tmp_path, monkeypatch):
    mod = load(tmp_path, monkeypatch, "broken_cycle_code")
    store = str(tmp_path / "s")
    pair = casmon.cache(mod.pair, store=store)
    alone = casmon.cache(mod.alone, store=store)
    assert within(pair, mod.Left(5)) == 6
    mod.Right.PEER = None
    mod.Right.value.__code__ = mod.value_two.__code__
    assert within(alone, mod.Right(0)) == 2
    assert within(pair, mod.Left(5)) == 7
