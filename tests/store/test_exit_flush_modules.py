"""A process whose only write is what its exit flush writes (a cache hit's usage record: no value named, nothing
waiting) writes it without loading the value checks (casmon.store.reliance), the fault points
(casmon.faultpoints), threading or signal.py; a fault point asked for through the environment still acts, and
a Ctrl-C in a flush's held step still waits for the step's end in a process that never loaded threading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent

SCRIPT = textwrap.dedent("""
    import atexit, json, sys

    def report():  # registered first, so it runs last: after casmon's exit flush
        mods = ["casmon.store.reliance", "casmon.faultpoints", "threading", "signal"]
        print(json.dumps({"loaded": [m for m in mods if m in sys.modules]}), flush=True)

    atexit.register(report)
    import casmon

    @casmon.cache(store=casmon.open(sys.argv[1]))
    def work(i):
        return i * 2

    work(3)
""")


def _run(script: Path, store: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), str(store)], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **(env or {})}, cwd=script.parent)


def _use_files(store: Path) -> list[Path]:
    return sorted(p for p in (store / "records").rglob("*") if p.is_file() and "use" in p.parent.parent.name)


def test_a_hits_exit_flush_writes_its_usage_record_without_loading_the_value_checks_or_fault_points(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    store = tmp_path / "store"
    miss = _run(script, store)
    assert miss.returncode == 0, miss.stderr
    before = _use_files(store)
    hit = _run(script, store)
    assert hit.returncode == 0, hit.stderr
    assert json.loads(hit.stdout.strip().splitlines()[-1])["loaded"] == []
    assert len(_use_files(store)) > len(before), "the hit's exit flush wrote no usage record"


def test_a_fault_point_named_in_the_environment_still_acts_at_the_exit_flush(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    store = tmp_path / "store"
    assert _run(script, store).returncode == 0
    counts = tmp_path / "counts"
    counts.mkdir()
    hit = _run(script, store, {"CASMON_FAULTPOINTS": f"flush.sealed=count:{counts}"})
    assert hit.returncode == 0, hit.stderr
    assert (counts / "flush.sealed.count").read_text().count("1") >= 1
    assert "casmon.faultpoints" in json.loads(hit.stdout.strip().splitlines()[-1])["loaded"]

DEFER = textwrap.dedent("""
    import json, os, sys
    import casmon

    s = casmon.open(sys.argv[1], autoflush=None)  # no flush thread: threading stays unloaded
    steps = []

    def hook(store):  # runs in the flush's held step: a Ctrl-C now arrives once the step ends
        os.kill(os.getpid(), 2)
        steps.append("hook ended")

    s.add_flush_hook(hook)
    s.append("note", {"x": 1})
    try:
        s.flush()
        steps.append("flush returned")
    except KeyboardInterrupt:
        steps.append("interrupted")
    print(json.dumps({"steps": steps, "threading": "threading" in sys.modules}), flush=True)
""")


def test_a_ctrl_c_in_a_flushs_held_step_arrives_after_it_in_a_process_without_threading(tmp_path):
    script = tmp_path / "defer.py"
    script.write_text(DEFER)
    r = _run(script, tmp_path / "store")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["steps"] == ["hook ended", "interrupted"]
    assert out["threading"] is False
