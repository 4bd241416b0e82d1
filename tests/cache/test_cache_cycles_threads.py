"""Threads making the first calls of cached functions over one graph of cycles at once (dask's threaded
scheduler, a thread pool) compute the versions a lone program computes: every call ends, each key is the
one another program makes, and a second round is all hits."""

import importlib
import sys
import threading

import pytest

import casmon
from casmon.keys import codeversion as cv
from tests.conftest import run_python

SOURCE = '''
import dataclasses
import enum


class Color(enum.Enum):
    RED = 1
    GREEN = 2

    def w(self):
        return self.value


@dataclasses.dataclass(frozen=True, slots=True)
class Cfg:
    lr: float
    c: Color = Color.RED


class Reg:
    all = []

    def __init__(self, x):
        self.x = x
        Reg.all.append(self)


for i in range(3):
    Reg(i)
Reg.DEFAULT = Reg.all[0]


class Left:
    def __init__(self, x):
        self.x = x


class Right:
    def __init__(self, x):
        self.x = x


Left.PEER = Right(1)
Right.PEER = Left(2)


def f0(cfg, i):
    return cfg.lr * i + cfg.c.w() + Reg.DEFAULT.x


def f1(i):
    return Color.GREEN.w() * i + len(Reg.all)


def f2(i):
    return Left(i).PEER.x + Right(i).PEER.x


def f3(cfg, i):
    return cfg.lr + Left.PEER.x + i
'''

NAMES = ("Color", "Cfg", "Reg", "Left", "Right", "f0", "f1", "f2", "f3")


def run_round(mod, fs, threads):
    args = [lambda i: (mod.Cfg(0.5), i), lambda i: (i,), lambda i: (i,), lambda i: (mod.Cfg(0.25), i)]
    barrier = threading.Barrier(threads)
    errors = []

    def go(k):
        try:
            barrier.wait(60)
            for i in range(4):
                fs[k % 4](*args[k % 4](i))
        except BaseException as e:  # noqa: BLE001 - handed to the test
            errors.append(e)

    ts = [threading.Thread(target=go, args=(k,), daemon=True) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not any(t.is_alive() for t in ts), "a first call did not end"
    assert not errors, errors


@pytest.mark.parametrize("threads", [4, pytest.param(16, marks=pytest.mark.slow)])
def test_concurrent_first_calls_over_cycles_make_the_versions_a_lone_program_makes(threads, tmp_path, monkeypatch):
    name = f"threads_{threads}_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, name, None)  # the test's end removes the module it imports
    del sys.modules[name]
    mod = importlib.import_module(name)
    store = str(tmp_path / "s")
    fs = [casmon.cache(getattr(mod, f"f{k}"), store=store) for k in range(4)]
    run_round(mod, fs, threads)
    run_round(mod, fs, threads)
    assert all(f.__casmon_cache__.misses + f.__casmon_cache__.hits == 2 * threads for f in fs)
    here = [cv.function_version(getattr(mod, n)).hex() for n in NAMES]
    alone = run_python(
        "import sys; sys.path.insert(0, sys.argv[1]); import importlib\n"
        "from casmon.keys import codeversion as cv\n"
        f"m = importlib.import_module({name!r})\n"
        f"print(*[cv.function_version(getattr(m, n)).hex() for n in {NAMES!r}])\n",
        str(tmp_path),
    ).stdout.split()
    assert dict(zip(NAMES, here)) == dict(zip(NAMES, alone))
