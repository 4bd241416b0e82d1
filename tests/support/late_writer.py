"""A writer that acknowledges only after its store is closed, and the check that what it acknowledged is there.

Tests of processes working beside a writer (``verify`` and ``verify --repair`` held at a step)
run this writer meanwhile: everything it acknowledged must still be in the store afterwards.
"""

import subprocess
from pathlib import Path

import casmon
from tests.support.processes import ENV, PY

#: A writer that acknowledges (prints "acked") only after its store is closed: a ref, a cache entry.
LATE_WRITER = """
import sys, casmon
s = casmon.open(sys.argv[1])
s.set_ref("late", s.put("late value"))

@casmon.cache(store=s)
def late(x):
    return ["late", x]

late(1)
s.close()
print("acked")
"""


def write_late(loc: Path) -> None:
    """Run the late writer on the store at ``loc`` to its acknowledgement."""
    w = subprocess.run([PY, "-c", LATE_WRITER, str(loc)], env=ENV, capture_output=True, text=True, timeout=60)
    assert w.returncode == 0 and w.stdout.strip() == "acked", (w.stdout, w.stderr)


def late_is_there(loc: Path) -> list[str]:
    """What the late writer acknowledged that the store at ``loc`` lacks (empty: nothing lost)."""
    s = casmon.open(loc, create=False)
    lost = []
    ref = s.get_ref("late")
    if ref is None or s.get(ref.target) != "late value":
        lost.append(f"ref late: {ref}")
    if not any(r.get("fn", "").endswith("late") for _k, r in s.records("cache")):
        lost.append("cache entry of late(1)")
    s.close()
    return lost
