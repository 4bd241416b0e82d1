"""Stores for the maintenance tests, and stores looked at from outside: a small store with reachable and
unreachable values, what files a store has, its loose objects' headers, and a store that lost a value a
long-lived reader still holds in memory."""

from pathlib import Path

import numpy as np

import casmon
from casmon.store.codec import FRAME_HEADER, read_header


def build(tmp_path):
    """A store with reachable values (a large one in loose chunks, a small packed one) and two unreachable ones.

    Returns ``(store, keep, small, orphan, orphan_small, big)``: ``keep`` and ``small`` are named by a
    record, ``small`` also by a ref; ``big`` is the array inside ``keep``."""
    s = casmon.open(tmp_path / "s", autoflush=None)
    big = np.random.default_rng(0).random(1_000_000)  # loose chunks
    keep = s.put({"big": big})
    small = s.put([1, 2, 3])
    orphan = s.put(np.random.default_rng(1).random(100_000))
    orphan_small = s.put("nobody points at me")
    s.append("call", {"n": 1}, refs=[keep, small])
    s.set_ref("named", small)
    s.flush()
    return s, keep, small, orphan, orphan_small, big


def files_under(root: Path) -> set[Path]:
    """Every file under ``root``."""
    return {p for p in root.rglob("*") if p.is_file()}


def loose_headers(store_path: Path):
    """The frame header of every loose object of the local store at ``store_path``."""
    return [read_header((p.read_bytes()[:FRAME_HEADER]), str(p)) for p in (store_path / "objects").rglob("*")
            if p.is_file() and ".partial" not in p.name]


def store_with_a_lost_value_a_reader_has_read(tmp_path):
    """A store whose second value lost its pack and index file, and a long-lived reader that loaded it
    before: the value's bytes are in the reader's memory only."""
    root = tmp_path / "s"
    w = casmon.open(root, autoflush=None)
    w.append("keep", {"n": 1}, refs=[w.put({"a": 1})])
    w.flush()
    w.close()
    before = files_under(root)
    w = casmon.open(root, autoflush=None)
    v = w.put({"v": 2})
    w.append("keep", {"n": 2}, refs=[v])
    w.flush()
    w.close()
    new = files_under(root) - before
    reader = casmon.open(root, autoflush=None)
    assert reader.get(v) == {"v": 2}
    lost = [p for p in new if "packs" in p.parts or "index" in p.parts]
    assert len(lost) == 2, lost
    for p in lost:
        p.unlink()
    assert not casmon.open(root).verify().ok  # a fresh process sees the loss
    return root, reader, v


def assert_no_record_names_a_removed_value(store) -> None:
    """verify is clean, and every value any record's ``_refs`` names is stored."""
    rep = store.verify()
    assert rep.ok, rep.as_dict()
    for kind in store.record_kinds():
        for _k, rec in store.records(kind):
            for h in rec.get("_refs", ()):
                assert h in store, f"a {kind} record names {h}, which is not stored"


def one_cached_call(path) -> str:
    """A store at ``path`` holding one cached call's entry, closed: where the store options' tests run."""
    s = casmon.open(path)

    @casmon.cache(store=s)
    def f(x):
        return x

    f(1)
    s.close()
    return str(path)
