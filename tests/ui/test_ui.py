"""``casmon ui`` and ``casmon report`` without a browser: the pages' content, escaping, strict requests, headers.

The store is real: runs recorded with ``casmon.record`` in a real git repository
(metrics, loss curves, a tracked file, a patch), a call log and cache entries.
The server is real too: ``ThreadingHTTPServer`` on 127.0.0.1, port 0, in a
thread; requests go through ``http.client``.
"""

from __future__ import annotations

import html
import http.client
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.ui import model, pages
from casmon.ui.server import make_server
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
    (the same outputs as 1-base); a call log linked to each run; cache entries."""
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
    curve1 = [1.0 / (i + 1) for i in range(30)]
    names = []

    def one(comment, lr, loss, curve, weights, drift, env_seed):
        DRIFT["k"] = drift
        monkeypatch.setenv("CASMON_UI_TEST_SEED", env_seed)
        with casmon.record(comment=comment, track=[r"config\.yaml$"], store=store, capture_output=True,
                           env=["CASMON_UI_TEST_SEED"]) as run:
            square(1000)
            for i in range(3):
                step(float(i))
            print(f"training with lr={lr}")
            run.info.update(lr=lr, loss=loss, epochs=3, curve=curve, weights=weights, model=Boom(str(marker)))
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


def test_runs_page_lists_every_run_with_info_columns(served, built):
    body = served.get("/")
    rows = re.findall(r'<tr data-run="([^"]+)">', body)
    assert rows == ["4", "3", "2", "1"]  # newest first
    heads = re.findall(r'<th data-col="([^"]+)"', body)
    assert heads[:7] == model.FIXED_COLUMNS and {"info.lr", "info.loss", "info.epochs"} <= set(heads)
    assert "info.curve" not in heads and "info.weights" not in heads  # not scalars
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and HOSTILE not in body
    assert "&lt;img src=x onerror=alert(2)&gt;" in body and HOSTILE_KEY not in body
    # sorting by a metric, both ways; empty cells last
    asc = re.findall(r'<tr data-run="([^"]+)">', served.get("/?sort=info.loss&order=asc"))
    assert asc[:3] == ["2", "1", "3"] or asc[:3] == ["2", "3", "1"]
    assert asc[-1] == "4"
    desc = re.findall(r'<tr data-run="([^"]+)">', served.get("/?sort=info.loss&order=desc"))
    assert desc[0] in ("1", "3") and desc[2] == "2" and desc[-1] == "4"


def test_runs_filter_and_pages(served):
    assert re.findall(r'<tr data-run="([^"]+)">', served.get("/?q=loss%3C0.3")) == ["2"]
    assert re.findall(r'<tr data-run="([^"]+)">', served.get("/?q=again")) == ["3"]
    assert sorted(re.findall(r'<tr data-run="([^"]+)">', served.get("/?q=lr%3D0.1"))) == ["1", "3"]
    page1 = served.get("/?per=3")
    page2 = served.get("/?per=3&page=2")
    assert re.findall(r'<tr data-run="([^"]+)">', page1) == ["4", "3", "2"]
    assert re.findall(r'<tr data-run="([^"]+)">', page2) == ["1"]
    assert "page 1 of 2" in page1 and 'href="/?sort=start&amp;order=desc&amp;page=2&amp;per=3"' in page1


def test_compare_page(served, built):
    body = served.get("/compare?run=1&run=2&run=3")
    text = text_of(body)
    # metrics side by side, the differing ones marked
    lr_row = re.search(r'<tr class="differs" data-key="lr">(.*?)</tr>', body).group(1)
    assert [html.unescape(x) for x in re.findall(r'<td class="num">(.*?)</td>', lr_row)] == ["0.1", "0.02", "0.1"]
    assert '<tr data-key="epochs">' in body  # the same in every run: not marked
    # a bar per run for each metric; the curves as lines, one per run
    loss_chart = re.search(r'<figure class="metric-chart" data-metric="loss"[^>]*>(.*?)</figure>', body, re.S).group(1)
    assert loss_chart.count('class="mark bar"') == 3
    curve = re.search(r'<figure class="curve" data-key="curve">(.*?)</figure>', body, re.S).group(1)
    assert curve.count('class="mark line"') == 3
    weights = re.search(r'<figure class="curve" data-key="weights">(.*?)</figure>', body, re.S).group(1)
    assert weights.count('class="mark line"') == 3  # stored arrays, read without unpickling
    assert 'data-key="model"' not in body.split('id="curves"')[1].split('id="identical"')[0]  # a pickle: no curve
    # identical outputs: 1-base and 3-again stored the same values, by digest
    groups = re.search(r'<table class="groups" id="groups">(.*?)</table>', body, re.S).group(1)
    all_row = re.search(r"<th>all info values</th><td>(.*?)</td>", groups).group(1)
    assert " ".join(text_of(all_row).split()) == "1-base , 3-again"
    weights_row = re.search(r"<th>info weights</th><td>(.*?)</td>", groups).group(1)
    assert " ".join(text_of(weights_row).split()) == "1-base , 3-again"  # np.ones(8) twice: one digest
    assert "<th>info epochs</th>" in groups and "1-base" in groups and "2-" in text_of(groups)
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


def test_run_page(served, built):
    body = served.get("/run/2")
    text = text_of(body)
    assert f"Run 2-{HOSTILE}" in " ".join(text.split()) and HOSTILE not in body
    assert '<span class="casmon-add">+lr = 0.02</span>' in body  # the patch
    assert "config.yaml" in text and "training with lr=0.02" in text  # files, captured output
    assert re.search(r'href="/calls\?session=\d+"', body) and 'href="/cache?fn=tests.ui.test_ui._square"' in body
    assert "curve" in text and "array(8,) float64" in text  # info, described
    by_name = served.get("/run/2-" + HOSTILE.replace("<", "%3C").replace(">", "%3E").replace("/", "%2F"))
    assert re.sub(r"\d\d:\d\d:\d\d", "", by_name) == re.sub(r"\d\d:\d\d:\d\d", "", body)  # by name or number
    assert not built["marker"].exists()


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
        ("/compare?run=1", 400, "two or more runs"),
        ("/compare?run=1&run=1", 400, "named twice"),
        ("/call?fn=_step", 400, "/call?fn=NAME&n=N"),
        ("/run/%ff", 400, "not UTF-8"),
        ("/static/../pyproject.toml", 404, "no file"),
        ("/static/model.py", 404, "no file"),
        ("/run/1?x=1", 400, "takes none"),
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
    for path in ("/", "/?sort=info.lr", "/compare?run=1&run=2&run=4", "/run/2", "/run/4", "/calls", "/cache", "/store",
                 "/?q=%3Cscript%3E"):
        body = served.get(path)
        assert HOSTILE not in body and HOSTILE_KEY not in body, path
        assert len(re.findall(r"<script\b", body)) == 1, path  # the page's own script tag, nothing else
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
    assert body.count('class="mark bar"') >= 3 and '<span class="casmon-add">+lr = 0.02</span>' in body
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', body).group(1)
    assert "sha256-" in policy and "unsafe-inline" not in html.unescape(policy)
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
    row = {"run": "3-x", "status": "ok", "info.loss": 0.2, "info.name": "adam"}
    assert model.matches(row, model.parse_filter("loss<0.3 status=ok"))
    assert not model.matches(row, model.parse_filter("loss>=0.3"))
    assert model.matches(row, model.parse_filter("name=adam ADAM"))
    assert not model.matches(row, model.parse_filter("missing=1"))
    assert sorted([3, "b", None, 1.5, "a"], key=model.sort_key) == [1.5, 3, "a", "b", None]


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
        assert re.findall(r'<tr data-run="([^"]+)">', body) == ["1", "3", "2"]
        assert "unreadable" in body
        assert "cannot be read" in text_of(srv.get("/run/2"))
        odd = text_of(srv.get("/run/3"))
        assert "3-odd" in odd
        cmp = text_of(srv.get("/compare?run=1&run=2&run=3"))
        assert "cannot compare" in cmp and "Metrics and info" in cmp
        assert srv.get("/?sort=info.loss").count("<tr data-run=") == 3
    finally:
        srv.close()
    assert not marker.exists()


def test_runs_recorded_while_the_server_runs_show_up(tmp_path, monkeypatch):
    """The runs list is served from memory and re-listed in the background; a run's page finds a new run at once."""
    import time

    monkeypatch.setattr(model, "REFRESH_SECONDS", 0.0)
    s = casmon.open(tmp_path / "s")
    with casmon.record(comment="first", store=s, capture_output=False) as run:
        run.info["loss"] = 1.0
    s.flush()
    srv = Served(tmp_path / "s")
    try:
        assert re.findall(r'<tr data-run="([^"]+)">', srv.get("/")) == ["1"]
        # A listing the first page started in the background must end before run 2 begins: one that
        # read the refs after run 2 claimed its number and the records before they were flushed would
        # leave run 2 in memory as still running, and the run's page would (rightly) show that listing.
        # Seen once on a loaded machine (three suites at once).
        runs = srv.server.app.runs
        deadline = time.monotonic() + 60
        while runs._refreshing:
            assert time.monotonic() < deadline, "the background listing never ended"
            time.sleep(0.01)
        with casmon.record(comment="second", store=s, capture_output=False) as run:
            run.info["loss"] = 0.5
        s.flush()
        assert "2-second" in srv.get("/run/2")  # not in the listing yet: looked for again at once
        deadline = time.monotonic() + 60
        while re.findall(r'<tr data-run="([^"]+)">', srv.get("/")) != ["2", "1"]:
            assert time.monotonic() < deadline, "the new run never showed in the list"
            time.sleep(0.05)
        # sorted by a value of its manifest (just written: the server may not see it for a moment, then must)
        while re.findall(r'<tr data-run="([^"]+)">', srv.get("/?sort=info.loss&order=asc")) != ["2", "1"]:
            assert time.monotonic() < deadline, "the new run's manifest was never read"
            time.sleep(0.05)
    finally:
        srv.close()
        s.close()


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
    assert tail[0] == "line 300" and tail[-1] == "line 499" and len(tail) == pages.OUTPUT_TAIL_LINES
    assert "the last 200 of 500 lines" in body
    everything = re.search(r'<details><summary>all 500 lines</summary><pre class="output">(.*?)</pre>', body, re.S)
    assert everything.group(1).splitlines()[0] == "line 0"
