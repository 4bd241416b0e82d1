"""stale lists its entries upstream first: the causes, then what they made stale in the order it was made, so
each entry's reason names an entry already listed above it."""

import numpy as np
import pytest

import casmon
from casmon.caching import edges
from casmon.lineage import stale


@pytest.fixture
def store(tmp_path):
    edges.forget_all()
    yield str(tmp_path / "store")
    edges.forget_all()


def test_stale_lists_a_chain_upstream_first_whatever_the_keys(store, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("\n".join(str(i) for i in range(64)) + "\n")

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    @casmon.cache(store=store)
    def s1(x):
        return x + 1

    @casmon.cache(store=store)
    def s2(x):
        return x * 2

    @casmon.cache(store=store)
    def s3(x):
        return x - 3

    @casmon.cache(store=store)
    def s4(x):
        return x / 4

    @casmon.cache(store=store)
    def s5(x):
        return x + 5

    @casmon.cache(store=store)
    def s6(x):
        return x * 6

    @casmon.cache(store=store)
    def s7(x):
        return x - 7

    chain = [load, s1, s2, s3, s4, s5, s6, s7]
    x = load(str(data))
    for f in chain[1:]:
        x = f(x)
    load.__casmon_cache__.store.flush()
    data.write_text("\n".join(str(i) for i in range(65)) + "\n")
    got = stale(store).to_dict()["nodes"]
    fns = [n["fn"].rsplit(".", 1)[-1] for n in got if n["kind"] == "entry"]
    assert fns == [f.__name__ for f in chain]  # 7 derived entries: by their keys' order, 1 chance in 5,040
    # each reason names the entry listed just above it, and the text reads the same way down
    text = str(stale(store))
    assert [line.split()[1] for line in text.splitlines()[1:]] == fns
