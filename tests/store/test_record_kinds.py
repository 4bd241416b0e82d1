"""A record kind names a folder (``records/{kind}/``): only a whole name of its pattern is accepted, checked without a
regular expression, exactly as the pattern matches the whole string."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings, strategies as st

import casmon
from casmon.store.records import KIND_PATTERN, is_kind_name

KIND_CHARS = st.sampled_from(list("abcz09_-AZ \n\t./é\x00"))


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.text(KIND_CHARS, max_size=34), st.from_regex(KIND_PATTERN, fullmatch=True)))
def test_a_kind_name_is_accepted_exactly_when_the_pattern_matches_it_whole(name):
    assert is_kind_name(name) == bool(re.fullmatch(KIND_PATTERN, name))


@pytest.mark.parametrize("kind", ["cache\n", "", "Cache", "9x", "a" * 33, "x/y", "x.y", 7, None])
def test_a_table_of_a_kind_that_is_not_a_whole_name_is_refused_and_nothing_is_made(tmp_path, kind):
    s = casmon.open(tmp_path / "s")
    with pytest.raises(ValueError, match="record kind must match"):
        s.table(kind)
    assert not (tmp_path / "s" / "records").exists() or not any((tmp_path / "s" / "records").iterdir())
