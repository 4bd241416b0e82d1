"""One crafted or damaged call-log record (a session, a function's signature, a batch of calls) is skipped with a
StoreDamageWarning naming it: it hides no other logged call, and raises nothing into ``casmon.load`` or ``casmon
calls``."""

import json
import warnings

import pytest
from click.testing import CliRunner

import casmon
from casmon.cli.app import main as cli


def add(a, b=2):
    return a + b


CRAFTED = [("session", {"n": "x"}), ("callfn", {"fn": [1], "session": 1}),
           ("callfn", {"fn": f"{__name__}.add", "session": 1, "params": "x"}),
           ("calls", {"session": 1, "pid": 1, "rank": None, "fns": [f"{__name__}.add"], "threads": {}, "c": [[0, 1]]}),
           ("calls", {"session": 1, "pid": 1, "rank": None, "fns": ["m.f"], "threads": {},
                      "c": [[0, 1, float("nan"), 1e308, 0, [], {}, 3, None]]}),
           ("calls", {"session": 1, "pid": 1, "rank": None, "fns": ["m.f"], "threads": {},
                      "c": [[0, 1, 1e308, -1.0, 0, [], {}, 3, None]]})]


@pytest.mark.parametrize("kind,record", CRAFTED + [(k, b) for k in ("session", "callfn", "calls")
                                                  for b in (b"[1]", b"7", b"[" * 5000 + b"]" * 5000)], ids=lambda v: v if isinstance(v, str) else (v[:8].decode() if isinstance(v, bytes) else json.dumps(v)[:30]))
def test_a_crafted_calllog_record_hides_no_other_call(tmp_path, kind, record):
    s = casmon.open(tmp_path / "s", autoflush=None)
    f = casmon.intercept(add, store=s)
    f(1), f(2, b=3)
    casmon.flush()
    s.append(kind, {}, encoded=record if isinstance(record, bytes) else json.dumps(record))
    s.flush()
    s.close()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        log = casmon.load(casmon.open(tmp_path / "s", read_only=True))
        assert [c.result() for c in log.calls(f"{__name__}.add")] == [3, 5]
        repr(log), log._repr_html_(), [repr(c) for c in log], repr(log.sessions)
    assert any(issubclass(w.category, casmon.StoreDamageWarning) and f"record {kind}/" in str(w.message)
               for w in seen), [str(w.message) for w in seen]
    for args in (["calls"], ["calls", f"{__name__}.add"]):
        r = CliRunner().invoke(cli, [*args, "--store", str(tmp_path / "s")])
        assert r.exit_code == 0, (args, r.output, r.exception)
