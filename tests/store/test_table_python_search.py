"""A table file's first searches and the provenance checks run a binary search in Python (no ``_bisect`` on a
first hit): they answer exactly as ``bisect`` does, duplicates, absent keys and ends included, before and after
a process switches to the C search."""

from __future__ import annotations

import bisect
import random

import pytest

from casmon.store.table import format as fmt
from casmon.store.table.ranges import ranges_has, ranges_within


def test_the_python_search_finds_what_bisect_finds():
    rng = random.Random(7)
    for n in range(0, 40):
        a = sorted(bytes([rng.randrange(4), rng.randrange(3)]).rstrip(b"\0") for _ in range(n))
        for x in [b"", b"\0", b"\x00\x01", b"\x05"] + a:
            for lo in {0, len(a) // 2}:
                assert fmt._py_bisect_left(a, x, lo, len(a)) == bisect.bisect_left(a, x, lo)
                assert fmt._py_bisect_right(a, x, lo, len(a)) == bisect.bisect_right(a, x, lo)


@pytest.mark.parametrize("searches", [0, fmt._C_AFTER + 5])
def test_a_table_file_finds_every_key_and_only_its_values_before_and_after_the_switch(monkeypatch, searches):
    monkeypatch.setattr(fmt, "_searches", 0)
    monkeypatch.setattr(fmt, "_bisect_left", fmt._py_bisect_left)
    monkeypatch.setattr(fmt, "_bisect_right", fmt._py_bisect_right)
    keys = sorted({bytes([i % 7, i]).ljust(16, b"\0") for i in range(1, 60)})
    entries = [(k, b"v%d" % j) for k in keys for j in range(1 + k[1] % 3)]
    f = fmt.TableFile("t", fmt.encode_table_file(entries))
    for _ in range(searches):
        f.find(keys[0])
    for k in keys:
        assert f.find(k) == [v for kk, v in entries if kk == k]
    assert f.find(b"\x09".ljust(16, b"\0")) == [] and f.find(b"\xff" * 16) == []
    assert (fmt._bisect_left is fmt._py_bisect_left) == (searches == 0)


def test_ranges_answer_as_bisect_did():
    spans = [(1, 3), (5, 5), (9, 20)]
    r = {"w": spans}
    for seq in range(-1, 23):
        i = bisect.bisect_right(spans, (seq, float("inf"))) - 1
        assert ranges_has(r, "w", seq) == (i >= 0 and spans[i][0] <= seq <= spans[i][1])
    assert ranges_within({"w": [(2, 3), (9, 12)]}, r) and not ranges_within({"w": [(3, 5)]}, r)
    assert not ranges_has({"w": []}, "w", 1) and not ranges_within({"w": [(0, 0)]}, r)
