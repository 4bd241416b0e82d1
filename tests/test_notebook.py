"""A notebook run on a real Jupyter kernel (nbclient + ipykernel): cached calls, an edited helper, a recorded run.

The kernel runs this venv's Python (a kernel spec written into a temporary
folder), with what a Jupyter server would give it: the notebook's folder as the
working directory and ``JPY_SESSION_NAME`` naming the notebook. The test checks
that cached results are used only while the code that made them is the code
that runs (an edited helper cell computes again, restoring it brings the old
results back, a fresh kernel uses the version its code matches), that the
code-change warning says so, and that the run names its notebook in the run
record and in ``casmon runs``, ``show`` and ``diff``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap

import pytest

from click.testing import CliRunner

import casmon
from casmon.cli.app import main as cli_main
from tests.conftest import ROOT

try:
    import ipykernel  # noqa: F401 - the kernel the notebook runs on
    import nbclient
    import nbformat
except ImportError:  # the `test` extra installs them
    nbclient = nbformat = None

KERNEL = "casmon-test-python"


@pytest.fixture
def kernel_dir(tmp_path, monkeypatch):
    """A kernel spec that starts this interpreter (the venv's), found through JUPYTER_PATH."""
    if nbclient is None:
        pytest.skip("needs nbclient, nbformat and ipykernel (pip install -e '.[test]')")
    spec = tmp_path / "jupyter" / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "casmon test", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    return spec


def cell(src: str) -> str:
    return textwrap.dedent(src).strip()


def run_notebook(path, cells: list[str], store) -> list:
    """Execute ``cells`` as the notebook at ``path`` in a fresh kernel; the executed cells."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells]  # a cell each time, even for the same source
    nbformat.write(nb, str(path))
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["CASMON_STORE"] = str(store)
    env["JPY_SESSION_NAME"] = str(path)  # what Jupyter Server 2 sets for a notebook's kernel
    env.pop("CASMON_FLUSH_EACH_CALL", None)
    client = nbclient.NotebookClient(nb, kernel_name=KERNEL, timeout=600, startup_timeout=600,
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=env)
    nbformat.write(nb, str(path))
    return nb.cells


def text(c, name: str = "stdout") -> str:
    return "".join(o.get("text", "") for o in c.get("outputs", []) if o.get("output_type") == "stream" and o.get("name") == name)


SETUP = cell("""
    import warnings, casmon
    warnings.simplefilter("always")  # every code-change warning shows in the cell's output
""")
HELPER_1 = cell("""
    def helper(x):
        return x + 1
""")
HELPER_2 = cell("""
    def helper(x):
        return x + 2   # the edited helper
""")
CACHED = cell("""
    @casmon.cache
    def f(x):
        print("computing", x)
        return helper(x) * 10
""")
CALL = cell("""
    print([f(i) for i in range(3)])
""")


def computed(c) -> list[int]:
    return [int(x) for x in re.findall(r"computing (\d+)", text(c))]


def result(c) -> list:
    return json.loads([ln for ln in text(c).splitlines() if ln.startswith("[")][-1])


def test_notebook_cached_calls_edited_helper_and_recorded_run(tmp_path, kernel_dir):
    store = tmp_path / "store"
    work = tmp_path / "analysis"
    work.mkdir()
    nb_path = work / "analysis.ipynb"
    record = cell("""
        with casmon.record(comment="nb") as run:
            print([f(i) for i in range(4)])
        print("run", run.name)
    """)
    cells = run_notebook(nb_path, [SETUP, HELPER_1, CACHED, CALL, CALL, HELPER_2, CALL, HELPER_1, CALL, record], store)
    first, again, edited, restored, recorded = cells[3], cells[4], cells[6], cells[8], cells[9]
    assert (result(first), computed(first)) == ([10, 20, 30], [0, 1, 2])
    assert (result(again), computed(again)) == ([10, 20, 30], []), "hits"
    assert (result(edited), computed(edited)) == ([20, 30, 40], [0, 1, 2]), "an edited helper never returns a stale result"
    assert (result(restored), computed(restored)) == ([10, 20, 30], []), "the old code's results are used again"
    warned = text(edited, "stderr")
    assert "changed" in warned and "will not be used" not in warned, warned
    back = " ".join(text(restored, "stderr").split())
    assert "matches a version cached before" in back and "3 entries" in back, back
    assert (result(recorded), computed(recorded)) == ([10, 20, 30, 40], [3])

    # A fresh kernel whose helper is the edited one: that version's results, and a warning that says so.
    nb2 = work / "second.ipynb"
    cells2 = run_notebook(nb2, [SETUP, HELPER_2, CACHED, CALL, record], store)
    assert (result(cells2[3]), computed(cells2[3])) == ([20, 30, 40], [])
    fresh = " ".join(text(cells2[3], "stderr").split())
    assert "matches a version cached before" in fresh and "3 entries" in fresh and "will not be used" not in fresh, fresh
    assert (result(cells2[4]), computed(cells2[4])) == ([20, 30, 40, 50], [3])

    s = casmon.open(str(store), trust=False)
    runs = casmon.list_runs(s)
    assert [r.manifest.get("notebook") for r in runs] == [str(nb_path), str(nb2)]
    assert all(r.status == "ok" for r in runs)
    s.close()

    cli = CliRunner()
    out = cli.invoke(cli_main, ["runs", "--store", str(store)], terminal_width=250)
    assert out.exit_code == 0, out.output
    assert "notebook" in out.output and "analysis.ipynb" in out.output and "second.ipynb" in out.output
    listed = json.loads(cli.invoke(cli_main, ["runs", "--json", "--store", str(store)]).output)
    assert [r["notebook"] for r in listed] == [str(nb_path), str(nb2)]
    shown = cli.invoke(cli_main, ["show", "latest", "--store", str(store)], terminal_width=250)
    assert shown.exit_code == 0, shown.output
    assert f"notebook: {nb2}" in shown.output and "ipykernel_launcher" not in shown.output
    names = [r["name"] for r in listed]
    d = cli.invoke(cli_main, ["diff", names[0], names[1], "--store", str(store)], terminal_width=250)
    assert d.exit_code == 0, d.output
    assert "notebook" in d.output and "analysis.ipynb" in d.output and "second.ipynb" in d.output
    assert "ipykernel_launcher" not in d.output, "two kernels differ only in their connection files"


def test_vscode_names_the_notebook_in_the_kernel(tmp_path, kernel_dir):
    """VS Code sets ``__vsc_ipynb_file__`` in the kernel; a script the notebook starts is not the notebook."""
    store = tmp_path / "store"
    nb_path = tmp_path / "vs.ipynb"
    cells = run_notebook(nb_path, [
        cell("""
            import casmon, subprocess, sys
            __vsc_ipynb_file__ = "/home/me/project/vs code.ipynb"   # what VS Code runs in the kernel at start
            with casmon.record():
                pass
            print(casmon.list_runs()[-1].manifest.get("notebook"))
        """),
        cell("""
            # a script started from the notebook inherits JPY_SESSION_NAME, but is not a kernel
            r = subprocess.run([sys.executable, "-c", "import casmon.runs.recorder as r; print(r.notebook_path())"],
                               capture_output=True, text=True)
            print(r.stdout.strip(), r.returncode)
        """),
    ], store)
    assert text(cells[0]).strip() == "/home/me/project/vs code.ipynb"
    assert text(cells[1]).split() == ["None", "0"]


def test_the_code_change_warning_says_which_entries_are_used(tmp_path):
    """Edited, edited back, and entries from before casmon recorded versions: the warning says what happens."""
    import time as _time
    import warnings

    from casmon.caching import CacheWarning, name_digest

    s = casmon.open(str(tmp_path / "s"))

    def g(x):
        return x + 1

    first_code = g.__code__
    cg = casmon.cache(store=s)(g)
    assert [cg(1), cg(2)] == [2, 3]
    g.__code__ = (lambda x: x + 2).__code__  # an edit, as %autoreload makes it
    with pytest.warns(CacheWarning) as w:
        assert cg(1) == 3
    msg = " ".join(str(w[0].message).split())
    assert "changed since its results were cached: this version has none yet, so calls compute again" in msg
    assert "2 entries of 1 other version stay in the store" in msg and "will not be used" not in msg
    # an entry an older casmon wrote (no version in it), for another argument
    s.append("cache", {"fn": cg.__casmon_cache__.name, "result": s.put(0).hex(), "time": _time.time(), "size": 1},
             key=name_digest("an old key"))
    g.__code__ = first_code  # the edit undone
    with pytest.warns(CacheWarning) as w:
        assert [cg(1), cg(2)] == [2, 3]
    msg = " ".join(str(w[0].message).split())
    assert "matches a version cached before" in msg and "its 2 entries are used" in msg, msg
    assert "1 entry of 1 other version" in msg and "1 older entry does not say its version" in msg, msg
    assert cg.cache_info().misses == 3, "the first version's entries were used"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cg(2) == 3  # the same version again: no second warning


def test_code_that_changes_at_every_call_warns_a_few_times_only(tmp_path):
    """A global the function reads, changed before every call: each call is a new version (computed
    again, never a stale hit), and the warnings stop after five, the fifth saying so."""
    import warnings

    from casmon.caching.memoize import VERSION_WARNINGS_MAX, CacheWarning

    s = casmon.open(str(tmp_path / "s"))
    scale = {"k": 0}

    @casmon.cache(store=s)
    def f(x):
        return x * scale["k"]

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        out = []
        for k in range(12):
            scale["k"] = k
            out.append(f(2))
    assert out == [2 * k for k in range(12)]
    msgs = [str(x.message) for x in w if issubclass(x.category, CacheWarning)]
    assert len(msgs) == VERSION_WARNINGS_MAX == 5
    assert "are not reported" in msgs[-1] and all("are not reported" not in m for m in msgs[:-1])
