"""Python runs a module's cached bytecode when its source was edited within the same second at the same size
(the .pyc records the source's mtime in whole seconds and its size). casmon keys a function by the code that
runs, so such an edit never files one version's result under the other's key."""

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.support.sources import write_module

V1 = "import casmon\n\n@casmon.cache(store='s')\ndef f(x):\n    return x + 1\n"
V2 = V1.replace("x + 1", "x + 5")  # the same size: only the mtime could tell the .pyc is stale

CALL = ("import json, sys, warnings\nsys.dont_write_bytecode = False\nwarnings.simplefilter('ignore')\n"
        "import m\nprint(json.dumps([m.f(1), m.f(1), m.f.cache_info().misses]))\n")


def run(cwd: Path) -> list:
    """A fresh interpreter with the bytecode cache on (read and written), as contributors run Python."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(ROOT)
    p = subprocess.run([sys.executable, "-c", CALL], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def make_stale(src: Path) -> None:
    """Edit ``src`` to V2 as an edit within the same second leaves it: same size, same mtime, the .pyc kept."""
    assert list(src.parent.glob("__pycache__/m.*.pyc")), "V1's bytecode is cached"
    st = src.stat()
    src.write_text(V2)
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_stale_pyc_is_keyed_by_the_code_that_runs_never_by_the_edited_source(tmp_path):
    src = write_module(tmp_path / "m.py", V1)
    assert run(tmp_path) == [2, 2, 1]
    make_stale(src)
    first, again, misses = run(tmp_path)
    assert (first, again) == (2, 2), "Python ran V1's bytecode, and its cached result is what that code returns"
    assert misses <= 1
    write_module(src, V2)
    assert run(tmp_path) == [6, 6, 1], "V2 computes its own result: V1's was not filed under V2's source"


def test_a_stale_pyc_run_before_any_entry_files_its_result_under_its_own_code(tmp_path):
    src = write_module(tmp_path / "m.py", V1)
    subprocess.run([sys.executable, "-c", "import sys; sys.dont_write_bytecode = False; import m"], cwd=tmp_path,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True, timeout=300)
    make_stale(src)
    assert run(tmp_path) == [2, 2, 1], "V1's bytecode ran, computed once, then hit its own entry"
    write_module(src, V2)
    assert run(tmp_path) == [6, 6, 1], "V2 is not served what V1's code returned"
