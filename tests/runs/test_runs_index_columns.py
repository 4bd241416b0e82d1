"""The runs index's binary columns, damaged or crafted one at a time: bits flipped in each column, the file cut
short, a column of the wrong length, NaN or infinity where a time must be, a name's offset past its blob. Each
such file is rebuilt or bypassed: a listing shows what the runs' refs and manifests say and never raises."""

import shutil
import time

import numpy as np
import pytest

import casmon
from casmon.errors import DamagedObjectError
from casmon.runs import index
from benchmarks.runs_store import build

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")

COLUMNS = [c[0] for c in index.COLUMNS]


def _view(runs):
    return [(r.ref, r.name, r.status, r.manifest.get("start"), r.params(), r.metric_summary(),
             r.manifest.get("tags")) for r in runs]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A store of 12 ended runs, the listing without an index, and a sound index file of them."""
    path = tmp_path_factory.mktemp("cols") / "s"
    build(str(path), 12, metrics=3, points=10)
    direct = _view(casmon.list_runs(casmon.open(path, read_only=True)))
    casmon.list_runs(casmon.open(path))
    return path, direct, (path / "runs-index" / "base").read_bytes()


@pytest.fixture
def store(made, tmp_path, monkeypatch):
    """A copy of the store whose refs are settled (an entry whose stamp matches is used as it is)."""
    import casmon.store.backend.local as local

    path, direct, raw = made
    old = time.time_ns() - 3600 * 10**9
    monkeypatch.setattr(local, "_stamp_of", lambda st: f"{st.st_ino:x}.{old:x}.{old:x}.{st.st_size:x}")
    copy = tmp_path / "s"
    shutil.copytree(path, copy)
    shutil.rmtree(copy / "runs-index")
    casmon.list_runs(casmon.open(copy))  # the index, made under this clock
    index._read.clear()
    return copy, direct


def _listed_after(path, raw):
    (path / "runs-index" / "base").write_bytes(raw)
    index._read.clear()
    return _view(casmon.list_runs(casmon.open(path)))


def _crafted(raw, **cols):
    c = index.columns(raw, "base")
    a = dict(c.a)
    a.update(cols)
    return index.pack(c.n, c.metrics, c.statuses, a)


def _sound(path):
    return (path / "runs-index" / "base").read_bytes()


@pytest.mark.parametrize("column", COLUMNS)
def test_a_bit_flipped_in_any_column_is_caught_and_the_index_rebuilt(store, column):
    path, direct = store
    raw = _sound(path)
    c = index.columns(raw, "base")
    head = len(raw) - sum(len(bytes(np.ascontiguousarray(v))) + (-len(bytes(np.ascontiguousarray(v))) % 8)
                          for v in c.a.values())
    at = head + sum(len(bytes(np.ascontiguousarray(c.a[n]))) + (-len(bytes(np.ascontiguousarray(c.a[n]))) % 8)
                    for n in COLUMNS[:COLUMNS.index(column)])
    if not len(c.a[column]):
        pytest.skip(f"{column} is empty in this store")
    b = bytearray(raw)
    b[at] ^= 0x04
    with pytest.raises(DamagedObjectError, match="checksum"):
        index.decode(bytes(b), "base")
    assert _listed_after(path, bytes(b)) == direct
    index.decode(_sound(path), "base")  # rebuilt


@pytest.mark.parametrize("cut", [1, 8, 100, 0.5])
def test_an_index_file_cut_short_is_caught_and_rebuilt(store, cut):
    path, direct = store
    raw = _sound(path)
    short = raw[: int(len(raw) * cut)] if type(cut) is float else raw[:-cut]
    assert _listed_after(path, short) == direct
    index.decode(_sound(path), "base")


@pytest.mark.parametrize("column", COLUMNS)
def test_a_column_of_the_wrong_length_under_a_sound_checksum_is_not_used(store, column):
    path, direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a[column]
    for bad in (v[:-1], np.concatenate([v, v[-1:] if len(v) else np.zeros(1, v.dtype)])):
        crafted = _crafted(raw, **{column: bad})
        with pytest.raises(DamagedObjectError):
            index.decode(crafted, "base")
        assert _listed_after(path, crafted) == direct


@pytest.mark.parametrize("column", ["start", "end", "at", "heartbeat", "time"])
@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf, -1.0, 1e12])
def test_a_time_that_is_not_one_under_a_sound_checksum_is_not_used(store, column, value):
    path, direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a[column].copy()
    v[len(v) // 2] = value
    crafted = _crafted(raw, **{column: v})
    if column == "end" and value != value or column == "heartbeat" and value != value:
        index.decode(crafted, "base")  # no end, no heartbeat: what such a run has
    else:
        with pytest.raises(DamagedObjectError):
            index.decode(crafted, "base")
    assert _listed_after(path, crafted) == direct


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_a_non_finite_metric_value_in_the_columns_reads_back_as_that_float(store, value):
    """A metric's last, min or max may be NaN or infinite (a run logged it): such a file is sound and its
    cells read back as such floats."""
    path, _direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a["last"].copy()
    v[0] = value
    got = index.decode(_crafted(raw, last=v), "base")
    first = got[index.columns(raw, "base").keys[0]]
    cell = next(iter(index.summary(first).values()))
    assert cell["last"] is not None and (cell["last"] != cell["last"] if value != value else cell["last"] == value)


@pytest.mark.parametrize("offsets", ["key_off", "stamp_off", "slim_off", "name_off", "cell_off", "fcell_off", "tag_off",
                                     "fname_off", "text_off"])
@pytest.mark.parametrize("how", ["past the end", "backwards", "not from zero"])
def test_an_offset_out_of_range_under_a_sound_checksum_is_not_used(store, offsets, how):
    path, direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a[offsets].copy()
    if how == "past the end":
        v[len(v) // 2] = v[-1] + 1000
    elif how == "backwards":
        v[1], v[2] = v[2], v[1] - 1
    else:
        v[0] = 1
    crafted = _crafted(raw, **{offsets: v})
    with pytest.raises(DamagedObjectError):
        index.decode(crafted, "base")
    assert _listed_after(path, crafted) == direct


@pytest.mark.parametrize("column,value", [("status", 999), ("metric", 999), ("count", -1), ("has_digest", 2),
                                          ("flag", 8), ("field", 999), ("fkind", 9), ("tag", 999)])
def test_a_code_out_of_range_under_a_sound_checksum_is_not_used(store, column, value):
    path, direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a[column].copy()
    v[0] = value
    crafted = _crafted(raw, **{column: v})
    with pytest.raises(DamagedObjectError):
        index.decode(crafted, "base")
    assert _listed_after(path, crafted) == direct


def test_a_header_that_places_columns_past_the_end_or_says_running_is_not_used(store):
    path, direct = store
    raw = _sound(path)
    c = index.columns(raw, "base")
    for crafted in (index.pack(c.n, c.metrics, [*c.statuses[:-1], "running"], dict(c.a)),
                    index.pack(c.n + 5, c.metrics, c.statuses, dict(c.a)),
                    index.pack(c.n, c.metrics[:1], c.statuses, dict(c.a))):
        with pytest.raises(DamagedObjectError):
            index.decode(crafted, "base")
        assert _listed_after(path, crafted) == direct


def test_a_name_crafted_under_a_sound_checksum_that_is_not_text_is_not_used(store):
    path, direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a["name"].copy()
    v[0] = 0xFF
    crafted = _crafted(raw, name=v)
    with pytest.raises(DamagedObjectError):
        index.decode(crafted, "base")
    assert _listed_after(path, crafted) == direct


@pytest.mark.parametrize("kind,value", [(1, 0.5), (1, 2.0**60), (2, 3.0), (3, None)])
def test_a_parameter_cell_its_kind_cannot_hold_under_a_sound_checksum_is_not_used(store, kind, value):
    """An integer that is not one (or past what a float holds exactly), a yes/no that is neither, text past the
    texts: the file is rebuilt, never a cell the run's manifest does not hold."""
    path, direct = store
    raw = _sound(path)
    a = index.columns(raw, "base").a
    at = int(np.flatnonzero(a["fkind"] == 1)[0])
    kinds, nums, codes = a["fkind"].copy(), a["fnum"].copy(), a["fstr"].copy()
    kinds[at] = kind
    if value is None:
        codes[at] = len(index.columns(raw, "base").texts)
    else:
        nums[at] = value
    crafted = _crafted(raw, fkind=kinds, fnum=nums, fstr=codes)
    with pytest.raises(DamagedObjectError):
        index.decode(crafted, "base")
    assert _listed_after(path, crafted) == direct


def test_a_run_s_metric_cells_sliced_for_a_page_are_those_made_for_a_listing(made):
    _path, _direct, raw = made
    sliced = index.columns(raw, "base")
    every = index.columns(raw, "base")
    every.cells()
    for i in range(sliced.n):
        got, want = sliced.summary(i), every.summary(i)
        assert got == want and [type(v) for c in got.values() for v in c.values()] == [
            type(v) for c in want.values() for v in c.values()]


@pytest.mark.parametrize("column", ["target", "digest"])
@pytest.mark.parametrize("byte", [ord("g"), ord("A"), ord("/"), ord(":"), 0, 0xFF])
def test_a_digest_that_is_not_lowercase_hex_under_a_sound_checksum_is_not_used(store, column, byte):
    path, direct = store
    raw = _sound(path)
    v = index.columns(raw, "base").a[column].copy()
    v[len(v) // 2] = byte
    crafted = _crafted(raw, **{column: v})
    with pytest.raises(DamagedObjectError):
        index.decode(crafted, "base")
    assert _listed_after(path, crafted) == direct


def test_a_fold_copies_each_run_s_parameter_cells_and_tags_as_its_manifest_gives_them(made):
    """A new base copies the parameter, info and tag columns of the file it folds; they are what each run's
    manifest text makes of them."""
    _path, _direct, raw = made
    first = index.columns(raw, "base")
    again = index.columns(index.encode(index.decode(raw, "base")), "base")
    entries = index.decode(raw, "base")
    for i, k in enumerate(first.keys):
        e = entries[k]
        flag, cells, tags = index.flat(index.slim(e, "test"), e[2])
        assert flag == 0 and first.flat_rows()[i] == cells == again.flat_rows()[again.keys.index(k)]
        assert first.tags(i) == tags == again.tags(again.keys.index(k)) and tags
