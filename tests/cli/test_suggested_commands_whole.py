"""A command the CLI suggests in a sentence (`casmon gc --now`, `casmon gc`) is never cut into lines by the console,
on a narrow terminal (60 columns) or piped: it is copied whole. The terminal wraps the sentence instead."""

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import pytest

import casmon
from tests.conftest import ROOT
from tests.support.cli import cli

LONG = "a_rather_long_module_name_for_this_test"


def _store(path):
    s = casmon.open(path)
    ns = {"__name__": LONG}
    exec("def features(x):\n    return x\n", ns)
    casmon.cache(store=s)(ns["features"])(1)
    s.close()
    return str(path)


def on_a_terminal(*args, columns=60):
    """`casmon ARGS` with its output on a terminal ``columns`` wide: what a user sees, as text."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS=str(columns), TERM="dumb")
    env.pop("CASMON_STORE", None)
    p = subprocess.Popen([sys.executable, "-m", "casmon", *args], stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=300) == 0, out
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out.decode()).replace("\r\n", "\n")


@pytest.mark.parametrize("terminal", [True, False])
def test_cache_clear_suggests_gc_commands_that_stay_whole(tmp_path, terminal):
    st = _store(tmp_path / "s")
    out = on_a_terminal("cache", "clear", "features", "--store", st) if terminal else cli("cache", "clear", "features", "--store", st).stdout
    lines = out.strip().splitlines()
    assert len(lines) == 1, lines  # one sentence, wrapped by the terminal, not by casmon
    assert "`casmon gc --now`" in lines[0] and "`casmon gc`" in lines[0]


def test_gc_report_lines_are_whole_on_a_narrow_terminal(tmp_path):
    st = _store(tmp_path / "s")
    cli("cache", "clear", "features", "--store", st)
    out = on_a_terminal("gc", "--store", st, "--dry-run")
    lines = out.strip().splitlines()
    assert any(line.startswith(f"  {LONG}.features: 1 entry (") for line in lines), lines
    assert any("would condemn" in line and "still unreachable" in line for line in lines), lines
