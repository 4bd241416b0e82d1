"""The command line run by the tests: ``casmon ARGS`` in this process (cheap) or in a process of its own,
a store of cache entries to run it on, and a snapshot of a folder's bytes to show a verb changed nothing."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import casmon
from tests.support.processes import ROOT


class Ran:
    """What a ``cli`` call returns: its exit status and output, as ``subprocess.run`` would."""

    def __init__(self, returncode: int, stdout: str, stderr: str) -> None:
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(*args, cwd=None, check=True):
    """`casmon ARGS` in this process (click's runner: no interpreter start-up, so many calls stay cheap)."""
    from click.testing import CliRunner

    from casmon.cli.app import main

    old = os.getcwd()
    os.chdir(cwd or old)
    try:
        r = CliRunner().invoke(main, list(args), env={"CASMON_STORE": None})
    finally:
        os.chdir(old)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    ran = Ran(r.exit_code, r.stdout, r.stderr)
    if check and ran.returncode != 0:
        raise AssertionError(f"casmon {' '.join(args)} failed ({ran.returncode}):\n{ran.stdout}\n{ran.stderr}")
    return ran


def cli_process(*args, cwd=None, check=True):
    """`casmon ARGS` in a process of its own (for replay, which imports the user's code)."""
    e = dict(os.environ, PYTHONPATH=str(ROOT))
    e.pop("CASMON_STORE", None)
    p = subprocess.run([sys.executable, "-m", "casmon.cli", *args], capture_output=True, text=True, env=e, cwd=cwd,
                       timeout=300)
    if check and p.returncode != 0:
        raise AssertionError(f"casmon {' '.join(args)} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def tree(path: Path) -> dict:
    """Every file under path with its bytes: what "changed nothing" is checked against."""
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def cached_store(path: Path) -> None:
    """A store with cache entries of two functions: large results (loose objects) and small ones (packed)."""
    s = casmon.open(path)

    @casmon.cache(store=s)
    def big(i):
        return np.random.default_rng(i).random(40_000)  # 320 KB: loose

    @casmon.cache(store=s)
    def small(i):
        return np.full(50, float(i))  # packed

    for i in range(6):
        big(i)
        small(i)
    for i in range(6, 12):
        small(i)
    s.close()
