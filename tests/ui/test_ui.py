"""``casmon ui`` and ``casmon report`` without a browser: the pages' content, escaping, strict requests, headers.

The store is real: runs recorded with ``casmon.record`` in a real git repository
(metrics, loss curves, a tracked file, a patch), a call log and cache entries.
The server is real too: ``ThreadingHTTPServer`` on 127.0.0.1, port 0, in a
thread; requests go through ``http.client``.
"""

from __future__ import annotations

import html
import http.client
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.ui import model, pages, runpage, table
from casmon.ui.server import make_server
from casmon.ui.table import FIXED_COLUMNS
from tests.conftest import ROOT
from tests.support.git import git

HOSTILE = "<script>alert(1)</script>"
HOSTILE_KEY = "<img src=x onerror=alert(2)>"
#: The logged function's hidden state: the second run gets a different result for the same input.
DRIFT = {"k": 1.0}



def _square(n):
    return np.arange(n, dtype=np.float64) ** 2


def _step(x, scale=2):
    return x * scale * DRIFT["k"]


class Boom:
    """Unpickling it creates a file: a value that would run code if a page ever loaded it."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def _touch(path: str):
    Path(path).write_text("unpickled")
    return path


def build_store(tmp_path: Path, monkeypatch) -> dict:
    """Three runs in a real git repo: 1-base, 2-<script>… (a patch, other metrics, a drifting call), 3-again
    (the same outputs as 1-base); a call log linked to each run; cache entries. Each run has parameters
    (nested too), logged metrics (loss, acc) and info: scalars, a 50-point curve, 8 weights, a pickle."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "train.py").write_text("lr = 0.1\nprint('train')\n")
    (repo / "config.yaml").write_text("lr: 0.1\nlayers: 2\n")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "first")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("CASMON_UI_TEST_SEED", "1")
    store = casmon.open(tmp_path / "store")
    square = casmon.cache(store=store)(_square)
    step = casmon.intercept(store=store)(_step)
    marker = tmp_path / "unpickled.txt"
    curve1 = [1.0 / (i + 1) for i in range(50)]
    names = []

    def one(comment, lr, loss, curve, weights, drift, env_seed):
        DRIFT["k"] = drift
        monkeypatch.setenv("CASMON_UI_TEST_SEED", env_seed)
        with casmon.record(comment=comment, track=[r"config\.yaml$"], store=store, capture_output=True,
                           env=["CASMON_UI_TEST_SEED"], params={"lr": lr, "cfg": {"layers": 2, "opt": "adam"}}) as run:
            square(1000)
            for i in range(3):
                step(float(i))
            for i in range(20):
                run.log(loss=loss * 20 / (i + 1), acc=min(1.0, lr * i))
            print(f"training with lr={lr}")
            run.info.update(loss=loss, epochs=3, curve=curve, weights=weights, model=Boom(str(marker)),
                            cfg={"dropout": 0.1})
        store.flush()
        names.append(run.name)

    one("base", 0.1, 0.5, curve1, np.ones(8), 1.0, "1")
    (repo / "train.py").write_text("lr = 0.02\nprint('train')\n")  # uncommitted: the second run has a patch
    (repo / "config.yaml").write_text("lr: 0.02\nlayers: 2\n")
    one(HOSTILE, 0.02, 0.25, np.linspace(1.0, 0.1, 40), np.zeros(8), 1.5, "2")
    (repo / "train.py").write_text("lr = 0.1\nprint('train')\n")
    (repo / "config.yaml").write_text("lr: 0.1\nlayers: 2\n")
    one("again", 0.1, 0.5, curve1, np.ones(8), 1.0, "1")
    with casmon.record(comment="odd", store=store, capture_output=False) as run:  # a key that is markup
        run.info[HOSTILE_KEY] = HOSTILE
    names.append(run.name)
    store.flush()
    casmon.flush()
    assert not marker.exists()
    return {"store": store, "path": tmp_path / "store", "repo": repo, "marker": marker, "names": names}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        b = build_store(tmp_path_factory.mktemp("ui"), mp)
    finally:
        mp.undo()
    b["store"].close()
    yield b


class Served:
    """A server over a store opened read-only and untrusted, on 127.0.0.1 port 0, in a thread."""

    def __init__(self, path: Path, trust: bool = False) -> None:
        self.store = casmon.open(path, read_only=True, trust=trust, create=False, autoflush=None)
        self.server = make_server(self.store, "127.0.0.1", 0, trust=trust)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def request(self, path: str, method: str = "GET", host: str | None = None) -> tuple[int, dict, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.putrequest(method, path, skip_host=True)
            conn.putheader("Host", host or f"127.0.0.1:{self.port}")
            conn.endheaders()
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read().decode("utf-8")
        finally:
            conn.close()

    def get(self, path: str) -> str:
        status, _h, body = self.request(path)
        assert status == 200, (path, status, body[:2000])
        return body

    def close(self) -> None:
        self.server.shutdown()
        self.server.close()
        self.store.close()


@pytest.fixture(scope="module")
def served(built):
    s = Served(built["path"])
    yield s
    s.close()


def text_of(body: str) -> str:
    """The page as text: tags removed, entities decoded (what a reader sees)."""
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


# -- pages -------------------------------------------------------------------------------------------


ROW_RE = r'<tr data-run="([^"]+)" data-status="[^"]*">'


def rows_of(body: str) -> list[str]:
    return re.findall(ROW_RE, body)


def test_runs_page_lists_every_run_with_param_and_metric_columns(served, built):
    body = served.get("/")
    assert rows_of(body) == ["4", "3", "2", "1"]  # newest first
    heads = re.findall(r'<th data-col="([^"]+)"', body)
    assert heads[:7] == FIXED_COLUMNS
    # metrics first (on screen beside many parameters), then parameters (flattened), then info scalars (flattened
    # too): each group sorted, every time
    assert heads[7:] == ["metric.acc", "metric.loss", "param.cfg.layers", "param.cfg.opt", "param.lr",
                         f"info.{HOSTILE_KEY}".replace("<", "&lt;").replace(">", "&gt;"), "info.cfg.dropout", "info.epochs",
                         "info.loss"]
    assert re.findall(r'<th data-col="([^"]+)"', served.get("/")) == heads  # the same order on a reload
    assert 'data-group="params"' in body and 'data-group="metrics"' in body
    assert "info.curve" not in heads and "info.weights" not in heads  # not scalars
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and HOSTILE not in body
    assert "&lt;img src=x onerror=alert(2)&gt;" in body and HOSTILE_KEY not in body
    # sorting by an info value and by a metric's last value, both ways; empty cells last
    asc = rows_of(served.get("/?sort=info.loss&order=asc"))
    assert asc[:3] in (["2", "1", "3"], ["2", "3", "1"]) and asc[-1] == "4"
    desc = rows_of(served.get("/?sort=info.loss&order=desc"))
    assert desc[0] in ("1", "3") and desc[2] == "2" and desc[-1] == "4"
    assert rows_of(served.get("/?sort=metric.acc&order=asc"))[:3] in (["2", "1", "3"], ["2", "3", "1"])
    assert rows_of(served.get("/?sort=param.lr&order=asc"))[0] == "2"


def test_runs_filter_and_pages(served):
    assert rows_of(served.get("/?q=info.loss%3C0.3")) == ["2"]  # loss alone is ambiguous: info.loss, metric.loss
    assert rows_of(served.get("/?q=metric.acc%3E0.5")) == ["3", "1"]
    assert rows_of(served.get("/?q=again")) == ["3"]
    assert sorted(rows_of(served.get("/?q=lr%3D0.1"))) == ["1", "3"]
    assert sorted(rows_of(served.get("/?q=cfg.opt%3Dadam"))) == ["1", "2", "3"]  # a nested parameter
    page1 = served.get("/?per=3")
    page2 = served.get("/?per=3&page=2")
    assert rows_of(page1) == ["4", "3", "2"]
    assert rows_of(page2) == ["1"]
    assert "page 1 of 2" in page1 and 'href="/?sort=start&amp;order=desc&amp;page=2&amp;per=3"' in page1


def test_a_bad_filter_says_what_is_wrong(served):
    """Not "0 of 4 runs": a 400 whose page names the term and why, and lists every run."""
    for q, words in [("loss%3C", "filter term 'loss<': a comparison needs a value after '<'"),
                     ("nosuchkey%3E1", "filter term 'nosuchkey>1': no run has a column 'nosuchkey'"),
                     ("%3E1", "needs a column name before '>'"),
                     ("los%3C1", "did you mean loss"),
                     ("loss%3C%3C1", "one comparison a term")]:
        status, _h, body = served.request("/?q=" + q)
        assert status == 400, (q, status)
        err = re.search(r'<p class="casmon-error filter-error" id="filter-error" role="alert">(.*?)</p>', body).group(1)
        assert words in html.unescape(err), (q, err)
        assert "0 of" not in text_of(body) and len(rows_of(body)) == 4


def test_compare_page(served, built):
    body = served.get("/compare?run=1&run=2&run=3")
    text = text_of(body)
    # parameters, metrics and info side by side, in tables that scroll in their own box; the differing rows marked
    lr_row = re.search(r'<tr class="differs" data-key="lr">(.*?)</tr>', body).group(1)
    assert [html.unescape(x) for x in re.findall(r'<td class="num">(.*?)</td>', lr_row)] == ["0.1", "0.02", "0.1"]
    assert '<tr class="same" data-key="cfg.opt">' in body and '<tr class="same" data-key="epochs">' in body
    for cls in ("metrics", "params", "info"):
        assert f'<div class="scroll"><table class="{cls}">' in body
    loss = re.search(r'<table class="metrics">.*?<tr class="differs" data-key="loss">(.*?)</tr>', body, re.S).group(1)
    assert "0.25" in loss and "20 points" in loss
    # lists are summaries with a sparkline, never printed inline
    curve = re.search(r'<tr class="same" data-key="curve">(.*?)</tr>|<tr class="differs" data-key="curve">(.*?)</tr>',
                      body).group(0)
    assert "[50 floats: 0.02 .. 1]" in curve and curve.count('<svg class="spark"') == 3  # two lists, a stored array
    assert "0.3333" not in curve
    # the chart block: logged metrics to draw (loss by default, never a parameter), parameters to group and plot by
    spec = chart_block(body)
    assert spec["mode"] == "compare" and spec["api"] == "/api/run/" and spec["default"] == "loss"
    assert spec["metrics"] == ["acc", "loss", "info:curve"]  # the 50-point curve; the 8 weights are no curve
    assert [r["tail"] for r in spec["runs"]] == ["1", "2", "3"] and spec["runs"][1]["params"]["lr"] == 0.02
    assert "lr" in spec["groupable"] and "cfg.opt" not in spec["groupable"]  # the same in every run: no groups
    assert set(spec["series"]) == {"info:curve"} and spec["series"]["info:curve"]["2"]["n"] == 40
    assert 'src="/static/uPlot.iife.min.js"' in body and 'href="/static/uPlot.min.css"' in body
    # identical outputs: 1-base and 3-again, by digest; hyperparameters and info scalars are not outputs
    groups = re.search(r'<table class="groups" id="groups">(.*?)</table>', body, re.S).group(1)
    all_row = re.search(r"<th>all outputs</th><td>(.*?)</td>", groups).group(1)
    assert " ".join(text_of(all_row).split()) == "1-base , 3-again"
    weights_row = re.search(r"<th>info weights</th><td>(.*?)</td>", groups).group(1)
    assert " ".join(text_of(weights_row).split()) == "1-base , 3-again"  # np.ones(8) twice: one digest
    assert "<th>metric loss</th>" in groups
    assert "epochs" not in groups and "lr" not in groups and "cfg" not in groups
    # the patch difference in colour, and the tracked file's text diff
    assert '<span class="casmon-add">+lr = 0.02</span>' in body
    assert '<span class="casmon-add">+lr: 0.02</span>' in body and '<span class="casmon-del">-lr: 0.1</span>' in body
    assert "env CASMON_UI_TEST_SEED" in text
    # the first logged call with the same inputs and a different result
    div = re.findall(r'<p class="divergence found"><b>([^<]*)</b>: ([^<]*)', body)
    assert [(html.unescape(a), b) for a, b in div] == [
        (f"1-base → 2-{HOSTILE}", "first call with the same inputs and a different result: tests.ui.test_ui._step call 2 (")]
    link = re.search(r'<p class="divergence found">.*?</p>', body).group(0)
    assert len(re.findall(r'href="/call\?fn=tests.ui.test_ui._step&amp;session=\d+&amp;n=(\d+)"', link)) == 2
    assert "every pair with the same inputs has the same result" in text  # 1-base → 3-again
    assert "<td>call log</td>" not in body  # not casmon.diff's pairing over whole (shared) sessions
    assert HOSTILE not in body and not built["marker"].exists()
    one = served.get("/compare?run=2")  # one run: its page with charts, no differences
    assert "<h1>Run 2-" in one and "Identical outputs" not in one and chart_block(one)["runs"][0]["tail"] == "2"


def chart_block(body: str) -> dict:
    raw = re.search(r'<script type="application/json" id="casmon-chart-data">(.*?)</script>', body, re.S).group(1)
    assert "<" not in raw and ">" not in raw
    return json.loads(raw)


def test_run_page(served, built):
    body = served.get("/run/2")
    text = text_of(body)
    assert f"Run 2-{HOSTILE}" in " ".join(text.split()) and HOSTILE not in body
    main = text_of(body.split("<main", 1)[1])
    assert body.count("<h1>") == 1 and main.count(f"2-{HOSTILE}") == 1  # the title once (not again in a frame)
    assert '<span class="casmon-add">+lr = 0.02</span>' in body  # the patch
    assert "config.yaml" in text and "training with lr=0.02" in text  # files, captured output
    assert re.search(r'href="/calls\?session=\d+"', body) and 'href="/cache?fn=tests.ui.test_ui._square"' in body
    assert re.search(r'href="/cache\?fn=tests\.ui\.test_ui\._square&amp;entry=[0-9a-f]{32}"', body)  # the entry's view
    assert "array(8,) float64" in text and "array(40,) float64" in text  # stored values, described
    metrics = re.search(r'<table class="metrics" id="run-metrics">(.*?)</table>', body, re.S).group(1)
    assert re.search(r'<tr data-metric="loss"><th data-k="name">loss</th><td class="num" data-k="last">0.25</td>'
                     r'<td class="num" data-k="step">19</td><td class="num" data-k="n">20</td>', metrics)
    spec = chart_block(body)
    assert spec["mode"] == "run" and spec["metrics"] == ["acc", "loss", "info:curve"]
    params = re.search(r'<h2 id="params">Parameters</h2>(.*?)</table>', body, re.S).group(1)
    assert "cfg.layers" in params and "cfg.opt" in params and "adam" in params
    by_name = served.get("/run/2-" + HOSTILE.replace("<", "%3C").replace(">", "%3E").replace("/", "%2F"))
    assert re.sub(r"\d\d:\d\d:\d\d", "", by_name) == re.sub(r"\d\d:\d\d:\d\d", "", body)  # by name or number
    assert 'id="run-live" data-run="2" data-status="ok"' in body
    assert not built["marker"].exists()


def test_json_endpoints(served):
    status, headers, body = served.request("/api/runs?since=0")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert "<" not in body  # store strings are escaped even in JSON
    got = json.loads(body)
    assert [r["tail"] for r in got["runs"]] == ["1", "2", "3", "4"] or len(got["runs"]) == 4
    two = next(r for r in got["runs"] if r["tail"] == "2")
    assert two["name"] == f"2-{HOSTILE}" and two["status"] == "ok" and two["metrics"]["loss"]["last"] == 0.25
    assert two["metrics"]["loss"]["n_text"] == "20" and two["elapsed_text"].endswith("s")
    later = json.loads(served.get(f"/api/runs?since={got['serial']}"))
    assert later["runs"] == [] and later["serial"] == got["serial"]  # nothing changed, nothing live
    run = json.loads(served.get("/api/run/2"))
    assert run["status"] == "ok" and "training with lr=0.02" in run["output_tail"] and run["metrics"]["acc"]["n"] == 20
    pts = json.loads(served.get("/api/metric?run=1&run=2&name=loss&n=5"))
    one, two = pts["series"]
    assert one["run"] == "1" and one["n"] == 20 and len(one["value"]) == 4 and one["step"][-1] == 19
    assert one["value"][0] == one["max"][0] == one["min"][0] == 10.0  # the first point is a bucket of its own
    assert one["every"] == 16 and one["step"][1:3] == [0, 16]  # the others in buckets of 16 steps
    assert one["max"][1] == 5.0 and one["min"][1] == pytest.approx(10 / 16)  # steps 1-15: the next bucket's envelope
    full = json.loads(served.get("/api/metric?run=2&name=acc"))["series"][0]
    assert len(full["value"]) == 20 and "min" not in full  # all points: no envelope needed
    assert json.loads(served.get("/api/metric?run=1&name=nope"))["missing"] == ["1"]
    for path, status_, words in [("/api/run/99", 404, "no run '99'"), ("/api/metric?run=1", 400, "/api/metric?run="),
                                 ("/api/metric?run=1&name=loss&n=0", 400, "n: 1 to"), ("/api/runs?since=x", 400, "whole")]:
        st, headers, body = served.request(path)
        assert st == status_ and headers["content-type"].startswith("application/json"), path
        assert words in json.loads(body)["error"], (path, body)


def test_calls_and_one_call(served):
    body = served.get("/calls")
    assert "tests.ui.test_ui._step" in body and body.count('class="mark bin"') >= 1
    calls = re.findall(r'href="(/call\?fn=[^"]+)"', body)
    assert len(calls) == 9
    one = served.get(html.unescape(calls[0]))
    text = text_of(one)
    assert "Inputs" in text and "Result" in text and "scale" in text and "nothing was unpickled" in text
    session = int(re.search(r"session=(\d+)", calls[0]).group(1))  # one process: one session for the three runs
    assert len(re.findall(r'href="(/call\?fn=[^"]+)"', served.get(f"/calls?session={session}&fn=_step"))) == 9
    assert len(re.findall(r'href="(/call\?fn=[^"]+)"', served.get(f"/calls?session={session + 1}"))) == 0
    assert len(re.findall(r'href="(/call\?fn=[^"]+)"', served.get(f"/calls?process={os.getpid()}"))) == 9
    assert len(re.findall(r'href="(/call\?fn=[^"]+)"', served.get("/calls?thread=MainThread"))) == 9
    assert len(re.findall(r'href="(/call\?fn=[^"]+)"', served.get("/calls?thread=nothread"))) == 0
    during = served.get("/calls?run=2")  # the three calls of run 2, not the session's nine
    assert re.findall(r'href="/call\?fn=tests.ui.test_ui._step&amp;session=\d+&amp;n=(\d+)"', during) == ["4", "5", "6"]
    assert 'href="/calls?run=2"' in served.get("/run/2")


def test_call_inputs_described_not_unpickled(tmp_path, built):
    """A logged argument that would run code when unpickled is described; --trust loads it."""
    s = casmon.open(tmp_path / "s")
    f = casmon.intercept(store=s)(_step.__wrapped__ if hasattr(_step, "__wrapped__") else _ident)
    marker = tmp_path / "ran.txt"
    f(Boom(str(marker)))
    s.flush()
    casmon.flush()
    s.close()
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/calls")
        link = html.unescape(re.findall(r'href="(/call\?fn=[^"]+)"', body)[0])
        text = text_of(srv.get(link))
        assert "pickle" in text and "_touch" in text and not marker.exists()
    finally:
        srv.close()
    srv = Served(tmp_path / "s", trust=True)
    try:
        srv.get(link)
        assert marker.exists()  # --trust: the value was loaded to show it
    finally:
        srv.close()


def _ident(x):
    return x


def test_cache_and_store_pages(served):
    body = served.get("/cache")
    assert "tests.ui.test_ui._square" in body
    entries = served.get("/cache?fn=_square")
    assert "array(1000,) float64" in text_of(entries)
    st = text_of(served.get("/store"))
    assert "dedup ratio" in st and "compression ratio" in st and "packs" in st and "records" in st.lower()


# -- strictness and safety ---------------------------------------------------------------------------


def test_requests_are_parsed_strictly(served):
    for path, status, words in [
        ("/nope", 404, "no page /nope"),
        ("/run/999", 404, "no run '999'"),
        ("/?sort=drop", 400, "sort: no column 'drop'"),
        ("/?bogus=1", 400, "unknown parameter 'bogus'"),
        ("/?page=1&page=2", 400, "given twice"),
        ("/?page=-1", 400, "whole number"),
        ("/compare", 400, "one or more runs"),
        ("/compare?run=1&run=1", 400, "named twice"),
        ("/call?fn=_step", 400, "/call?fn=NAME&n=N"),
        ("/run/%ff", 400, "not UTF-8"),
        ("/static/../pyproject.toml", 404, "no file"),
        ("/static/model.py", 404, "no file"),
        ("/run/1?x=1", 400, "this page takes shared"),
    ]:
        got, headers, body = served.request(path)
        assert got == status, (path, got, body[:500])
        assert words in html.unescape(body), (path, body[:800])
        assert "content-security-policy" in headers


def test_non_get_and_foreign_hosts_are_refused(served):
    for method in ("POST", "PUT", "DELETE", "PATCH", "OPTIONS"):
        status, headers, body = served.request("/", method)
        assert status == 405 and headers["allow"] == "GET", method
    status, _h, _b = served.request("/", "HEAD")
    assert status == 405
    status, _h, body = served.request("/", host="evil.example:80")  # DNS rebinding
    assert status == 403 and "Host header" in body
    status, _h, _b = served.request("/", host=f"localhost:{served.port}")
    assert status == 200


def test_security_headers(served):
    _s, headers, _b = served.request("/")
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp and headers["x-content-type-options"] == "nosniff"
    assert headers["cache-control"] == "no-store"
    status, headers, body = served.request("/static/casmon-ui.js")
    assert status == 200 and headers["content-type"].startswith("text/javascript") and "addEventListener" in body


def test_no_page_holds_unescaped_store_strings(served, built):
    for path in ("/", "/?sort=info.loss", "/compare?run=1&run=2&run=4", "/run/2", "/run/4", "/calls", "/cache", "/store",
                 "/?q=%3Cscript%3E", "/api/runs?since=0", "/api/run/2"):
        status, _h, body = served.request(path)
        assert status == (400 if "q=" in path else 200), (path, status)  # <script> is a comparison without a name
        assert HOSTILE not in body and HOSTILE_KEY not in body, path
        # scripts only from the server, and data blocks the page's script reads; nothing from the store runs
        for tag in re.findall(r"<script\b[^>]*>", body):
            assert re.fullmatch(r'<script src="/static/[\w.-]+\.js" defer>|<script type="application/json" id="[\w-]+">',
                                tag), (path, tag)
    assert not built["marker"].exists()


def test_report_is_one_self_contained_file(built, tmp_path):
    out = tmp_path / "report.html"
    r = subprocess.run([sys.executable, "-m", "casmon.cli", "report", "1", "2", "3", "-o", str(out),
                        "--store", str(built["path"])], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "wrote the comparison of 3 runs" in r.stdout
    body = out.read_text()
    assert HOSTILE not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    assert not re.search(r'(src|href)="(?!data:)[^"#]', body)  # nothing fetched, no link anywhere
    assert "uPlot" in body and '<span class="casmon-add">+lr = 0.02</span>' in body  # the chart library, inline
    spec = chart_block(body)
    assert spec["api"] is None and set(spec["series"]) == {"acc", "loss", "info:curve"}  # points inline
    assert spec["series"]["loss"]["2"]["value"][-1] == 0.25
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', body).group(1)
    assert html.unescape(policy).count("sha256-") == 5 and "unsafe-inline" not in html.unescape(policy)  # 3 scripts, 2 styles
    one = subprocess.run([sys.executable, "-m", "casmon.cli", "report", "2", "-o", str(tmp_path / "one.html"),
                          "--store", str(built["path"])], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert one.returncode == 0 and "wrote the report of 1 run" in one.stdout, one.stderr
    assert chart_block((tmp_path / "one.html").read_text())["runs"][0]["tail"] == "2"
    bad = subprocess.run([sys.executable, "-m", "casmon.cli", "report", "1", "nope", "-o", str(tmp_path / "x.html"),
                          "--store", str(built["path"])], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 1 and "no run 'nope'" in bad.stderr and not (tmp_path / "x.html").exists()
    missing = subprocess.run([sys.executable, "-m", "casmon.cli", "ui", "--store", str(tmp_path / "typo")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert missing.returncode == 1 and "typo" in missing.stderr and not (tmp_path / "typo").exists()
    assert not built["marker"].exists()


def test_ui_command_serves_on_loopback(built, tmp_path):
    """``casmon ui`` in a subprocess: it says where it listens, answers, and stops on SIGINT."""
    import signal
    import urllib.request

    proc = subprocess.Popen([sys.executable, "-m", "casmon.cli", "ui", "--port", "0", "--store", str(built["path"])],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        m = re.search(r"at (http://127\.0\.0\.1:(\d+)/)", line)
        assert m, (line, proc.poll())
        with urllib.request.urlopen(m.group(1), timeout=120) as r:
            assert r.status == 200 and b"1-base" in r.read()
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    assert proc.returncode == 0, (proc.returncode, out, err)
    assert "stopped" in err


def test_histogram_and_filters_units():
    bins = model.histogram([1e-6, 1e-5, 1e-3, 1e-3, 0.5])
    assert sum(c for _, _, c in bins) == 5 and bins[0][2] == 1 and bins[-1][2] == 1
    assert model.histogram([]) == [] and model.histogram([0.1, 0.1]) == [(0.1, 0.1, 2)]
    row = {"run": "3-x", "status": "ok", "info.loss": 0.2, "param.name": "adam", "metric.acc": 0.9}
    known = set(row)

    def ok(q: str) -> bool:
        return table.matches(row, table.resolve(table.parse_filter(q), known))

    assert ok("loss<0.3 status=ok") and not ok("loss>=0.3")
    assert ok("name=adam ADAM") and ok("acc>0.5") and ok("metric.acc>0.5") and not ok("info.loss>1")
    for bad in ("missing=1", "loss<", "=1", "a b<"):
        with pytest.raises(table.FilterError):
            ok(bad)
    assert sorted([3, "b", None, 1.5, "a"], key=table.sort_key) == [1.5, 3, "a", "b", None]
    from casmon.ui.values import json_block, summary_text

    assert summary_text([0.5] * 500) == "[500 floats: 0.5 .. 0.5]" and summary_text(list(range(3))) == "[3 ints: 0 .. 2]"
    assert summary_text({"a": 1, "b": [1]}) == "{2 keys: a, b}" and len(summary_text("x" * 5000)) <= 121
    block = json_block("d", {"s": "</script><!--"})
    assert "</script><" not in block[:-9] and json.loads(re.search(r">(.*)</script>$", block).group(1)) == {"s": "</script><!--"}


def test_pages_escape_everything_they_are_given():
    ctx = pages.Ctx(HOSTILE)
    body = pages.error_page(ctx, 404, HOSTILE).decode()
    assert HOSTILE not in body and body.count("&lt;script&gt;") == 2
    assert str(ctx.link("/run/1?a=1&b=\"x", HOSTILE)) == \
        '<a href="/run/1?a=1&amp;b=&quot;x">&lt;script&gt;alert(1)&lt;/script&gt;</a>'


def test_crafted_runs_do_not_break_pages(tmp_path):
    """A run whose manifest is a pickle that would run code, and one whose info names no real value: listed,
    shown and compared with what can be read; nothing is unpickled and no page fails."""
    from casmon.keys.fingerprint import fingerprint
    from casmon.runs import KIND_RUN

    s = casmon.open(tmp_path / "s")
    with casmon.record(comment="fine", store=s, capture_output=False) as run:
        run.info.update(loss=0.5, curve=[3.0, 2.0, 1.0])
    marker = tmp_path / "ran.txt"
    for n, manifest in ((2, Boom(str(marker))),
                        (3, {"name": "3-odd", "status": "ok", "start": 1.0, "info": {"loss": {"$": "zz"}, "curve": [1, "x"],
                                                                                        "w": {"$": "0" * 32}}})):
        d = s.put(manifest)
        s.append(KIND_RUN, {"name": f"{n}-x", "manifest": d.hex(), "status": "ok", "time": 1.0 + n, "_ref": f"runs/{n}",
                            "_ref_target": d.hex()}, key=fingerprint(("casmon.run", f"runs/{n}")), refs=[d])
        s.flush()
        s.set_ref(f"runs/{n}", d, {"name": f"{n}-x", "status": "ok", "start": 1.0 + n})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/")
        assert rows_of(body) == ["1", "3", "2"]
        assert "unreadable" in body
        assert "cannot be read" in text_of(srv.get("/run/2"))
        odd = text_of(srv.get("/run/3"))
        assert "3-odd" in odd
        cmp = text_of(srv.get("/compare?run=1&run=2&run=3"))
        assert "cannot compare" in cmp and "Parameters" in cmp and "Info" in cmp
        assert srv.get("/?sort=info.loss").count("<tr data-run=") == 3
    finally:
        srv.close()
    assert not marker.exists()


def test_the_index_is_fresh_on_every_load(tmp_path, monkeypatch):
    """A run that started before the server is listed on the first load as running; the first load after it
    ended says ok (the index revalidates by the refs, it does not serve an old listing)."""
    monkeypatch.setattr(model, "FRESH_SECONDS", 0.0)
    s = casmon.open(tmp_path / "s")
    with casmon.record(comment="first", store=s, capture_output=False) as run:
        run.info["loss"] = 1.0
    s.flush()
    with casmon.record(comment="second", store=s, capture_output=False, params={"lr": 0.5}):
        s.flush()
        srv = Served(tmp_path / "s")
        try:
            body = srv.get("/")
            assert rows_of(body) == ["2", "1"] and '<tr data-run="2" data-status="running">' in body
            assert json.loads(srv.get("/api/run/2"))["status"] == "running"
            serial = json.loads(srv.get("/api/runs?since=0"))["serial"]
            assert [r["tail"] for r in json.loads(srv.get(f"/api/runs?since={serial}"))["runs"]] == ["2"]  # live
        except BaseException:
            srv.close()
            raise
    try:
        s.flush()
        body = srv.get("/")  # the first load after it ended
        assert '<tr data-run="2" data-status="ok">' in body
        later = json.loads(srv.get(f"/api/runs?since={serial}"))
        assert [(r["tail"], r["status"], r["new"]) for r in later["runs"]] == [("2", "ok", False)]
        with casmon.record(comment="third", store=s, capture_output=False) as run:
            run.info["loss"] = 0.5
        s.flush()
        assert "3-third" in srv.get("/run/3")  # looked for again at once
        assert [(r["tail"], r["new"]) for r in json.loads(srv.get(f"/api/runs?since={later['serial']}"))["runs"]] == [
            ("3", True)]
        assert rows_of(srv.get("/?sort=info.loss&order=asc")) == ["3", "1", "2"]  # values of manifests just written
    finally:
        srv.close()
        s.close()


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_statuses_killed_lost_and_failed(tmp_path, monkeypatch):
    """Badges for killed and lost; a lost run's elapsed time is up to its last heartbeat; a failed run's
    traceback shows once."""
    import time

    from casmon.runs.imported import write_run

    monkeypatch.chdir(tmp_path)  # outside this repository: its uncommitted changes are no patch of the run

    s = casmon.open(tmp_path / "s")
    t = time.time()
    write_run(s, comment="stopped", status="killed", start=t - 50, end=t - 20, params={"lr": 1})
    name = write_run(s, comment="gone", status="running", start=t - 100, params={"lr": 2})
    ref = s.get_ref(f"runs/{name.split('-')[0]}")
    s.set_ref(ref.name, ref.target, {**ref.data, "heartbeat": t - 60, "heartbeat_s": 1.0})  # 40 s after its start
    with pytest.raises(ZeroDivisionError):
        with casmon.record(comment="broken", store=s, capture_output=False):
            1 / 0
    s.close()
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/")
        for tail, status in (("1", "killed"), ("2", "lost"), ("3", "failed")):
            row = re.search(rf'<tr data-run="{tail}" data-status="{status}">(.*?)</tr>', body).group(1)
            assert f'<span class="casmon-status casmon-status-{status}">{status}</span>' in row
        lost = json.loads(srv.get("/api/run/2"))
        assert lost["status"] == "lost" and lost["elapsed"] == pytest.approx(40, abs=0.5)
        assert "40.00 s" in srv.get("/run/2") and "last heartbeat" in text_of(srv.get("/run/2"))
        failed = srv.get("/run/3")
        assert failed.count("ZeroDivisionError: division by zero") == 1 and failed.count("<h1>") == 1
    finally:
        srv.close()


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """Seven runs as a sweep leaves them: nested params, metrics of 500 points, info with 500-element lists,
    an 8-element array-like list, a long string without spaces and a nested dict."""
    from casmon.runs.imported import write_run

    path = tmp_path_factory.mktemp("wide") / "store"
    s = casmon.open(path)
    rng = np.random.default_rng(0)
    steps = np.arange(500)
    for i in range(7):
        lr = [0.1, 0.03, 0.01][i % 3]
        loss = 2.0 * np.exp(-steps * lr / 10) + rng.random(500) * 0.05
        write_run(s, comment=f"sweep{i}", start=1.7e9 + i * 100, end=1.7e9 + i * 100 + 60,
                  params={"lr": lr, "seed": i, "cfg": {"depth": 4 + i % 2, "opt": "adam"}},
                  info={"loss_curve": loss.tolist(), "weights": [float(i)] * 8, "notes": "x" * 3000,
                        "final": float(loss[-1]), "cfg": {"drop": 0.1 * (i % 2)}},
                  metrics={"loss": (steps, loss, 1.7e9 + i * 100 + steps * 0.1),
                           "acc": (steps, 1 - loss / 2, 1.7e9 + i * 100 + steps * 0.1)})
    s.close()
    return path


def test_wide_runs_leave_no_long_values_inline(wide):
    """Lists are summaries with sparklines and long text is cut, on every page; tables sit in scroll boxes."""
    srv = Served(wide)
    try:
        tails = "&".join(f"run={i}" for i in range(1, 8))
        for path in ("/", f"/compare?{tails}", "/run/4"):
            body = srv.get(path)
            cells = re.findall(r"<td[^>]*>(.*?)</td>", body, re.S)
            longest = max(len(text_of(c).strip()) for c in cells)
            assert longest <= 130, (path, longest)
            assert not [c for c in cells if text_of(c).count(",") > 20]  # no list printed out
            assert re.search(r"\[500 floats: [\d.e-]+ \.\. [\d.e-]+\]", body) or path == "/", path
            assert '<div class="scroll"><table' in body
        cmp = srv.get(f"/compare?{tails}")
        spec = chart_block(cmp)
        assert spec["default"] == "loss" and spec["metrics"] == ["acc", "loss", "info:loss_curve"]
        assert "info:weights" not in spec["metrics"]  # 8 values are not a curve
        assert set(spec["groupable"]) >= {"lr", "cfg.depth"} and "seed" not in spec["groupable"]
        assert '<tr class="same" data-key="cfg.opt">' in cmp and '<tr class="differs" data-key="lr">' in cmp
        runs = srv.get("/")
        heads = re.findall(r'<th data-col="([^"]+)"', runs)[7:]
        assert heads == ["metric.acc", "metric.loss", "param.cfg.depth", "param.cfg.opt", "param.lr", "param.seed",
                         "info.cfg.drop", "info.final", "info.notes"]
        assert rows_of(srv.get("/?q=cfg.depth%3D5"))  == ["6", "4", "2"]
    finally:
        srv.close()


def test_a_million_points_load_in_under_a_second(tmp_path):
    """One run with a million points: its chart's data comes downsampled (2,000 buckets with min/max)."""
    import time

    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    n = 1_000_000
    steps = np.arange(n)
    values = np.sin(steps / 5e4) + (steps == 123_456) * 5.0  # one spike: the envelope keeps it
    write_run(s, comment="long", start=1.7e9, end=1.7e9 + n / 100, metrics={"loss": (steps, values, 1.7e9 + steps / 100)})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        srv.get("/run/1")  # the index, listed once
        times = []
        for _ in range(2):
            t0 = time.perf_counter()
            page = srv.get("/run/1")
            got = json.loads(srv.get("/api/metric?run=1&name=loss&n=2000"))["series"][0]
            times.append(time.perf_counter() - t0)
        assert "1,000,000" in page
        assert got["n"] == n and 998 <= len(got["value"]) <= 2000 and max(got["max"]) == pytest.approx(values.max())
        assert min(times) < 1.0, times
        print(f"a run of 1M points: page and chart data in {min(times) * 1000:.0f} ms")
    finally:
        srv.close()


def test_long_output_shows_its_tail_first(tmp_path):
    s = casmon.open(tmp_path / "s")
    with casmon.record(comment="chatty", store=s, capture_output=True):
        for i in range(500):
            print(f"line {i}")
    s.close()
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/run/1")
    finally:
        srv.close()
    tail = re.search(r'<pre class="output tail">(.*?)</pre>', body, re.S).group(1).splitlines()
    assert tail[0] == "line 300" and tail[-1] == "line 499" and len(tail) == runpage.OUTPUT_TAIL_LINES
    assert "the last 200 of 500 lines" in body
    everything = re.search(r'<details><summary>all 500 lines</summary><pre class="output">(.*?)</pre>', body, re.S)
    assert everything.group(1).splitlines()[0] == "line 0"


# -- what a new user found (issue 26, round two) -------------------------------------------------------


def filter_error(body: str) -> str:
    return html.unescape(re.search(r'id="filter-error" role="alert">(.*?)</p>', body, re.S).group(1))


def test_a_bare_name_two_groups_have_is_an_error(served, tmp_path):
    """``loss`` as an info value and as a metric (in one run, or a parameter in one run and a metric in another):
    a 400 that names the prefixed names to write, never one group chosen quietly."""
    status, _h, body = served.request("/?q=loss%3C0.3")
    assert status == 400 and len(rows_of(body)) == 4
    err = filter_error(body)
    assert "'loss' is both an info value and a metric" in err and "info.loss<0.3 or metric.loss<0.3" in err, err
    assert rows_of(served.get("/?q=info.loss%3C0.3")) == ["2"] and rows_of(served.get("/?q=metric.loss%3C0.3")) == ["2"]
    assert rows_of(served.get("/?q=acc%3E0.5")) == ["3", "1"]  # a bare name only one group has keeps working
    from casmon.runs.imported import write_run

    s = casmon.open(tmp_path / "s")
    write_run(s, comment="a", start=1.7e9, end=1.7e9 + 1, params={"loss": 5})
    write_run(s, comment="b", start=1.7e9 + 10, end=1.7e9 + 11, metrics={"loss": ([0, 1], [0.5, 0.25], [1.7e9, 1.7e9])})
    s.close()
    srv = Served(tmp_path / "s")
    try:
        status, _h, body = srv.request("/?q=loss%3D5")
        assert status == 400 and "'loss' is both a parameter and a metric" in filter_error(body)
        assert "param.loss=5 or metric.loss=5" in filter_error(body)
        assert rows_of(srv.get("/?q=param.loss%3D5")) == ["1"] and rows_of(srv.get("/?q=metric.loss%3C0.3")) == ["2"]
    finally:
        srv.close()


def test_filter_values_are_compared_as_the_column_holds_them(served, built):
    """Numbers with numbers, ``start``/``started`` with ISO dates and times, ``dirty`` with yes/no, ``commit`` by a
    prefix of the hash; a value the column cannot be compared with is a 400 saying so."""
    import datetime

    s = casmon.open(built["path"], read_only=True, create=False, autoflush=None)
    try:
        runs = {r.name.split("-")[0]: r for r in casmon.list_runs(s)}
    finally:
        s.close()
    day = datetime.datetime.fromtimestamp(runs["1"].manifest["start"]).date()
    commit = runs["1"].manifest["git"]["commit"]

    def rows(q: str) -> list[str]:
        return rows_of(served.get("/?q=" + q.replace("<", "%3C").replace(">", "%3E").replace("=", "%3D")))

    def bad(q: str) -> str:
        status, _h, body = served.request("/?q=" + q.replace("<", "%3C").replace(">", "%3E").replace("=", "%3D"))
        assert status == 400, (q, status)
        return filter_error(body)

    assert "param.lr holds numbers" in bad("lr<abc") and "'abc' is not a number" in bad("lr<abc")
    assert rows(f"start>={day}") == ["4", "3", "2", "1"] and rows(f"started>={day}") == ["4", "3", "2", "1"]
    assert rows(f"start={day}") == ["4", "3", "2", "1"] and rows(f"start>{day}") == []  # > the day: from the next one
    assert rows(f"start<{day}") == [] and rows(f"started<{day + datetime.timedelta(days=1)}") == ["4", "3", "2", "1"]
    between = datetime.datetime.fromtimestamp((runs["1"].manifest["start"] + runs["2"].manifest["start"]) / 2)
    assert rows(f"start>{between.isoformat()}") == ["4", "3", "2"] and rows(f"start<{between.isoformat()}") == ["1"]
    assert rows(f"start>={between:%Y-%m-%dT%H:%M}")[-1] in ("1", "2")  # to the minute, as the table shows it
    assert "is a date and time" in bad("start>yesterday") and "2026-12-02T14:30" in bad("start>yesterday")
    assert rows("dirty=yes") == ["2"] and rows("dirty=no") == ["4", "3", "1"] and rows("dirty=true") == ["2"]
    assert "yes or no" in bad("dirty=maybe") and "yes or no" in bad("dirty>no")
    assert rows(f"commit={commit[:10]}") == ["4", "3", "2", "1"] == rows(f"commit={commit[:4].upper()}")
    assert rows(f"commit={commit}") == ["4", "3", "2", "1"] and rows(f"commit!={commit[:7]}") == []
    assert "not a commit hash" in bad("commit=zzzz") and "= or !=" in bad(f"commit<{commit[:7]}")
    err = bad("-status=ok")
    assert "status!=ok" in err and "letters, digits" not in err and "'-')" not in err, err
    assert "no status 'sucess'" in bad("status=sucess") and rows("status=running") == []
    assert "duration in seconds" in bad("duration>1m")


def test_identical_outputs_are_equal_digests_of_the_points():
    """Two metrics with the same summary (points, last, min, max) but other points are not identical; a summary
    without a digest (an older run) is never called identical, nor is its run's "all outputs"."""
    from types import SimpleNamespace

    from casmon.ui.compare import identical_groups

    base = {"n": 20, "last": 0.5, "step": 19, "time": 1.0, "min": 0.5, "max": 10.0}
    runs = [SimpleNamespace(name=n, manifest={"info": {}}) for n in ("a", "b", "c", "d", "e")]
    summaries = [{"loss": {**base, "digest": "1" * 32}}, {"loss": {**base, "digest": "1" * 32}},
                 {"loss": {**base, "digest": "2" * 32}}, {"loss": {**base, "digest": None}}, {"loss": dict(base)}]
    groups = dict(identical_groups(runs, summaries))
    assert groups == {"all outputs": [["a", "b"]], "metric loss": [["a", "b"]]}


def test_the_compare_page_says_the_same_points(served):
    text = " ".join(text_of(served.get("/compare?run=1&run=2&run=3")).split())
    assert "for a logged metric, the same points (the same steps and values, by their digest" in text
    assert "same points, last value, minimum and maximum" not in text


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_report_of_one_run_is_its_page(tmp_path, monkeypatch):
    """``casmon report RUN``: the run's page (traceback, output, a chart per metric with its points inline,
    parameters), not a comparison of one run."""
    from casmon.ui import report_html

    monkeypatch.chdir(tmp_path)  # not in a git repository: no patch of this one in the page
    s = casmon.open(tmp_path / "s")
    with pytest.raises(ZeroDivisionError):
        with casmon.record(comment="broken", store=s, capture_output=True, params={"lr": 0.5}) as run:
            for i in range(30):
                run.log(loss=1 / (i + 1), acc=i / 30)
            print("about to fail")
            1 / 0
    s.flush()
    try:
        data, n = report_html(s, ["1"])
    finally:
        s.close()
    body = data.decode()
    assert n == 1 and "<h1>Run <code>1-broken</code></h1>" in body and "Compare" not in text_of(body)
    assert body.count("ZeroDivisionError: division by zero") == 1 and '<h2 id="traceback">Traceback</h2>' in body
    assert "about to fail" in body and '<h2 id="params">Parameters</h2>' in body
    spec = chart_block(body)
    assert spec["mode"] == "run" and spec["api"] is None and sorted(spec["series"]) == ["acc", "loss"]
    assert len(spec["series"]["loss"]["1"]["value"]) == 30
    assert 'http-equiv="Content-Security-Policy"' in body and 'data-standalone="1"' in body
    assert "<a " not in body.split("<main", 1)[1]  # links are text in a file sent by mail


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_a_report_carries_the_full_licence_of_every_library_it_inlines(tmp_path, monkeypatch):
    """uPlot is MIT: a file that copies it carries its whole notice, not only the script's one-line banner."""
    from casmon.ui import report_html

    monkeypatch.chdir(tmp_path)
    s = casmon.open(tmp_path / "s")
    for lr in (0.1, 0.2):
        with casmon.record(store=s, params={"lr": lr}) as run:
            run.log(loss=lr)
    s.flush()
    try:
        bodies = [report_html(s, runs)[0].decode() for runs in (["1"], ["1", "2"])]
    finally:
        s.close()
    inlined = [n for n in pages.STATIC if not n.endswith("LICENSE") and pages.bundled(n).strip()[-200:] in bodies[0]]
    assert "uPlot.iife.min.js" in inlined and "uPlot.min.css" in inlined
    vendored = [n for n in inlined if not n.startswith("casmon-")]
    assert set(vendored) <= set(pages.VENDORED), vendored  # every library a page inlines has its licence listed
    for body in bodies:
        head = body.split("</head>", 1)[0]
        comments = re.findall(r"<!--(.*?)-->", head, re.S)
        for n in vendored:
            licence = pages.bundled(pages.VENDORED[n][1]).strip()
            assert "Copyright (c) 2022 Leon Sorokin" in licence
            assert any(licence in c for c in comments), n  # the whole notice, inside a comment: shown nowhere
        assert body.index('<meta charset="utf-8">') < 1024  # still where a browser looks for it
        assert body.count("Permission is hereby granted") == 1  # once, however many files share the licence


def _signalled(s, name: str, signal: str) -> None:
    """Give an imported killed run the signal a recorded one carries (``manifest["signal"]``)."""
    import time

    from casmon.keys.fingerprint import fingerprint
    from casmon.runs import KIND_RUN

    r = casmon.load_run(name, s)
    d = s.put({**r.manifest, "signal": signal})
    ref = s.get_ref(r.ref)
    s.append(KIND_RUN, {"name": r.name, "manifest": d.hex(), "status": "killed", "time": time.time() + 1,
                        "_ref": r.ref, "_ref_target": d.hex()}, key=fingerprint(("casmon.run", r.ref)), refs=[d])
    s.flush()
    s.set_ref(r.ref, d, ref.data)


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_killed_runs_name_their_signal_and_live_data_has_every_cell(tmp_path, monkeypatch):
    """The killed badge says which signal; ``/api/runs`` sends each run's cells as the table shows them (info
    too), ``/api/run`` a failed run's traceback and its output as a terminal shows it (a progress bar's last
    state, the line being written)."""
    import time

    from casmon.runs.imported import write_run
    from casmon.ui.values import console_text

    monkeypatch.chdir(tmp_path)
    s = casmon.open(tmp_path / "s")
    t = time.time()
    name = write_run(s, comment="stopped", status="killed", start=t - 50, end=t - 20, params={"lr": 1},
                     info={"final_acc": 0.75, "cfg": {"seed": 3}})
    _signalled(s, name, "SIGTERM")
    with pytest.raises(RuntimeError):
        with casmon.record(comment="bar", store=s, capture_output=True):
            for i in range(3):
                sys.stdout.write(f"\rprogress {i}/3")
            print()
            sys.stdout.write("epoch 1 [####")
            raise RuntimeError("diverged")
    s.close()
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/")
        assert '<span class="casmon-status casmon-status-killed">killed (SIGTERM)</span>' in body
        assert "killed (SIGTERM)" in srv.get("/run/1") and "killed (SIGTERM)" in srv.get("/compare?run=1&run=2")
        row = re.search(r'<tr data-run="1" data-status="killed">(.*?)</tr>', body).group(1)
        assert re.search(r'<td class="when" data-col="start" title="[^"]+">\d{4}-\d\d-\d\d \d\d:\d\d</td>', row)
        got = {r["tail"]: r for r in json.loads(srv.get("/api/runs?since=0"))["runs"]}
        assert got["1"]["status"] == "killed" and got["1"]["status_text"] == "killed (SIGTERM)"
        cells = got["1"]["cells"]
        assert cells["info.final_acc"] == "0.75" and cells["info.cfg.seed"] == "3" and cells["param.lr"] == "1"
        assert cells["comment"] == "stopped" and cells["duration"] == "30.00 s" and len(cells["start"]) == 16
        failed = json.loads(srv.get("/api/run/2"))
        assert failed["status"] == "failed" and "RuntimeError: diverged" in failed["traceback"]
        assert "progress 2/3" in failed["output_tail"] and "progress 0/3" not in failed["output_tail"]
    finally:
        srv.close()
    assert console_text("\rstep 1\rstep 2\nnext\r\nx\rab") == "step 2\nnext\nab"
    assert console_text("long line\rshort") == "shortline" and console_text("plain\n") == "plain\n"


@pytest.mark.filterwarnings("ignore:casmon.record. not a git repository")
def test_write_report_takes_a_store_by_path_and_one_run_by_name(tmp_path, monkeypatch):
    from casmon.ui import write_report

    monkeypatch.chdir(tmp_path)
    loc = str(tmp_path / "s")
    s = casmon.open(loc)
    with casmon.record(store=s, capture_output=False) as run:
        run.log(loss=1.0)
    s.close()
    path, n = write_report(loc, "latest", tmp_path / "r.html")
    assert n == 1 and "<h1>Run <code>1</code></h1>" in path.read_text()
    with pytest.raises(casmon.CasmonError):
        write_report(str(tmp_path / "nowhere"), ["1"], tmp_path / "r2.html")
