"""casmon's own reading of a source file gives exactly linecache's lines, or leaves the file to linecache:
a code version computed where linecache is not loaded (a script's first hit) names the same source as one
computed where it is (the process that stored the entry)."""

from __future__ import annotations

import linecache
import os

from hypothesis import given, settings, strategies as st

from casmon.keys import sourcelines

PIECES = st.sampled_from(["x = 1", "def f(a):", "    return a", "# c", "", " ", "\t", "é", "\u2028", "\x0c", "\x1c",
                          "s = 'a\rb'", "\x00", "coding", "# -*- coding: latin-1 -*-", "# vim: set fileencoding=utf-8 :"])
ENDS = st.sampled_from(["\n", "\r\n", "\r", ""])


def _linecache_lines(path: str) -> list[str]:
    linecache.checkcache(path)
    return linecache.getlines(path)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(PIECES, ENDS), max_size=8), st.booleans(), st.sampled_from(["utf-8", "latin-1"]))
def test_a_file_read_without_linecache_has_linecaches_lines_or_is_left_to_linecache(tmp_path_factory, parts, bom, enc):
    path = str(tmp_path_factory.mktemp("src") / "m.py")
    text = "".join(p + e for p, e in parts)
    try:
        data = text.encode(enc)
    except UnicodeEncodeError:
        data = text.encode("utf-8")
    with open(path, "wb") as f:
        f.write((b"\xef\xbb\xbf" if bom else b"") + data)
    read = sourcelines.read_plain(path)
    if read is not None:
        assert read[2] == _linecache_lines(path)
        assert read[0] == os.stat(path).st_size


def test_names_that_are_not_plain_utf8_files_are_left_to_linecache(tmp_path):
    assert sourcelines.read_plain("<stdin>") is None
    assert sourcelines.read_plain(str(tmp_path / "missing.py")) is None
    assert sourcelines.read_plain(str(tmp_path)) is None  # a folder
    bad = tmp_path / "bad.py"
    bad.write_bytes(b"x = '\xff'\n")
    assert sourcelines.read_plain(str(bad)) is None
    cookie = tmp_path / "cookie.py"
    cookie.write_bytes(b"# -*- coding: latin-1 -*-\nx = '\xe9'\n")
    assert sourcelines.read_plain(str(cookie)) is None
    assert sourcelines.getlines(str(cookie)) == _linecache_lines(str(cookie))


def test_kept_lines_are_the_same_list_until_the_file_changes(tmp_path, monkeypatch):
    monkeypatch.delitem(__import__("sys").modules, "linecache")  # as in a fresh script's process
    path = tmp_path / "m.py"
    path.write_text("a = 1\n")
    first = sourcelines.getlines(str(path))
    assert first == ["a = 1\n"]
    sourcelines.checkcache(str(path))
    assert sourcelines.getlines(str(path)) is first
    path.write_text("a = 22\nb = 3\n")
    assert sourcelines.getlines(str(path)) is first  # as linecache: read again only after checkcache
    sourcelines.checkcache(str(path))
    assert sourcelines.getlines(str(path)) == ["a = 22\n", "b = 3\n"]
    path.unlink()
    sourcelines.checkcache(str(path))
    assert sourcelines.getlines(str(path)) == []


def test_an_empty_file_is_left_to_linecache_whose_lines_for_it_differ_by_version(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_bytes(b"")
    assert sourcelines.read_plain(str(empty)) is None
    assert sourcelines.getlines(str(empty)) == _linecache_lines(str(empty))
