"""The UI's artifacts: the run page's list and downloads, checkpoints, resumes, the compare page's differences."""

from __future__ import annotations

import html
import http.client
import io
import os
import re
import zipfile

import numpy as np
import pytest

import casmon
from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key
from casmon.runs.pieces import PIECED_MIN
from casmon.store.objects import loose_key
from tests.ui.test_ui import Served, text_of

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

BIG = np.random.default_rng(3).bytes(PIECED_MIN + 4321)


@pytest.fixture
def built(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # out of any git repository: the pages show no patch
    path = tmp_path / "s"
    s = casmon.open(path, create=True)
    (tmp_path / "big.bin").write_bytes(BIG)
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("a")
    (tmp_path / "d" / "sub" / "b.bin").write_bytes(b"\x00b")
    (tmp_path / "n\u00e9 \"x\".txt").write_text("odd name")
    with casmon.record(store=s, capture_output=False, comment="a") as run:
        run.save_file(tmp_path / "big.bin", name="model/big.bin")
        run.save_file(tmp_path / "d", name="plots")
        run.save_file(tmp_path / "n\u00e9 \"x\".txt")
        run.save("w", np.arange(1000))
        run.save("same", b"same in both")
        run.checkpoint({"s": 1}, step=10)
        run.checkpoint({"s": 2}, step=20)
    with pytest.raises(RuntimeError):
        with casmon.record(store=s, capture_output=False, comment="b") as run:
            run.save("w", np.arange(1000))
            run.save("only-b", 1)
            run.save("same", b"same in both")
            raise RuntimeError("preempted")
    with casmon.record(store=s, capture_output=False, resume="2-b", resume_ok=True) as run:
        run.save("w", np.arange(1001))
    s.close()
    yield {"path": path, "tmp": tmp_path}


@pytest.fixture
def served(built):
    s = Served(built["path"])
    yield s
    s.close()


def _raw(served, path):
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_the_run_page_lists_artifacts_with_sizes_shares_and_downloads_and_checkpoints_with_steps(served):
    body = served.get("/run/1-a")
    text = " ".join(text_of(body).split())
    assert "Artifacts (5," in text and "model/big.bin" in text and "plots" in text and "folder (2 files)" in text
    assert "Checkpoints (2)" in text and "shared" in text
    links = re.findall(r'href="(/artifact[^"]*)"', body)
    assert links == ["/artifact?run=1&amp;name=model%2Fbig.bin", "/artifact?run=1&amp;name=n%C3%A9+%22x%22.txt",
                     "/artifact?run=1&amp;name=plots"]  # a value is no file: no download
    assert ">zip<" in body


def test_a_file_downloads_whole_a_folder_as_a_zip(served):
    status, h, got = _raw(served, "/artifact?run=1-a&name=model%2Fbig.bin")
    assert status == 200 and got == BIG and h["content-length"] == str(len(BIG))
    assert 'filename="big.bin"' in h["content-disposition"]
    status, h, got = _raw(served, "/artifact?run=1-a&name=plots")
    assert status == 200 and h["content-type"] == "application/zip"
    z = zipfile.ZipFile(io.BytesIO(got))
    assert {n: z.read(n) for n in z.namelist()} == {"a.txt": b"a", "sub/b.bin": b"\x00b"}
    status, h, got = _raw(served, "/artifact?run=1-a&name=n%C3%A9%20%22x%22.txt")
    assert status == 200 and got == b"odd name" and "filename*=UTF-8''n%C3%A9%20%22x%22.txt" in h["content-disposition"]


def test_a_download_of_no_file_or_a_damaged_one_is_an_error_page(served, built):
    assert _raw(served, "/artifact?run=1-a&name=w")[0] == 404
    assert _raw(served, "/artifact?run=1-a&name=nope")[0] == 404
    assert _raw(served, "/artifact?run=1-a")[0] == 400
    s = served.store
    a = casmon.load_run("1-a", s)
    from casmon.runs.artifacts import read_artifacts

    first_piece = read_artifacts(s, a.ref)["model/big.bin"].refs[1]
    p = built["path"] / loose_key(next(s.manifest(first_piece).chunk_digests()))
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    p.write_bytes(bytes(raw))
    s.objects.clear_caches()
    status, _h, body = _raw(served, "/artifact?run=1-a&name=model%2Fbig.bin")
    assert status == 500 and b"damaged" in body


def test_the_run_page_says_a_run_was_resumed_when_and_how_often(served):
    text = " ".join(text_of(served.get("/run/2-b")).split())
    assert "resumed 1 time, last at" in text and "after it was failed" in text and "Resumed 1 time" in text
    assert "resumed" not in text_of(served.get("/run/1-a")).lower()


def test_the_compare_page_says_which_artifacts_differ(served):
    body = served.get("/compare?run=1-a&run=2-b")
    text = " ".join(text_of(body).split())
    assert "Artifacts" in text
    section = body[body.index('id="artifacts-summary"'):]
    got = {html.unescape(k): v for v, k in re.findall(r'<tr class="(differs|same)" data-key="([^"]+)">', section)}
    assert got == {"w": "differs", "only-b": "differs", "plots": "differs", "model/big.bin": "differs", "same": "same",
                   "n\u00e9 \"x\".txt": "differs", "checkpoint/10": "differs", "checkpoint/20": "differs"}
    assert "7 artifacts of 8 differ" in text


def test_a_crafted_folder_listing_never_zips_a_path_outside(built, tmp_path):
    s = casmon.open(built["path"])
    r = casmon.load_run("1-a", s)
    evil = s.put({"casmon_folder": 1, "files": {"../up.txt": {"digest": s.put(b"x").hex(), "size": 1, "mode": 0o644},
                                                "ok.txt": {"digest": s.put(b"ok").hex(), "size": 2, "mode": 0o644}}})
    s.append(KIND_ARTIFACT, {"run": r.ref, "name": "evil", "kind": "folder", "digest": evil.hex(), "size": 3,
                             "time": 1e12, "seq": 1}, key=artifacts_key(r.ref), refs=[evil])
    s.close()
    served = Served(built["path"])
    try:
        status, _h, got = _raw(served, "/artifact?run=1-a&name=evil")
    finally:
        served.close()
    assert status == 200 and zipfile.ZipFile(io.BytesIO(got)).namelist() == ["ok.txt"]


def _craft(path, name, kind, value, size, **extra):
    s = casmon.open(path)
    r = casmon.load_run("1-a", s)
    d = s.put(value)
    s.append(KIND_ARTIFACT, {"run": r.ref, "name": name, "kind": kind, "digest": d.hex(), "size": size,
                             "time": 1e12, "seq": 1, **extra}, key=artifacts_key(r.ref), refs=[d])
    s.close()
    return d


@pytest.mark.parametrize("said", [10, 1000])
def test_a_file_whose_record_says_another_size_is_an_error_and_the_connection_stays_in_step(built, said):
    """The body sent must be the length announced: more would be read as the next answer on the connection,
    less would leave the client waiting for bytes that never come."""
    _craft(built["path"], "lies.bin", "file", b"y" * 100, said)
    served = Served(built["path"])
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=60)
    try:
        conn.request("GET", "/artifact?run=1-a&name=lies.bin")
        r = conn.getresponse()
        body = r.read()
        assert r.status == 500 and b"damaged" in body, (r.status, body[:300])
        conn.request("GET", "/artifact?run=1-a&name=same")
        r = conn.getresponse()
        assert r.status == 404 and r.read()
    finally:
        conn.close()
        served.close()


def test_a_folder_file_whose_listing_says_another_size_is_not_zipped_as_if_whole(built):
    s = casmon.open(built["path"])
    listing = {"casmon_folder": 1, "files": {"a.txt": {"digest": s.put(b"z" * 50).hex(), "size": 5, "mode": 0o644}}}
    s.close()
    _craft(built["path"], "badfolder", "folder", listing, 5, files=1)
    served = Served(built["path"])
    try:
        status, _h, got = _raw(served, "/artifact?run=1-a&name=badfolder")
    finally:
        served.close()
    with pytest.raises(zipfile.BadZipFile):  # cut short: the client sees an incomplete zip, never a wrong one
        zipfile.ZipFile(io.BytesIO(got)).read("a.txt")


def test_the_run_page_walks_the_store_for_shares_only_when_asked(served, monkeypatch):
    """Counting what other runs share walks every record and ref of the store (seconds on a large one): the run
    page offers it as a link instead of paying it on every view."""
    from casmon.runs import sharing

    walks = []
    real = sharing.held_elsewhere
    monkeypatch.setattr(sharing, "held_elsewhere", lambda *a, **k: walks.append(1) or real(*a, **k))
    body = served.get("/run/1-a")
    assert walks == [] and 'href="/run/1?shared=1#artifacts"' in body
    assert "Artifacts (5," in text_of(body) and "Checkpoints (2)" in text_of(body)
    body = served.get("/run/1-a?shared=1")
    assert walks and 'href="/run/1?shared=1#artifacts"' not in body
    text = " ".join(text_of(body).split())
    assert re.search(r"\(\d+%\)", text), text[:3000]
    assert served.request("/run/1-a?shared=2")[0] == 400


def test_downloads_of_a_large_file_and_a_folder_holding_it_stream(tmp_path, monkeypatch):
    import tracemalloc

    monkeypatch.chdir(tmp_path)
    data = np.random.default_rng(9).bytes(48 << 20)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "big.bin").write_bytes(data)
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, comment="m") as run:
        run.save_file(tmp_path / "d" / "big.bin")
        run.save_file(tmp_path / "d", name="d")
    s.close()
    del data
    served = Served(tmp_path / "s")
    try:
        for name in ("big.bin", "d"):
            conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=120)
            tracemalloc.start()
            try:
                conn.request("GET", f"/artifact?run=1-m&name={name}")
                r = conn.getresponse()
                n = 0
                while b := r.read(1 << 20):
                    n += len(b)
                peak = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
                conn.close()
            assert r.status == 200 and n >= 48 << 20
            assert peak < 32 << 20, (name, peak)  # a 48 MiB file is never whole in memory
    finally:
        served.close()


def test_a_folder_zips_every_file_it_saved_deep_paths_and_odd_names_too(tmp_path, monkeypatch):
    """Only a path that would unzip outside (or into .git/) is left out of the zip, never a file saved from disk."""
    monkeypatch.chdir(tmp_path)
    deep = "/".join(["level" + "x" * 60] * 5) + "/deep.txt"  # over 255 characters as a path, each part short
    odd = "zero\u200bwidth \x01.txt"
    for rel in (deep, odd, "plain.txt"):
        (tmp_path / "d" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "d" / rel).write_bytes(rel.encode())
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, comment="m") as run:
        run.save_file(tmp_path / "d", name="d")
    s.close()
    served = Served(tmp_path / "s")
    try:
        status, _h, got = _raw(served, "/artifact?run=1-m&name=d")
    finally:
        served.close()
    z = zipfile.ZipFile(io.BytesIO(got))
    assert status == 200 and {n: z.read(n) for n in z.namelist()} == {r: r.encode() for r in (deep, odd, "plain.txt")}


def test_a_crafted_name_with_line_breaks_and_quotes_never_splits_the_download_headers(built):
    name = 'x"\r\nSet-Cookie: a=b;\\ \u00e9.bin'
    _craft(built["path"], name, "file", b"payload", 7)
    served = Served(built["path"])
    try:
        status, h, got = _raw(served, "/artifact?" + __import__("urllib.parse").parse.urlencode({"run": "1-a", "name": name}))
        page = served.get("/run/1-a")
    finally:
        served.close()
    assert status == 200 and got == b"payload" and "set-cookie" not in h
    assert h["content-disposition"] == ("attachment; filename=\"x___Set-Cookie: a=b__ _.bin\"; "
                                        "filename*=UTF-8''x%22%0D%0ASet-Cookie%3A%20a%3Db%3B%5C%20%C3%A9.bin")
    assert "Set-Cookie: a=b" in html.unescape(page) and '"\r\nSet' not in page


def test_a_file_of_exactly_two_gib_zips_whole(monkeypatch):
    """zipfile needs ZIP64 from 2**31 - 1 bytes on: a folder holding a file of exactly 2 GiB must not fail midway."""
    from casmon.runs import pieces
    from casmon.ui import artifactview

    n = 2**31
    block = bytes(8 << 20)

    def zeros(store, digest, what, size=None):
        for _ in range(n // len(block)):
            yield block

    monkeypatch.setattr(pieces, "chunks", zeros)
    out = 0
    tail = b""
    for b in artifactview._zip(None, {"big.bin": {"digest": "0" * 32, "size": n, "mode": 0o644}}, "w"):
        out += len(b)
        tail = (tail + b)[-4096:]
    assert out > n and b"PK\x06\x06" in tail  # the ZIP64 end of central directory


def test_a_folder_with_a_file_name_that_is_not_utf8_zips_whole(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = tmp_path / "d"
    d.mkdir()
    try:
        (d / os.fsdecode(b"caf\xe9.bin")).write_bytes(b"latin-1 name")
    except (OSError, UnicodeError):
        pytest.skip("this file system takes UTF-8 names only")
    (d / "ok.bin").write_bytes(b"ok")
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False, comment="m") as run:
        run.save_file(d, name="d")
    s.close()
    served = Served(tmp_path / "s")
    try:
        status, _h, got = _raw(served, "/artifact?run=1-m&name=d")
    finally:
        served.close()
    z = zipfile.ZipFile(io.BytesIO(got))
    assert status == 200 and {n: z.read(n) for n in z.namelist()} == {"caf\ufffd.bin": b"latin-1 name", "ok.bin": b"ok"}
