"""A cache entry's inline value is decoded as binascii decodes it (strictly), without loading binascii on a hit."""

from __future__ import annotations

import binascii
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmon.caching import memoize
from casmon.caching.memoize import _unbase64


@pytest.fixture(autouse=True)
def _in_python(monkeypatch):
    monkeypatch.setattr(memoize, "_B64_IN_PYTHON", [10 ** 9])  # every text here by the Python decoder


def _outcome(fn, text):
    try:
        return "value", fn(text)
    except Exception as e:  # noqa: BLE001 - compared, type and message
        return "error", type(e).__name__, str(e)


def _strict(text):
    return binascii.a2b_base64(text, strict_mode=True)


@pytest.mark.parametrize("n", range(0, 70))
def test_what_b2a_base64_writes_decodes_to_the_same_bytes(n):
    data = random.Random(n).randbytes(n)
    assert _unbase64(binascii.b2a_base64(data, newline=False).decode()) == data


@pytest.mark.parametrize("text", ["", "=", "==", "A===", "AB==", "ABC=", "ABCD", "AB=C", "A", "AB", "ABC", "QQ==", "QR==",
                                  "QUJ=", "QUI=", "QUJD\n", " QUJD", "QU JD", "QUJD=", "=QUJD", "QUJD====", "QU*D", "QUJDé===",
                                  "QUJD" * 90 + "QQ=", "QUJD" * 90 + "Q", "\x00\x00\x00\x00"])
def test_any_other_text_decodes_or_fails_as_binascii_strict_mode_does(text):
    assert _outcome(_unbase64, text) == _outcome(_strict, text)


def test_a_process_decodes_its_first_inline_values_in_python_and_the_rest_with_binascii(monkeypatch):
    monkeypatch.setattr(memoize, "_B64_IN_PYTHON", [2])
    texts = [binascii.b2a_base64(bytes([i]) * 40, newline=False).decode() for i in range(4)]
    assert [_unbase64(t) for t in texts] == [bytes([i]) * 40 for i in range(4)]
    assert memoize._B64_IN_PYTHON == [0]


_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@settings(max_examples=500, **_SETTINGS)
@given(st.binary(max_size=300))
def test_any_bytes_b2a_base64_writes_decode_to_themselves(data):
    assert _unbase64(binascii.b2a_base64(data, newline=False).decode()) == data


@settings(max_examples=1000, **_SETTINGS)
@given(st.text(st.sampled_from("AQgwBZz09+/=\n \x00\u00e9-_"), max_size=16))
def test_any_text_decodes_or_fails_as_binascii_strict_mode_does(text):
    """A crafted inline value (bad padding, stray characters, non-zero padding bits) is refused as binascii
    refuses it, never decoded to other bytes."""
    assert _outcome(_unbase64, text) == _outcome(_strict, text)
