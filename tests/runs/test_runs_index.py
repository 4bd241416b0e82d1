"""The runs index is derived data: listings through it agree with the runs, deleting or damaging it loses
nothing, a stale or crafted entry loses to the run's own ref, and writers killed while it is updated leave
listings true."""

import json
import os
import shutil
import subprocess

import pytest

import casmon
from casmon.runs import index
from casmon.runs.listing import IndexedManifest
from benchmarks.runs_store import build
from tests.support.processes import ENV, PY

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


def _raw_doc(base):
    """An index file's entries as stored (each manifest as text, its metric cells not yet read)."""
    return {"runs": index.decode(base.read_bytes(), "base")}


def _write_doc(base, doc):
    """``doc``'s entries as a sound index file (a crafted one: its checksum matches)."""
    base.write_bytes(index.encode(doc["runs"]))
    index._read.clear()


def _view(runs):
    return [(r.ref, r.name, r.status, r.manifest.get("start"), r.params(), r.metric_summary(),
             r.manifest.get("tags")) for r in runs]


def _direct(path):
    """The listing with no index at all (read from every ref and manifest)."""
    shutil.rmtree(path / "runs-index", ignore_errors=True)
    s = casmon.open(path, read_only=True)  # read-only: it writes no index either
    return _view(casmon.list_runs(s))


#: File clocks whose tick is long over (every entry settled: its stamp alone is trusted) or not over yet (no entry
#: settled: each run's ref is read and its entry used while the ref names the same manifest).
TICKS = {"settled": -3600, "unsettled": 3600}


@pytest.fixture
def many(tmp_path):
    path = tmp_path / "s"
    build(str(path), 60, metrics=3, points=20)
    return path


def test_a_listing_through_the_index_is_the_listing_without_it(many):
    direct = _direct(many)
    s = casmon.open(many)
    first = _view(casmon.list_runs(s))  # reads every run, writes the index
    assert (many / "runs-index" / "base").exists()
    second = casmon.list_runs(s)
    assert all(isinstance(r.manifest, IndexedManifest) for r in second)
    assert _view(second) == first == direct


def test_fields_the_index_leaves_out_are_read_from_the_manifest(many):
    s = casmon.open(many)
    casmon.list_runs(s)
    r = casmon.list_runs(s)[3]
    assert isinstance(r.manifest, IndexedManifest)
    assert r.manifest.get("argv") == ["train.py"] and r.manifest["cwd"] == "/work/project"
    full = json.loads(json.dumps(r.manifest))
    assert full["links"] == {"call_sessions": [], "cache": []} and "metrics" in full and full["name"] == r.name


def test_deleting_or_damaging_the_index_loses_nothing_and_it_is_rebuilt(many):
    direct = _direct(many)
    s = casmon.open(many)
    casmon.list_runs(s)
    base = many / "runs-index" / "base"
    raw = bytearray(base.read_bytes())
    raw[len(raw) // 2] ^= 0x20
    base.write_bytes(bytes(raw))
    assert _view(casmon.list_runs(s)) == direct
    index.decode(base.read_bytes(), "base")  # rebuilt: sound again
    shutil.rmtree(many / "runs-index")
    assert _view(casmon.list_runs(s)) == direct


@pytest.mark.parametrize("clock", TICKS)
def test_a_crafted_index_entry_is_not_used_and_the_run_read_from_its_ref(many, monkeypatch, clock):
    import time

    _coarse_clock(monkeypatch, time.time_ns() + TICKS[clock] * 10**9)
    direct = _direct(many)
    s = casmon.open(many)
    casmon.list_runs(s)
    base = many / "runs-index" / "base"
    doc = _raw_doc(base)
    entries = doc["runs"]
    names = sorted(entries)

    def slim(i, **change):
        m = json.loads(entries[names[i]][2])
        m.update(change)
        entries[names[i]][2] = json.dumps(m)

    slim(0, start="yesterday")  # a type no manifest has
    slim(2, status="running")  # a run the index never holds
    slim(3, params=[1, 2])
    slim(4, git={"commit": 7})
    entries[names[5]][2] = "{not json"
    entries[names[6]][2] = "[1, 2]"
    slim(7, start=1.0)  # not the start the entry is listed by
    slim(8, metrics={"loss": {}})
    entries[names[1]][4] = [["loss"], ["not a digest"], 10 ** 9]
    entries["runs/999"] = entries[names[9]]  # a run that does not exist
    _write_doc(base, doc)
    runs = casmon.list_runs(s)
    assert len(runs) == 60 and "runs/999" not in [r.ref for r in runs]
    assert _view(runs) == direct  # each crafted field read from the stored manifest instead
    odd = [r for r in runs if r.ref == names[1]][0]
    assert odd.metric_summary()["loss"]["n"] == 20  # read from its manifest: the crafted columns are left out
    json.dumps(casmon.list_runs(s)[0].manifest)  # whole, as a stored manifest


def test_a_crafted_entry_whose_stored_manifest_is_gone_lists_the_run_as_unreadable(many, monkeypatch):
    import time

    _coarse_clock(monkeypatch, time.time_ns() - 3600 * 10**9)  # settled refs: the entries are used as they are
    s = casmon.open(many)
    casmon.list_runs(s)
    base = many / "runs-index" / "base"
    doc = _raw_doc(base)
    doc["runs"]["runs/5"][1] = "0" * 32  # a manifest the store does not hold
    doc["runs"]["runs/5"][2] = "{}"
    _write_doc(base, doc)
    r = {r.ref: r for r in casmon.list_runs(casmon.open(many, read_only=True))}["runs/5"]
    assert r.status == "unreadable" and r.name == "5" and "no value" in str(r.manifest.error)
    assert r.metric_summary()["loss"]["n"] == 20  # the columns were sound


def test_a_stale_entry_loses_to_the_runs_own_ref(many):
    s = casmon.open(many)
    casmon.list_runs(s)
    target = casmon.list_runs(s)[0]
    other = casmon.list_runs(s)[1]
    ref = s.get_ref(other.ref)
    s.set_ref(target.ref, ref.target, ref.data)  # a re-tag or resume writes a new manifest to the ref
    casmon.delete_run(casmon.list_runs(s)[2].ref, s)
    runs = {r.ref: r for r in casmon.list_runs(s)}
    assert runs[target.ref].manifest.get("name") == other.name
    assert len(runs) == 59


def test_an_ended_run_leaves_a_delta_that_the_next_listing_uses(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    with casmon.record(store=s, capture_output=False) as run:
        run.params = {"lr": 0.1}
        run.log(loss=0.5)
    deltas = [f for f in os.listdir(tmp_path / "s" / "runs-index") if f.startswith("d-")]
    assert len(deltas) == 1
    r = casmon.list_runs(s)[0]
    assert isinstance(r.manifest, IndexedManifest) and r.params() == {"lr": 0.1}
    assert r.metric_summary()["loss"]["last"] == 0.5


LISTER = """
import sys, casmon
from casmon import faultpoints
faultpoints.configure(sys.argv[2])
casmon.list_runs(casmon.open(sys.argv[1]))
"""


@pytest.mark.parametrize("point", ["index.base_written", "local.partial_written"])
def test_a_lister_killed_while_it_writes_the_index_leaves_listings_true(many, point):
    direct = _direct(many)
    p = subprocess.run([PY, "-c", LISTER, str(many), f"{point}=kill"], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stderr
    s = casmon.open(many)
    assert _view(casmon.list_runs(s)) == direct
    assert _view(casmon.list_runs(s)) == direct


def test_runs_killed_while_they_write_their_index_delta_leave_listings_true(tmp_path):
    path = tmp_path / "s"
    code = """
import sys, casmon
from casmon import faultpoints
s = casmon.open(sys.argv[1], create=True)
with casmon.record(store=s, capture_output=False) as run:
    run.log(loss=1.0)
    faultpoints.configure(sys.argv[2])
"""
    for point in ("index.delta_written=kill", "local.partial_written@2=kill", ""):
        subprocess.run([PY, "-c", code, str(path), point], env=ENV, capture_output=True, timeout=300)
    s = casmon.open(path)
    listed = _view(casmon.list_runs(s))
    assert listed == _direct(path)
    assert len(listed) == 3


def test_a_base_read_once_is_read_again_only_once_it_changes(many):
    s = casmon.open(many)
    first = _view(casmon.list_runs(s))
    base = many / "runs-index" / "base"
    r = casmon.list_runs(s)[0]
    r.manifest["name"] = "changed by the caller"  # a caller's change stays in its own copy
    r.metric_summary()["loss"]["last"] = -1.0
    assert _view(casmon.list_runs(s)) == first
    raw = bytearray(base.read_bytes())
    raw[len(raw) // 2] ^= 0x20  # a new base (damaged): read again, ignored, rebuilt
    base.write_bytes(bytes(raw))
    assert _view(casmon.list_runs(s)) == first
    index.decode(base.read_bytes(), "base")


def test_an_entry_whose_manifest_cannot_be_read_hides_no_run(many, monkeypatch):
    import time

    from tests.support.cli import cli

    _coarse_clock(monkeypatch, time.time_ns() - 3600 * 10**9)  # settled refs: their entries used as they are
    s = casmon.open(many)
    casmon.list_runs(s)
    base = many / "runs-index" / "base"
    doc = _raw_doc(base)
    doc["runs"]["runs/5"][1] = "0" * 32  # a manifest the store does not hold
    _write_doc(base, doc)
    runs = {r.ref: r for r in casmon.list_runs(casmon.open(many, read_only=True))}
    r = runs["runs/5"]
    assert r.manifest.get("argv") is None and "no value" in str(r.manifest.error)
    assert r.status == "unreadable" and r.error is r.manifest.error and r.name == "5"
    out = cli("runs", "--store", str(many))
    assert "60" in out.stdout and out.returncode == 0


@pytest.mark.parametrize("clock", TICKS)
def test_a_run_whose_stored_manifest_is_damaged_is_listed_through_the_index_as_without_it(many, monkeypatch, clock):
    """The index holds a copy of the manifest's listed fields; once the stored manifest is found damaged (any
    field the copy lacks read), the run is what a listing without the index makes of it, and so is every later
    listing of the process."""
    import time

    from casmon.errors import DamagedObjectError
    from casmon.runs import listing

    _coarse_clock(monkeypatch, time.time_ns() + TICKS[clock] * 10**9)
    s = casmon.open(many)
    casmon.list_runs(s)
    bad = s.get_ref("runs/5").target.hex()
    real = listing.load_data

    def load_data(store, digest, what, types):
        if digest == bad:
            raise DamagedObjectError(f"value {bad}", "its content does not match its digest")
        return real(store, digest, what, types)

    monkeypatch.setattr(listing, "load_data", load_data)
    direct = {v[0]: v for v in _direct_keeping_index(many)}
    assert direct["runs/5"][2] == "unreadable"
    r = {r.ref: r for r in casmon.list_runs(casmon.open(many))}["runs/5"]
    assert r.manifest.get("argv") is None  # a field only the stored manifest holds: it is damaged
    assert (r.ref, r.name, r.status) == direct["runs/5"][:3] and isinstance(r.error, DamagedObjectError)
    again = {v[0]: v for v in _view(casmon.list_runs(casmon.open(many)))}
    assert again["runs/5"][:4] == direct["runs/5"][:4]
    assert {k: v for k, v in again.items() if k != "runs/5"} == {k: v for k, v in direct.items() if k != "runs/5"}
    # Another process (nothing of this one's kept): the index no longer holds the run, which is read directly.
    listing._unreadable.clear()
    index._read.clear()
    assert "runs/5" not in index.decode((many / "runs-index" / "base").read_bytes(), "base")
    other = {v[0]: v for v in _view(casmon.list_runs(casmon.open(many, read_only=True)))}
    assert other["runs/5"][:4] == direct["runs/5"][:4]


def _direct_keeping_index(path):
    """The listing with every ref and manifest read (the index kept aside, then put back)."""
    aside = path.parent / "index-aside"
    shutil.move(path / "runs-index", aside)
    try:
        return _view(casmon.list_runs(casmon.open(path, read_only=True)))
    finally:
        shutil.move(aside, path / "runs-index")
        index._read.clear()


@pytest.mark.parametrize("clock", TICKS)
def test_a_listing_through_the_index_reads_an_entrys_manifest_only_when_a_field_of_it_is_read(many, monkeypatch,
                                                                                               clock):
    import time

    _coarse_clock(monkeypatch, time.time_ns() + TICKS[clock] * 10**9)
    s = casmon.open(many)
    casmon.list_runs(s)
    parsed = []
    real = index.slim
    monkeypatch.setattr(index, "slim", lambda e, where: parsed.append(where) or real(e, where))
    runs = casmon.list_runs(s)
    assert [r.metric_summary()["loss"]["n"] for r in runs] == [20] * 60
    assert parsed == []  # the order and every run's metrics from the index's columns alone
    assert runs[7].name == "8" and runs[7].status == "failed" and len(parsed) == 1


def _coarse_clock(monkeypatch, tick):
    """The local medium as a filesystem whose timestamps stay at ``tick`` (a clock tick longer than the test:
    FAT, ext3 or an NFS server with whole seconds), so a file rewritten in place keeps its stamp."""
    import casmon.store.backend.local as local

    def stamp_of(st):
        return f"{st.st_ino:x}.{tick:x}.{tick:x}.{st.st_size:x}"

    monkeypatch.setattr(local, "_stamp_of", stamp_of)


def test_a_ref_rewritten_within_its_filesystems_clock_tick_is_read_not_taken_from_the_index(many, monkeypatch):
    import time

    _coarse_clock(monkeypatch, time.time_ns() + 3600 * 10**9)  # the tick is not over yet
    s = casmon.open(many)
    casmon.list_runs(s)
    casmon.list_runs(s)
    refs = sorted((many / "refs" / "runs").iterdir())
    same = [p for p in refs[1:] if p.stat().st_size == refs[0].stat().st_size]
    stamp = s.backend.stamp("refs/runs/" + refs[0].name)
    with open(refs[0], "r+b") as f:  # the same inode, size and tick: inode reuse or an in-place rewrite
        f.write(same[0].read_bytes())
    assert s.backend.stamp("refs/runs/" + refs[0].name) == stamp
    listed = _view(casmon.list_runs(s))
    assert listed == _direct(many)
    assert [v for v in listed if v[0] == "runs/" + refs[0].name][0][1] == same[0].name


def test_entries_whose_refs_are_older_than_the_clocks_tick_are_used_without_reading_the_ref(many, monkeypatch):
    import time

    _coarse_clock(monkeypatch, time.time_ns() - 3600 * 10**9)
    s = casmon.open(many)
    first = _view(casmon.list_runs(s))
    casmon.list_runs(s)
    monkeypatch.setattr(type(s), "get_ref", lambda *a, **k: pytest.fail("a settled entry's ref was read"))
    assert _view(casmon.list_runs(s)) == first


def _touch(path):
    with open(path, "w") as f:
        f.write("unpickled")
    return path


class Boom:
    """Unpickling it writes a file: a value that would run code if anything loaded it."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (_touch, (self.path,))


def test_a_crafted_index_with_a_sound_checksum_makes_casmon_run_no_code(many, monkeypatch, tmp_path):
    """An unkeyed checksum lets whoever writes the store write an index that lies, as they could write a
    manifest that lies: what it names is described, never unpickled, in every view."""
    import time

    from casmon.ui.model import RunIndex
    from casmon.ui.table import runs_view
    from tests.support.cli import cli

    _coarse_clock(monkeypatch, time.time_ns() - 3600 * 10**9)  # settled refs: the entries are used as they are
    marker = tmp_path / "ran.txt"
    s = casmon.open(many, trust=True)  # even a trusting reader: a listing loads no value
    casmon.list_runs(s)
    bomb = s.put(Boom(str(marker))).hex()
    s.flush()
    base = many / "runs-index" / "base"
    doc = _raw_doc(base)
    for name in ("runs/3", "runs/4"):
        m = json.loads(doc["runs"][name][2])
        m["params"] = {"lr": {"$": bomb}, "cfg": {"model": {"$": bomb}}}
        m["info"] = {"model": {"$": bomb}}
        m["git"] = {"commit": "0" * 40, "patch": bomb}
        m["name"] = doc["runs"][name][6] = "lied"
        doc["runs"][name][2] = json.dumps(m)
    _write_doc(base, doc)
    runs = {r.ref: r for r in casmon.list_runs(casmon.open(many))}
    r = runs["runs/3"]
    assert r.name == "lied"  # a writer of the store can make it lie, as with a manifest
    r.params(), r.flat_params(), r.info_cells(), r.information(), repr(r), r._repr_html_()
    with pytest.raises(casmon.CasmonError):
        r.patch()
    casmon.list_runs(casmon.open(many)).to_pandas()
    out = cli("runs", "--store", str(many))
    assert out.returncode == 0 and "lied" in out.stdout
    idx = RunIndex(casmon.open(many))
    try:
        for sort in ("param.lr", "info.model", "start"):
            runs_view(idx, sort=sort, q="lr>0 or status=ok")
    finally:
        idx.stop()
    assert not marker.exists()


FOLDER = """
import sys, casmon
from casmon.runs import index
index.FOLD_AT = 1  # every listing that read a run writes a new base and folds the deltas
s = casmon.open(sys.argv[1])
for _ in range(int(sys.argv[2])):
    runs = casmon.list_runs(s)
    assert len({r.ref for r in runs}) == len(runs)
"""

ENDER = """
import sys, casmon
s = casmon.open(sys.argv[1])
for i in range(int(sys.argv[2])):
    with casmon.record(store=s, capture_output=False) as run:
        run.params = {"i": i, "who": sys.argv[3]}
        run.log(loss=float(i))
"""


def test_processes_folding_deltas_at_once_while_runs_end_leave_listings_true(many):
    procs = [subprocess.Popen([PY, "-c", FOLDER, str(many), "15"], env=ENV, stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    procs += [subprocess.Popen([PY, "-c", ENDER, str(many), "6", w], env=ENV, stderr=subprocess.PIPE, text=True)
              for w in "ab"]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()
    s = casmon.open(many)
    listed = _view(casmon.list_runs(s))
    assert listed == _direct(many) and len(listed) == 72


@pytest.mark.parametrize("clock", TICKS)
def test_a_callers_change_to_a_listed_runs_nested_fields_stays_in_its_own_copy(many, monkeypatch, clock):
    import time

    _coarse_clock(monkeypatch, time.time_ns() + TICKS[clock] * 10**9)  # settled: the base is read once, then kept
    s = casmon.open(many)
    first = _view(casmon.list_runs(s))
    casmon.list_runs(s)
    r = casmon.list_runs(s)[0]
    assert isinstance(r.manifest, IndexedManifest)
    r.manifest["params"]["lr"] = -1.0
    r.manifest["params"]["model"]["depth"] = -1
    r.manifest["tags"].append("changed")
    r.ref_data["heartbeat"] = 0.0
    assert _view(casmon.list_runs(s)) == first
    assert casmon.load_run(r.ref, s).params() == first[0][4]
    assert casmon.list_runs(s)[0].ref_data.get("heartbeat") != 0.0


@pytest.mark.parametrize("clock", TICKS)
def test_a_listed_manifest_reads_back_what_the_caller_set_as_a_dict_does(many, monkeypatch, clock):
    import time

    _coarse_clock(monkeypatch, time.time_ns() + TICKS[clock] * 10**9)
    s = casmon.open(many)
    casmon.list_runs(s)
    m = casmon.list_runs(s)[0].manifest
    assert isinstance(m, IndexedManifest)
    mine = {"a": 1}
    m["params"] = mine
    m.update(info=mine)
    m |= {"tags": [mine]}
    mine["b"] = 2
    assert m["params"] is mine and m.get("info") is mine and m["tags"][0] is mine
    assert m.setdefault("extra", mine) is mine and m["extra"] is mine
    assert m.get("params") is m.get("params") and m.get("links") is m.get("links")
    assert json.loads(json.dumps(m))["params"] == {"a": 1, "b": 2}


def test_an_entry_made_by_a_clock_ahead_of_the_readers_is_not_taken_as_settled_early(many, monkeypatch):
    import time

    _coarse_clock(monkeypatch, time.time_ns() + 3600 * 10**9)  # a ref written (by the file clock) just now
    s = casmon.open(many)
    casmon.list_runs(s)
    base = many / "runs-index" / "base"
    doc = _raw_doc(base)
    for e in doc["runs"].values():
        e[8] = time.time() + 86400.0  # made by a machine whose clock is a day ahead
    _write_doc(base, doc)
    index._read.clear()  # the frozen clock keeps the base's stamp: read it again
    refs = sorted((many / "refs" / "runs").iterdir())
    same = [p for p in refs[1:] if p.stat().st_size == refs[0].stat().st_size]
    stamp = s.backend.stamp("refs/runs/" + refs[0].name)
    with open(refs[0], "r+b") as f:  # rewritten in place within the tick: the stamp stays
        f.write(same[0].read_bytes())
    assert s.backend.stamp("refs/runs/" + refs[0].name) == stamp
    assert _view(casmon.list_runs(s)) == _direct(many)


def test_an_index_file_of_an_older_format_is_not_read_and_is_rebuilt(many):
    """A format-6 file (JSON entries) is ignored, never misread as today's columns."""
    import xxhash

    s = casmon.open(many)
    direct = _view(casmon.list_runs(s))
    base = many / "runs-index" / "base"
    body = json.dumps({"runs": {}, "f": "", "i": ""}).encode()
    base.write_bytes(b"casmon-runs-index 6 " + xxhash.xxh3_128_hexdigest(body).encode() + b"\n" + body)
    with pytest.raises(casmon.errors.DamagedObjectError):
        index.decode(base.read_bytes(), "base")
    index._read.clear()
    assert _view(casmon.list_runs(s)) == direct
    assert len(index.decode(base.read_bytes(), "base")) == 60  # rebuilt in today's format


ENDED = """
import sys, casmon
s = casmon.open(sys.argv[1])
for i in range(int(sys.argv[2])):
    with casmon.record(store=s, capture_output=False) as run:
        run.params = {"i": i}
        run.log(loss=float(i))
"""


@pytest.mark.parametrize("point", ["index.base_written", "index.delta_deleted@3"])
def test_a_lister_killed_after_it_wrote_a_base_and_before_it_deleted_the_deltas_leaves_listings_true(many, point):
    """Runs ended since the base was written left deltas; a listing folds them into a new base and is killed
    before (or while) it deletes them: the next listings read the base and the deltas left, and agree."""
    p = subprocess.run([PY, "-c", ENDED, str(many), "5"], env=ENV, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    deltas = [f for f in os.listdir(many / "runs-index") if f.startswith("d-")]
    assert len(deltas) == 5
    code = "import sys, casmon\nfrom casmon import faultpoints\nfrom casmon.runs import index\nindex.FOLD_AT = 1\n" \
           "faultpoints.configure(sys.argv[2])\ncasmon.list_runs(casmon.open(sys.argv[1]))\n"
    p = subprocess.run([PY, "-c", code, str(many), f"{point}=kill"], env=ENV, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -9, p.stderr
    left = [f for f in os.listdir(many / "runs-index") if f.startswith("d-")]
    assert 0 < len(left) <= 5
    index.decode((many / "runs-index" / "base").read_bytes(), "base")  # the new base, whole
    direct = _direct_keeping_index(many)
    s = casmon.open(many)
    assert _view(casmon.list_runs(s)) == direct and len(direct) == 65
    index._read.clear()
    assert _view(casmon.list_runs(casmon.open(many))) == direct
