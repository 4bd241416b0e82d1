"""Lineage queries in a process that keeps its store open (``casmon ui``, a notebook) see the entries another
process wrote a moment ago: the cache's rule of listing again at most once a second on a miss does not make a
query call a live entry unrecorded."""

import subprocess
import sys
import textwrap

import casmon
from casmon.lineage import first_difference
from casmon.store import default_store
from tests.support.processes import ENV


def test_first_difference_with_a_run_another_process_just_recorded_reads_its_entries(tmp_path):
    store = str(tmp_path / "store")
    script = textwrap.dedent(f"""
        import sys
        import numpy as np, casmon
        @casmon.cache(store={store!r})
        def make(n):
            return np.arange(n, dtype=float)
        @casmon.cache(store={store!r})
        def total(a):
            return float(a.sum())
        sys.stdin.readline()  # imported and ready: the write comes a moment after the reader listed the store
        with casmon.record(store={store!r}, capture_output=False):
            total(make(int(sys.argv[1])))
    """)

    def start(n):
        return subprocess.Popen([sys.executable, "-c", script, str(n)], env=ENV, stdin=subprocess.PIPE, text=True)

    def finish(p):
        p.communicate("go\n", timeout=300)
        assert p.returncode == 0
        return casmon.load_run("latest", s)

    s = default_store(store)  # this process's store, held open as casmon ui holds it
    a = finish(start(50))
    p = start(60)
    assert not first_difference(a, a, s)  # lists the tables now, then the other process writes
    b = finish(p)
    fd = first_difference(a, b, s)
    assert [(p.fn.rsplit(".", 1)[-1], [(d.what, d.name, d.detail) for d in p.differences]) for p in fd.partings] == [
        ("make", [("parameter", "n", "differs")])]
