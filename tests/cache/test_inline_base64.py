"""A cache entry's inline value is decoded as binascii decodes it (strictly), without loading binascii on a hit."""

from __future__ import annotations

import binascii
import random

import pytest

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
