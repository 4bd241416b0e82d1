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


def test_a_notebook_runs_page_and_html_view_name_the_notebook_not_the_kernels_command_line(tmp_path, monkeypatch):
    import sys

    from casmon.runs import recorder

    monkeypatch.setattr(recorder, "notebook_path", lambda: "/work/train.ipynb")
    monkeypatch.setattr(sys, "argv", ["/venv/ipykernel_launcher.py", "-f", "/tmp/tmpab12.json"])
    monkeypatch.chdir(tmp_path)  # outside this repository: its patch would hold this test's text
    s = casmon.open(tmp_path / "s")
    with casmon.record(store=s, capture_output=False, system_metrics=False):
        pass
    s.close()
    served = Served(tmp_path / "s")
    try:
        body = served.get("/run/1")
    finally:
        served.close()
    html = casmon.load_run("1", store=str(tmp_path / "s"))._repr_html_()
    for shown in (body, html):
        assert "/work/train.ipynb" in shown and "ipykernel_launcher" not in shown
