"""What a lineage query's target names, from Python: an intercepted function (by name or as the function) is one
line saying call logs are not lineage's graph and what lists its calls; ``FILE@DIGEST`` names one content."""

import numpy as np
import pytest

import casmon
from casmon.lineage import lineage, used_by


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = casmon.open(str(tmp_path / "s"), create=True)
    yield s
    s.close()


def test_an_intercepted_function_by_name_or_object_is_one_line_naming_what_lists_its_calls(store):
    @casmon.cache(store=store)
    def prep(x):
        return x * 2

    @casmon.intercept(store=store)
    def score(x):
        return float(x.sum())

    score(prep(np.arange(40.0)))
    store.flush()
    full = f"{score.__module__}.{score.__qualname__}"
    for query in (used_by, lineage):
        for target, name in (("score", "score"), (score, full)):
            with pytest.raises(LookupError) as e:
                query(target, store)
            msg = str(e.value)
            assert "\n" not in msg and "no cached function" not in msg
            assert msg.startswith(f"{name!r} is a logged (intercepted) function, not a cached one"), msg
            assert f"casmon.load(store).calls({full!r})" in msg
    # the logged call still shows where lineage has it: as what took a cached result
    assert any(n.kind == "call" for n in used_by("prep", store).nodes.values())


def test_file_at_digest_names_that_content_of_the_file_and_no_other(store, tmp_path):
    data = tmp_path / "d.txt"

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    data.write_text("1 2 3 4 5 6 7 8\n")
    load(str(data))
    data.write_text("9 8 7 6 5 4 3 2\n")
    load(str(data))
    store.flush()
    files = [n for n in used_by(str(data), store).of_kind("file")]
    assert len(files) == 2
    for f in files:
        g = used_by(f"d.txt@{f.data['digest'][:8]}", store)
        assert [n.data["digest"] for n in g.of_kind("file")] == [f.data["digest"]]
        assert len(g.of_kind("entry")) == 1
