"""gc at the shortest grace racing resumes of one run: nothing a resumed run saved or carried over is lost."""

import os
import subprocess
import sys
import textwrap
import time

import pytest

import casmon
from tests.support.processes import ROOT

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

RESUMER = textwrap.dedent("""
    import sys, numpy as np, casmon
    path, rounds = sys.argv[1], int(sys.argv[2])
    s = casmon.open(path)
    for i in range(rounds):
        try:
            with casmon.record(store=s, resume=None if i == 0 else "latest", capture_output=False) as run:
                prev = run.checkpoint_latest() if i else None
                assert i == 0 or prev["i"] == i - 1, (i, prev)
                run.log(x=float(i))
                run.save("note", f"round {i}".encode())
                run.checkpoint({"i": i, "w": np.full(2000, i, "f8")}, step=i, keep_last=1)
                raise RuntimeError("preempted")
        except RuntimeError:
            pass
""")


def test_gc_racing_resumes_at_the_shortest_grace_keeps_every_checkpoint_and_manifest_a_resume_needs(tmp_path,
                                                                                                   min_grace):
    min_grace(0.3)
    path = tmp_path / "s"
    casmon.open(path, create=True).close()
    script = tmp_path / "resumer.py"
    script.write_text(RESUMER)
    rounds = 12
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CASMON_MIN_GRACE": "0.3"}
    proc = subprocess.Popen([sys.executable, str(script), str(path), str(rounds)], env=env, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 600
    while proc.poll() is None and time.monotonic() < deadline:
        s = casmon.open(path)
        try:
            s.gc(grace=0.3)
        except casmon.StoreError:
            pass  # a merge or the writer's lock holds a moment
        finally:
            s.close()
    assert proc.wait(timeout=60) == 0, proc.stderr.read().decode()[-3000:]
    s = casmon.open(path)
    for _ in range(2):
        time.sleep(0.4)
        s.gc(grace=0.3)
    r = casmon.load_run("latest", s)
    assert r.checkpoint()["i"] == rounds - 1 and r.load("note") == f"round {rounds - 1}".encode()
    assert list(r.metric("x").values) == [float(i) for i in range(rounds)]
    assert len(r.manifest["resumes"]) == rounds - 1
    for e in r.manifest["resumes"]:
        assert isinstance(s.get(e["manifest"]), dict)
    rep = s.verify()
    assert rep.ok, (rep.damaged, rep.missing)
    s.close()
