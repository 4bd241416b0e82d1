"""What a process writes after its exit flush ran is written all the same: a user's atexit handler that makes a
cached call, or a thread still running when the interpreter exits (Python waits for it after threading's exit
hooks, where the flush runs), in whichever order threading, casmon and the handler were loaded.

Real processes; each result is checked from a fresh one, once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_python

MOD = """
import casmon
CALLS = []


def make(store):
    @casmon.cache(store=store)
    def f(x):
        CALLS.append(x)
        return x * 2
    return f
"""

CHECK = "import casmon, mod\nf = mod.make(casmon.open('st'))\nf(1); f(7)\nprint(mod.CALLS)\n"

ATEXIT_FIRST = "import atexit\natexit.register(lambda: f(7))\nimport casmon, mod\nf = mod.make(casmon.open('st'{o}))\nf(1)\n"
ATEXIT_LAST = "import casmon, mod, atexit\nf = mod.make(casmon.open('st'{o}))\natexit.register(lambda: f(7))\nf(1)\n"
THREADING_FIRST = "import threading\n" + ATEXIT_FIRST
THREAD_AT_EXIT = ("import casmon, mod, threading\nf = mod.make(casmon.open('st'{o}))\ngo = threading.Event()\n"
                  "def late():\n    go.wait()\n    import time\n    time.sleep(0.2)\n    f(7)\n"
                  "threading.Thread(target=late).start()\nf(1)\ngo.set()\n")
THREAD_AFTER_FIRST_CALL = ("import casmon, mod\nf = mod.make(casmon.open('st'{o}))\nf(1)\nimport threading, time\n"
                           "threading.Thread(target=lambda: (time.sleep(0.2), f(7))).start()\n")


@pytest.mark.parametrize("opened", ["", ", autoflush=None", ", autoflush=3600"])
@pytest.mark.parametrize("script", [ATEXIT_FIRST, ATEXIT_LAST, THREADING_FIRST, THREAD_AT_EXIT, THREAD_AFTER_FIRST_CALL],
                         ids=["atexit-before-casmon", "atexit-after-casmon", "threading-then-atexit",
                              "thread-running-at-exit", "thread-started-after-first-call"])
def test_a_cached_call_made_after_the_exit_flush_reaches_the_store(tmp_path, script, opened):
    (tmp_path / "mod.py").write_text(MOD)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    run_python(script.format(o=opened), cwd=tmp_path, env=env)
    p = run_python(CHECK, cwd=tmp_path, env=env)
    assert p.stdout.split("\n")[-2] == "[]", "a result computed during exit was lost"


OPENED_IN_LATE_THREAD = ("import threading, time, casmon, mod\n"
                         "def late():\n    time.sleep(0.2)\n    f = mod.make(casmon.open('st'{o}))\n    f(1); f(7)\n"
                         "threading.Thread(target=late).start()\n")
OPENED_IN_ATEXIT = ("import threading, atexit, casmon, mod\n"
                    "def late():\n    f = mod.make(casmon.open('st'{o}))\n    f(1); f(7)\natexit.register(late)\n")
EARLIER_STORE_THEN_LATE_THREAD = ("import casmon, mod\nother = casmon.open('other', autoflush=None)\n"
                                  "other.append('call', {{'a': 1}})\n" + OPENED_IN_LATE_THREAD)


@pytest.mark.parametrize("opened", ["", ", autoflush=None"])
@pytest.mark.parametrize("script", [OPENED_IN_LATE_THREAD, OPENED_IN_ATEXIT, EARLIER_STORE_THEN_LATE_THREAD],
                         ids=["first-store-in-a-thread-joined-at-exit", "first-store-in-an-atexit-handler",
                              "a-store-opened-before-then-one-in-a-thread-joined-at-exit"])
def test_a_store_first_opened_while_the_interpreter_exits_keeps_its_writes_and_exits(tmp_path, script, opened):
    """Once threading's exit hooks have run, the exit flush can no longer be one of them: a store opened then
    starts no background thread (Python would wait for it forever) and flushes each write as it is made."""
    (tmp_path / "mod.py").write_text(MOD)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    try:  # generous: a process that exits takes a second or two; one that hangs never does
        p = subprocess.run([sys.executable, "-c", script.format(o=opened)], cwd=tmp_path, capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("the process did not exit")
    assert p.returncode == 0, p.stderr
    p = run_python(CHECK, cwd=tmp_path, env=env)
    assert p.stdout.split("\n")[-2] == "[]", "a result computed during exit was lost"
