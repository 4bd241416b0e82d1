"""A pickle of plain values reads back without the pickle module exactly as pickle reads it, and anything else --
a global, damage, a crafted stream -- is declined (NOT_PLAIN), never read differently, never an error or a hang.

Checked against ``pickle.loads`` over hypothesis' nested values (pickled by casmon's own encoder and by pickle at
protocols 2 to 5), byte-level mutations of those pickles, and hand-made streams."""

from __future__ import annotations

import io
import math
import pickle
import pickletools
import struct
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import casmon
from casmon.errors import DamagedObjectError, UntrustedStoreError
from casmon.store import serialize
from casmon.store.encode import encode
from casmon.store.plainpickle import NOT_PLAIN, loads
from tests.support.processes import ENV

# -- values ---------------------------------------------------------------------------------------------------

floats = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, math.inf, -math.inf]),
    # NaNs with payloads and either sign, quiet and signalling
    st.integers(1, (1 << 52) - 1).flatmap(
        lambda m: st.sampled_from([0x7FF0 << 48, 0xFFF0 << 48]).map(lambda e: struct.unpack(">d", struct.pack(">Q", e | m))[0])),
)
texts = st.one_of(st.text(),
                  st.lists(st.integers(0, 0x10FFFF).map(chr)).map("".join),  # lone surrogates and non-BMP
                  st.text(min_size=250, max_size=300))  # BINUNICODE, not SHORT_
ints = st.one_of(st.integers(), st.integers(-(1 << 70000), 1 << 70000), st.sampled_from([0, -1, 255, 256, 65535, 65536,
                 2**31 - 1, -(2**31), 2**31, 2**63, -(2**64)]))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, texts, st.binary(), st.binary(min_size=256, max_size=300))
hashables = st.recursive(scalars, lambda c: st.one_of(st.tuples(c), st.lists(c, max_size=5).map(tuple),
                                                       st.frozensets(c, max_size=5)), max_leaves=12)


def _with_sharing(c):
    # a sub-object referred to twice stays one object (pickle's memo); repeated in lists and dict values
    return st.one_of(st.lists(c, max_size=6), st.lists(c, max_size=4).map(lambda xs: [xs, xs, tuple(xs)]),
                     st.dictionaries(hashables, c, max_size=5), st.tuples(c, c), st.lists(c, max_size=5).map(tuple),
                     st.sets(hashables, max_size=5), st.frozensets(hashables, max_size=5),
                     c.map(lambda x: {"a": x, "b": x, "c": [x]}), st.binary(max_size=40).map(bytearray))


plain = st.recursive(st.one_of(scalars, hashables), _with_sharing, max_leaves=30)


def _deep(depth: int, kind: str):
    v: object = 1
    for i in range(depth):
        v = {"list": lambda: [v], "tuple": lambda: (v, i), "dict": lambda: {i: v}, "frozenset": lambda: frozenset([v])}[kind]()
    return v


def _casmon_pickle(v) -> bytes:
    enc = encode(v)
    if enc.tag != "pickle":  # casmon keeps small dicts and lists as JSON: pickle them as its encoder would
        enc = encode(("wrapped", v))
        assert enc.tag == "pickle"
    assert not enc.parts and not enc.children
    return enc.inline


_CONTAINERS = (list, dict, set, frozenset, tuple, bytearray)


def _ids(v) -> list[int]:
    """The identity structure of ``v``: for each container met walking it, -1 the first time, else which one it is."""
    seen: dict[int, int] = {}
    out, stack = [], [v]
    while stack:
        x = stack.pop()
        if type(x) not in _CONTAINERS:
            continue
        if id(x) in seen:
            out.append(seen[id(x)])
            continue
        seen[id(x)] = len(seen)
        out.append(-1)
        if type(x) is dict:
            stack.extend(reversed([y for kv in x.items() for y in kv]))
        elif type(x) in (list, tuple):  # not into sets: their order follows hashes, a NaN's its object's
            stack.extend(reversed(x))
    return out


def same(a, b, seen=None) -> bool:
    """Equal value, exact types all the way down, floats by their bits (recursive values compared once)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return struct.pack("<d", a) == struct.pack("<d", b)
    if type(a) not in (list, tuple, dict, set, frozenset):
        return bool(a == b)
    seen = set() if seen is None else seen
    if (id(a), id(b)) in seen:
        return True
    seen.add((id(a), id(b)))
    if len(a) != len(b):
        return False
    if type(a) is dict:  # keys in order, by their types too (1 and True are one key)
        return all(same(k1, k2, seen) and same(a[k1], b[k2], seen) for k1, k2 in zip(a, b))
    if type(a) in (list, tuple):
        return all(same(x, y, seen) for x, y in zip(a, b))
    rest = list(b)  # sets: matched element by element (a NaN hashes by its object, so orders differ)
    for x in a:
        j = next((j for j, y in enumerate(rest) if same(x, y, seen)), None)
        if j is None:
            return False
        del rest[j]
    return True


def _dis(stream: bytes) -> str:
    out = io.StringIO()
    try:
        pickletools.dis(stream, out)
    except Exception as e:  # noqa: BLE001
        out.write(f"<{e}>")
    return out.getvalue()[:4000]


def check(stream: bytes) -> None:
    got = loads(stream)
    assert got is not NOT_PLAIN, _dis(stream)
    want = pickle.loads(stream)
    assert same(got, want)
    assert _ids(got) == _ids(want)


# -- round trips ----------------------------------------------------------------------------------------------

COMMON = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@COMMON
@given(plain)
def test_plain_values_casmon_pickled_read_back_as_pickle_reads_them(v):
    check(_casmon_pickle(v))


def _declined_at(v, protocol: int) -> bool:
    """Whether pickle names a global for a part of ``v`` at ``protocol``: bytes before 3, sets before 4,
    bytearrays before 5."""
    seen, stack = set(), [v]
    while stack:
        x = stack.pop()
        t = type(x)
        if (t is bytes and protocol < 3) or (t in (set, frozenset) and protocol < 4) or (t is bytearray and protocol < 5):
            return True
        if id(x) in seen:
            continue
        seen.add(id(x))
        if t is dict:
            stack.extend(x.keys())
            stack.extend(x.values())
        elif t in (list, tuple, set, frozenset):
            stack.extend(x)
    return False


@COMMON
@given(plain, st.integers(2, 5))
def test_plain_values_pickled_at_protocols_2_to_5_read_back_or_are_declined(v, protocol):
    stream = pickle.dumps(v, protocol=protocol)
    if _declined_at(v, protocol):
        assert loads(stream) is NOT_PLAIN
    else:
        check(stream)


@pytest.mark.parametrize("kind", ["list", "tuple", "dict", "frozenset"])
@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_deep_nesting_reads_back_without_recursion(kind, protocol):
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 10_000))  # for pickle.dumps and same(), which recurse; loads does not
    try:
        # A frozenset below protocol 4 pickles through REDUCE, a few C frames a level: 3.12's fixed C stack
        # limit refuses 400 of them. Such a stream names a global, so it is declined at any depth.
        v = _deep(100 if kind == "frozenset" and protocol < 4 else 400, kind)
        stream = pickle.dumps(v, protocol=protocol)
        if _declined_at(v, protocol):
            assert loads(stream) is NOT_PLAIN
        else:
            check(stream)
    finally:
        sys.setrecursionlimit(old)


def test_shared_and_recursive_containers_keep_their_shape():
    inner = [1.5, "x"]
    lst: list = [inner, inner]
    lst.append(lst)
    d: dict = {"self": None, "inner": inner}
    d["self"] = d
    t = ([],)
    t[0].append(t)  # a tuple inside itself: POP_MARK (or POPs) and a GET
    for v in (lst, d, t, [t, t], {"t": t}):
        for protocol in (2, 3, 4, 5):
            stream = pickle.dumps(v, protocol=protocol)
            check(stream)
        check(_casmon_pickle(v))
    got = loads(pickle.dumps(t, protocol=5))
    assert got[0][0] is got
    got = loads(pickle.dumps(lst, protocol=5))
    assert got[0] is got[1] and got[2] is got


@pytest.mark.parametrize("bits", [0x7FF0000000000001, 0xFFF8000000000123, 0x7FF8DEADBEEF0000, 0x7FF4000000000000,
                                  0x8000000000000000, 0x0000000000000001, 0x7FEFFFFFFFFFFFFF])
def test_float_bits_are_kept(bits):
    x = struct.unpack("<d", struct.pack("<Q", bits))[0]
    got = loads(pickle.dumps([x, (x,)], protocol=5))
    want = pickle.loads(pickle.dumps([x, (x,)], protocol=5))
    assert [struct.pack("<d", y) for y in (got[0], got[1][0])] == [struct.pack("<d", y) for y in (want[0], want[1][0])]
    assert struct.pack("<d", got[0]) == struct.pack("<d", x)


def test_large_strings_and_bytes_outside_a_frame_read_back():
    # the C pickler writes a payload of 64 KiB or more after its frame, unframed
    v = ["a" * 70000, b"b" * 70000, "\U0001F600" * 20000, 1 << 600000, [2.5] * 3000]
    for protocol in (3, 4, 5):
        check(pickle.dumps(v, protocol=protocol))
    check(pickle.dumps(v + [bytearray(b"c" * 70000)], protocol=5))
    check(_casmon_pickle(tuple(v)))


# -- what is declined -----------------------------------------------------------------------------------------

class Point:
    def __init__(self, x):
        self.x = x


@pytest.mark.parametrize("value", [Point(1), [1, Point(2)], complex(1, 2), range(3), {"k": Point(3)}, Exception("e"),
                                   slice(1, 2)])
def test_a_pickle_naming_a_global_is_declined(value):
    for protocol in (2, 3, 4, 5):
        assert loads(pickle.dumps(value, protocol=protocol)) is NOT_PLAIN


def test_a_pickle_with_an_out_of_band_buffer_is_declined():
    buffers: list = []
    stream = pickle.dumps([1, pickle.PickleBuffer(b"abc")], protocol=5, buffer_callback=buffers.append)
    assert buffers and loads(stream) is NOT_PLAIN


@pytest.mark.parametrize("stream", [
    b"", b".", b"N", b"NN.", b"(N.", b"N.x", b"\x80\x06N.",  # empty, no value, no STOP, two values, open MARK, trailing, future protocol
    b"K", b"J\x01\x02", b"\x8b\xff\xff\xff\xffN.", b"\x8b\x10\x00\x00\x00\x01.",  # truncated, negative and overlong LONG4
    b"X\xff\xff\xff\x7fab.", b"\x8c\x02\xff\xfe.", b"\x8e\x00\x00\x00\x00\x00\x00\x00\x80.",  # overlong, bad UTF-8
    b"\x95\xff\xff\xff\xff\xff\xff\xff\xffN.",  # a frame longer than the data
    b"h\x00.", b"N\x94h\x01.", b"Nq\x05.", b"Nr\xff\xff\xff\xff.", b"Np1x\nN.", b"Ng0.",  # memo: missing, out of order, text
    b"Na.", b"K\x01K\x02a.", b"K\x01(K\x02e.", b"}K\x01s.", b"}(K\x01u.", b"K\x01(K\x02\x90.",  # underflow, not a list/dict/set
    b"](]\x94e\x8f(h\x00\x90.", b"}(]K\x01u.",  # an unhashable set item or key
    b"\x86.", b"(\x85.", b"0.", b"1.", b"t.",  # a tuple of nothing, POP of nothing, no MARK
    b"cbuiltins\nprint\n.", b"\x8c\x08builtins\x8c\x05print\x93.", b"N\x85R.", b"K\x01Q.", b"\x97.", b"\x82\x01.", b"\xff.",
    b"I1\n.", b"S'a'\n.", b"U\x01a.",  # text and protocol-0/1 strings: pickle's own
])
def test_damaged_or_crafted_streams_are_declined(stream):
    assert loads(stream) is NOT_PLAIN


def _mutate(stream: bytes, data) -> bytes:
    b = bytearray(stream)
    for _ in range(data.draw(st.integers(1, 3))):
        kind = data.draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete"]))
        i = data.draw(st.integers(0, max(0, len(b) - 1)))
        if kind == "flip" and b:
            b[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set" and b:
            b[i] = data.draw(st.integers(0, 255))
        elif kind == "truncate":
            del b[i:]
        elif kind == "insert":
            b[i:i] = data.draw(st.binary(min_size=1, max_size=9))
        elif kind == "delete" and b:
            del b[i:i + data.draw(st.integers(1, 4))]
    return bytes(b)


def _pickle_result(stream: bytes):
    try:
        return pickle.loads(stream)
    except BaseException as e:  # noqa: BLE001 - any failure: the decoder must have declined
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return NOT_PLAIN


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(plain, st.sampled_from(["casmon", 2, 3, 4, 5]), st.data())
def test_mutated_pickles_are_declined_or_read_exactly_as_pickle_reads_them(v, how, data):
    stream = _casmon_pickle(v) if how == "casmon" else pickle.dumps(v, protocol=how)
    mutated = _mutate(stream, data)
    got = loads(mutated)  # never raises: an exception here fails the test
    if got is NOT_PLAIN:
        return
    want = _pickle_result(mutated)
    assert want is not NOT_PLAIN, f"read a stream pickle refuses: {mutated!r}"
    assert same(got, want), mutated
    assert _ids(got) == _ids(want)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=64))
def test_random_bytes_are_declined_or_read_as_pickle_reads_them(raw):
    for stream in (raw, b"\x80\x05" + raw, b"\x80\x05" + raw + b"."):
        got = loads(stream)
        if got is not NOT_PLAIN:
            want = _pickle_result(stream)
            assert want is not NOT_PLAIN and same(got, want), stream


def test_the_work_is_bounded_by_the_streams_length():
    # lengths naming far more than the data, and a memo index naming a huge slot: declined without allocating
    for stream in (b"\x8d" + (1 << 62).to_bytes(8, "little") + b"x.", b"\x96" + (1 << 62).to_bytes(8, "little") + b".",
                   b"N\x72\xff\xff\xff\x7f.", b"\x8b\xff\xff\xff\x7f."):
        assert loads(stream) is NOT_PLAIN
    many = b"\x80\x05" + b"(" * 200_000 + b"N" + b"t" * 200_000 + b"."  # deep tuples, no recursion
    got = loads(many)
    assert type(got) is tuple


def test_bytes_like_input_reads_as_bytes():
    stream = pickle.dumps({"k": [1, 2.5]}, protocol=5)
    assert loads(memoryview(stream)) == {"k": [1, 2.5]}
    assert loads(bytearray(stream)) == {"k": [1, 2.5]}


# -- through the store ----------------------------------------------------------------------------------------

@pytest.fixture(params=["plainpickle", "unpickler"])
def route(request, monkeypatch):
    """Values decoded by plainpickle first (as in a process that has not loaded the C pickler), or by the
    unpickler alone (as once it is loaded); counts plainpickle's answers."""
    from casmon.store import plainpickle

    read = []
    real = plainpickle.loads
    monkeypatch.setattr(serialize, "_plain_first", lambda n: request.param == "plainpickle")
    monkeypatch.setattr(plainpickle, "loads", lambda data: read.append(real(data)) or read[-1])
    return request.param, read


@pytest.mark.parametrize("trust", [True, False])
def test_a_store_reads_plain_pickled_values_alike_trusted_or_not(tmp_path, trust, route):
    values = [5, -(1 << 100), 2.5, -0.0, "s\udc80\U0001F600", b"b", None, True, (1, (2, "x")), frozenset({1, 2}),
              {1: 2.0, (3,): {4}}, [bytearray(b"ab"), {1, 2}]]
    w = casmon.open(tmp_path / "s")
    ds = [w.put(v) for v in values]
    w.close()
    r = casmon.open(tmp_path / "s", trust=trust)
    for v, d in zip(values, ds):
        assert same(r.get(d), v)
    r.close()
    read = [x for x in route[1] if x is not NOT_PLAIN]
    assert len(read) == (len(values) if route[0] == "plainpickle" else 0)


def test_an_untrusted_store_still_refuses_a_pickle_naming_a_global(tmp_path, route):
    w = casmon.open(tmp_path / "s")
    d = w.put(Point(1))
    w.close()
    r = casmon.open(tmp_path / "s", trust=False)
    with pytest.raises(UntrustedStoreError):
        r.get(d)
    r.close()


@pytest.mark.parametrize("trusted", [True, False])
def test_a_damaged_plain_pickle_gets_the_error_it_always_got(trusted, route):
    stream = pickle.dumps([1, 2, 3], protocol=5)
    for bad in (stream[:-3], stream[:-1] + b"\x00", b"\x80\x05h\x07."):
        enc = serialize.Encoded("pickle", {"oob": 0}, inline=bad)
        with pytest.raises(DamagedObjectError):
            serialize.decode(enc, [], trusted=trusted, key="v")


def test_a_long_plain_pickle_or_one_in_a_process_with_the_c_pickler_is_read_by_it():
    assert serialize._plain_first(serialize.PLAIN_MAX) is ("_pickle" not in sys.modules)
    assert not serialize._plain_first(serialize.PLAIN_MAX + 1)


def test_loading_serialize_and_decoding_a_plain_value_loads_no_pickle_module():
    code = textwrap.dedent("""
        import json, sys
        from casmon.store import serialize
        enc = serialize.Encoded("pickle", {"oob": 0}, inline=%r)
        v = serialize.decode(enc, [], trusted=False)
        print(json.dumps([v, [m for m in ("pickle", "_pickle", "_compat_pickle", "casmon.keys.cpickle") if m in sys.modules]]))
    """ % (pickle.dumps({"a": (1, 2.5)}, protocol=5),))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == '[{"a": [1, 2.5]}, []]'
