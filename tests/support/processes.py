"""Python processes a test starts on this checkout: started, waited on at a file, or run to the end.

The tests hold real processes at a step (a fault point writes a file there and waits), so the
helpers start them with this checkout first on ``PYTHONPATH`` and wait for a file to appear
while checking that no process ended early.
"""

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

#: The repository's root: what ``PYTHONPATH`` needs for ``import casmon`` and ``import tests``.
ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
ENV = dict(os.environ, PYTHONPATH=str(ROOT))


def start_python(code: str, *args, env=None) -> subprocess.Popen:
    """Start ``python -c code args`` (code dedented), with pipes for its output; ``env`` defaults to ``ENV``."""
    return subprocess.Popen([PY, "-c", textwrap.dedent(code), *map(str, args)], env=env or ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_file(path: Path, *procs: subprocess.Popen, timeout: float = 60) -> None:
    """Wait until ``path`` exists; fail if one of ``procs`` ends first or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        for p in procs:
            assert p.poll() is None, f"process ended before {path.name}: {p.communicate()}"
        assert time.monotonic() < deadline, f"{path.name} not reached"
        time.sleep(0.01)


def run_code(code: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run ``python -c code`` (dedented) from the repository's root and capture its output."""
    return subprocess.run([PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout,
                          cwd=str(ROOT), **kw)


def run_code_in(code: str, *args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -c code args`` (dedented) in ``cwd`` with ``env`` and capture its output."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)
