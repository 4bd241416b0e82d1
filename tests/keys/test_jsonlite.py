"""jsonlite reads and writes JSON as the json package does, to the byte and to the error, without loading it."""

from __future__ import annotations

import json
import random
import sys

import pytest

from casmon.keys import jsonlite
from tests.conftest import run_python


def _outcome(fn, *args, **kw):
    try:
        return "value", repr(fn(*args, **kw))
    except Exception as e:  # noqa: BLE001 - compared, type and message
        return "error", type(e).__name__, str(e)


TEXTS = ['{"a": [1, 2.5, "x\\u00e9", true, false, null], "b": {"c": -0.0}}', "1", '"s"', " 1 ", "\ufeff1", "[NaN, Infinity, -Infinity]",
         '{"a":1}x', "", "[1,]", '{"a":"\\ud800"}', "1e400", "-", '"\x00"', "[" * 100_000 + "]" * 100_000, '{"a":1,"a":2}',
         "123456789012345678901234567890", '{"k": "caf\u00e9 \U0001f600"}', "\t[1]\n", "nul", "tru", '"\\x"']
BYTES = [b'{"a": 1}', b"\xff", b"\xef\xbb\xbf[1]", '[1, "\u00e9"]'.encode("utf-16"), '{"a": 2}'.encode("utf-16-le"), b"1\x00",
         bytearray(b"[true]"), b"[1, 2]  \n"]


@pytest.mark.parametrize("text", TEXTS + BYTES, ids=range(len(TEXTS + BYTES)))
def test_loads_returns_and_raises_what_json_loads_does(text):
    assert _outcome(jsonlite.loads, text) == _outcome(json.loads, text)


def _no_constant(name):
    raise ValueError(f"{name} is not allowed")


def _small(s):
    if len(s) > 5:
        raise ValueError("too long")
    return int(s)


@pytest.mark.parametrize("text", ["[1, 2.5, NaN]", "[123456, 1]", "[1.5e3, 7]", '{"x": [Infinity]}', "[1, 2]"])
def test_loads_calls_the_number_hooks_as_json_loads_does(text):
    hooks = dict(parse_constant=_no_constant, parse_float=lambda s: ("f", s), parse_int=_small)
    assert _outcome(jsonlite.loads, text, **hooks) == _outcome(json.loads, text, **hooks)
    assert _outcome(jsonlite.loads, text) == _outcome(json.loads, text)  # the hooks of one call stay its own


class _Str(str):
    pass


class _Int(int):
    pass


def _deep(n):
    v: list = [1]
    for _ in range(n):
        v = [v]
    return v


VALUES = [{"a": 1, "b": [1.5, 'x\u00e9"\n\\', None, True, False], "c": {"z": 1, "y": 2}}, [1, 2.0, -0.0, 1e300, 5e-324, 1e16],
          {"casmon": "content-addressed call store", "format": 2, "created": 1733500000.123}, {}, [], "", (1, [2, (3,)]),
          {"x": float("nan")}, [float("inf")], {1: 2}, {"b": 1, "a": {"d": 1, "c": 2}}, [_Str("s"), _Int(3)], {_Str("k"): 1},
          2 ** 70, ["\ud800"], {"k": {"d": [[[]]]}}, _deep(40), _deep(5000),
          {None: 1}, {True: 1}, {1.5: 2}, b"bytes", {"set": {1}}]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
@pytest.mark.parametrize("sort_keys", [False, True])
@pytest.mark.parametrize("separators", [None, (",", ":"), (", ", ": ")])
def test_dumps_writes_what_json_dumps_does(value, sort_keys, separators):
    assert _outcome(jsonlite.dumps, value, sort_keys=sort_keys, separators=separators) == \
        _outcome(json.dumps, value, sort_keys=sort_keys, separators=separators)


def test_dumps_of_a_list_that_holds_itself_raises_as_json_does():
    a: list = [1]
    a.append(a)
    assert _outcome(jsonlite.dumps, a) == _outcome(json.dumps, a)


def test_random_documents_round_trip_as_json_reads_and_writes_them():
    rng = random.Random(7)

    def value(depth):
        k = rng.randrange(8 if depth < 4 else 5)
        if k == 0:
            return rng.choice([None, True, False])
        if k == 1:
            return rng.randrange(-10 ** 20, 10 ** 20)
        if k == 2:
            return rng.uniform(-1e10, 1e10)
        if k in (3, 4):
            return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0, 0x2FFFF)])) for _ in range(rng.randrange(6)))
        if k == 5:
            return [value(depth + 1) for _ in range(rng.randrange(4))]
        return {f"k{rng.randrange(50)}": value(depth + 1) for _ in range(rng.randrange(4))}

    for _ in range(500):
        v = value(0)
        for sep in (None, (",", ":")):
            text = jsonlite.dumps(v, sort_keys=True, separators=sep)
            assert text == json.dumps(v, sort_keys=True, separators=sep)
            assert _outcome(jsonlite.loads, text) == _outcome(json.loads, text)


def test_reading_and_writing_plain_json_loads_no_json_package():
    p = run_python("import sys\nfrom casmon.keys import jsonlite\n"
                   "v = jsonlite.loads(b'{\"a\": [1, 2.5, \"x\"], \"b\": null}')\n"
                   "t = jsonlite.dumps(v, sort_keys=True, separators=(',', ':'))\n"
                   "print(t, 'json' in sys.modules)\n")
    assert p.stdout.split() == ['{"a":[1,2.5,"x"],"b":null}', "False"]


@pytest.mark.parametrize("data", [memoryview(b"[1]"), [49], 3, None, (b"1",)], ids=["memoryview", "list", "int", "none", "tuple"])
def test_loads_refuses_what_json_loads_refuses_to_read(data):
    """json.loads reads str, bytes and bytearray only: anything else (a memoryview, a list of byte values) is its
    TypeError, never a value that jsonlite made of it."""
    assert _outcome(jsonlite.loads, data) == _outcome(json.loads, data)
