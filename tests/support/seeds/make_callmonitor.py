"""Makes a callmonitor 0.3.7 folder with callmonitor itself (tests/compat/test_import.py runs it; also made the fixture).

Run in a folder with ``fancy_handlers.py`` next to it: ``python make_callmonitor.py``.
"""

import numpy as np
from callmonitor import REGISTRY, intercept

from fancy_handlers import Fancy, FancyHandler, Point

REGISTRY.add(Fancy, FancyHandler)


@intercept
def test_fn_1(x, y, z=3):
    pass


@intercept
def test_np_1(x, n):
    pass


class A:
    @staticmethod
    @intercept
    def run(x):
        return x


class B:
    @staticmethod
    @intercept
    def run(x, y=1):
        return x


@intercept
def fancy(f, g=None):
    pass


@intercept
def point(p):
    pass


if __name__ == "__main__":
    test_fn_1(1, "two")
    test_fn_1(2, y="three", z=[])
    big = np.arange(2_000, dtype=np.float64)
    test_np_1(10, np.zeros(10))
    test_np_1(10, n=big)
    test_np_1(11, big)  # the same array again: casmon stores it once
    A.run(1)
    B.run(2, y=5)
    A.run(3)
    fancy(Fancy("hello"), g=Fancy("kw"))
    point(Point(1, 2))
