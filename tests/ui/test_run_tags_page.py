"""The run page shows a run's tags and note, escaped (a note is anyone's text)."""

import pytest

import casmon
from casmon.runs import note_run, tag_run
from tests.ui.test_ui import HOSTILE, Served, text_of

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def test_the_run_page_shows_tags_and_an_escaped_note(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, tags=["baseline"], capture_output=False) as run:
        run.log(x=1.0)
    tag_run("1", ["v2"], store=s)
    note_run("1", f"looks odd {HOSTILE}", store=s)
    s.close()
    served = Served(tmp_path / "s")
    try:
        body = served.get("/run/1")
    finally:
        served.close()
    assert '<span class="casmon-tag">baseline</span> <span class="casmon-tag">v2</span>' in body
    assert HOSTILE not in body and f"looks odd {HOSTILE}" in text_of(body)
