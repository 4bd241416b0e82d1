"""``casmon replay`` of a function from a script run as ``python x.py``: the README's call-log example,
the script's top level imported without its ``__main__`` block, and a recorded ``__main__`` path that
is only data."""

import os
import shutil
import subprocess
import sys

import pytest

import casmon
from tests.conftest import ROOT
from tests.support.cli import cli_process, tree


# runs recorded in tmp folders outside git say so; that is not what these tests look at
pytestmark = pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")


def test_replay_the_readme_call_log_example(tmp_path):
    shutil.copy(ROOT / "docs" / "examples" / "call_log.py", tmp_path / "call_log.py")
    p = subprocess.run([sys.executable, "call_log.py", "st"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr
    script = str(tmp_path / "call_log.py")
    assert casmon.load(tmp_path / "st").sessions[1]["main"] == {"script": script}

    def listing():  # Python's own bytecode cache (an import writes it) is not the script's doing
        return sorted(n for n in os.listdir(tmp_path) if n != "__pycache__")

    before = listing(), tree(tmp_path / "st")

    r = cli_process("replay", "normalise", "2", "--store", "st", cwd=tmp_path, check=False)
    assert r.returncode == 1 and script in r.stderr and "--import-main" in r.stderr, "it says how to vouch for the script"
    r = cli_process("replay", "normalise", "2", "--store", "st", "--import-main", cwd=tmp_path)
    assert "same result as recorded" in r.stdout and script in r.stderr
    r = cli_process("replay", "normalise", "3", "--store", "st", "--import", "call_log.py", cwd=tmp_path)
    assert "same result as recorded" in r.stdout
    # the script's `if __name__ == "__main__"` block did not run: no new session, no store made from argv
    assert (listing(), tree(tmp_path / "st")) == before

    os.rename(tmp_path / "call_log.py", tmp_path / "moved.py")
    r = cli_process("replay", "normalise", "2", "--store", "st", "--import-main", cwd=tmp_path, check=False)
    assert r.returncode == 1 and "no such file" in r.stderr


def test_replay_import_main_runs_the_top_level_not_the_main_block(tmp_path):
    (tmp_path / "job.py").write_text(
        "import pathlib, casmon\n"
        "pathlib.Path('top-level-ran').write_text('x')\n"
        "@casmon.intercept(store='st')\n"
        "def step(x):\n"
        "    return x * 3\n"
        "if __name__ == '__main__':\n"
        "    pathlib.Path('main-block-ran').write_text('x')\n"
        "    step(2)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, timeout=120).returncode == 0
    (tmp_path / "top-level-ran").unlink()
    (tmp_path / "main-block-ran").unlink()
    assert "same result" in cli_process("replay", "step", "1", "--store", "st", "--import-main", cwd=tmp_path).stdout
    assert (tmp_path / "top-level-ran").exists() and not (tmp_path / "main-block-ran").exists()



def test_calls_the_imported_scripts_top_level_makes_are_not_logged(tmp_path):
    """A script without a main guard calls its logged function at its top level: `--import job.py` logged those
    calls as `job.step` in a new session, so the next `replay step 1` found `step` ambiguous."""
    (tmp_path / "job.py").write_text(
        "import casmon\n"
        "@casmon.intercept(store='st')\n"
        "def step(x):\n"
        "    return x * 3\n"
        "for i in range(3):\n"
        "    step(i)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    assert subprocess.run([sys.executable, "job.py"], cwd=tmp_path, env=env, timeout=120).returncode == 0
    assert "same result" in cli_process("replay", "step", "2", "--store", "st", "--import", "job.py", cwd=tmp_path).stdout
    assert list(casmon.load(tmp_path / "st").functions) == ["__main__.step"]
    assert "same result" in cli_process("replay", "step", "3", "--store", "st", "--import-main", cwd=tmp_path).stdout
    assert list(casmon.load(tmp_path / "st").sessions) == [1]

def test_a_recorded_main_path_is_data(tmp_path):
    """A store can name any path as its __main__: only an absolute .py path is offered, and only on request."""
    from casmon.cli.call_verbs import _recorded_main

    class Log:
        sessions = {1: {"main": {"script": "relative.py"}}, 2: {"main": {"script": "/etc/passwd"}},
                    3: {"main": "x"}, 4: {"main": {"script": ["/a.py"]}}, 5: {"main": {"script": "/abs/ok.py"}}, 6: {}}

    assert [_recorded_main(Log, n) for n in range(1, 8)] == [None, None, None, None, "/abs/ok.py", None, None]
