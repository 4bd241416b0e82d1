"""A runs index file damaged or crafted anywhere (bytes flipped; any column replaced by other values, lengths
or bytes, or any entry's fields replaced, under a checksum that matches) is ignored or has its odd entries
left out: decoding it raises only DamagedObjectError, and a listing through it shows each run without
raising."""

import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import casmon
from casmon.errors import DamagedObjectError
from casmon.runs import index

pytestmark = [pytest.mark.filterwarnings("ignore::casmon.RunWarning"),
              pytest.mark.filterwarnings("ignore::RuntimeWarning")]  # crafted columns: NaN cast to int

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=40),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
                     max_leaves=12)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "s"
    s = casmon.open(path, create=True)
    for i in range(3):
        with casmon.record(store=s, capture_output=False) as run:
            run.params = {"lr": 0.1 * i, "cfg": {"depth": i}}
            run.tags = ["t"]
            run.log(loss=1.0 / (i + 1), acc=float("nan"))
    entries, _d, _ok = index.load(s)
    return path, index.encode(entries)


def _use(path, raw, monkeypatch):
    import casmon.store.backend.local as local

    old = time.time_ns() - 3600 * 10**9
    monkeypatch.setattr(local, "_stamp_of", lambda st: f"{st.st_ino:x}.{old:x}.{old:x}.{st.st_size:x}")
    s = casmon.open(path, read_only=True)
    entries = {}
    try:
        entries = index.decode(raw, "base")
    except DamagedObjectError:
        pass
    stamps = s.backend.list_stamped("refs/runs/")
    for name, e in entries.items():
        e[0] = stamps.get("refs/" + name, e[0])  # as if made when the refs were: used as they are
    (path / "runs-index").mkdir(exist_ok=True)
    index._read.clear()
    (path / "runs-index" / "base").write_bytes(index.encode(entries) if entries else raw)
    for r in casmon.list_runs(s):
        r.name, r.status, r.tags, r.note, r.params(), r.flat_params(), r.metric_summary(), r.elapsed, r.resumes
        r.information(), r.info_cells(), repr(r)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_flipped_index_file_is_ignored_or_decoded_never_a_crash(made, data):
    _path, raw = made
    b = bytearray(raw)
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(b) - 1))
        b[at] ^= data.draw(st.integers(1, 255))
    try:
        index.decode(bytes(b), "base")
    except DamagedObjectError:
        pass


_ARRAYS = st.one_of(
    st.lists(st.floats(), max_size=40).map(lambda v: np.array(v, "<f8")),
    st.lists(st.integers(-2**63, 2**63 - 1), max_size=40).map(lambda v: np.array(v, "<i8")),
    st.binary(max_size=300).map(lambda b: np.frombuffer(b, "u1")))


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_crafted_index_column_under_a_sound_checksum_is_shown_without_raising(made, data, monkeypatch):
    path, raw = made
    cols = index.columns(raw, "base")
    a = dict(cols.a)
    for _ in range(data.draw(st.integers(1, 3))):
        name = data.draw(st.sampled_from(sorted(a)))
        a[name] = data.draw(_ARRAYS)
    n = data.draw(st.sampled_from([cols.n, cols.n + 1, max(0, cols.n - 1)]))
    _use(path, index.pack(n, cols.metrics, cols.statuses, a), monkeypatch)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_crafted_index_entry_under_a_sound_checksum_is_shown_without_raising(made, data, monkeypatch):
    path, raw = made
    entries = index.decode(raw, "base")
    for _ in range(data.draw(st.integers(1, 3))):
        e = entries[data.draw(st.sampled_from(sorted(entries)))]
        at = data.draw(st.sampled_from([2, 3, 5, 6, 8]))
        if at == 2:
            e[2] = json.dumps(data.draw(_JSON)) if data.draw(st.booleans()) else data.draw(st.text(max_size=40))
        elif at == 3:
            e[3] = {"heartbeat": data.draw(st.floats())}
        elif at in (5, 8):
            e[at] = data.draw(st.floats(0, 1e11 - 1))
        else:
            e[6] = data.draw(st.text(max_size=20))
    try:
        crafted = index.encode(entries)
    except (ValueError, TypeError, UnicodeEncodeError):
        return
    _use(path, crafted, monkeypatch)
