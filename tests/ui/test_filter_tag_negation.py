"""``-tag:NAME`` finds the runs not tagged NAME, on the server's column path and the row path alike; a bare
``tag!=NAME`` (no run has a column ``tag``) says how to write it, in one line."""

from urllib.parse import quote

import pytest

from casmon.ui.table import FilterError, compile_query, parse_query
from tests.ui.test_runs_table import N, _all_rows, _status, _tags, scale_store, server  # noqa: F401 - fixtures


@pytest.mark.parametrize("q, want", [
    ("-tag:baseline", lambda n: "baseline" not in _tags(n)),
    ("status:ok and -tag:baseline", lambda n: _status(n) == "ok" and "baseline" not in _tags(n)),
    ("(-tag:sweep or tag:best)", lambda n: "sweep" not in _tags(n) or "best" in _tags(n)),
    ('-tag:"best"', lambda n: "best" not in _tags(n)),
])
def test_the_server_finds_the_runs_without_a_tag(server, q, want):  # noqa: F811 - the fixture
    rows, _body = _all_rows(server, f"q={quote(q)}&sort=start&order=asc")
    assert rows == [str(n) for n in range(1, N + 1) if want(n)], q


class _Run:
    def __init__(self, tags):
        self.tags = tags


def test_a_row_without_a_tag_passes_minus_tag():
    rows = [{"run": "1", "status": "ok"}, {"run": "2", "status": "ok"}]
    test = compile_query(parse_query("-tag:baseline"), rows)
    assert [test(_Run(t), row) for t, row in zip((("baseline",), ("x",)), rows)] == [False, True]


@pytest.mark.parametrize("q", ["tag!=baseline", "-tag:"])
def test_a_tag_compared_with_an_operator_says_how_to_write_it(q):
    with pytest.raises(FilterError) as e:
        compile_query(parse_query(q), [{"run": "1", "status": "ok"}])
    assert "\n" not in str(e.value) and "-tag:" in str(e.value) and repr(q) in str(e.value)
