"""small_array_digest: a small plain array's fingerprint in one call, equal to the full walk's, or None."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from casmon import fingerprint
from casmon.keys.fingerprint import small_array_digest

DTYPES = st.one_of(hnp.scalar_dtypes(), hnp.byte_string_dtypes(), hnp.unicode_string_dtypes(),
                   hnp.scalar_dtypes().map(lambda d: d.newbyteorder(">")))


@settings(max_examples=300, deadline=None)
@given(hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9)), st.booleans())
def test_a_small_arrays_digest_is_its_fingerprint_or_none(a, strided):
    if strided and a.ndim:
        a = a[::2]
    got = small_array_digest(a)
    if got is None:
        assert a.dtype.hasobject
    else:
        assert got == bytes(fingerprint(a))
        assert small_array_digest(a, True) == got.hex()


def test_values_it_does_not_take_are_none():
    big = np.zeros((1 << 16) + 8, np.uint8)
    structured = np.zeros(3, [("a", "i1"), ("b", "f8")])
    for v in (big, structured, np.array([object()]), np.ma.arange(3), [1.0], 1.0, b"x" * 64):
        assert small_array_digest(v) is None
    for v in (np.arange(6.).reshape(2, 3).T, np.arange(24).reshape(2, 3, 4)[:, ::2, 1:], np.asfortranarray(np.ones((3, 5))),
              np.ones((100, 50)).T, np.arange(5000).astype("M8[s]").reshape(50, 100).T):  # also past 4096 bytes
        assert small_array_digest(v) == bytes(fingerprint(v)), "any layout: its C-order bytes"
    assert small_array_digest(np.zeros((0, 3))) == bytes(fingerprint(np.zeros((0, 3))))
    assert small_array_digest(np.array(2.5)) == bytes(fingerprint(np.array(2.5)))
    assert small_array_digest(np.arange(4).astype("M8[s]")) == bytes(fingerprint(np.arange(4).astype("M8[s]")))


def test_a_dtype_equal_to_a_plain_one_but_holding_more_is_not_taken_for_it():
    # np.dtype("f8", metadata=...) == np.dtype("f8") and hashes alike, yet its key encoding holds the metadata
    plain = np.arange(4.0)
    for extra in (np.dtype("f8", metadata={"unit": "m"}), np.dtype((np.record, "f8"))):
        if extra != plain.dtype:
            continue
        odd = plain.astype(extra)
        for v in (plain, odd, plain, odd):  # after an equal plain dtype of the same shape was digested, and before
            got = small_array_digest(v)
            assert got is None or got == bytes(fingerprint(v)), v.dtype


def test_arrays_that_alternate_shapes_and_dtypes_each_get_their_own_digest():
    vs = [np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(3, 2), np.arange(6.0), np.arange(6).reshape(2, 3),
          np.arange(6.0).reshape(2, 3).astype(">f8"), np.arange(6.0).reshape(2, 3).astype(np.dtype(">f8")),
          np.zeros((2, 3), "U2"), np.zeros((2, 3), "U3"), np.array(1.0), np.zeros((1, 6))]
    for v in vs + vs[::-1] + [x for x in vs for _ in range(2)]:
        assert small_array_digest(v) == bytes(fingerprint(v)), (v.dtype, v.shape)


def test_threads_digesting_arrays_of_other_shapes_and_dtypes_at_once_each_get_their_own():
    import threading

    kinds = [np.arange(6.0).reshape(2, 3), np.arange(6.0).reshape(3, 2), np.arange(6, dtype="i4").reshape(2, 3),
             np.arange(6.0).astype(">f8")]
    want = [bytes(fingerprint(v)) for v in kinds]
    bad = []

    def work(i):
        for n in range(3000):
            j = (i + n) % len(kinds)
            if small_array_digest(kinds[j]) != want[j]:
                bad.append((i, j))

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert bad == []
