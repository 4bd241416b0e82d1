"""Importing casmon's integrations imports no framework: a class is built from its framework when first asked for."""

import json
import importlib.util
import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import ROOT

FRAMEWORKS = ["torch", "lightning", "pytorch_lightning", "transformers", "keras", "jax", "tensorflow"]


def test_importing_casmon_and_its_integrations_imports_no_framework(tmp_path):
    probe = textwrap.dedent(f"""
        import json, sys
        import casmon, casmon.integrations
        import casmon.integrations.owner, casmon.integrations.lightning
        import casmon.integrations.transformers, casmon.integrations.keras
        from casmon.integrations import lightning, transformers, keras
        print(json.dumps([m for m in {FRAMEWORKS!r} if m in sys.modules]))
    """)
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stderr == ""
    assert json.loads(r.stdout) == []


@pytest.mark.parametrize("module,name", [("lightning", "CasmonLogger"), ("transformers", "CasmonCallback"),
                                         ("keras", "CasmonCallback")])
def test_an_unknown_name_is_an_attribute_error(module, name):
    import importlib

    mod = importlib.import_module(f"casmon.integrations.{module}")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        mod.Nope  # noqa: B018
    assert name in mod.__all__


@pytest.mark.parametrize("module,name,blocked,says", [
    ("lightning", "CasmonLogger", ["lightning", "pytorch_lightning"], "PyTorch Lightning is not installed"),
    ("transformers", "CasmonCallback", ["transformers"], "transformers is not installed"),
    ("keras", "CasmonCallback", ["keras"], "Keras is not installed"),
    ("lightning", "CasmonLogger", ["torch"], "needs 'torch', which cannot be imported"),
    ("keras", "CasmonCallback", ["ml_dtypes"], "needs 'ml_dtypes', which cannot be imported"),
])
def test_a_missing_framework_or_package_it_needs_is_a_one_line_import_error_naming_it(tmp_path, module, name,
                                                                                     blocked, says):
    pytest.importorskip(module)
    probe = textwrap.dedent(f"""
        import sys
        for m in {blocked!r}:
            sys.modules[m] = None  # as if not installed
        import casmon.integrations.{module} as mod
        try:
            mod.{name}
        except ImportError as e:
            print(str(e))
    """)
    r = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                            "KERAS_BACKEND": "torch" if importlib.util.find_spec("torch") else "jax"})
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert line.startswith(f"casmon.integrations.{module}: ") and says in line, line
