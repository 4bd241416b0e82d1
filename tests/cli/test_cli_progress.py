"""Long commands draw a progress bar on a terminal (a real pseudo-terminal here) and stay quiet when piped."""

import os
import pty
import select
import subprocess
import sys
import time

import numpy as np
import pytest

import casmon
from tests.conftest import ROOT

BAR = "━"  # rich's bar character


def env() -> dict:
    e = dict(os.environ, PYTHONPATH=str(ROOT), TERM="xterm-256color", COLUMNS="120", LINES="40")
    for k in ("CASMON_STORE", "CASMON_PROGRESS", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        e.pop(k, None)
    return e


def run_on_pty(argv: list[str], stdout_on_pty: bool = True, stderr_on_pty: bool = True, timeout: float = 300):
    """Run argv with the chosen streams on a pseudo-terminal; returns (exit status, what the terminal got, piped stdout, piped stderr)."""
    master, slave = pty.openpty()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=slave if stdout_on_pty else subprocess.PIPE,
                         stderr=slave if stderr_on_pty else subprocess.PIPE, env=env(), close_fds=True)
    os.close(slave)
    got = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer of the terminal is gone
                break
            if not data:
                break
            got += data
        elif p.poll() is not None and not stdout_on_pty and not stderr_on_pty:
            break
    out, err = p.communicate(timeout=60)
    os.close(master)
    return p.returncode, got.decode("utf-8", "replace"), (out or b"").decode(), (err or b"").decode()


@pytest.fixture(scope="module")
def store_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "s"
    s = casmon.open(path)
    rng = np.random.default_rng(0)
    values = [s.put({"i": i, "a": rng.random(64)}) for i in range(400)]
    s.append("note", {"what": "keeps the values"}, refs=values)
    s.close()
    return path


CLI = [sys.executable, "-m", "casmon.cli"]


@pytest.mark.parametrize("cmd, phase", [(["verify"], "objects"), (["gc", "--dry-run"], "mark records"),
                                        (["stats"], "sizes")])
def test_a_bar_on_a_terminal(store_path, cmd, phase):
    code, term, _, _ = run_on_pty(CLI + cmd + ["--store", str(store_path)])
    assert code == 0, term
    assert BAR in term and phase in term, term[-2000:]


def test_the_bar_goes_to_stderr_and_the_report_stays_clean(store_path):
    code, term, out, _ = run_on_pty(CLI + ["verify", "--store", str(store_path)], stdout_on_pty=False)
    assert code == 0 and "store is sound" in out
    assert BAR not in out and "\x1b" not in out, "the report piped to a file has no bar and no escape codes"
    assert BAR in term


def test_quiet_when_piped(store_path, tmp_path):
    p = subprocess.run(CLI + ["verify", "--store", str(store_path)], capture_output=True, text=True, env=env(), timeout=300)
    assert p.returncode == 0 and "store is sound" in p.stdout, p.stderr
    assert p.stderr == "" and BAR not in p.stdout and "\x1b" not in p.stdout
    # the other long commands, in this process (click's runner: streams that are not terminals)
    from click.testing import CliRunner

    from casmon.cli.app import main

    with casmon.record(store=str(tmp_path / "runs"), capture_output=False, track=[]):
        pass
    for cmd in (["gc", "--dry-run"], ["stats"], ["verify", "--json"], ["gc", "--now", "--store", str(tmp_path / "runs")],
                ["export", "latest", str(tmp_path / "out"), "--store", str(tmp_path / "runs")]):
        args = cmd if "--store" in cmd else cmd + ["--store", str(store_path)]
        r = CliRunner().invoke(main, args, env={"CASMON_STORE": None, "TERM": "xterm"})
        assert r.exit_code == 0, (cmd, r.output)
        assert r.stderr == "" and BAR not in r.stdout and "\x1b" not in r.stdout, (cmd, r.stderr)


def test_quiet_when_only_stderr_is_piped(store_path):
    """A bar is drawn where it is seen: stderr piped (e.g. `2>log`) means no bar, even on a terminal's stdout."""
    code, term, _, err = run_on_pty(CLI + ["verify", "--store", str(store_path)], stderr_on_pty=False)
    assert code == 0 and "store is sound" in term
    assert BAR not in term and err == ""


def test_track_for_other_long_jobs():
    """The helper other commands (casmon import) use: a bar on a terminal, nothing when piped."""
    code = ("from casmon.view.progress import track, progress\n"
            "assert sum(track(range(300), label='importing things')) == 44850\n"
            "with progress(None, 'counting') as bar:\n"
            "    bar.advance(3)\n"
            "print('done')\n")
    rc, term, _, _ = run_on_pty([sys.executable, "-c", code])
    assert rc == 0 and "importing things" in term and BAR in term and "done" in term


def test_track_is_silent_without_a_terminal(capfd, monkeypatch):
    from casmon.view.progress import progress, track

    monkeypatch.delenv("CASMON_PROGRESS", raising=False)
    assert list(track(iter(range(5)), label="x")) == [0, 1, 2, 3, 4]
    with progress(10, "y") as bar:
        bar.advance()
        bar.update(5, 20)
    out, err = capfd.readouterr()
    assert out == "" and err == ""


def test_wanted_follows_the_stream(monkeypatch):
    from casmon.view.progress import wanted

    monkeypatch.delenv("CASMON_PROGRESS", raising=False)

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setenv("TERM", "xterm")
    assert wanted(Stream(True)) and not wanted(Stream(False)) and not wanted(object())
    monkeypatch.setenv("TERM", "dumb")
    assert not wanted(Stream(True))
    monkeypatch.setenv("CASMON_PROGRESS", "0")
    monkeypatch.setenv("TERM", "xterm")
    assert not wanted(Stream(True))
