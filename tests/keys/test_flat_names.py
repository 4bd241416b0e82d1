"""Moving code inside casmon changes no key and no stored byte.

Compared with casmon as it was before its modules became packages (``FLAT_COMMIT``,
extracted from this repository's history): every function and class both have
is named the same way in keys, and casmon's public types pickle to the same
bytes, so a value holding one keeps its digest and the older casmon still loads
it from a shared store.
"""

from __future__ import annotations

import json
import pickle
import pkgutil
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import casmon
from casmon.keys.fingerprint import casmon_key_module, key_class_module
from tests.conftest import ROOT
from tests.support.modules import import_if_installed

#: The last commit with casmon's flat layout (casmon/store.py, casmon/cache.py, ...).
FLAT_COMMIT = "9a91ec2"

_OLD_NAMES = r"""
import importlib, inspect, json, pickle, pkgutil, sys
import casmon
assert casmon.__file__.startswith(sys.argv[1]), casmon.__file__
from casmon.fingerprint import qualified_name
names = {}
for info in pkgutil.walk_packages(casmon.__path__, "casmon."):
    if info.name.endswith("__main__"):
        continue
    mod = importlib.import_module(info.name)
    for k, v in vars(mod).items():
        if (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ == info.name:
            names.setdefault(v.__qualname__, []).append(qualified_name(v))
kinds = sorted(n for n in casmon.__all__ if isinstance(getattr(casmon, n), type))
values = {"digest": casmon.Digest(bytes(range(16))), "cache_info": casmon.CacheInfo(1, 2, 3, 4)}
print(json.dumps({"names": names,
                  "kinds": {n: pickle.dumps(getattr(casmon, n), 5).hex() for n in kinds},
                  "values": {k: pickle.dumps(v, 5).hex() for k, v in values.items()}}))
"""


@pytest.fixture(scope="module")
def flat(tmp_path_factory):
    """What the flat layout's casmon says, from a process running it."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and this repository's history")
    tmp = tmp_path_factory.mktemp("flat")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", FLAT_COMMIT, "casmon"], capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {FLAT_COMMIT} is not in this clone's history")
    (tmp / "casmon.tar").write_bytes(archive.stdout)
    with tarfile.open(tmp / "casmon.tar") as t:
        t.extractall(tmp / "src", filter="data")
    p = subprocess.run([sys.executable, "-c", _OLD_NAMES, str(tmp / "src")], capture_output=True, text=True,
                       cwd=tmp, env={"PYTHONPATH": str(tmp / "src"), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def _new_names() -> dict[str, list[str]]:
    import inspect

    names: dict[str, list[str]] = {}
    for info in pkgutil.walk_packages(casmon.__path__, "casmon."):
        if info.name.endswith("__main__"):
            continue
        mod = import_if_installed(info.name)
        if mod is None:
            continue
        for v in vars(mod).values():
            if (inspect.isclass(v) or inspect.isfunction(v)) and v.__module__ in (info.name, casmon_key_module(info.name)):
                module = key_class_module(casmon_key_module(v.__module__), v.__qualname__)
                names.setdefault(v.__qualname__, []).append(f"{module}.{v.__qualname__}")
    return {k: sorted(set(v)) for k, v in names.items()}


#: Moves accepted on purpose, each (old name, new name) exactly, with why a key is not expected to hold the old
#: name.
#:
#: casmon.ui, the ``casmon ui`` web app (issue 26): the runs table moved out of ``model`` into ``table``, the
#: comparison of runs into ``compare``, the compare page into ``comparepage``, the run page into ``runpage``,
#: the number format into ``values``. These are the app's internal page and request code, called by its own
#: server; none is public API, a value users store, or something documented to pass to a cached or logged
#: function, so a key that names one is not expected. Any other move, or one of these to yet another module,
#: still fails, and so does a listed move that did not happen.
_UI_MOVES = [
    ("casmon.ui.model", "casmon.ui.table", ["row_of", "sort_key", "parse_filter", "_as_number", "matches", "_sorted_rows",
                                           "RunsView", "runs_view"]),
    ("casmon.ui.model", "casmon.ui.compare", ["Divergence", "Comparison", "_cell_key", "_text_diff", "_same_call",
                                             "_outcome", "_window", "in_run", "run_calls", "divergence",
                                             "_without_sessions", "_hexlike", "identical_groups"]),
    ("casmon.ui.pages", "casmon.ui.comparepage", ["compare_body", "_group", "_summary", "_patches", "_commit",
                                                 "_diff_section", "_divergence", "compare_page"]),
    ("casmon.ui.pages", "casmon.ui.runpage", ["run_page"]),
    ("casmon.ui.charts", "casmon.ui.values", ["fmt"]),
]
ACCEPTED_MOVES = {q: (f"{old}.{q}", f"{new}.{q}") for old, new, names in _UI_MOVES for q in names}


def test_every_function_and_class_keeps_the_name_keys_give_it(flat):
    new = _new_names()
    both = [q for q, old in flat["names"].items() if len(set(old)) == 1 and len(new.get(q, ())) == 1]
    assert len(both) > 300  # the comparison covers casmon, not a handful of names
    moved = {q: (flat["names"][q][0], new[q][0]) for q in both if flat["names"][q][0] != new[q][0]}
    unexpected = {q: m for q, m in moved.items() if ACCEPTED_MOVES.get(q) != m}
    assert not unexpected, f"named otherwise in keys than before (old, new): {unexpected}"
    # every accepted move is one that happened: the list names nothing that does not need it
    assert {q: m for q, m in ACCEPTED_MOVES.items() if moved.get(q) != m} == {}


def test_public_types_pickle_to_the_bytes_they_did(flat):
    for name, old in flat["kinds"].items():
        assert pickle.dumps(getattr(casmon, name), 5).hex() == old, name


def test_values_holding_casmon_types_keep_their_bytes(flat):
    values = {"digest": casmon.Digest(bytes(range(16))), "cache_info": casmon.CacheInfo(1, 2, 3, 4)}
    for k, v in values.items():
        assert pickle.dumps(v, 5).hex() == flat["values"][k], k
    assert pickle.loads(bytes.fromhex(flat["values"]["digest"])) == values["digest"]


def test_flat_names_are_namespaces_not_modules_on_disk():
    assert sys.modules["casmon.digest"].Digest is casmon.Digest
    assert not (Path(casmon.__file__).parent / "digest.py").exists()
    assert callable(casmon.cache) and casmon.cache.__module__.startswith("casmon.caching")
