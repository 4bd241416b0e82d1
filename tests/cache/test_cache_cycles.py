"""Cached functions over classes whose stored values refer back to the class (issue 40).

A frozen slots dataclass, an Enum, a ``__slots__`` class, a registry of a class's own
instances, ``Point.ORIGIN = Point(0)``: the code-version walk meets the class again through
its own values. It must stop there (the class's name stands for it), never re-enter: the
first call ends, the second is a hit that computes no version, and an edit still misses.
Each call runs in a thread with a generous deadline, so a hang fails the test instead of
hanging the suite.
"""

import dataclasses
import enum

import pytest

import casmon
from tests.support import deadline
from casmon.keys import codeversion as cv

DEADLINE = 120.0


def within(fn, *args, **kwargs):
    return deadline.within(DEADLINE, fn, *args, **kwargs)


@pytest.fixture
def walks(monkeypatch):
    """How many times a version was checked and computed: a walk that re-enters itself counts hundreds."""
    counts = {"valid": 0, "compute": 0}
    valid, compute = cv.VersionTracker.valid, cv.VersionTracker._compute

    def counting_valid(self, *a, **k):
        counts["valid"] += 1
        return valid(self, *a, **k)

    def counting_compute(self, *a, **k):
        counts["compute"] += 1
        return compute(self, *a, **k)

    monkeypatch.setattr(cv.VersionTracker, "valid", counting_valid)
    monkeypatch.setattr(cv.VersionTracker, "_compute", counting_compute)
    return counts


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    lr: float
    epochs: int


class Color(enum.Enum):
    RED = 1
    GREEN = 2
    BLUE = 3


class Slotted:
    __slots__ = ("x", "y")

    def __init__(self, x, y=0):
        self.x = x
        self.y = y


class Registered:
    all = []

    def __init__(self, x):
        self.x = x
        Registered.all.append(self)


Registered(1)
Registered(2)


class Point:
    def __init__(self, x):
        self.x = x


Point.ORIGIN = Point(0)


class Left:
    def __init__(self, x):
        self.x = x


class Right:
    def __init__(self, x):
        self.x = x


Left.PEER = Right(1)
Right.PEER = Left(2)


def train(cfg):
    return cfg.lr * cfg.epochs


def shade(c):
    return c.value * 10


def redden(x):
    return x * Color.RED.value


def norm(p):
    return p.x + p.y


def registered(r):
    return r.x + len(Registered.all)


def shift(p):
    return p.x - Point.ORIGIN.x


def pair(p):
    return p.x + p.PEER.x


CASES = {
    "frozen slots dataclass argument": (train, lambda: Config(0.1, 3), 0.1 * 3),
    "enum argument": (shade, lambda: Color.GREEN, 20),
    "enum read only in the body": (redden, lambda: 4, 4),
    "__slots__ class argument": (norm, lambda: Slotted(2, 3), 5),
    "registry class argument": (registered, lambda: Registered.all[0], 1 + len(Registered.all)),
    "class attribute holding an instance": (shift, lambda: Point(5), 5),
    "two classes holding each other's instances": (pair, lambda: Left(5), 6),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_class_whose_values_refer_back_to_it_caches_without_hanging(case, tmp_path, walks):
    fn, make, want = CASES[case]
    f = casmon.cache(fn, store=str(tmp_path / "s"))
    assert within(f, make()) == want
    assert f.__casmon_cache__.misses == 1
    assert walks["valid"] < 50, f"the version check re-entered itself {walks['valid']} times"
    assert walks["compute"] < 30, f"versions computed {walks['compute']} times for one call"
    before = dict(walks)
    assert within(f, make()) == want
    assert f.__casmon_cache__.hits == 1
    # The hit computes no version and checks each class's version a handful of times, not recursively.
    assert walks["compute"] == before["compute"]
    assert walks["valid"] - before["valid"] < 20


def test_classes_referring_to_each_other_have_one_version_whatever_asks_first(tmp_path):
    # A cached entry written by one program is found by another that met the classes in another order.
    code = (
        "from tests.cache import test_cache_cycles as m\n"
        "from casmon.keys import codeversion as cv\n"
        "for name in {order!r}:\n"
        "    cv.function_version(getattr(m, name))\n"
        "print(*[cv.function_version(getattr(m, n)).hex() for n in ('Point', 'shift', 'Left', 'Right', 'pair')])\n"
    )
    from tests.conftest import run_python

    orders = (["Point", "shift"], ["shift", "Point", "Point"], ["Left", "pair"], ["Right", "pair"], ["pair", "Right"])
    outs = [run_python(code.format(order=order)).stdout.split() for order in orders]
    assert all(out == outs[0] for out in outs), outs


@pytest.mark.filterwarnings("ignore::casmon.caching.CacheWarning")
@pytest.mark.parametrize("closed", [False, True])
def test_a_long_chain_of_classes_holding_the_next_ones_instance_is_walked_to_its_end(tmp_path, monkeypatch, closed):
    # Each class's version holds the next one's: nested far past the recursion limit's depth. An edit at the
    # far end still misses; no part of the chain is cut off as "unhashable" by a swallowed RecursionError.
    n = 300
    src = []
    for i in range(n):
        src += [f"class C{i}:", "    def __init__(self, x):", "        self.x = x",
                "    def tag(self):", f"        return {i}", ""]
    src += [f"C{i}.NEXT = C{i + 1}(1)" for i in range(n - 1)]
    if closed:
        src.append(f"C{n - 1}.NEXT = C0(1)")  # one cycle of 300
    src += ["def f(x):", "    return x.tag()", ""]
    name = f"chain_{tmp_path.name.replace('-', '_')}_{int(closed)}"
    (tmp_path / f"{name}.py").write_text("\n".join(src))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    import sys

    mod = importlib.import_module(name)
    try:
        f = casmon.cache(mod.f, store=str(tmp_path / "s"))
        arg = mod.C0(1)
        assert within(f, arg) == 0
        assert within(f, arg) == 0
        trackers = [cv.version_tracker(getattr(mod, f"C{i}")) for i in range(n)]
        assert all(t.digest is not None for t in trackers)
        assert not [t for t in trackers if any("unhashable" in str(p) for p in t.parts)]
        mod.C250.tag.__code__ = mod.C251.tag.__code__
        assert within(f, arg) == 0
        assert (f.__casmon_cache__.misses, f.__casmon_cache__.hits) == (2, 1)
    finally:
        sys.modules.pop(name, None)
