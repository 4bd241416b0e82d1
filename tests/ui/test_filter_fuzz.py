"""The runs table's filter under odd input: any text is a filter or a one-line :class:`FilterError`, never
another exception (deep parentheses, ``and``/``or`` as names, odd tags), applied to rows of every kind."""

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from casmon.ui import table
from casmon.ui.table import FilterError, compile_query, parse_query

ROWS = [
    {"run": "exp1", "comment": "", "status": "ok", "start": time.time(), "duration": 3.0, "commit": "99b3052aa",
     "dirty": False, "param.lr": 0.1, "param.or": 2, "param.and": "x", "metric.loss": float("nan"),
     "info.seed": "a"},
    {"run": "exp2", "comment": "f(x)", "status": "failed", "start": None, "duration": None, "commit": "",
     "dirty": None, "param.lr": "high", "metric.loss": float("inf"), "info.seed": 3},
]


class _Run:
    def __init__(self, tags):
        self.tags = tags


def _apply(q):
    test = compile_query(parse_query(q), ROWS)
    return [test(_Run(("a b", "baseline", "é")), row) for row in ROWS]


@pytest.mark.parametrize("depth", [60, 400, 5000])
def test_deeply_nested_parentheses_are_a_filter_error_or_a_filter_never_a_recursion_error(depth):
    q = "(" * depth + "lr>0.01" + ")" * depth
    try:
        _apply(q)
    except FilterError as e:
        assert "\n" not in str(e) and "nest" in str(e)
    q = " ".join(["("] * depth + ["lr>0.01"] + [")"] * depth)
    try:
        _apply(q)
    except FilterError as e:
        assert "\n" not in str(e) and "nest" in str(e)


def test_parentheses_nested_a_few_deep_still_filter():
    assert _apply("((((status=ok))))") == [True, False]
    assert _apply("(((status=ok) or (((status=failed)))))") == [True, True]


@pytest.mark.parametrize("q, want", [("or=2", [True, False]), ("param.and=x", [True, False]),
                                     ("tag:é", [True, True]), ("tag:baseline and status=ok", [True, False])])
def test_and_or_as_column_names_and_odd_tags(q, want):
    assert _apply(q) == want


_ALPHABET = st.sampled_from(list("()<>=!:.-_ \t\nabcxyz019éTtagorndstu") + ["and", "or", "tag:", "status",
                                                                              "start", "commit", "dirty", "lr",
                                                                              "loss", "duration", "2026-12-02"])


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.one_of(st.text(max_size=60), st.lists(_ALPHABET, max_size=40).map("".join)))
def test_any_filter_text_is_a_filter_or_a_one_line_filter_error(q):
    try:
        _apply(q)
    except FilterError as e:
        assert "\n" not in str(e) and str(e)
