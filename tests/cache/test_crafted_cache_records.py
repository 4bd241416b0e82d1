"""A cache record (entry, version, clear, use) whose fields are of the wrong type or out of range -- crafted or
damaged -- stops no cached call, lookup, explain or ``casmon cache`` with a raw exception, and hides no entry."""

import json
import os
import warnings

import pytest
from click.testing import CliRunner

import casmon
from casmon.caching.entries import KIND, KIND_CLEAR, KIND_FN, KIND_USE, cache_entries, eviction_plan, name_digest
from casmon.cli.app import main as cli


def sq(x):
    return [x] * 3


#: What a crafted field holds: wrong types, NaN, infinities, a far future, a 400-digit integer, a negative size.
HOSTILE = [b'"x"', b"[1]", b'{"a": 1}', b"null", b"NaN", b"-Infinity", b"1e308", b"1" + b"0" * 400, b"-5",
           b'{"00000000000000000000000000000000": ["f", "x", "y"]}']
FIELDS = {KIND: ["time", "result", "fn", "seconds", "size", "expires", "label", "v", "a", "inline"],
          KIND_FN: ["fn", "version", "time", "parts"], KIND_CLEAR: ["fn", "time"], KIND_USE: ["hits", "time"]}


def _crafted(kind: str, template: dict, value: bytes) -> bytes:
    body = json.dumps({k: v for k, v in template.items() if k not in FIELDS[kind] and k != "_refs"})[:-1].encode()
    fields = b",".join(b'"' + f.encode() + b'":' + value for f in FIELDS[kind])
    return body + (b"," if len(body) > 1 else b"") + fields + b"}"


@pytest.mark.parametrize("kind", list(FIELDS))
@pytest.mark.parametrize("value", HOSTILE, ids=lambda v: v[:12].decode())
def test_a_crafted_cache_record_stops_nothing_and_hides_no_entry(tmp_path, kind, value):
    root = tmp_path / "s"
    s = casmon.open(root, autoflush=None)
    f = casmon.cache(store=s)(sq)
    f(1), f(1), f(2)
    s.flush()
    name = f.__casmon_cache__.name
    template = next(r for _k, r in s.records(kind)) if kind != KIND_CLEAR else {"fn": name, "time": 1.0}
    key = {KIND: bytes(f.__casmon_cache__.key((1,), {})), KIND_USE: os.urandom(16)}.get(kind, bytes(name_digest(name)))
    s.append(kind, {}, key=key, encoded=_crafted(kind, template, value))
    s.flush()
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s = casmon.open(root, autoflush=None)
        g = casmon.cache(store=s)(sq)
        assert g(1) == [1] * 3 and g(3) == [3] * 3
        assert g.lookup(2) == [2] * 3
        g.explain(1)
        s.flush()
        for args in (["cache"], ["cache", name]):
            r = CliRunner().invoke(cli, [*args, "--store", str(root)])
            assert r.exit_code in (0, 1, 2) and not (r.exception and not isinstance(r.exception, SystemExit)), \
                (r.output, r.exception)
        assert cache_entries(s)[name]["entries"] == 3
        eviction_plan(s, max_size=1)
        casmon.open(root).gc(grace=0)
        s = casmon.open(root, read_only=True)
        g = casmon.cache(store=s)(sq)
        assert g.lookup(2) == [2] * 3 and g.lookup(3) == [3] * 3


@pytest.mark.parametrize("kind", list(FIELDS))
def test_the_cache_pages_show_a_store_with_a_crafted_cache_record(tmp_path, kind):
    """A clear record whose function name was not text made the UI's cache pages answer 404 "fn"."""
    from tests.ui.test_ui import Served

    root = tmp_path / "s"
    s = casmon.open(root, autoflush=None)
    f = casmon.cache(store=s)(sq)
    f(1), f(2)
    s.flush()
    name = f.__casmon_cache__.name
    template = next(r for _k, r in s.records(kind)) if kind not in (KIND_CLEAR, KIND_USE) else {"fn": name, "time": 1.0}
    for value in (b"[1]", b"NaN"):
        s.append(kind, {}, key=bytes(name_digest(name)), encoded=_crafted(kind, template, value))
    s.flush()
    s.close()
    srv = Served(root)
    try:
        for path in ("/cache", f"/cache?fn={name}"):
            status, _h, body = srv.request(path)
            assert status == 200 and name in body, (path, status, body[-400:])
    finally:
        srv.close()


@pytest.mark.parametrize("label", [7, [1, "a"], {"k": 1}, None])
def test_a_label_that_is_not_text_is_kept_as_given(tmp_path, label):
    """Labels are what the user's label function returned (any JSON); the field checks leave them be."""
    s = casmon.open(tmp_path / "s", autoflush=None)
    f = casmon.cache(store=s, label=lambda x: label)(sq)
    f(1)
    s.flush()
    assert [r.get("label") for _k, r in casmon.open(tmp_path / "s").records(KIND)] == [label]
