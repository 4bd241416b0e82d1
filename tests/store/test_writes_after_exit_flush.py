"""What a process writes after its exit flush ran is written all the same: a user's atexit handler that makes a
cached call, or a thread still running when the interpreter exits (Python waits for it after threading's exit
hooks, where the flush runs), in whichever order threading, casmon and the handler were loaded.

Real processes; each result is checked from a fresh one, once."""

from __future__ import annotations

import os

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
