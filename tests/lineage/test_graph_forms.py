"""A lineage graph's text and dot forms stay one node per line and valid Graphviz whatever a crafted record
names its function or parameter: control characters are written as escapes, never as themselves."""

import os
import shutil
import subprocess

import pytest

import casmon
from casmon.caching import KIND
from casmon.keys.digest import Digest
from casmon.lineage import used_by

CONTROLS = "".join(map(chr, range(32))) + "\x7f\u2028\u2029"


@pytest.fixture
def crafted(tmp_path):
    s = casmon.open(str(tmp_path / "s"), create=True)
    a, b = "aa" * 16, "bb" * 16
    s.append(KIND, {"fn": "x.a" + CONTROLS + '"<b>', "result": "1" * 32, "time": 1.0, "rf": "11" * 16},
             key=Digest(bytes.fromhex(a)))
    s.append(KIND, {"fn": "x.b\\", "result": "2" * 32, "time": 2.0, "pc": {"p" + CONTROLS + '"\\': "11" * 16}},
             key=Digest(bytes.fromhex(b)))
    s.flush()
    yield used_by(a, s)
    s.close()


def test_the_text_form_has_one_line_per_node_whatever_a_function_is_named(crafted):
    lines = crafted.text().split("\n")
    assert len(lines) == 1 + len(crafted.nodes)
    assert not any(c in line for line in lines for c in CONTROLS)
    assert "\\x00" in lines[1]


def test_the_dot_form_holds_no_control_character_and_graphviz_reads_it(crafted):
    dot = crafted.to_dot()
    assert not any(c in line for line in dot.split("\n") for c in CONTROLS)
    if shutil.which("dot") is None:
        pytest.skip("Graphviz is not installed")
    r = subprocess.run(["dot", "-Tsvg"], input=dot.encode(), capture_output=True, timeout=60,
                       env={**os.environ, "LC_ALL": "C.UTF-8"})
    assert r.returncode == 0, r.stderr
