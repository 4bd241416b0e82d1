"""Lineage in ``casmon ui``: the run and entry pages' lineage panel, "used by" lists, the file page and the compare
page's first difference in lineage.

Server tests read the JSON endpoints and pages without a browser; the browser tests drive Debian's Chromium
(``tests/support/browser.py``) over a four-stage pipeline (load a file -> clean -> features -> train) recorded in
two runs that differ in one stage's parameter.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest

import casmon
from casmon.lineage import Graph, Node
from casmon.ui.lineageview import MAX_NODES, graph_json
from tests.support.browser import needs_chromium, watch
from tests.ui.test_ui import Served

STAGES = ("load", "clean", "features", "train")
HOSTILE = '<img src=x onerror=alert(1)>"&\''


def _pipeline(root: Path) -> dict:
    """Two runs of load -> clean -> features -> train, the second with clean's ``scale`` changed."""
    store = str(root / "store")
    data = root / "data.txt"
    data.write_text("\n".join(str(i - 3) for i in range(40)) + "\n")

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    @casmon.cache(store=store)
    def clean(x, scale):
        return x[x > 0] * scale

    @casmon.cache(store=store)
    def features(x):
        return (x * 2, x + 1)

    @casmon.cache(store=store)
    def train(fl):
        return {"loss": float(fl[0].sum() - fl[1].sum()), "weights": fl[0] / 3}

    for scale in (1.0, 2.0):
        with casmon.record(store=store, capture_output=False, params={"scale": scale}) as run:
            run.log({"loss": train(features(clean(load(str(data)), scale)))["loss"]})
    runs = [casmon.load_run(n, store) for n in ("1", "2")]
    keys = [{link["fn"].rsplit(".", 1)[-1]: link["key"] for link in r.manifest["links"]["cache"]} for r in runs]
    casmon.flush()
    return {"path": root / "store", "store": store, "data": str(data), "keys": keys,
            "fns": {link["fn"].rsplit(".", 1)[-1]: link["fn"] for link in runs[0].manifest["links"]["cache"]}}


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    return _pipeline(tmp_path_factory.mktemp("lineage-ui"))


@pytest.fixture
def served(pipe):
    srv = Served(pipe["path"])
    try:
        yield srv
    finally:
        srv.close()


def _json(srv: Served, path: str, status: int = 200) -> dict:
    got, headers, body = srv.request(path)
    assert got == status, (path, got, body[:2000])
    assert headers["content-type"].startswith("application/json")
    return json.loads(body)


# -- server ------------------------------------------------------------------------------------------------------
def test_a_runs_lineage_endpoint_lays_out_its_four_stages_upstream_of_the_run(served, pipe):
    g = _json(served, "/api/lineage/run/2")
    by_id = {n["id"]: n for n in g["nodes"]}
    k = pipe["keys"][1]
    col = {s: by_id[f"entry:{k[s]}"]["col"] for s in STAGES}
    assert col["load"] < col["clean"] < col["features"] < col["train"]
    run = next(n for n in g["nodes"] if n["kind"] == "run")
    assert run["root"] and run["col"] > col["train"] and run["link"] == "/run/2"
    f = next(n for n in g["nodes"] if n["kind"] == "file")
    assert f["col"] < col["load"] and f["link"].startswith("/file?path=")
    assert {n["label"] for n in g["nodes"] if n["kind"] == "param"} == {"scale=2.0"}
    assert by_id[f"entry:{k['clean']}"]["link"] == f"/cache?fn={quote(pipe['fns']['clean'], safe='')}&entry={k['clean']}"
    assert ("entry:" + k["clean"], "entry:" + k["features"]) in {(e["from"], e["to"]) for e in g["edges"]}
    assert g["more"] == 0


def test_an_entrys_lineage_and_used_by_endpoints_walk_up_and_down_the_pipeline(served, pipe):
    k = pipe["keys"][0]
    g = _json(served, f"/api/lineage/entry/{k['features']}")
    assert {n["id"] for n in g["nodes"] if n["kind"] == "entry"} == {f"entry:{k[s]}" for s in ("load", "clean", "features")}
    down = _json(served, f"/api/used-by/entry/{k['clean']}")
    labels = [i["label"] for i in down["items"]]
    assert down["total"] == 3 and down["next"] is None
    assert any(x.startswith("features") for x in labels) and any(x.startswith("train") for x in labels)
    assert "1" in labels  # the run that used them
    assert all(i["link"] for i in down["items"])


def test_a_files_page_and_used_by_list_name_what_read_it(served, pipe):
    k = pipe["keys"][0]
    body = served.get("/file?" + f"path={quote(pipe['data'], safe='')}")
    assert "data.txt" in body and 'data-src="/api/used-by/file?path=' in body
    digest = json.loads(served.request(f"/api/lineage/entry/{k['load']}")[2])["nodes"][0]
    items = _json(served, f"/api/used-by/file?path={quote(pipe['data'], safe='')}")["items"]
    assert {i["label"].split()[0] for i in items if i["kind"] == "entry"} == set(STAGES)
    assert digest  # the entry lineage names the file too


def test_unknown_lineage_targets_answer_404_json(served, pipe):
    for path in ("/api/lineage/run/nosuchrun", "/api/lineage/entry/" + "0" * 32, "/api/used-by/entry/" + "0" * 32,
                 "/api/used-by/file?path=/no/such/file", "/api/lineage/nothing"):
        assert "error" in _json(served, path, 404)
    assert "32 hex digits" in _json(served, "/api/lineage/entry/xyz", 400)["error"]
    assert "unknown parameter" in _json(served, f"/api/lineage/entry/{pipe['keys'][0]['load']}?x=1", 400)["error"]
    assert served.request("/file?path=/no/such/file")[0] == 404
    assert "page" in _json(served, f"/api/used-by/entry/{pipe['keys'][0]['load']}?page=0", 400)["error"]
    assert "digest" in _json(served, f"/api/used-by/file?path=x&digest=zz", 400)["error"]


def test_the_pages_do_not_pay_for_lineage_until_it_is_shown(served, pipe):
    k = pipe["keys"][0]
    run = served.get("/run/1")
    assert 'class="lineage-panel" data-src="/api/lineage/run/1"' in run and "casmon-lineage.js" in run
    assert '"edges":' not in run  # no graph inline: the panel fetches it when shown
    entry = served.get(f"/cache?fn={quote(pipe['fns']['clean'], safe='')}&entry={k['clean']}")
    assert f'data-src="/api/lineage/entry/{k["clean"]}"' in entry and f'data-src="/api/used-by/entry/{k["clean"]}"' in entry


def test_the_compare_page_names_the_stage_where_the_runs_part_above_the_metrics(served, pipe):
    body = served.get("/compare?run=1&run=2")
    first = body.index('id="first-difference"')
    assert first < body.index('id="metrics"')
    section = body[first:body.index('id="metrics"')]
    assert f'data-fn="{html.escape(pipe["fns"]["clean"])}"' in section and "scale" in section and "differs" in section
    assert html.escape(pipe["fns"]["features"]) not in section  # downstream of the cause: not a first difference


def test_a_compare_report_file_names_the_first_difference_too(pipe):
    from casmon.ui import report_html

    with casmon.open(pipe["path"], read_only=True, create=False) as store:
        body = report_html(store, ["1", "2"])[0].decode()
        one = report_html(store, ["2"])[0].decode()
    section = body[body.index('id="first-difference"'):body.index('id="metrics"')]
    assert f'data-fn="{html.escape(pipe["fns"]["clean"])}"' in section and "scale" in section
    assert 'class="lineage-panel"' not in one  # a file has no server to load a panel from


def test_a_used_by_list_is_paged(tmp_path):
    from casmon.ui.lineageview import used_by_json

    items = [{"kind": "entry", "label": f"e{i}", "status": "live"} for i in range(120)]
    a, c = used_by_json(items, 1), used_by_json(items, 3)
    assert len(a["items"]) == 50 and a["next"] == 2 and a["total"] == 120
    assert [i["label"] for i in c["items"]] == [f"e{i}" for i in range(100, 120)] and c["next"] is None


def test_a_big_graph_is_capped_and_says_how_many_more():
    g = Graph("root")
    g.add(Node("run:r", "run", "r"))
    for i in range(500):
        g.add(Node(f"entry:{i:032x}", "entry", f"f {i}", "", {"status": "live"}))
        g.link(f"entry:{i:032x}", "run:r", "used")
        if i:
            g.link(f"entry:{i - 1:032x}", f"entry:{i:032x}", "result")
    got = graph_json(g, "run:r")
    assert len(got["nodes"]) == MAX_NODES and got["more"] == 500 + 1 - MAX_NODES
    assert any(n["id"] == "run:r" for n in got["nodes"])
    kept = {n["id"] for n in got["nodes"]}
    assert all(e["from"] in kept and e["to"] in kept for e in got["edges"])


def test_a_node_links_only_to_this_uis_own_pages():
    g = Graph("x")
    for i, link in enumerate(("javascript:alert(1)", "//elsewhere.example/x", "https://elsewhere.example/", "/run/1")):
        g.add(Node(f"run:{i}", "run", str(i), link, {"status": "ok"}))
    assert [n["link"] for n in graph_json(g, "run:0")["nodes"]] == ["", "", "", "/run/1"]


def test_a_cycle_in_crafted_records_still_lays_out():
    g = Graph("a")
    for n in "abc":
        g.add(Node(f"entry:{n}", "entry", n, "", {"status": "live"}))
    g.link("entry:a", "entry:b", "result")
    g.link("entry:b", "entry:c", "result")
    g.link("entry:c", "entry:a", "result")
    got = graph_json(g, "entry:a")
    assert len(got["nodes"]) == 3 and all(isinstance(n["col"], int) for n in got["nodes"])


def test_a_missing_entry_is_drawn_missing_without_a_link():
    g = Graph("x")
    g.add(Node("entry:" + "a" * 32, "entry", "missing entry aaaaaaaaaaaa", "", {"key": "a" * 32, "status": "missing"}))
    g.add(Node("entry:" + "b" * 32, "entry", "second bbbbbbbbbbbb", "/cache?fn=f&entry=" + "b" * 32,
               {"status": "live", "version": "0123456789"}))
    g.link("entry:" + "a" * 32, "entry:" + "b" * 32, "result", "a")
    by_id = {n["id"]: n for n in graph_json(g, "entry:" + "b" * 32)["nodes"]}
    gone, here = by_id["entry:" + "a" * 32], by_id["entry:" + "b" * 32]
    assert gone["missing"] and gone["link"] == "" and "missing" in gone["sub"]
    assert not here["missing"] and here["link"] and here["sub"] == "code 01234567"


def test_a_cleared_upstream_is_shown_as_such_and_crafted_strings_stay_data(tmp_path):
    """An entry whose upstream was cleared: a node marked so, never an error; a crafted label and file name come
    back as JSON strings (no markup characters) and as escaped text on the pages."""
    from casmon.caching import clear_function

    store = str(tmp_path / "store")
    hostile_file = tmp_path / HOSTILE.replace("/", "")
    hostile_file.write_text("1 2 3\n" * 20)

    @casmon.cache(store=store, label=lambda path: HOSTILE, files=["path"])
    def first(path):
        return np.loadtxt(path).ravel() + np.arange(60.0)

    @casmon.cache(store=store)
    def second(a):
        return a * 2

    second(first(str(hostile_file)))
    casmon.flush()
    with casmon.open(store, create=False) as s:
        recs = {r.get("fn", "").rsplit(".", 1)[-1]: (k.hex(), r["fn"]) for k, r in s.records("cache")}
        clear_function(s, recs["first"][1])
    (up, fn_up), (down, fn_down) = recs["first"], recs["second"]
    srv = Served(tmp_path / "store")
    try:
        g = _json(srv, f"/api/lineage/entry/{down}")
        node = next(n for n in g["nodes"] if n["id"] == f"entry:{up}")
        assert node["status"] == "cleared" and "cleared" in node["sub"]
        f = next(n for n in g["nodes"] if n["kind"] == "file")
        assert HOSTILE[:10] in f["label"]  # the crafted name, as a string
        for path in (f"/api/lineage/entry/{down}", f"/api/used-by/file?path={quote(str(hostile_file), safe='')}"):
            _status, _h, raw = srv.request(path)
            assert "<" not in raw and ">" not in raw, raw[:500]
        page = srv.get(f"/file?path={quote(str(hostile_file), safe='')}")
        assert "<img" not in page and html.escape(HOSTILE.replace("/", ""), quote=False)[:20] in page
        entry = srv.get(f"/cache?fn={quote(fn_down, safe='')}&entry={down}")
        assert "<img" not in entry
    finally:
        srv.close()


# -- browser -----------------------------------------------------------------------------------------------------


def _clean(w) -> None:
    assert w.dialogs == [] and w.foreign == [] and w.page_errors == []
    assert [e for e in w.console_errors if "status of 40" not in e] == []


@needs_chromium
def test_a_pipeline_runs_page_draws_its_lineage_when_shown_and_its_boxes_navigate(tmp_path, served, pipe, browser):
    base = f"http://127.0.0.1:{served.port}"
    # a short window: the panel starts well below the fold whatever the page shows above it
    page = browser.new_page(viewport={"width": 1400, "height": 320})
    w = watch(page, lambda u: u.startswith(base + "/"))
    asked: list[str] = []
    page.on("request", lambda r: asked.append(r.url) if "/api/lineage/" in r.url else None)
    try:
        page.goto(base + "/run/2", wait_until="load")
        panel = page.locator(".lineage-panel")
        below = page.evaluate("document.querySelector('.lineage-panel').getBoundingClientRect().top - innerHeight")
        assert below > 400, "the panel is not below the fold: the test cannot tell a lazy load"
        assert page.locator(".lineage-panel svg").count() == 0 and asked == []  # not loaded before it is shown
        panel.scroll_into_view_if_needed()
        page.wait_for_selector(".lineage-panel svg .lineage-node", timeout=30_000)
        assert asked == [base + "/api/lineage/run/2"]
        k = pipe["keys"][1]
        kinds = page.eval_on_selector_all(".lineage-panel .lineage-node", "ns => ns.map(n => n.dataset.kind)")
        assert kinds.count("entry") == 4 and {"file", "param", "run"} <= set(kinds)
        labels = page.eval_on_selector_all(".lineage-panel .lineage-label", "ts => ts.map(t => t.textContent)")
        assert {f"{s} {k[s][:12]}" for s in STAGES} <= set(labels)
        assert page.locator(".lineage-panel .lineage-edge").count() >= 5
        page.screenshot(path=str(tmp_path / "run-lineage.png"), full_page=True)
        page.locator(f".lineage-node[data-id='entry:{k['clean']}']").click()
        page.wait_for_url(re.compile(f"entry={k['clean']}"))
        assert "Entry" in page.locator("h1").inner_text()
        page.locator(".used-by").scroll_into_view_if_needed()
        page.wait_for_selector(".used-by-item", timeout=30_000)
        assert page.locator(".used-by-item").count() == 3
        page.locator(".lineage-panel").scroll_into_view_if_needed()
        page.wait_for_selector(".lineage-panel .lineage-node[data-kind='file']", timeout=30_000)
        page.locator(".lineage-node[data-kind='file']").click()
        page.wait_for_url(re.compile(r"/file\?path="))
        page.locator(".used-by").scroll_into_view_if_needed()
        page.wait_for_selector(".used-by-item", timeout=30_000)
        assert page.locator(".used-by-item").count() >= 4
        _clean(w)
    finally:
        page.close()


@needs_chromium
def test_the_compare_page_of_runs_differing_in_one_stage_names_that_stage(served, pipe, browser):
    base = f"http://127.0.0.1:{served.port}"
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    w = watch(page, lambda u: u.startswith(base + "/"))
    try:
        page.goto(base + "/compare?run=1&run=2", wait_until="load")
        part = page.locator("#first-difference ~ section.first-difference .parting")
        assert part.count() == 1
        assert part.get_attribute("data-fn") == pipe["fns"]["clean"]
        assert "scale" in part.inner_text() and "differs" in part.inner_text()
        box = page.locator("section.first-difference").bounding_box()
        assert box["y"] < page.locator("#metrics").bounding_box()["y"]
        _clean(w)
    finally:
        page.close()


def test_a_parting_under_a_scripts_two_names_links_each_side_to_its_own_function():
    """``__main__.load`` in run A, ``train.load`` in run B: each key opens the entry under the name it has."""
    from casmon.caching.explain import Difference
    from casmon.lineage.difference import FirstDifference, Parting
    from casmon.ui.cachepage import entry_url
    from casmon.ui.lineageview import first_difference_html
    from casmon.ui.pages import Ctx

    a, b = "ab" * 16, "cd" * 16
    fd = FirstDifference("1", "2", [Parting("train.load", a, b, [Difference("name", "", "keyed apart")],
                                            "__main__.load")])
    got = str(first_difference_html(Ctx("s"), [("1 → 2", fd, "")]))
    assert html.escape(entry_url("__main__.load", a)) in got and html.escape(entry_url("train.load", b)) in got
    assert "__main__.load" in got.split("<h4>")[1].split("</h4>")[0]


@needs_chromium
def test_a_tall_lineage_panel_opens_with_its_root_and_sources_in_view(tmp_path, browser):
    store = str(tmp_path / "store")

    @casmon.cache(store=store)
    def make(n):
        return np.arange(n, dtype=float)

    @casmon.cache(store=store)
    def part(x, i):
        return x[i::40] * 2

    @casmon.cache(store=store)
    def total(parts):
        return float(sum(p.sum() for p in parts))

    with casmon.record(store=store, capture_output=False) as run:
        x = make(400)
        total([part(x, i) for i in range(40)])  # a column of 40 boxes between the source and the run
    casmon.flush()
    srv = Served(tmp_path / "store")
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    try:
        page.goto(f"http://127.0.0.1:{srv.port}/run/{run.name}", wait_until="load")
        page.locator(".lineage-panel").scroll_into_view_if_needed()
        page.wait_for_selector(".lineage-panel svg .lineage-node", timeout=30_000)
        box = page.locator(".lineage-scroll").bounding_box()
        assert box["height"] < 900, "the panel is not taller than its box: the test cannot tell"
        for sel in (f".lineage-node[data-id='run:{run.ref}']", ".lineage-node[data-kind='entry']:has-text('make')"):
            b = page.locator(sel).bounding_box()
            assert box["y"] <= b["y"] and b["y"] + b["height"] <= box["y"] + box["height"], sel  # not scrolled to
    finally:
        page.close()
        srv.close()


def test_the_compare_page_says_a_changed_files_old_and_new_content_digests(tmp_path):
    store = str(tmp_path / "store")
    data = tmp_path / "data.txt"

    @casmon.cache(store=store, files=["path"])
    def load(path):
        return np.loadtxt(path)

    for text in ("1 2 3 4 5 6 7 8 9\n", "9 8 7 6 5 4 3 2 1\n"):
        data.write_text(text)
        with casmon.record(store=store, capture_output=False):
            load(str(data))
    casmon.flush()
    a, b = ([n.data["digest"] for n in casmon.lineage(casmon.load_run(r, store), store).of_kind("file")][0]
            for r in ("1", "2"))
    assert a != b
    said = f"its content changed: {a[:8]} in 1, {b[:8]} in 2 (parameter &#x27;path&#x27;)"
    srv = Served(tmp_path / "store")
    try:
        page = srv.get("/compare?run=1&run=2")
    finally:
        srv.close()
    from casmon.ui import report_html

    with casmon.open(store, read_only=True, create=False) as s:
        report = report_html(s, ["1", "2"])[0].decode()
    for body in (page, report):
        section = body[body.index('id="first-difference"'):body.index('id="metrics"')]
        assert said in section, section
