"""Artifacts count like every other value: stats, verify, repair, export and restore."""

import json

import numpy as np
import pytest

import casmon
from casmon.maintenance import repair
from casmon.runs.artifacts import KIND_ARTIFACT, artifacts_key
from casmon.runs.pieces import PIECED_MIN
from casmon.store.objects import loose_key

pytestmark = pytest.mark.filterwarnings("ignore::casmon.RunWarning")


@pytest.fixture
def store(tmp_path):
    s = casmon.open(tmp_path / "s", create=True)
    yield s
    s.close()


def _big(tmp_path, seed=1):
    f = tmp_path / "big.bin"
    f.write_bytes(np.random.default_rng(seed).bytes(2 * PIECED_MIN + 99))
    return f


def _damage_piece(store, root, art, i=2):
    chunk = next(store.manifest(art.refs[i]).chunk_digests())
    p = root / loose_key(chunk)
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    p.write_bytes(bytes(raw))
    store.objects.clear_caches()
    return chunk


def test_stats_counts_artifact_records_and_their_bytes(store, tmp_path):
    f = _big(tmp_path)
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(f)
        run.save("w", np.arange(1000))
    st = store.stats()
    assert st["records"][KIND_ARTIFACT] == 2
    assert st["logical_bytes"] >= f.stat().st_size + 8000


def test_verify_finds_a_damaged_piece_and_repair_drops_only_the_artifact_that_needs_it(store, tmp_path):
    f = _big(tmp_path)
    with casmon.record(store=store, capture_output=False) as run:
        art = run.save_file(f)
        run.save("w", np.arange(1000))
    assert store.verify().ok
    chunk = _damage_piece(store, tmp_path / "s", art)
    rep = store.verify()
    assert not rep.ok and any(chunk.hex() in k for k, _ in rep.damaged)
    done = repair(store)
    assert done["dropped_records"] == 1
    r = casmon.load_run("latest", store)
    assert [a["name"] for a in r.artifacts()] == ["w"] and r.load("w")[999] == 999
    assert store.verify().ok


def test_export_writes_file_and_folder_artifacts_and_lists_every_one(store, tmp_path):
    f = _big(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(f, name="model/big.bin")
        run.save_file(tmp_path / "d", name="plots")
        run.save("w", np.arange(10))
        run.checkpoint({"step": 4}, step=4)
    root = casmon.export("latest", tmp_path / "out", store=store)
    assert (root / "artifacts" / "model" / "big.bin").read_bytes() == f.read_bytes()
    assert (root / "artifacts" / "plots" / "a.txt").read_text() == "a"
    index = {a["name"]: a for a in json.loads((root / "artifacts.json").read_text())}
    assert index["model/big.bin"]["path"] == "artifacts/model/big.bin" and index["plots"]["kind"] == "folder"
    assert "load('w')" in index["w"]["load"] and index["checkpoint/4"]["step"] == 4
    assert not (root / "artifacts" / "w").exists()


def test_export_goes_on_past_an_artifact_it_cannot_write_and_says_why(store, tmp_path):
    f = _big(tmp_path)
    (tmp_path / "small").write_bytes(b"small")
    with casmon.record(store=store, capture_output=False) as run:
        art = run.save_file(f)
        run.save_file(tmp_path / "small")
        ref = run.ref
    _damage_piece(store, tmp_path / "s", art)
    store.append(KIND_ARTIFACT, {"run": ref, "name": "../../evil", "kind": "file", "digest": art.digest, "size": 1,
                                 "time": 1e12, "seq": 1}, key=artifacts_key(ref), refs=[])
    store.flush()
    root = casmon.export("latest", tmp_path / "out", store=store)
    index = {a["name"]: a for a in json.loads((root / "artifacts.json").read_text())}
    assert "damaged" in index["big.bin"]["not_written"] and "refusing" in index["../../evil"]["not_written"]
    assert (root / "artifacts" / "small").read_bytes() == b"small"
    assert not (root / "artifacts" / "big.bin").exists() and not (tmp_path / "evil").exists()


def test_restore_writes_artifacts_only_when_asked_and_never_over_the_codes_own(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no git repository: the run keeps no code, restore writes an empty tree
    (tmp_path / "small").write_bytes(b"small")
    with casmon.record(store=store, capture_output=False) as run:
        run.save_file(tmp_path / "small")
    assert not (casmon.restore("latest", tmp_path / "code", store=store) / "artifacts").exists()
    root = casmon.restore("latest", tmp_path / "code2", store=store, artifacts=True)
    assert (root / "artifacts" / "small").read_bytes() == b"small" and (root / "artifacts.json").exists()
