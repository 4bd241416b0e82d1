"""``casmon ui``'s cache page: a function's code versions with what changed, and one entry with what differs
from its nearest entries, without a browser.

The store is real: two real processes cache ``prep.features`` with a module file edited in between (its helper
``scale`` changes, and the new source holds markup), a function whose entries expire at once, and one whose
entries were cleared. The server is the real one, in a thread (``tests.ui.test_ui.Served``).
"""

from __future__ import annotations

import html
import re
import textwrap

import pytest

import casmon
from casmon.caching import KIND, clear_function
from tests.conftest import run_python
from tests.support.sources import write_module
from tests.ui.test_ui import Served, text_of

#: Source text that would close the diff's <pre> and run a script if a page ever put it in as markup.
HOSTILE_SRC = "</pre><script>alert(3)</script>"
SCRIPT_TAG = r'<script src="/static/[\w.-]+\.js" defer>'

PREP = textwrap.dedent('''
    import casmon

    def scale(x):
        return x * 2

    @casmon.cache(store="s", label=lambda x: f"x={x}")
    def features(x):
        return scale(x) + 1

    @casmon.cache(store="s", expires_after=0.001)
    def quick(x):
        return x

    @casmon.cache(store="s")
    def gone(x):
        return x
    ''')


@pytest.fixture(scope="module")
def explained(tmp_path_factory):
    """Version 1 stores features(20), features(21), quick(1), gone(1); the helper is edited (its new line holds
    HOSTILE_SRC); version 2 stores features(20). Then gone's entries are cleared."""
    root = tmp_path_factory.mktemp("cachepage")
    write_module(root / "prep.py", PREP)
    run_python("import prep\nprep.features(20)\nprep.features(21)\nprep.quick(1)\nprep.gone(1)\n", cwd=root)
    edited = PREP.replace("return x * 2", f"return x * 3 if {HOSTILE_SRC!r} else 0")
    write_module(root / "prep.py", edited)
    run_python("import prep, warnings\nwarnings.simplefilter('ignore')\nprep.features(20)\n", cwd=root)
    s = casmon.open(root / "s")
    keys: dict[tuple[str, str | None], list[str]] = {}  # (function, label) -> keys, oldest first
    for k, r in sorted(s.records(KIND), key=lambda kr: kr[1]["time"]):
        keys.setdefault((r["fn"], r.get("label")), []).append(k.hex())
    clear_function(s, "prep.gone")
    s.close()
    srv = Served(root / "s")
    yield srv, keys, root
    srv.close()


def entry_links(body: str, fn: str) -> list[tuple[str, str]]:
    """The entry rows of a function's page: (label, the entry's link), newest first."""
    out = []
    for row in re.findall(r"<tr\b[^>]*>(.*?)</tr>", body, re.S):
        m = re.search(r'href="(/cache\?fn=' + re.escape(fn) + r'&amp;entry=[0-9a-f]{32})"', row)
        if m:
            label = re.search(r'<td data-k="label">(.*?)</td>', row)
            out.append((html.unescape(label.group(1)) if label else "", html.unescape(m.group(1))))
    return out


def test_cache_page_lists_code_versions_with_what_changed_and_the_source_diff(explained):
    srv, _keys, _root = explained
    body = srv.get("/cache?fn=prep.features")
    versions = re.search(r'<table class="versions" id="versions">(.*?)</table>', body, re.S).group(1)
    rows = re.findall(r'<tr id="version-(\d+)"[^>]*>(.*?)</tr>', versions, re.S)
    assert [n for n, _r in rows] == ["1", "2"]  # oldest first
    first, second = (text_of(r) for _n, r in rows)
    assert [" ".join(text_of(c).split()) for c in re.findall(r'<td class="num">(.*?)</td>', rows[0][1])] == ["1", "2"]
    assert [" ".join(text_of(c).split()) for c in re.findall(r'<td class="num">(.*?)</td>', rows[1][1])] == ["2", "1"]
    assert "first version" in first and "prep.scale" not in first
    assert re.search(r"code\s+prep\.scale\s*:\s*changed", second), second
    assert "prep.features" not in second  # the function's own code is the same: only the helper is named
    # the diff, coloured, and escaped: markup in the source is text
    assert '<span class="casmon-del">-    return x * 2</span>' in rows[1][1]
    assert '<span class="casmon-meta">--- prep.scale (#1)</span><span class="casmon-meta">+++ prep.scale (#2)</span>' in rows[1][1]
    add = re.search(r'<span class="casmon-add">\+    return x \* 3 if (.*?)</span>', rows[1][1]).group(1)
    assert html.unescape(add) == f"{HOSTILE_SRC!r} else 0"
    # each entry says its version, linked to the version's row
    assert len(re.findall(r'href="/cache\?fn=prep\.features#version-1"', body)) == 2
    assert len(re.findall(r'href="/cache\?fn=prep\.features#version-2"', body)) == 1


def test_each_entry_links_to_its_view_naming_the_differing_parameter(explained):
    srv, keys, _root = explained
    (old20, new20), (k21,) = keys[("prep.features", "x=20")], keys[("prep.features", "x=21")]
    links = entry_links(srv.get("/cache?fn=prep.features"), "prep.features")
    assert [label for label, _l in links] == ["x=20", "x=21", "x=20"]  # newest first
    assert [link for _label, link in links] == [f"/cache?fn=prep.features&entry={k}" for k in (new20, k21, old20)]
    body = srv.get(links[1][1])
    record = text_of(re.search(r'<table id="entry-record">(.*?)</table>', body, re.S).group(1))
    record = " ".join(record.split())
    assert k21 in record and "label x=21" in record and "state live" in record
    assert "code version #1" in record and "computed in" in record and "stored" in record
    nearest = re.findall(r'<section class="nearest"[^>]*>(.*?)</section>', body, re.S)
    assert len(nearest) == 2  # the two other entries, the nearest first
    near = " ".join(text_of(nearest[0]).split())
    assert re.search(r"parameter x : differs", near) and "code" not in near.split("differs", 1)[1], near
    assert f'href="/cache?fn=prep.features&amp;entry={old20}"' in nearest[0]  # a link to it
    assert f'href="/cache?fn=prep.features&amp;entry={new20}"' in nearest[1]
    far = " ".join(text_of(nearest[1]).split())
    assert "parameter x : differs" in far and "code prep.scale : changed" in far
    # the diff goes from the neighbour's source to this entry's, its sides named so
    assert '<span class="casmon-add">+    return x * 2</span>' in nearest[1] and "casmon-del\">-    return x * 3" in nearest[1]
    assert f"--- prep.scale (entry {new20[:12]})" in html.unescape(nearest[1])
    assert "+++ prep.scale (this entry)" in html.unescape(nearest[1])
    params = re.search(r'<table id="entry-params">(.*?)</table>', body, re.S).group(1)
    assert re.findall(r"<tr><td><code>(.*?)</code></td>", params) == ["x"]


def test_an_entry_key_that_is_not_hex_or_not_live_is_refused(explained):
    srv, keys, _root = explained
    (quick_key,), (gone_key,) = keys[("prep.quick", None)], keys[("prep.gone", None)]
    for path, status, words in [
        ("/cache?fn=prep.features&entry=zz", 400, "32 hex digits"),
        ("/cache?fn=prep.features&entry=" + "0" * 31, 400, "32 hex digits"),
        ("/cache?fn=prep.features&entry=%3Cscript%3Ealert(1)%3C%2Fscript%3E", 400, "32 hex digits"),
        ("/cache?entry=" + "0" * 32, 400, "fn="),
        ("/cache?fn=prep.features&entry=" + "0" * 32, 404, "no live entry"),
        ("/cache?fn=prep.features&entry=" + quick_key, 404, "no live entry"),  # another function's key
        ("/cache?fn=prep.gone&entry=" + gone_key, 404, "cleared"),
        ("/cache?fn=prep.features&entry=" + "0" * 32 + "&entry=" + "0" * 32, 400, "given twice"),
    ]:
        got, headers, body = srv.request(path)
        assert got == status, (path, got, body[:800])
        assert words in html.unescape(text_of(body)), (path, text_of(body)[:800])
        assert "<script>alert" not in body and "content-security-policy" in headers


def test_expired_entries_are_shown_as_expired_not_live(explained):
    srv, keys, _root = explained
    body = srv.get("/cache?fn=prep.quick")
    rows = [r for r in re.findall(r"<tr\b[^>]*>(.*?)</tr>", body, re.S) if "entry=" in r]
    assert len(rows) == 1
    assert "casmon-status-expired" in rows[0] and "casmon-status-live" not in rows[0]
    assert re.search(r"0\s*\+\s*1 expired", text_of(body))  # the version's entries: none live, one expired
    one = srv.get(f"/cache?fn=prep.quick&entry={keys[('prep.quick', None)][0]}")
    record = " ".join(text_of(re.search(r'<table id="entry-record">(.*?)</table>', one, re.S).group(1)).split())
    assert "state expired" in record and "live" not in record and "expires" in record
    live = srv.get("/cache?fn=prep.features")
    assert "casmon-status-expired" not in live and live.count("casmon-status-live") == 3


def test_cache_pages_escape_hostile_source_and_load_nothing(explained):
    srv, keys, _root = explained
    for path in ("/cache", "/cache?fn=prep.features", f"/cache?fn=prep.features&entry={keys[('prep.features', 'x=21')][0]}",
                 f"/cache?fn=features&entry={keys[('prep.features', 'x=20')][0]}"):
        status, _h, body = srv.request(path)
        assert status == 200, (path, status, body[:800])
        assert HOSTILE_SRC not in body and "<script>alert" not in body, path
        for tag in re.findall(r"<script\b[^>]*>", body):
            assert re.fullmatch(SCRIPT_TAG, tag), (path, tag)
        assert body.count("<pre") == body.count("</pre>"), path  # no <pre> closed by the store's text
    assert "&lt;/pre&gt;&lt;script&gt;alert(3)&lt;/script&gt;" in srv.get("/cache?fn=prep.features")


def test_the_entry_page_of_a_function_without_neighbours_says_so(tmp_path):
    s = casmon.open(tmp_path / "s")
    f = casmon.cache(store=s)(_alone)
    f(3)
    s.close()
    srv = Served(tmp_path / "s")
    try:
        link = html.unescape(re.search(r'href="(/cache\?fn=[^"]+&amp;entry=[0-9a-f]{32})"',
                                       srv.get("/cache?fn=_alone")).group(1))
        text = " ".join(text_of(srv.get(link)).split())
        assert "no other live entry of tests.ui.test_cache_page._alone to compare with" in text
    finally:
        srv.close()


def _alone(x):
    return x * 2


def test_cache_pages_decode_a_table_once_while_it_is_unchanged_and_see_new_entries_at_once(tmp_path, monkeypatch):
    """A cache page reads every entry of the cache table: the records are decoded again only when the table's
    files changed (a store of 100,000 entries took seconds a page), and an entry another process adds shows at
    the next request."""
    from casmon.ui import snapshot
    from casmon.ui.server import App, Params

    decoded = {"n": 0}
    real = snapshot.parse_record

    def counting(kind, k, v):
        decoded["n"] += 1
        return real(kind, k, v)

    monkeypatch.setattr(snapshot, "parse_record", counting)
    (tmp_path / "work.py").write_text("import casmon\n\n@casmon.cache(store='s')\ndef sq(x):\n    return x * x\n")
    run_python("import work\nfor i in range(300):\n    work.sq(i)\n", cwd=tmp_path)
    app = App(casmon.open(tmp_path / "s", read_only=True))

    def page(*query):
        return app.cache_page(Params(list(query), {"fn", "entry"}))[1].decode()

    assert "300" in text_of(page())
    first = decoded["n"]
    assert first >= 300
    page()
    page(("fn", "work.sq"))
    assert decoded["n"] - first < 300, "the unchanged cache table was decoded again"
    run_python("import work\nwork.sq(1000)\n", cwd=tmp_path)
    assert "301" in text_of(page()) and "301" in text_of(page(("fn", "work.sq")))


def test_a_cache_page_shown_before_a_table_file_was_damaged_reports_the_damage_as_a_fresh_ui_does(tmp_path):
    """The decoded records a UI keeps are no licence to hide damage: a level-0 file another process writes and
    that is damaged makes the page refuse the table whole, as it does in a UI started after it."""
    from casmon.errors import DamagedObjectError
    from casmon.ui.server import App, Params

    (tmp_path / "work.py").write_text("import casmon\n\n@casmon.cache(store='s')\ndef sq(x):\n    return x * x\n")
    run_python("import work\nfor i in range(3):\n    work.sq(i)\n", cwd=tmp_path)

    def page(app, *query):
        return app.cache_page(Params(list(query), {"fn", "entry"}))[1].decode()

    shown = App(casmon.open(tmp_path / "s", read_only=True))
    assert "3" in text_of(page(shown, ("fn", "work.sq")))
    l0 = tmp_path / "s" / "records" / "cache" / "l0"
    before = set(l0.iterdir())
    run_python("import work\nwork.sq(1000)\n", cwd=tmp_path)
    (new,) = set(l0.iterdir()) - before
    data = bytearray(new.read_bytes())
    data[len(data) // 2] ^= 1
    new.write_bytes(bytes(data))
    with pytest.raises(DamagedObjectError, match=new.name):
        page(App(casmon.open(tmp_path / "s", read_only=True)), ("fn", "work.sq"))
    with pytest.raises(DamagedObjectError, match=new.name):
        page(shown, ("fn", "work.sq"))
    with pytest.raises(DamagedObjectError, match=new.name):
        page(shown)


def test_cache_page_counts_a_value_two_functions_share_once(tmp_path):
    from casmon.view.text import size
    from tests.cli.test_cache_totals import OWN, SHARED, shared_store

    shared_store(tmp_path / "s")
    srv = Served(tmp_path / "s")
    try:
        body = srv.get("/cache")
        store_page = " ".join(text_of(srv.get("/store")).split())
    finally:
        srv.close()
    assert "of it the gc reserve, room for gc on a full disk" in store_page  # not data: said so
    head = " ".join(text_of(re.search(r"<h1>(.*?)</h1>", body, re.S).group(1)).split())
    assert head == f"Cache 3 functions, {size(SHARED.nbytes + OWN.nbytes)}, {size(SHARED.nbytes)} of it shared between functions"
    rows = {" ".join(text_of(r).split()).split(" ")[0].rsplit(".", 1)[1]: re.findall(r'<td class="num">(.*?)</td>', r)
            for r in re.findall(r"<tr>(.*?)</tr>", body, re.S) if "shared_store" in r}
    assert rows == {"first": ["1", size(SHARED.nbytes), size(SHARED.nbytes), "0"], "own": ["1", size(OWN.nbytes), "", "0"],
                    "second": ["1", size(SHARED.nbytes), size(SHARED.nbytes), "0"]}, rows


def test_a_parameter_whose_digest_was_not_kept_says_so_in_words():
    from casmon.ui.cachepage import _params_table

    shown = text_of(str(_params_table({"X": "~", "lr": "f43075fb83988858"})))
    assert "~" not in shown and "not kept" in shown and "f43075fb83988858" in shown
