"""A filter value or word holding spaces is written in quotes (``model.name="gpt2 small"``), as the search box's
users write it; a quote left open is a one-line :class:`FilterError`, and an apostrophe inside a word is text."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmon.ui.table import FilterError, compile_query, parse_query

ROWS = [
    {"run": "1", "status": "ok", "comment": "it's fine", "param.model.name": "gpt2 small", "param.lr": 0.1,
     "info.note": "a=b (x)"},
    {"run": "2", "status": "failed", "comment": "other", "param.model.name": "gpt2", "param.lr": 0.5,
     "info.note": "<3"},
]


class _Run:
    tags = ("baseline",)


def _apply(q):
    test = compile_query(parse_query(q), ROWS)
    return [test(_Run(), row) for row in ROWS]


@pytest.mark.parametrize("q, want", [
    ('model.name="gpt2 small"', [True, False]),
    ("model.name='gpt2 small'", [True, False]),
    ('model.name!="gpt2 small"', [False, True]),
    ('"gpt2 small"', [True, False]),
    ('(model.name="gpt2 small" or lr>0.3)', [True, True]),
    ('model.name="gpt2 small" and status:ok', [True, False]),
    ('note="a=b (x)"', [True, False]),
    ('note="<3"', [False, True]),
    ('status:"failed"', [False, True]),
    ('"or"', [False, False]),
    ("comment=it's", [False, False]),
    ("it's", [True, False]),
])
def test_a_quoted_value_or_word_keeps_its_spaces_and_operators(q, want):
    assert _apply(q) == want


@pytest.mark.parametrize("q", ['model.name="gpt2 small', "'gpt2", '(lr>0.1 or model.name="x)'])
def test_a_quote_left_open_is_a_one_line_error_naming_it(q):
    with pytest.raises(FilterError) as e:
        _apply(q)
    assert "\n" not in str(e.value) and "not closed" in str(e.value) and repr(q) in str(e.value)


_ALPHABET = st.sampled_from(list("\"'()<>=!:-. abé") + ["and", "or", "tag:", "-tag:", "model.name", "lr", "it's"])


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(_ALPHABET, max_size=30).map("".join))
def test_any_filter_with_quotes_is_a_filter_or_a_one_line_filter_error(q):
    try:
        _apply(q)
    except FilterError as e:
        assert "\n" not in str(e) and str(e)
