"""The installed wheel, run from outside the repository by .ci/run: casmon, its package data and its CLI are the
install's. A file left out of the wheel fails here."""

import importlib.metadata
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import casmon
from casmon.ui import pages

where = Path(casmon.__file__).resolve()
assert where.is_relative_to(Path(sys.prefix).resolve()), f"casmon imported from {where}, not the installed wheel"
assert casmon.__version__ == importlib.metadata.version("casmon"), (casmon.__version__, importlib.metadata.version("casmon"))
missing = [n for n in pages.STATIC if pages.static_file(n) is None]
assert not missing, f"left out of the wheel: {missing}"
assert (where.parent / "py.typed").is_file(), "py.typed left out of the wheel"

with tempfile.TemporaryDirectory() as d:
    store = os.path.join(d, "s")
    computed = []

    @casmon.cache(store=store)
    def square(x):
        computed.append(x)
        return x * x

    assert square(3) == 9 and square(3) == 9 and computed == [3], computed
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", casmon.RunWarning)  # not a git repository: no commit recorded
        with casmon.record(store=store, params={"lr": 0.1}) as run:
            for step in range(5):
                run.log(loss=1 / (step + 1))
    cli = Path(sys.executable).with_name("casmon")
    for args in (["verify"], ["report", "latest", "-o", os.path.join(d, "report.html")]):
        out = subprocess.run([str(cli), *args, "--store", store], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
    text = Path(d, "report.html").read_text()
    assert "uPlot" in text and "Permission is hereby granted" in text, "the report lost uPlot or its licence"
print(f"casmon {casmon.__version__} from the wheel: imports, caches, records, reports, verifies")
