"""jsonlite against json on generated texts and values: the same value, the same text, the same error."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from casmon.keys import jsonlite


def _outcome(fn, *args, **kw):
    try:
        return "value", repr(fn(*args, **kw))
    except Exception as e:  # noqa: BLE001 - compared, type and message
        return "error", type(e).__name__, str(e)


_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=8)  # lone surrogates included
VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | _TEXT,
                      lambda inner: st.lists(inner, max_size=4) | st.tuples(inner) | st.dictionaries(_TEXT, inner, max_size=4),
                      max_leaves=25)
SEPARATORS = st.sampled_from([None, (",", ":"), (", ", ": "), (" ,", " : ")])
#: Fragments JSON texts are made of, and what breaks them (NUL, a lone surrogate escape, stray characters).
PIECES = st.sampled_from(['{', '}', '[', ']', '"', ',', ':', ' ', '\t', '\n', '0', '1', '-', '.', 'e', '+', 'E', 'true',
                          'false', 'null', 'NaN', 'Infinity', '"a"', '\\u', 'd800', '\\n', '\\', '\x00', '\u00e9',
                          '\ud800', '\ufeff', '9' * 30, '1e400', '-0.0'])


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans(), SEPARATORS)
def test_dumps_writes_what_json_dumps_writes_for_any_value(value, sort_keys, separators):
    assert _outcome(jsonlite.dumps, value, sort_keys=sort_keys, separators=separators) == \
        _outcome(json.dumps, value, sort_keys=sort_keys, separators=separators)


@settings(max_examples=400, deadline=None)
@given(VALUES, st.booleans())
def test_loads_reads_what_json_wrote_as_json_loads_does(value, sort_keys):
    text = json.dumps(value, sort_keys=sort_keys)
    assert _outcome(jsonlite.loads, text) == _outcome(json.loads, text)
    raw = text.encode("utf-8")
    assert _outcome(jsonlite.loads, raw) == _outcome(json.loads, raw)


@settings(max_examples=600, deadline=None)
@given(st.lists(PIECES, max_size=14).map("".join))
def test_loads_of_any_text_returns_or_raises_what_json_loads_does(text):
    assert _outcome(jsonlite.loads, text) == _outcome(json.loads, text)
    raw = text.encode("utf-8", "surrogatepass")  # bytes that are not UTF-8, from a lone surrogate
    assert _outcome(jsonlite.loads, raw) == _outcome(json.loads, raw)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=24))
def test_loads_of_any_bytes_returns_or_raises_what_json_loads_does(raw):
    assert _outcome(jsonlite.loads, raw) == _outcome(json.loads, raw)
