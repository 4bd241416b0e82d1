"""The damage figure of issue 11: damage any single file of a store, repair, count what survives.

One store is built (cache entries with small and large results, ~600 intercepted
calls in batches, a recorded run; the index and every record table hold a
generation and level-0 files). Then, for each kind of file -- loose object,
pack, index level-0 file / generation manifest / bucket, record level-0 file /
generation manifest / bucket, ref, ``casmon.json`` -- and each kind of damage
-- a flipped bit, a truncation, deletion -- a copy of the store is damaged and
repaired. Every record (every call of a call-log batch counts as one) whose
bytes were not touched -- neither its table file nor any byte of a value it
needs -- must still be there, with its values, after repair, and ``verify``
must be clean. The default run damages one file of each kind in each way; the
slow run every file. gc's own files (fences, lock, leases, claims, condemned
lists), compute claims and run refs are damaged the same ways and more in
test_metadata_damage_campaign.py, on a store gc has run on.
"""

import json
import random
import shutil
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

import casmon
from casmon.store.codec import decode_frame, split_pack
from casmon.maintenance import repair
from casmon.store.objects import loose_key
from casmon.errors import StoreDamageWarning
from casmon.store.table import TableFile, split_bucket

from tests.support.damage import flip_at

KINDS = {
    "loose object": "objects/*/*",
    "pack": "packs/*",
    "index level-0 file": "index/l0/*",
    "index generation manifest": "index/gens/*",
    "index bucket": "index/buckets/*/*",
    "record level-0 file": "records/*/l0/*",
    "record generation manifest": "records/*/gens/*",
    "record bucket": "records/*/buckets/*/*",
    "ref": "refs/**/*",
    "casmon.json": "casmon.json",
}
HOWS = ["flip", "truncate", "delete"]


def build(root: Path) -> None:
    s = casmon.open(root, autoflush=None)

    @casmon.cache(store=s)
    def prep(i):
        return np.full(200 + i % 5, i, dtype=np.float64)

    @casmon.cache(store=s)
    def big(i):
        return np.random.default_rng(i).random(40_000)  # 320 KB: a loose chunk

    @casmon.intercept(store=s)
    def step(i, a):
        return float(a[0])

    with casmon.record(comment="damage figure", store=s, capture_output=False):
        for i in range(600):
            step(i, prep(i % 150))
            if i % 60 == 0:
                big(i // 60)
            if i % 100 == 99:
                s.flush()
                if i == 299:
                    s.objects.index.consolidate(force=True)
                    for kind in s.record_kinds():
                        s.table(kind).consolidate(force=True)
    s.close()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("figure") / "s"
    build(root)
    return root, Census(root)


class Census:
    """Every unit of a store (a record, or one call of a call-log batch), what holds it, what it needs."""

    def __init__(self, root: Path) -> None:
        s = casmon.open(root, read_only=True)
        self.files: dict[tuple, set[str]] = defaultdict(set)  # unit -> table files holding it
        self.needs: dict[tuple, set] = {}  # unit -> digests it needs (values, their chunks, children)
        self.where: dict = {}  # digest -> ("loose", key) or ("pack", key, start, end)
        closure_cache: dict = {}

        def closure(h: str) -> set:
            if h not in closure_cache:
                out = {h}
                try:
                    m = s.manifest(h)
                    out |= {c.hex() for c in m.chunk_digests()}
                    for c in m.children:
                        out |= closure(c.hex())
                except casmon.CasmonError:
                    pass
                closure_cache[h] = out
            return closure_cache[h]

        for f in sorted(root.glob("records/*/*/**/*")):
            if not f.is_file() or "/gens/" in f.as_posix():
                continue
            rel = f.relative_to(root).as_posix()
            kind = rel.split("/")[1]
            # A bucket file of a format-2 generation is its blocks' frames, back to back.
            tfs = split_bucket(f.read_bytes(), rel)[0] if "/buckets/" in rel else [
                TableFile(rel, decode_frame(f.read_bytes(), rel)[1])]
            for k, v in (kv for tf in tfs for kv in tf.items()):
                rec = json.loads(v)
                if kind == "calls":
                    for row in rec["c"]:
                        unit = ("call", rec["session"], rec["fns"][row[0]], row[1])
                        cells = [*row[5], *row[6].values(), row[7]]
                        digests = {c["$"] for c in cells if isinstance(c, dict) and "$" in c}
                        self.files[unit].add(rel)
                        self.needs[unit] = set().union(*(closure(h) for h in digests)) if digests else set()
                else:
                    unit = ("record", kind, bytes(k).hex(), v)
                    self.files[unit].add(rel)
                    self.needs[unit] = set().union(*(closure(h) for h in rec.get("_refs", []))) if rec.get("_refs") else set()
        for d in set().union(*self.needs.values()):
            key = loose_key(casmon.Digest(d))
            if (root / key).exists():
                self.where[d] = ("loose", key)
            else:
                for loc in s.objects.locations(casmon.Digest(d)):
                    self.where[d] = ("pack", f"packs/{loc.pack}", loc.offset, loc.offset + loc.length)
                    break

    def touched(self, rel: str, lo: int, hi: int) -> set:
        """Units whose bytes lie in ``rel``'s byte range [lo, hi)."""
        out = set()
        hit = set()
        for d, w in self.where.items():
            if w[1] == rel and (w[0] == "loose" or (w[2] < hi and lo < w[3])):
                hit.add(d)
        for unit, files in self.files.items():
            if rel in files or self.needs[unit] & hit:
                out.add(unit)
        return out


def present_units(root: Path) -> set:
    """The units a fresh reader finds, with every value they need present."""
    s = casmon.open(root, read_only=True)
    out = set()
    for kind in s.record_kinds():
        for k, rec in s.records(kind):
            refs = rec.get("_refs", [])
            if kind == "calls":
                for row in rec["c"]:
                    cells = [*row[5], *row[6].values(), row[7]]
                    if all(c["$"] in s for c in cells if isinstance(c, dict) and "$" in c):
                        out.add(("call", rec["session"], rec["fns"][row[0]], row[1]))
            elif all(h in s for h in refs):
                out.add(("record", kind, bytes(k).hex(), json.dumps(rec, separators=(",", ":"), allow_nan=True).encode()))
    return out


def damage(path: Path, how: str, rng: random.Random) -> tuple[int, int]:
    """Damage ``path``; returns the byte range touched."""
    data = bytearray(path.read_bytes())
    if how == "flip":
        out, i = flip_at(bytes(data), rng.randrange(len(data)), 1 << rng.randrange(8))  # a flip that changes content
        path.write_bytes(out)
        return i, i + 1
    if how == "truncate":
        cut = rng.randrange(1, max(2, len(data)))
        path.write_bytes(bytes(data[: len(data) - cut]))
        return len(data) - cut, len(data)
    path.unlink()
    return 0, len(data)


def one_case(pristine, tmp_path: Path, kind: str, how: str, victim_rel: str | None, seed: str, figures) -> None:
    base, census = pristine
    root = tmp_path / f"case-{abs(hash((kind, how, victim_rel, seed))) % 10**8}"
    shutil.copytree(base, root)
    rng = random.Random(seed)
    if victim_rel is None:
        victims = sorted(p.relative_to(root).as_posix() for p in root.glob(KINDS[kind]) if p.is_file())
        assert victims, kind
        victim_rel = rng.choice(victims)
    lo, hi = damage(root / victim_rel, how, rng)
    touched = census.touched(victim_rel, lo, hi)
    untouched = set(census.files) - touched
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", StoreDamageWarning)
        done = repair(casmon.open(root))
        assert done["ok"], (victim_rel, how, done)
        if done["rounds"]:  # repair's first verify found the damage (a writer's newest level-0 file leaves no trace)
            figures("damage figure: damaged stores found damaged by verify")
        assert casmon.open(root, read_only=True).verify().ok
        kept = untouched & present_units(root)
    figures("damage figure: stores damaged")
    figures(f"damage figure: stores damaged ({kind}, {how})")
    figures("damage figure: stores repaired to a clean verify")
    figures("damage figure: records (calls counted singly) whose bytes were not touched", len(untouched))
    figures("damage figure: of those, kept by repair", len(kept))
    lost = untouched - kept
    assert len(kept) >= 0.99 * len(untouched), (victim_rel, how, len(lost), sorted(lost, key=str)[:5])


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", list(KINDS))
def test_damage_any_file_repair_keeps_what_was_not_touched(pristine, tmp_path, kind, how, figures):
    one_case(pristine, tmp_path, kind, how, None, f"{kind}/{how}", figures)


@pytest.mark.slow
def test_damage_every_file_of_a_store(pristine, tmp_path, figures):
    base, _census = pristine
    files = sorted(p.relative_to(base).as_posix() for p in base.rglob("*") if p.is_file() and ".partial" not in p.name)
    for rel in files:
        kind = next((k for k, pat in KINDS.items() if Path(rel).match(pat) or rel == pat), None)
        if kind is None:
            continue
        for how in HOWS:
            for seed in ("a", "b"):
                one_case(pristine, tmp_path, kind, how, rel, f"{rel}/{how}/{seed}", figures)
