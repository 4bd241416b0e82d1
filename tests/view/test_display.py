"""Objects that show themselves: reprs, HTML views (escaped), to_pandas; never unpickling, never raising."""

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import zarr

import casmon
from casmon.view import display
from casmon.caching import ResultRef
from tests.support.git import git

HOSTILE = "<script>alert(1)</script>"
HOSTILE_FILE = "<b onmouseover=alert(3)>.yaml"


def _square(n):
    return np.arange(n, dtype=np.float64) ** 2


def _step(x, note="<img src=x onerror=alert(2)>"):
    return x * 2


class Boom:
    """Unpickling it creates a file: a value that would run code if a view ever loaded it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path: str):
    Path(path).write_text("unpickled")
    return path


def build_store(tmp_path: Path, monkeypatch) -> dict:
    """A real store: two runs (metrics, a tracked file, a patch) in a real git repo, a call log, cache entries."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("lr = 0.1\nprint('train')\n")
    (repo / "config.yaml").write_text("lr: 0.1\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    monkeypatch.chdir(repo)
    store = casmon.open(tmp_path / "store")
    square = casmon.cache(store=store)(_square)
    step = casmon.intercept(store=store)(_step)
    marker = tmp_path / "unpickled.txt"
    with casmon.record(comment="base", track=[r"config\.yaml$"], store=store, capture_output=False) as run:
        square(1000)
        step(3)
        run.info.update(loss=0.5, lr=0.1, weights=np.ones(8), model=Boom(str(marker)))
    (repo / "train.py").write_text("lr = 0.02\nprint('train')\n")  # uncommitted: the second run has a patch
    (repo / "config.yaml").write_text("lr: 0.02\n")
    (repo / HOSTILE_FILE).write_text("x: 1\n")  # a tracked file whose name is markup
    with casmon.record(comment=HOSTILE, track=[r"\.yaml$"], store=store, capture_output=False) as run:
        square(2000)
        step(4)
        step(5)
        run.info.update(loss=0.25, lr=0.02, weights=np.zeros(8), model=Boom(str(marker)), note=HOSTILE)
    store.flush()
    casmon.flush()
    assert not marker.exists()
    return {"store": store, "path": tmp_path / "store", "repo": repo, "marker": marker, "square": square}


@pytest.fixture
def built(tmp_path, monkeypatch):
    b = build_store(tmp_path, monkeypatch)
    yield b
    b["store"].close()


def all_views(path: Path, square=None) -> list:
    """Every object a notebook user looks at, from a store opened without trust (as a reader should)."""
    s = casmon.open(path, trust=False)
    runs = casmon.list_runs(s)
    log = casmon.load(s)
    objs = [runs, runs[0], runs[1], casmon.diff(runs[0], runs[1]), s.stats(), s.verify(), log, log.sessions]
    weights = runs[0].manifest["info"]["weights"]["$"]
    objs.append(s.open_array(weights))
    if square is not None:
        objs += [square.entries(), square.ref(1000)]
    return objs


def test_hostile_strings_render_as_text(built):
    views = all_views(built["path"], built["square"])
    for obj in views:
        h = obj._repr_html_()
        r = repr(obj)
        assert "casmon" in h and "<script" not in h.lower(), type(obj)
        assert "onerror=" not in h.replace("onerror=alert(2)&gt;", ""), type(obj)
        assert "cannot show it" not in h + r, (type(obj), h)
    runs, run2, diff, log = views[0], views[2], views[3], views[6]
    for h in (runs._repr_html_(), run2._repr_html_(), diff._repr_html_()):
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in h
    for h in (run2._repr_html_(), diff._repr_html_()):
        assert "&lt;b onmouseover=alert(3)&gt;.yaml" in h and "<b " not in h
    assert "&lt;img src=x onerror=alert(2)&gt;" in log._repr_html_()  # a default value, in the signature
    assert not built["marker"].exists(), "a view unpickled a value"


def test_views_never_unpickle_even_on_a_trusted_store(built):
    views = all_views(built["path"], built["square"])
    s = casmon.open(built["path"])  # trusted: still, a view only describes
    runs = casmon.list_runs(s)
    views += [runs, runs[0], casmon.diff(runs[0], runs[1])]
    for obj in views:
        text = repr(obj) + obj._repr_html_()
        assert "unpickled" not in text
    if hasattr(runs, "to_pandas"):
        df = runs.to_pandas()
        assert "needs tests.view.test_display._touch" in str(df["model"].iloc[0])  # described, not loaded
    assert not built["marker"].exists()
    assert "model=<pickle tests.view.test_displ…>" in repr(runs[0])  # the type name, cut at the repr's width


def test_reprs_say_what_they_are(built):
    s = casmon.open(built["path"], trust=False)
    runs = casmon.list_runs(s)
    start = runs[0].manifest["start"]
    r0 = repr(runs[0])
    assert r0.startswith("<casmon run 1-base ok") and display.when(start) in r0
    assert f"commit {git(built['repo'], 'rev-parse', 'HEAD')[:10]} on main, clean" in r0
    assert "loss=0.5" in r0 and "1 file" in r0
    assert "uncommitted changes" in repr(runs[1])
    lst = repr(runs)
    assert lst.startswith("2 runs:") and "1-base" in lst and HOSTILE in lst and str(start) not in lst

    d = casmon.diff(runs[0], runs[1])
    assert isinstance(d, dict) and d["a"] == "1-base" and d["info"]["loss"] == {"a": 0.5, "b": 0.25}
    assert json.loads(json.dumps({k: v for k, v in d.items() if k != "info"}))["commit"]["same"] is True
    text = repr(d)
    assert display.when(start) in text and "loss" in text and "0.25" in text and "files changed: config.yaml" in text
    assert "uncommitted changes: differ (+6 -0 lines)" in text or "uncommitted changes: differ" in text
    w = [ln for ln in text.splitlines() if ln.strip().startswith("weights")][0]
    assert w.count("array(8,) float64") == 2 and len(set(w.split("(")[-2:])) == 2, "equal texts get their digests"

    st = s.stats()
    assert isinstance(st, dict) and isinstance(st["dedup_ratio"], float) and json.loads(json.dumps(st)) == dict(st)
    t = repr(st)
    assert f"dedup {st['dedup_ratio']:.2f}×" in t and repr(st["dedup_ratio"]) not in t
    assert display.size(st["logical_bytes"]) in t and "KiB" in t

    rep = s.verify()
    assert rep.ok and repr(rep).startswith("<casmon verify: ok") and "defaultdict" not in repr(rep)
    assert f"values {rep.checked['values']:,}" in repr(rep)

    log = casmon.load(s)
    assert "1 function, 3 calls, 1 session)" in repr(log)
    sess = log.sessions
    assert isinstance(sess, dict) and sorted(sess) == [1] and sess[1]["pid"] == os.getpid()
    assert display.when(sess[1]["start"]) in repr(sess) and str(sess[1]["start"]) not in repr(sess)

    arr = s.open_array(runs[0].manifest["info"]["weights"]["$"])
    assert isinstance(arr, zarr.Array) and arr[2:4].tolist() == [1.0, 1.0]
    a = repr(arr)
    assert "shape=(8,)" in a and "dtype=float64" in a and "chunks=(8,)" in a
    assert runs[0].manifest["info"]["weights"]["$"][:12] in a and "object at 0x" not in a

    ref = built["square"].ref(1000)
    rr = repr(ref)
    assert "casmon result of" in rr and "_square" in rr and "array(1000,) float64" in rr and "7.8 KiB" in rr
    assert "entry=" not in rr and ref.digest.hex()[:12] in rr


def test_to_pandas_columns(built):
    pytest.importorskip("pandas")
    s = casmon.open(built["path"], trust=False)
    runs = casmon.list_runs(s)
    df = runs.to_pandas()
    assert list(df.index) == ["1-base", f"2-{HOSTILE}"] and df.index.name == "run"
    for col in ("status", "start", "end", "duration_s", "commit", "branch", "dirty", "comment", "files",
                "loss", "lr", "weights", "model", "note"):
        assert col in df.columns, col
    assert df["loss"].tolist() == [0.5, 0.25] and df["dirty"].tolist() == [False, True]
    assert df["files"].tolist() == [1, 2] and str(df["start"].dtype).startswith("datetime64")
    assert df["note"].isna().tolist() == [True, False]

    calls = casmon.load(s).to_pandas()
    assert list(calls.columns) == display.CALL_COLUMNS and len(calls) == 3
    assert calls["n"].tolist() == [1, 2, 3] and (calls["duration_s"] >= 0).all() and set(calls["status"]) == {"ok"}
    assert len(casmon.load(s).to_pandas(session=2)) == 0

    entries = built["square"].entries()
    assert isinstance(entries, list) and len(entries) == 2 and all(isinstance(e, ResultRef) for e in entries)
    edf = entries.to_pandas()
    assert list(edf.columns) == display.CACHE_COLUMNS
    assert sorted(edf["size"].tolist()) == [8000, 16000] and edf["function"].str.endswith("_square").all()
    assert "2 cache entries, 23.4 KiB" in repr(entries)

    sdf = casmon.load(s).sessions.to_pandas()
    assert sdf["session"].tolist() == [1] and sdf["pid"].tolist() == [os.getpid()]


def test_to_pandas_without_pandas_says_so(built, monkeypatch):
    runs = casmon.list_runs(built["store"])
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if pandas were not installed
    for fn in (runs.to_pandas, casmon.load(built["store"]).to_pandas, built["square"].entries().to_pandas):
        with pytest.raises(ImportError, match="to_pandas\\(\\) needs pandas.*pip install pandas"):
            fn()


def test_damaged_store_shows_what_it_can(built):
    path = built["path"]
    built["store"].close()
    for p in (path / "packs").rglob("*"):  # every value gone: manifests, patches, info, results
        if p.is_file():
            p.write_bytes(b"\0" * p.stat().st_size)
    s = casmon.open(path, trust=False)
    # The runs index (derived, read without the manifests) lists both runs as it indexed them, and says what
    # cannot be read once a run's manifest is asked for.
    indexed = casmon.list_runs(s)
    assert len(indexed) == 2
    for r in indexed:
        dict(r.manifest.items())  # the whole manifest: read from the store, which cannot give it
        assert isinstance(r.manifest.error, casmon.DamagedObjectError)
    shutil.rmtree(path / "runs-index")
    runs = casmon.list_runs(s)
    assert [r.status for r in runs] == ["unreadable", "unreadable"]
    rep = s.verify()
    assert not rep.ok and repr(rep).startswith("<casmon verify: DAMAGED") and "damaged" in rep._repr_html_()
    for obj in (runs, runs[0], s.stats(), casmon.load(s)):
        r, h = repr(obj), obj._repr_html_()
        assert "cannot show it" not in r + h, (type(obj), r)
    assert "this run cannot be read" in runs[0]._repr_html_()
    assert "unreadable" in repr(runs)


def test_views_never_raise():
    class Broken:
        manifest = {"status": "ok", "start": "yesterday", "git": {"commit": 5}, "files": {"a": None}, "info": 7}
        name = HOSTILE
        error = None

        def info_cells(self):
            raise casmon.DamagedObjectError("run x", "info unreadable")

    b = Broken()
    text, h = display.run_text(b), display.run_html(b)
    assert "?" in text and "info: DamagedObjectError" in h and "<script" not in h
    weird = display.StoreStats({"store": HOSTILE, "records": 5, "dedup_ratio": "x", "logical_bytes": None})
    assert "cannot show it" in repr(weird) and "<script" not in weird._repr_html_()
    d = display.RunDiff({"a": HOSTILE, "b": 1, "info": {"k": "not a dict"}})
    assert "cannot show it" in repr(d) and "<script" not in d._repr_html_()
    assert display.when(float("nan")) == "?" and display.when(1e300) == "?" and display.when(None) == "-"
    assert display.size(5 * 2**30) == "5.0 GiB" and display.size(1536) == "1.5 KiB" and display.size(None) == "?"
    assert display.ratio(11.166620251558138) == "11.17×" and display.seconds(125) == "2 min 5 s"


def test_patch_is_coloured_line_by_line():
    h = display.patch_html("diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old <b>\n+new &amp;\n same\n")
    assert '<span class="casmon-del">-old &lt;b&gt;</span>' in h
    assert '<span class="casmon-add">+new &amp;amp;</span>' in h
    assert '<span class="casmon-meta">+++ b/x</span>' in h and '<span class="casmon-hunk">@@ -1 +1 @@</span>' in h
    assert " same\n" in h


def test_live_run_shows_itself(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not a git repository: the run says so
    with pytest.warns(casmon.RunWarning, match="not a git repository"):
        with casmon.record(comment="live", store=tmp_path / "s", capture_output=False) as run:
            run.info["step"] = 3
            text, h = repr(run), run._repr_html_()
            assert text.startswith("<casmon run 1-live running") and "step=3" in text
            assert "not in a git repository" in text and "casmon-status-running" in h and "<td>step</td>" in h
    assert repr(run).startswith("<casmon run 1-live ok")
    with pytest.warns(casmon.RunWarning), pytest.raises(ValueError):
        with casmon.record(comment="boom", store=tmp_path / "s", capture_output=False):
            raise ValueError("<i>no</i>")
    failed = casmon.list_runs(tmp_path / "s")[-1]
    text, h = repr(failed), failed._repr_html_()
    assert text.startswith("<casmon run 2-boom failed") and "ValueError: <i>no</i>" in text
    assert "casmon-status-failed" in h and "<summary>traceback</summary>" in h
    assert "raise ValueError(&quot;&lt;i&gt;no&lt;/i&gt;&quot;)" in h and "<i>" not in h


def test_long_run_list_shows_the_newest(tmp_path):
    from types import SimpleNamespace

    runs = display.RunList(SimpleNamespace(name=f"{i}-r", manifest={"status": "ok", "start": 1.7e9 + i}, error=None,
                                           info_cells=lambda i=i: {"loss": 1 / (i + 1)}) for i in range(250))
    text, h = repr(runs), runs._repr_html_()
    assert text.startswith("250 runs:") and "249-r" in text and "\n  0-r " not in text and "(50 older runs not shown)" in text
    assert "the newest 200 shown" in h and "249-r" in h and ">0-r<" not in h and h.count("<tr>") == 201


def test_result_ref_on_a_failing_backend_says_why(built):
    ref = built["square"].ref(1000)

    class Failing:
        def manifest(self, d):
            raise OSError(5, "Input/output error")

    broken = ResultRef(Failing(), ref.digest, ref.key, ref.entry)
    text = repr(broken)
    assert "casmon result of" in text and "cannot read it: OSError" in text and "7.8 KiB" in text
    assert "cannot read it: OSError" in broken._repr_html_()


def test_a_size_too_large_for_a_float_shows_as_unknown_not_an_overflow():
    from casmon.view.text import size

    assert size(10**400) == "?" and size(-(10**400)) == "?" and size(10**400, "MiB") == "?"
