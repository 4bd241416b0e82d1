"""Tables built directly on a backend for the table tests: random keys, and a table in one format-2 generation."""

import random

from casmon.store.backend import Backend, open_backend
from casmon.store.table import Table


def random_keys(n, seed=0):
    """``n`` random 16-byte keys, the same for the same ``seed``."""
    r = random.Random(seed)
    return [r.randbytes(16) for _ in range(n)]


def gen_table(loc, entries, prefix="r/", writer="w1") -> tuple[Backend, Table, str]:
    """A table whose entries are all in one format-2 generation."""
    b = open_backend(loc)
    t = Table(b, prefix, writer)
    for k, v in entries:
        t.add(k, v)
    t.write_l0(t.take_pending())
    gid = t.consolidate(min_l0=1, force=True)
    assert gid is not None and t._active_gens[0].v == 2
    return b, t, gid
