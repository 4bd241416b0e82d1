"""A four-stage pipeline (load a file -> clean -> features -> train), each run in a fresh interpreter inside a run:
each single change -- a helper edited, the input file's bytes, a parameter, one stage's entry cleared -- is found
by ``stale`` exactly, by ``used_by`` from the changed node, and as the first difference between the runs.

The pipeline is a module file imported fresh by each process, so an edit is a real edit of its code; the queries
run here, in yet another interpreter, from the records alone.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import casmon
from casmon.caching import clear_function
from casmon.lineage import first_difference, stale, used_by
from tests.conftest import run_python
from tests.support.cli import cli
from tests.support.processes import ROOT

PIPELINE = '''
import os
import sys

import numpy as np

import casmon

STORE = os.environ["LINEAGE_STORE"]


def helper(x):
    return x[x > 0]


@casmon.cache(store=STORE, files=["path"])
def load(path):
    return np.loadtxt(path)


@casmon.cache(store=STORE)
def clean(x, scale):
    return helper(x) * scale


@casmon.cache(store=STORE)
def features(x):
    return (x * 2, x + 1)


@casmon.cache(store=STORE)
def train(fl):
    return {"loss": float(fl[0].sum() - fl[1].sum()), "weights": fl[0] / 3}


def main(path, scale):
    with casmon.record(store=STORE, capture_output=False, params={"scale": scale}) as run:
        model = train(features(clean(load(path), scale)))
        run.save("model", model["weights"])
    print(model["loss"])
'''

STAGES = ("load", "clean", "features", "train")


class Pipeline:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "proj"
        self.dir.mkdir()
        self.store = str(tmp / "store")
        self.data = self.dir / "data.txt"
        self.data.write_text("\n".join(str(i - 3) for i in range(40)) + "\n")
        self.source = PIPELINE
        (self.dir / "pipeline.py").write_text(self.source)

    def edit(self, old: str, new: str) -> None:
        assert old in self.source
        self.source = self.source.replace(old, new)
        (self.dir / "pipeline.py").write_text(self.source)

    def run(self, scale: float = 1.0) -> casmon.RunInfo:
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(self.dir), str(ROOT)]), LINEAGE_STORE=self.store,
                   PYTHONDONTWRITEBYTECODE="1")
        p = subprocess.run([sys.executable, "-c", f"import pipeline; pipeline.main({str(self.data)!r}, {scale!r})"],
                           cwd=self.dir, env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        return casmon.load_run("latest", self.store)

    @staticmethod
    def keys(run: casmon.RunInfo) -> dict[str, str]:
        """Stage -> the key of the entry the run read or wrote."""
        return {link["fn"].rsplit(".", 1)[-1]: link["key"] for link in run.manifest["links"]["cache"]}


def stale_set(store: str) -> set[str]:
    return {n["id"] for n in stale(store).to_dict()["nodes"]}


def ids(run: casmon.RunInfo, keys: dict[str, str], stages) -> set[str]:
    return {f"entry:{keys[s]}" for s in stages} | ({f"run:{run.ref}"} if run is not None else set())


@pytest.fixture
def pipe(tmp_path):
    p = Pipeline(tmp_path)
    p.first = p.run()
    p.first_keys = p.keys(p.first)
    assert set(p.first_keys) == set(STAGES)
    assert stale_set(p.store) == set(), "a fresh pipeline is stale"
    return p


def downstream(store: str, target: str) -> set[str]:
    return {n["id"] for n in used_by(target, store).to_dict()["nodes"]}


def test_a_baseline_run_links_its_four_stages_upstream(pipe):
    g = pipe.first.lineage().to_dict()
    k = pipe.first_keys
    edges = {(e["from"], e["to"], e["kind"]) for e in g["edges"]}
    for a, b in zip(STAGES, STAGES[1:]):
        assert (f"entry:{k[a]}", f"entry:{k[b]}", "result") in edges, (a, b)
    assert any(n["kind"] == "file" and n["path"] == str(pipe.data) for n in g["nodes"])
    assert {(n["kind"], n["label"]) for n in g["nodes"] if n["kind"] in ("param", "artifact")} == {
        ("param", "scale=1.0"), ("artifact", "model")}
    assert (f"run:{pipe.first.ref}", f"artifact:{pipe.first.ref}:model", "saved") in edges
    # a second process that hits every stage adds no entry and keeps the graph
    again = pipe.run()
    assert pipe.keys(again) == k
    assert stale_set(pipe.store) == set()


def test_an_edited_helper_makes_its_stage_and_everything_downstream_stale(pipe):
    pipe.edit("return x[x > 0]", "return x[x > 1]")
    second = pipe.run()
    k1, k2 = pipe.first_keys, pipe.keys(second)
    assert k2["load"] == k1["load"] and k2["clean"] != k1["clean"]
    assert stale_set(pipe.store) == ids(pipe.first, k1, ("clean", "features", "train"))
    reasons = {n["id"]: n["reason"] for n in stale(pipe.store).to_dict()["nodes"]}
    assert "the code of pipeline.clean changed" in reasons[f"entry:{k1['clean']}"]
    assert "'pipeline.helper'" in reasons[f"entry:{k1['clean']}"]
    old_version = casmon.lineage(k1["clean"], pipe.store).nodes[f"entry:{k1['clean']}"].data["version"]
    assert downstream(pipe.store, f"pipeline.clean@{old_version[:10]}") == ids(pipe.first, k1, ("clean", "features",
                                                                                                "train"))
    fd = first_difference(pipe.first, second)
    assert [p.fn for p in fd.partings] == ["pipeline.clean"]
    (d,) = [d for d in fd.partings[0].differences if d.what == "code"]
    assert d.name == "pipeline.helper" and "+    return x[x > 1]" in d.diff


def test_a_stages_own_edit_is_said_once_in_stale(pipe):
    pipe.edit("return helper(x) * scale", "return helper(x) * scale * 1.5")
    pipe.run()
    k1 = pipe.first_keys
    reasons = {n["id"]: n["reason"] for n in stale(pipe.store).to_dict()["nodes"]}
    # not "...since it was stored: code 'pipeline.clean' changed": the function named twice
    assert reasons[f"entry:{k1['clean']}"] == "the code of pipeline.clean changed since it was stored"


def test_diff_names_the_two_runs_on_the_first_differences_source_diff(pipe):
    pipe.edit("return x[x > 0]", "return x[x > 1]")
    second = pipe.run()
    a, b = pipe.first.name, second.name
    want = [f"--- pipeline.helper (in {a})", f"+++ pipeline.helper (in {b})"]
    fd = first_difference(pipe.first, second)
    (d,) = [d for d in fd.partings[0].differences if d.what == "code"]
    assert d.diff.splitlines()[:2] == want, str(fd)  # not explain's "(stored)" and "(now)": the code may have moved on
    out = cli("diff", a, b, "--store", pipe.store).stdout
    assert "\n".join(want) in "\n".join(line.strip() for line in out.splitlines())
    assert "(stored)" not in out and "(now)" not in out


def test_changed_input_bytes_make_load_and_everything_downstream_stale(pipe):
    k1 = pipe.first_keys
    old_digest = [f for f in casmon.lineage(k1["load"], pipe.store).of_kind("file")][0].data["digest"]
    pipe.data.write_text(pipe.data.read_text().replace("10\n", "11\n"))
    expected = ids(pipe.first, k1, STAGES)
    assert stale_set(pipe.store) == expected  # seen before anything runs again
    second = pipe.run()
    assert stale_set(pipe.store) == expected
    assert downstream(pipe.store, old_digest) >= expected - {f"run:{pipe.first.ref}"}
    assert f"run:{second.ref}" not in downstream(pipe.store, old_digest)
    assert f"run:{pipe.first.ref}" in downstream(pipe.store, old_digest)
    fd = first_difference(pipe.first, second)
    assert [p.fn for p in fd.partings] == ["pipeline.load"]
    assert [(d.what, d.name) for d in fd.partings[0].differences] == [("file", str(pipe.data))]
    assert f"its content changed: {old_digest[:8]} in {pipe.first.name}, " in str(fd)
    assert "(parameter 'path')" in str(fd)


def test_a_changed_parameter_makes_nothing_stale_and_is_the_first_difference(pipe):
    second = pipe.run(scale=2.0)
    k1, k2 = pipe.first_keys, pipe.keys(second)
    assert k2["load"] == k1["load"] and k2["clean"] != k1["clean"]
    assert stale_set(pipe.store) == set()  # the old entries still answer the calls they were made for
    assert str(stale(pipe.store)).endswith(": nothing is stale")  # not "nothing recorded": edges were
    assert downstream(pipe.store, k1["clean"]) == ids(pipe.first, k1, ("clean", "features", "train"))
    fd = first_difference(pipe.first, second)
    assert [p.fn for p in fd.partings] == ["pipeline.clean"]
    assert [(d.what, d.name, d.detail) for d in fd.partings[0].differences] == [("parameter", "scale", "differs")]


def test_a_cleared_stage_makes_what_used_it_stale_until_it_is_computed_again(pipe):
    k1 = pipe.first_keys
    clear_function(casmon.open(pipe.store), "pipeline.features")
    assert stale_set(pipe.store) == {f"entry:{k1['train']}", f"run:{pipe.first.ref}"}
    reasons = {n["id"]: n["reason"] for n in stale(pipe.store).to_dict()["nodes"]}
    assert reasons[f"run:{pipe.first.ref}"] == f"its pipeline.features entry {k1['features'][:12]} was cleared"
    assert downstream(pipe.store, k1["features"]) == ids(pipe.first, k1, ("features", "train"))
    g = casmon.lineage(pipe.first, pipe.store).to_dict()
    assert {n["id"]: n["status"] for n in g["nodes"] if n["kind"] == "entry"}[f"entry:{k1['features']}"] == "cleared"
    second = pipe.run()
    assert pipe.keys(second) == k1
    assert stale_set(pipe.store) == set()
    fd = first_difference(pipe.first, second)
    assert [p.fn for p in fd.partings] == ["pipeline.features"]
    assert f"cleared between the runs: {pipe.first.name} used the entry before the clear, {second.name} computed it " \
           "again" in str(fd)


def test_a_script_run_then_imported_parts_at_one_function_under_both_names(tmp_path):
    """``python train.py`` caches ``__main__.load``, ``import train`` caches ``train.load``: the first difference
    pairs the two names as one function and says what else differs (the file), not "made by one run only"."""
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import numpy as np
        import casmon

        @casmon.cache(files=["path"])
        def load(path):
            return np.loadtxt(path)

        @casmon.cache
        def fit(x, lr=0.5):
            return x * lr

        def main():
            with casmon.record(capture_output=False):
                fit(load("data.txt"))

        if __name__ == "__main__":
            main()
        """))
    (tmp_path / "data.txt").write_text("1 2 3 4 5 6 7 8 9 10 11 12\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CASMON_STORE": str(tmp_path / "store")}
    subprocess.run([sys.executable, "train.py"], cwd=tmp_path, check=True, env=env, capture_output=True)
    (tmp_path / "data.txt").write_text("1 2 3 4 5 6 7 8 9 10 11 13\n")
    run_python("import train\ntrain.main()\n", cwd=tmp_path, env={"CASMON_STORE": str(tmp_path / "store")})
    fd = first_difference("1", "2", str(tmp_path / "store"))
    (p,) = fd.partings
    assert (p.fn_a, p.fn) == ("__main__.load", "train.load") and p.a and p.b
    assert [d.what for d in p.differences] == ["name", "file"]
    assert "train.py" in p.differences[0].detail
    assert fd.to_dict()["first_difference"][0]["function_a"] == "__main__.load"
    text = cli("diff", "1", "2", "--store", str(tmp_path / "store")).stdout
    assert "__main__.load -> train.load (" in text and "made by" not in text


def test_a_notebooks_main_function_is_not_paired_with_a_modules_function_of_its_name(tmp_path):
    """``python -c`` (or a notebook) names no script: its ``__main__.load`` may be any code, so it stays apart."""
    (tmp_path / "train.py").write_text(textwrap.dedent("""\
        import numpy as np
        import casmon

        @casmon.cache
        def load(n):
            return np.arange(float(n))

        def main():
            with casmon.record(capture_output=False):
                load(40)
        """))
    env = {"CASMON_STORE": str(tmp_path / "store")}
    run_python("import numpy as np, casmon\n@casmon.cache\ndef load(n):\n    return np.ones(n)\n"
               "with casmon.record(capture_output=False):\n    load(40)\n", cwd=tmp_path, env=env)
    run_python("import train\ntrain.main()\n", cwd=tmp_path, env=env)
    fd = first_difference("1", "2", str(tmp_path / "store"))
    assert sorted((p.fn, p.fn_a) for p in fd.partings) == [("__main__.load", None), ("train.load", None)]
