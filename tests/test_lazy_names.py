"""Loading on first use stays invisible: a look at casmon's flat module names (kept in sys.modules for old pickles)
loads nothing, and values fingerprint the same whether numpy was imported before or after casmon.

Behavioural: checked in fresh interpreters."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def _run(code: str, cwd) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_looking_a_missing_name_up_in_every_module_loads_neither_casmons_layers_nor_numpy(tmp_path):
    """pickle (``whichmodule``, for an object without ``__module__``), cloudpickle and other tools look a name up
    in every module of sys.modules; casmon's flat names (``casmon.cache``, ``casmon.gc``, ...) are there after
    ``import casmon`` and must answer "no such name" without importing the store, the cache or numpy."""
    got = json.loads(_run("""
        import json, pickle, sys
        import casmon

        def helper():
            pass

        helper.__module__ = None
        pickle.whichmodule(helper, "helper")  # looks "helper" up in every module
        for name, module in list(sys.modules.items()):
            getattr(module, "no_such_name_anywhere", None)
        print(json.dumps({m: m in sys.modules for m in ("numpy", "casmon.store.store", "casmon.caching",
                                                          "casmon.maintenance", "casmon.view.display")}))
    """, tmp_path))
    assert not any(got.values()), [m for m, v in got.items() if v]


def test_numpy_values_fingerprint_the_same_whether_numpy_was_imported_before_or_after_casmon(tmp_path):
    values = textwrap.dedent("""
        class Sub(np.ndarray):
            pass

        values = [(np.float32(2.0), 1), np.float64(1.5), np.int64(3), np.bool_(True), np.arange(3), np.arange(3).view(Sub),
                  np.array([1, "a", None], dtype=object), np.dtype("f4"), np.zeros(2, dtype=[("a", "i4")]),
                  {"k": np.arange(2)}, [np.int8(1)], np.ma.masked_array([1, 2], mask=[0, 1]),
                  np.datetime64("2020-01-01"), np.str_("x"), np.array(1.0), frozenset({np.int64(1)})]
        print(json.dumps([fingerprint(v).hex() for v in values]))
    """)
    first = _run("import json\nimport numpy as np\nfrom casmon import fingerprint\n" + values, tmp_path)
    # The first value ever fingerprinted is a numpy scalar inside a tuple, with numpy imported after casmon
    # fingerprinted something else.
    after = _run("import json\nfrom casmon import fingerprint\nfingerprint((1, 'a', [2.0]))\nimport numpy as np\n"
                 + values, tmp_path)
    after_first = _run("import json\nfrom casmon import fingerprint\nimport numpy as np\n" + values, tmp_path)
    assert json.loads(first) == json.loads(after) == json.loads(after_first)


def test_loading_a_name_on_first_use_leaves_the_garbage_collectors_state_as_the_program_set_it(tmp_path):
    """A first use pauses the collector while it loads casmon's modules: enabled before, enabled after; a program
    that disabled it keeps it disabled, through a load that fails too; and nothing collectable is lost."""
    got = json.loads(_run("""
        import gc, json, sys
        import casmon

        out = {}
        out["on_before"] = gc.isenabled()
        casmon.open  # loads the store
        out["on_after"] = gc.isenabled()
        gc.disable()
        casmon.cache  # loads the cache
        out["off_after"] = not gc.isenabled()
        gc.enable()
        sys.modules["casmon.runs"] = None  # the next load fails
        try:
            casmon.list_runs
        except ImportError:
            out["failed"] = True
        out["on_after_failure"] = gc.isenabled()

        class Cycle:
            pass

        a = Cycle(); a.me = a
        import weakref
        r = weakref.ref(a)
        del a
        gc.collect()
        out["collected"] = r() is None
        print(json.dumps(out))
    """, tmp_path))
    assert got == {"on_before": True, "on_after": True, "off_after": True, "failed": True, "on_after_failure": True,
                   "collected": True}
